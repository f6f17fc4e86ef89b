"""`repair`: a file refused for damage back in service without a backup (issue 45).

Each case damages one key, as docs/reliability.md names the damage, in a file of three
sessions of 40 items, then repairs it. The damaged session loses what cannot be read. Every other
session keeps exactly its items. The damaged files are kept aside, byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_damage
from test_damage import (
    KEY,
    SESSIONS,
    Citadel,
    damage_atom,
    items,
    read_all,
    refused,
    wreck_slot,
)
from test_secrets import secrets_in_frames

from citadeldb_openai_agents import (
    CitadelSessionStore,
    CorruptDatabaseError,
    DatabaseLockedError,
    LedgerError,
    SessionLoss,
    repair_file,
)
from citadeldb_openai_agents.cli import main


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, Path]:
    """test_damage's file of three sessions (and its backup), to be damaged by each test."""
    return test_damage.original.__wrapped__(tmp_path)  # type: ignore[attr-defined, no-any-return]


@contextlib.contextmanager
def backed_up(path: Path, tmp_path: Path) -> Iterator[tuple[CitadelSessionStore, Path, Path]]:
    """The file opened with an erasure ledger, just backed up: (store, ledger, backup)."""
    ledger, backup = tmp_path / "erasures.jsonl", tmp_path / "b2" / "agent.cdl"
    backup.parent.mkdir()
    with CitadelSessionStore(path, KEY, erasure_ledger=ledger) as store:
        store.backup(backup)
        yield store, ledger, backup


def digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()
    }


def untouched_others(path: Path, damaged: str) -> None:
    """Every other session holds exactly the items written, and the damaged one a subset in order."""
    after = read_all(path)  # opens and verifies
    for session_id, count in SESSIONS.items():
        if session_id != damaged:
            assert after[session_id] == items(session_id, count), session_id
    kept = after.get(damaged, [])
    written = items(damaged, SESSIONS[damaged])
    assert kept == [item for item in written if item in kept]


def test_a_damaged_item_key_loses_that_item_only(damaged: tuple[Path, Path]) -> None:
    path, _ = damaged
    damage_atom(path, Citadel(path).segments_of("alice"), 7, "item")
    refused(path)
    before = digests(path.parent)
    report = repair_file(path, KEY)
    assert report.repaired and report.items_lost == 1
    assert report.lost == [SessionLoss("alice", None, 1, 40, report.lost[0].cause)]
    assert "atomkeys" in report.lost[0].cause
    aside = Path(report.aside or "")
    assert aside.parent == path.parent and aside.name.startswith("agent.cdl.damaged-")
    assert {n: d for n, d in digests(aside).items() if not n.endswith("-audit")} == {
        n: d for n, d in before.items() if not n.endswith("-audit")
    }, "the damaged files are moved aside unchanged"
    untouched_others(path, "alice")
    assert len(read_all(path)["alice"]) == 39


def test_a_damaged_session_record_loses_that_session_named_by_its_hash(damaged: tuple[Path, Path]) -> None:
    path, _ = damaged
    bob = Citadel(path).segments_of("bob")  # coa.s.HID.
    damage_atom(path, "coa.catalog", 1)  # bob's record
    report = repair_file(path, KEY)
    assert [(loss.session_id, loss.hid, loss.items_lost) for loss in report.lost] == [
        (None, bob.split(".")[2], 40)
    ]
    assert report.lost[0].name == f"the session hashed {bob.split('.')[2]}"
    untouched_others(path, "bob")
    assert "bob" not in read_all(path)


def test_a_damaged_segment_key_loses_that_segment(damaged: tuple[Path, Path]) -> None:
    path, _ = damaged
    citadel = Citadel(path)
    segment = citadel.segments_of("carol")
    wreck_slot(Path(f"{path}.citadel-regions"), citadel.region_slot(segment))
    report = repair_file(path, KEY)
    assert [(loss.session_id, loss.items_lost) for loss in report.lost] == [("carol", 40)]
    untouched_others(path, "carol")
    with CitadelSessionStore(path, KEY) as store:  # the session is usable again
        state = store._file._local._layout.state("carol")
        assert state.record is not None and state.record.segments == state.segments == []  # unlisted
        asyncio.run(store.session("carol").add_items([{"role": "user", "content": "carol again"}]))
        assert asyncio.run(store.session("carol").get_items()) == [{"role": "user", "content": "carol again"}]


