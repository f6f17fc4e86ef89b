"""The erasure ledger: an erasure survives a restore of a backup taken before it (issue 28)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_serving import owner_running

from citadeldb_openai_agents import (
    BackupExistsError,
    CitadelSessionStore,
    ConfigurationError,
    DatabaseLockedError,
    LedgerError,
    restore_backup,
)
from citadeldb_openai_agents.cli.main import main

from conftest import KEY


def open_store(database: Path, ledger: Path | None) -> CitadelSessionStore:
    return CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger)


def texts(store: CitadelSessionStore, session_id: str) -> list[Any]:
    return [item["content"] for item in asyncio.run(store.session(session_id).get_items())]


def add(store: CitadelSessionStore, session_id: str, *contents: str) -> None:
    asyncio.run(store.session(session_id).add_items([{"role": "user", "content": c} for c in contents]))


@pytest.fixture
def backed_up(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A file with three sessions and a backup of it, then erasures made after the backup."""
    database, ledger, backup = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl", tmp_path / "backup.cdl"
    with open_store(database, ledger) as store:
        for session_id in ("alice", "bob", "carol"):
            add(store, session_id, f"{session_id} 1", f"{session_id} 2", f"{session_id} 3")
        store.backup(backup)
        store.erase_session("alice")
        asyncio.run(store.session("bob").pop_item())
        add(store, "carol", "carol 4")  # written after the backup: a restore loses it, as any restore does
        add(store, "alice", "alice again")  # the same id after its erasure: not erased by the replay
        store.backup(tmp_path / "later.cdl")
    return database, ledger, backup


def test_a_restore_erases_again_what_was_erased_after_the_backup(backed_up: tuple[Path, Path, Path]) -> None:
    database, ledger, backup = backed_up
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert report.erased == {"alice": 3, "bob": 1}
    assert (report.sessions, report.ledger_entries, report.items_erased) == (2, 2, 4)
    with open_store(database, ledger) as store:
        assert store.session_ids() == ["bob", "carol"]
        assert texts(store, "bob") == ["bob 1", "bob 2"]
        assert texts(store, "carol") == ["carol 1", "carol 2", "carol 3"]
        assert store.verify().ok


def test_a_later_backup_keeps_what_was_written_after_an_erasure(
    backed_up: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """The ledger erases by creation time: alice's new conversation, after her erasure, stays."""
    database, ledger, _ = backed_up
    report = restore_backup(tmp_path / "later.cdl", database, KEY, erasure_ledger=ledger, replace=True)
    assert report.erased == {}
    with open_store(database, ledger) as store:
        assert texts(store, "alice") == ["alice again"]
        assert texts(store, "carol") == ["carol 1", "carol 2", "carol 3", "carol 4"]


def test_verify_reports_what_the_ledger_erased_and_the_file_still_holds(
    backed_up: tuple[Path, Path, Path],
) -> None:
    database, ledger, backup = backed_up
    report = restore_backup(backup, database, KEY, erasure_ledger=None, replace=True)
    assert report.erased == {} and report.sessions == 3
    # Restored without its ledger, the file is two erasures behind it: a rollback, not served
    # (tests/test_rollback.py); repair would erase them again.
    with pytest.raises(
        LedgerError, match="older than its erasure ledger: the ledger holds this file's erasures 1 to 2"
    ):
        open_store(database, ledger)
    # One entry behind is a crash's window, and served: verify names what that entry erased.
    whole = ledger.read_bytes()
    ledger.write_bytes(whole.splitlines(keepends=True)[0])
    with open_store(database, ledger) as store:
        verdict = store.verify()
    assert not verdict.ok
    assert [finding.split(" holds ")[0] for finding in verdict.findings] == ["session 'alice'"]
    assert "holds 3 items the erasure ledger says were erased" in verdict.findings[0]


def test_the_ledger_names_no_session_and_a_changed_line_stops_the_restore(
    backed_up: tuple[Path, Path, Path],
) -> None:
    database, ledger, backup = backed_up
    raw = ledger.read_bytes()
    assert b"alice" not in raw and b"bob" not in raw
    assert oct(ledger.stat().st_mode & 0o777) == "0o600"
    before = database.read_bytes()
    lines = [json.loads(line) for line in raw.splitlines()]
    lines[1]["items"][0][1] += 1  # another item's creation time: a forged entry
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(LedgerError, match=r"line 2 of the erasure ledger .* MAC does not match"):
        restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    ledger.write_bytes(raw.splitlines(keepends=True)[1])  # the first line dropped
    with pytest.raises(LedgerError, match=r"line 1 .* an entry before it is missing"):
        restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert database.read_bytes() == before
    assert not [name for name in os.listdir(database.parent) if ".restoring-" in name]


def test_a_restore_refuses_a_file_in_use_or_one_it_was_not_told_to_replace(
    backed_up: tuple[Path, Path, Path],
) -> None:
    database, ledger, backup = backed_up
    with pytest.raises(BackupExistsError, match="Pass replace=True"):
        restore_backup(backup, database, KEY, erasure_ledger=ledger)
    with open_store(database, ledger), pytest.raises(DatabaseLockedError, match=f"PID {os.getpid()}"):
        restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)


