"""An erasure ledger cut short is refused: the file keeps the ledger's head (issue 45).

Each edit of the issue's table (no passphrase needed for any) is made to a ledger holding two
erasures made after a backup; `restore --replace` must refuse it with nothing restored, and
`verify` must fail on it. A mirror on another volume survives the edit of one copy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, LedgerError, restore_backup
from citadeldb_openai_agents.cli.main import main

from conftest import KEY


def open_store(database: Path, ledger: Path, mirror: Path | None = None) -> CitadelSessionStore:
    return CitadelSessionStore(
        database, KEY, argon2_profile="iot", erasure_ledger=ledger, ledger_mirror=mirror
    )


def add(store: CitadelSessionStore, session_id: str, *contents: str) -> None:
    asyncio.run(store.session(session_id).add_items([{"role": "user", "content": c} for c in contents]))


def erased_twice(tmp_path: Path, mirror: Path | None = None) -> tuple[Path, Path, Path]:
    """alice, bob and carol backed up, then alice and bob erased: two entries, the file's head at 2."""
    database, ledger, backup = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl", tmp_path / "backup.cdl"
    with open_store(database, ledger, mirror) as store:
        for session_id in ("alice", "bob", "carol"):
            add(store, session_id, f"{session_id} 1", f"{session_id} 2")
        store.backup(backup)
        store.erase_session("alice")
        store.erase_session("bob")
        assert store.erasure_ledger_head is not None and store.erasure_ledger_head[0] == 2
    return database, ledger, backup


def drop_last_line(ledger: Path) -> None:
    ledger.write_bytes(b"".join(ledger.read_bytes().splitlines(keepends=True)[:-1]))


def change_file_field(ledger: Path) -> None:
    """The first line made to look like another file's: skipped unseen before the fix."""
    lines = ledger.read_bytes().splitlines()
    first = json.loads(lines[0])
    first["file"] = "0123456789abcdef"
    ledger.write_bytes(b"\n".join([json.dumps(first, separators=(",", ":")).encode(), *lines[1:]]) + b"\n")


EDITS: dict[str, Callable[[Path], None]] = {
    "last line removed": drop_last_line,
    "ledger deleted": lambda ledger: ledger.unlink(),
    "emptied": lambda ledger: ledger.write_bytes(b""),
    "file field changed": change_file_field,
    "last newline removed": lambda ledger: ledger.write_bytes(ledger.read_bytes()[:-1]),
}
REFUSALS = {
    "last line removed": r"ends at entry 1 \(line 1\), but the file recorded entry 2",
    "ledger deleted": r"ends at entry 0 \(line 0\), but the file recorded entry 2",
    "emptied": r"ends at entry 0 \(line 0\), but the file recorded entry 2",
    "file field changed": r"line 1 of the erasure ledger .* this file's entry with its file field changed",
    "last newline removed": r"ends at entry 1 \(line 1, and its line 2 has no newline \(cut short\)\)",
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_each_edit_of_the_ledger_is_refused_by_restore_and_verify(tmp_path: Path, edit: str) -> None:
    database, ledger, backup = erased_twice(tmp_path)
    EDITS[edit](ledger)
    before = database.read_bytes()
    with pytest.raises(LedgerError, match=REFUSALS[edit]) as refused:
        restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert "Nothing was changed" in str(refused.value) or "Nothing was" in str(refused.value)
    assert database.read_bytes() == before
    with open_store(database, ledger) as store:
        assert store.session_ids() == ["carol"]  # nothing erased came back
        verdict = store.verify()
    assert not verdict.ok
    assert any("erasure ledger" in finding for finding in verdict.findings), verdict.findings


def test_a_cut_ledger_refuses_the_next_erasure_instead_of_healing_the_chain(tmp_path: Path) -> None:
    """Before the fix, the next append took the removed entry's number and the chain looked whole."""
    database, ledger, _ = erased_twice(tmp_path)
    drop_last_line(ledger)
    with open_store(database, ledger) as store:
        with pytest.raises(LedgerError, match="but the file recorded entry 2"):
            store.erase_session("carol")
        assert store.session_ids() == ["carol"]
    assert len(ledger.read_bytes().splitlines()) == 1


def test_the_restore_command_refuses_a_cut_ledger_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    database, ledger, backup = erased_twice(tmp_path)
    drop_last_line(ledger)
    monkeypatch.setenv("CITADEL_PATH", str(database))
    monkeypatch.setenv("CITADEL_KEY", KEY)
    monkeypatch.setenv("CITADEL_ERASURE_LEDGER", str(ledger))
    assert main(["restore", str(backup), "--replace"]) == 1
    err = capsys.readouterr().err
    assert "but the file recorded entry 2" in err and "Put back the copy that holds every entry" in err
    assert KEY not in err


def test_a_restored_file_takes_the_ledgers_head(tmp_path: Path) -> None:
    """The backup recorded no erasure; once restored, the ledger's two entries are its head."""
    database, ledger, backup = erased_twice(tmp_path)
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert report.erased == {"alice": 2, "bob": 2} and report.ledger_notes == ()
    drop_last_line(ledger)
    with open_store(database, ledger) as store:
        assert store.erasure_ledger_head is not None and store.erasure_ledger_head[0] == 2
        assert not store.verify().ok


def test_a_mirror_outlives_an_edit_of_one_copy_and_the_restore_says_where_they_disagree(
    tmp_path: Path,
) -> None:
    mirror = tmp_path / "other-volume" / "erasures.jsonl"
    mirror.parent.mkdir()
    database, ledger, backup = erased_twice(tmp_path, mirror)
    assert mirror.read_bytes() == ledger.read_bytes()
    drop_last_line(ledger)
    database.unlink()  # a lost file: its head is gone too, and only the mirror shows the cut
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, ledger_mirror=mirror, replace=True)
    assert report.erased == {"alice": 2, "bob": 2}
    assert report.ledger_notes == (
        f"there is no file at {database}, so the ledger was checked against the backup's head and its "
        "own copies only (docs/reliability.md: what the mirror is for)",
        f"erasure ledger: {ledger} ends at entry 1, {mirror} at entry 2: the entries after 1 are read from {mirror}",
    )
    with open_store(database, ledger, mirror) as store:
        assert store.session_ids() == ["carol"]
        assert not store.verify().ok  # the copies still disagree
        store.erase_session("carol")  # the append gives the short copy what it lacks first
        assert store.verify().ok
    assert ledger.read_bytes() == mirror.read_bytes()
    assert [json.loads(line)["n"] for line in ledger.read_bytes().splitlines()] == [1, 2, 3]