def test_an_undamaged_file_is_left_as_it_is(damaged: tuple[Path, Path]) -> None:
    path, _ = damaged
    before = digests(path.parent)
    report = repair_file(path, KEY)
    assert not report.repaired and report.lost == [] and report.aside is None
    assert {n: d for n, d in digests(path.parent).items() if not n.endswith("-audit")} == {
        n: d for n, d in before.items() if not n.endswith("-audit")
    }


def test_a_damaged_layout_record_or_a_held_file_is_refused_with_nothing_changed(
    damaged: tuple[Path, Path],
) -> None:
    path, _ = damaged
    with CitadelSessionStore(path, KEY), pytest.raises(DatabaseLockedError, match="stop the service"):
        repair_file(path, KEY)
    damage_atom(path, "coa.meta", 0)
    before = digests(path.parent)
    with pytest.raises(CorruptDatabaseError, match=r"cannot be repaired: the layout record .* from a backup"):
        repair_file(path, KEY)
    after = digests(path.parent)
    assert {n: d for n, d in after.items() if not n.endswith("-audit")} == {
        n: d for n, d in before.items() if not n.endswith("-audit")
    }
    assert not [p for p in path.parent.iterdir() if ".repairing-" in p.name or ".damaged-" in p.name]


def test_the_repair_command_prints_each_sessions_loss(
    damaged: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = damaged
    damage_atom(path, Citadel(path).segments_of("alice"), 3, "item")
    monkeypatch.setenv("CITADEL_PATH", str(path))
    monkeypatch.setenv("CITADEL_KEY", KEY)
    assert main(["repair"]) == 1  # refused without --yes: it drops what cannot be read
    assert "--yes" in capsys.readouterr().err
    assert main(["repair", "--yes"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == f"repaired {path}: 1 item could not be read in 1 session; every other session kept whole; verified"
    )
    assert out[1].startswith("  'alice'  1 of 40 items unreadable (their keys in the .citadel-atomkeys file")
    assert out[2].startswith(f"the damaged files are kept in {path}.damaged-")
    assert main(["repair", "--yes"]) == 0
    assert capsys.readouterr().out == f"{path} is not damaged: nothing to repair.\n"


def test_from_a_backup_the_lost_items_come_back_and_nothing_erased_since(
    damaged: tuple[Path, Path], tmp_path: Path
) -> None:
    """alice loses one item to damage and popped one since the backup (in the ledger); bob's record
    is damaged. From the backup: the damaged item and all of bob come back, the popped one does
    not, and carol (written to since the backup) keeps her newer item."""
    path, _ = damaged
    with backed_up(path, tmp_path) as (store, ledger, backup):
        asyncio.run(store.session("alice").pop_item())  # alice 39: erased, recorded in the ledger
        asyncio.run(store.session("carol").add_items([{"role": "user", "content": "carol new"}]))
    damage_atom(path, Citadel(path).segments_of("alice"), 7, "item")  # alice 7
    damage_atom(path, "coa.catalog", 1)  # bob's record
    report = repair_file(path, KEY, from_backup=backup, erasure_ledger=ledger)
    assert sorted((loss.items_lost, loss.items_restored) for loss in report.lost) == [(1, 1), (40, 40)]
    assert report.backup == str(backup) and report.notes == ()
    after = read_all(path)
    assert after["alice"] == items("alice", 39)  # 7 back, 39 still erased
    assert after["bob"] == items("bob", 40)
    assert after["carol"] == [*items("carol", 40), {"role": "user", "content": "carol new"}]


def test_from_a_backup_a_ledger_cut_short_of_the_files_head_is_refused(
    damaged: tuple[Path, Path], tmp_path: Path
) -> None:
    path, _ = damaged
    with backed_up(path, tmp_path) as (store, ledger, backup):
        store.erase_session("carol")
    damage_atom(path, Citadel(path).segments_of("alice"), 7, "item")
    ledger.write_bytes(b"")
    before = digests(path.parent)
    with pytest.raises(LedgerError, match="but the file recorded entry 1"):
        repair_file(path, KEY, from_backup=backup, erasure_ledger=ledger)
    assert {n: d for n, d in digests(path.parent).items() if not n.endswith("-audit")} == {
        n: d for n, d in before.items() if not n.endswith("-audit")
    }


def test_the_repair_command_takes_lost_items_from_a_backup_only_with_the_ledger(
    damaged: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, _ = damaged
    with backed_up(path, tmp_path) as (_, ledger, backup):
        pass
    damage_atom(path, Citadel(path).segments_of("carol"), 0, "item")
    monkeypatch.setenv("CITADEL_PATH", str(path))
    monkeypatch.setenv("CITADEL_KEY", KEY)
    assert main(["repair", "--yes", "--from-backup", str(backup)]) == 1
    assert "erasure_ledger is not set" in capsys.readouterr().err
    monkeypatch.setenv("CITADEL_ERASURE_LEDGER", str(ledger))
    assert main(["repair", "--yes", "--from-backup", str(backup)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"repaired {path}: 1 item could not be read in 1 session, 1 put back from {backup}; "
        "every other session kept whole; verified"
    )
    assert out[1].endswith("are damaged or missing), 1 put back")
    assert read_all(path) == {sid: items(sid, count) for sid, count in SESSIONS.items()}


def test_a_refused_repair_keeps_no_passphrase_in_its_frames(
    damaged: tuple[Path, Path], tmp_path: Path
) -> None:
    path, _ = damaged
    with backed_up(path, tmp_path) as (store, ledger, backup):
        store.erase_session("carol")
    damage_atom(path, Citadel(path).segments_of("alice"), 7, "item")
    ledger.write_bytes(b"")
    with pytest.raises(LedgerError) as cut:
        repair_file(path, KEY, from_backup=backup, erasure_ledger=ledger)
    assert secrets_in_frames(cut.value, lambda value: value == KEY) == []
    damage_atom(path, "coa.meta", 0)
    with pytest.raises(CorruptDatabaseError) as layout:
        repair_file(path, KEY)
    assert secrets_in_frames(layout.value, lambda value: value == KEY) == []


# -- issue 59: what repair must not bring back -------------------------------------------------------


def test_a_pops_ledger_head_survives_the_loss_of_its_sessions_record(
    damaged: tuple[Path, Path], tmp_path: Path
) -> None:
    """The retest's attack, with no passphrase: bob pops an item (its head in bob's record), then
    the attacker damages bob's record's key and cuts the ledger's last line. Repair must refuse the
    cut ledger (the layout record holds the head too), with or without a backup, changing nothing;
    before the fix it let Citadel drop the record, and --from-backup brought the popped item back."""
    path, _ = damaged
    with backed_up(path, tmp_path) as (store, ledger, backup):
        popped = asyncio.run(store.session("bob").pop_item())
    assert popped == items("bob", 40)[-1]
    damage_atom(path, "coa.catalog", 1)  # bob's record
    lines = ledger.read_bytes().splitlines(keepends=True)
    assert len(lines) == 1
    ledger.write_bytes(b"".join(lines[:-1]))  # the pop's entry cut
    before = digests(path.parent)
    for backup_given in (None, backup):
        with pytest.raises(LedgerError, match="but the file recorded entry 1") as refused_repair:
            repair_file(path, KEY, from_backup=backup_given, erasure_ledger=ledger)
        assert "Put back the copy that holds every entry" in str(refused_repair.value)
        assert {n: d for n, d in digests(path.parent).items() if not n.endswith("-audit")} == {
            n: d for n, d in before.items() if not n.endswith("-audit")
        }
    ledger.write_bytes(b"".join(lines))  # the whole ledger put back: repair goes on
    report = repair_file(path, KEY, from_backup=backup, erasure_ledger=ledger)
    assert report.repaired
    assert read_all(path)["bob"] == items("bob", 39), "the popped item must stay erased"