def test_an_erasure_the_ledger_cannot_hold_is_refused_and_erases_nothing(tmp_path: Path) -> None:
    ledger = tmp_path / "gone" / "erasures.jsonl"  # its directory does not exist
    with open_store(tmp_path / "agent.cdl", ledger) as store:
        add(store, "alice", "hello")
        with pytest.raises(LedgerError, match="nothing was erased"):
            store.erase_session("alice")
        assert texts(store, "alice") == ["hello"]


def test_a_ledger_that_is_a_symlink_is_refused_saying_so(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    real.write_text("")
    (tmp_path / "link.jsonl").symlink_to(real)
    with open_store(tmp_path / "agent.cdl", tmp_path / "link.jsonl") as store:
        add(store, "alice", "hello")
        with pytest.raises(
            LedgerError, match=r"is a symbolic link .to .*real.jsonl.*point erasure_ledger at the real file"
        ) as refused:
            store.erase_session("alice")
        assert "writable" not in str(refused.value) and "nothing was erased" in str(refused.value)
        assert texts(store, "alice") == ["hello"] and real.read_text() == ""


def test_the_restore_command_replays_the_configured_ledger(
    backed_up: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    database, ledger, backup = backed_up
    for name in [name for name in os.environ if name.startswith("CITADEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CITADEL_PATH", str(database))
    monkeypatch.setenv("CITADEL_KEY", KEY)
    assert main(["restore", str(backup), "--replace"]) == 1
    assert "erasure_ledger is not set" in capsys.readouterr().err
    monkeypatch.setenv("CITADEL_ERASURE_LEDGER", str(ledger))
    assert main(["restore", str(backup), "--replace"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"restored {backup} to {database}: 2 sessions, verified"
    assert out[2:] == ["  alice  3 items", "  bob  1 item"]


def test_a_line_a_crash_cut_short_is_skipped_and_cut_off_by_the_next_erasure(
    backed_up: tuple[Path, Path, Path],
) -> None:
    """Each line is flushed before its erasure starts: a torn last line erased nothing."""
    database, ledger, backup = backed_up
    torn = ledger.read_bytes().splitlines(keepends=True)[1][:-40]
    with ledger.open("ab") as file:
        file.write(torn)
    with open_store(database, ledger) as store:
        assert store.verify().ok  # read: the torn line is not an entry
        store.erase_session("carol")
    lines = ledger.read_bytes().splitlines()
    assert [json.loads(line)["n"] for line in lines] == [1, 2, 3]  # the fragment is gone
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert report.erased == {"alice": 3, "bob": 1, "carol": 3}


def test_verify_reports_a_ledger_it_cannot_trust(backed_up: tuple[Path, Path, Path]) -> None:
    database, ledger, _ = backed_up
    ledger.write_bytes(ledger.read_bytes().replace(b'"n":1', b'"n":7'))
    with open_store(database, ledger) as store:
        verdict = store.verify()
    assert not verdict.ok
    assert any("line 1 of the erasure ledger" in finding for finding in verdict.findings), verdict.findings


OWNER = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    ledger = sys.argv[3] or None
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot", erasure_ledger=ledger)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def owner_with(
    database: Path, ledger: Path | None
) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    """Another process owning `database` with `ledger` (or none); killed at the end."""
    return owner_running(OWNER, database, "" if ledger is None else str(ledger))


def test_a_clients_ledger_must_be_the_owners_and_its_erasures_are_recorded_there(tmp_path: Path) -> None:
    """The owner records every erasure: a client naming another ledger (or none) would find its
    erasures missing from the one it named, so it is refused, or adopts the owner's."""
    database, ledger, backup = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl", tmp_path / "backup.cdl"
    with owner_with(database, None) as owner:
        with pytest.raises(ConfigurationError) as caught:
            open_store(database, ledger)
        assert f"erasure_ledger: this process has {str(ledger)!r}, the owner has none" in str(caught.value)
        assert f"process {owner.pid}" in str(caught.value)
    with owner_with(database, ledger) as owner:
        with pytest.raises(ConfigurationError, match=f"this process has none, the owner has {str(ledger)!r}"):
            open_store(database, None)
        with open_store(database, ledger) as client:
            assert client.served_by == owner.pid
            add(client, "alice", "alice 1", "alice 2")
            add(client, "bob", "bob 1")
            client.backup(backup)
            client.erase_session("alice")
        with CitadelSessionStore(database, KEY, adopt=["erasure_ledger"]) as adopter:
            assert adopter.adopted == {"erasure_ledger": str(ledger)}
            owner.kill()
            # killed: 0.034 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
            owner.wait(timeout=30)
            asyncio.run(adopter.session("bob").pop_item())  # the takeover keeps recording there
            assert adopter.served_by is None
    assert [json.loads(line)["op"] for line in ledger.read_bytes().splitlines()] == ["session", "items"]
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert report.erased == {"alice": 2, "bob": 1}


def test_two_writers_of_one_files_ledger_keep_one_chain(tmp_path: Path) -> None:
    """An owner appends from the head it wrote last, unless the ledger changed since: a process that
    takes the file back after another owner's erasures continues their chain, not its own."""
    from citadeldb_openai_agents.storage.ledger import ErasureLedger

    path = str(tmp_path / "erasures.jsonl")
    first, second = ErasureLedger(path, b"s" * 32), ErasureLedger(path, b"s" * 32)
    for n, writer in enumerate([first, first, second, second, first, second, first]):
        writer.record_items("h" * 32, [(n, 1_700_000_000_000_000 + n)])
    assert [entry.number for entry in ErasureLedger(path, b"s" * 32).entries()] == [1, 2, 3, 4, 5, 6, 7]


def test_a_ledger_path_under_home_is_expanded_as_every_process_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with open_store(tmp_path / "agent.cdl", Path("~/erasures.jsonl")) as store:
        add(store, "alice", "hello")
        store.erase_session("alice")
    assert [json.loads(line)["op"] for line in (tmp_path / "erasures.jsonl").read_bytes().splitlines()] == [
        "session"
    ]


def test_a_link_planted_where_a_restore_once_staged_changes_nothing(
    backed_up: tuple[Path, Path, Path],
) -> None:
    """Issue 59's retest: the copy was staged at PATH.restoring-PID, a name anyone could predict,
    and a link planted there ended the restore with a raw EEXIST. It is staged in a private
    directory now: the link is neither followed nor in the way."""
    database, ledger, backup = backed_up
    planted = Path(f"{database}.restoring-{os.getpid()}")
    elsewhere = database.parent / "elsewhere"
    planted.symlink_to(elsewhere)
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert report.erased == {"alice": 3, "bob": 1}
    assert not elsewhere.exists() and planted.is_symlink()
    assert not [name for name in os.listdir(database.parent) if name.startswith(".restoring-")]