def test_an_erasure_is_refused_when_the_mirror_cannot_be_written(tmp_path: Path) -> None:
    mirror = tmp_path / "unmounted" / "erasures.jsonl"  # its directory does not exist
    database, ledger = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl"
    with open_store(database, ledger, mirror) as store:
        add(store, "alice", "hello")
        with pytest.raises(LedgerError, match=f"erasure ledger {mirror} .*nothing was erased"):
            store.erase_session("alice")
        assert store.session_ids() == ["alice"]


def test_both_copies_cut_are_refused(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror.jsonl"
    database, ledger, backup = erased_twice(tmp_path, mirror)
    drop_last_line(ledger)
    drop_last_line(mirror)
    with pytest.raises(LedgerError, match="but the file recorded entry 2"):
        restore_backup(backup, database, KEY, erasure_ledger=ledger, ledger_mirror=mirror, replace=True)


def test_a_crash_torn_line_beyond_the_head_is_dropped_but_one_short_of_it_is_refused(tmp_path: Path) -> None:
    """The head is written after the ledger line: a torn line past it is a crash's, not an entry."""
    database, ledger, backup = erased_twice(tmp_path)
    whole = ledger.read_bytes()
    ledger.write_bytes(whole + whole.splitlines(keepends=True)[1][:-30])  # past the head: a crash
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert report.ledger_entries == 2
    ledger.write_bytes(whole[:-30])  # entry 2 itself torn: short of the head
    with pytest.raises(LedgerError, match="its line 2 has no newline"):
        restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)


def test_a_pops_head_is_in_the_sessions_record_and_a_cut_after_it_shows(tmp_path: Path) -> None:
    """A pop keeps the session's record: the head it carries is what shows the cut after a reopen."""
    database, ledger = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl"
    with open_store(database, ledger) as store:
        add(store, "alice", "one", "two", "three")
        asyncio.run(store.session("alice").pop_item())
        asyncio.run(store.session("alice").pop_item())
    drop_last_line(ledger)
    with open_store(database, ledger) as store:
        assert store.erasure_ledger_head is not None and store.erasure_ledger_head[0] == 2
        verdict = store.verify()
        assert not verdict.ok and "but the file recorded entry 2" in " ".join(verdict.findings)
        with pytest.raises(LedgerError, match="but the file recorded entry 2"):
            asyncio.run(store.session("alice").pop_item())


def test_a_ledger_ahead_of_the_head_is_a_crash_before_the_record_and_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line is flushed before the record that carries the head: a crash between the two
    leaves the ledger one entry ahead, which is allowed (the erasure never started)."""
    from citadeldb_openai_agents.storage.segments import SessionLayout

    database, ledger = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl"
    with open_store(database, ledger) as store:
        add(store, "alice", "one", "two")
        add(store, "bob", "three")

        def crash(*args: object) -> None:
            raise RuntimeError("killed before the record was written")

        with monkeypatch.context() as patched:
            patched.setattr(SessionLayout, "write_record", crash)
            with pytest.raises(Exception, match="killed before the record"):
                store.erase_session("alice")
    assert len(ledger.read_bytes().splitlines()) == 1
    with open_store(database, ledger) as store:
        # The open takes the crash's entry as the file's head (tests/test_rollback.py: so a
        # second crash leaves the file one entry behind again, never two).
        assert store.erasure_ledger_head is not None and store.erasure_ledger_head[0] == 1
        assert store.session_ids() == ["alice", "bob"]
        store.erase_session("alice")  # entry 2, after the one the crash left
        store.erase_session("bob")
        assert store.erasure_ledger_head is not None and store.erasure_ledger_head[0] == 3
        assert store.verify().ok


@pytest.mark.parametrize("live", ["deleted", "unopenable"])
def test_a_restore_over_a_lost_live_file_says_the_ledger_was_checked_without_its_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], live: str
) -> None:
    """Issue 59: with the live file gone (or not opening) and the ledger emptied, nothing in the
    data directory can tell that the ledger was cut; the restore must say so in both cases (before
    the fix it said nothing when the file was gone). Only a copy out of the writer's reach (a
    mirror on another volume) stands against it."""
    database, ledger, backup = erased_twice(tmp_path)
    ledger.write_bytes(b"")
    if live == "deleted":
        database.unlink()
    else:
        Path(f"{database}.citadel-keys").write_bytes(b"not a key file")
    monkeypatch.setenv("CITADEL_PATH", str(database))
    monkeypatch.setenv("CITADEL_KEY", KEY)
    monkeypatch.setenv("CITADEL_ERASURE_LEDGER", str(ledger))
    assert main(["restore", str(backup), "--replace"]) == 0
    out = capsys.readouterr().out
    said = (
        f"there is no file at {database}"
        if live == "deleted"
        else f"{database} did not open (CorruptDatabaseError)"
    )
    assert f"{said}, so the ledger was checked against the backup's head and its own copies only" in out
