"""A file put back from an older copy is not served: its ledger holds erasures it lacks (issue 59).

The retest's attack, with the same user's access and no passphrase: copy the file's five parts,
let two erasures happen, copy the parts back, leaving the ledger whole. Before the fix the store
opened the file with no word, served the erased sessions, and appended the next erasure as entry 3.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, LedgerError, repair_file
from citadeldb_openai_agents.cli.main import main
from citadeldb_openai_agents.storage.files import database_files

from conftest import KEY


def open_store(database: Path, ledger: Path) -> CitadelSessionStore:
    return CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger)


def add(store: CitadelSessionStore, session_id: str, *contents: str) -> None:
    asyncio.run(store.session(session_id).add_items([{"role": "user", "content": c} for c in contents]))


def parts(database: Path) -> dict[str, str]:
    """Each of the file's parts, by name, with its digest (the audit log aside: an open appends)."""
    return {
        Path(name).name: hashlib.sha256(Path(name).read_bytes()).hexdigest()
        for name in database_files(str(database))
        if Path(name).exists() and not name.endswith("-audit")
    }


def rolled_back(tmp_path: Path, erasures: int = 2) -> tuple[Path, Path]:
    """alice, bob and carol written; the parts copied; `erasures` of them erased; the parts put back."""
    database, ledger, saved = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl", tmp_path / "saved"
    saved.mkdir()
    with open_store(database, ledger) as store:
        for session_id in ("alice", "bob", "carol"):
            add(store, session_id, f"{session_id} 1", f"{session_id} 2")
    for name in database_files(str(database)):
        shutil.copy2(name, saved)
    with open_store(database, ledger) as store:
        for session_id in ("alice", "bob")[:erasures]:
            store.erase_session(session_id)
    for name in saved.iterdir():
        shutil.copy2(name, database.parent / name.name)  # the attacker puts the older parts back
    return database, ledger


def test_a_rolled_back_file_is_refused_at_open_naming_the_erasures_it_lacks(tmp_path: Path) -> None:
    database, ledger = rolled_back(tmp_path)
    before, ledger_before = parts(database), ledger.read_bytes()
    with pytest.raises(LedgerError) as refused:
        open_store(database, ledger)
    message = str(refused.value)
    assert f"{database} is older than its erasure ledger" in message
    assert "erasures 1 to 2" in message and "records none of them" in message
    assert "repair --yes" in message and KEY not in message
    assert parts(database) == before and ledger.read_bytes() == ledger_before, "nothing may change"


def test_the_crash_window_one_entry_ahead_still_opens(tmp_path: Path) -> None:
    """One entry ahead is what a crash after the ledger's line leaves: not a rollback."""
    database, ledger = rolled_back(tmp_path, erasures=1)
    with open_store(database, ledger) as store:
        assert store.session_ids() == ["alice", "bob", "carol"]  # the one erasure: verify names it


def test_an_erasure_is_refused_on_a_file_older_than_its_ledger(tmp_path: Path) -> None:
    """The ledger hidden while the file is opened, then put back: the next erasure is refused
    rather than appended as entry 3."""
    database, ledger = rolled_back(tmp_path)
    hidden = ledger.rename(tmp_path / "hidden.jsonl")
    with open_store(database, ledger) as store:
        hidden.rename(ledger)
        with pytest.raises(LedgerError, match="is older than its erasure ledger"):
            store.erase_session("carol")
        assert asyncio.run(store.session("carol").get_items()) != []
    assert len(ledger.read_bytes().splitlines()) == 2


def test_repair_erases_again_what_a_rolled_back_file_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    database, ledger = rolled_back(tmp_path)
    report = repair_file(database, KEY, erasure_ledger=ledger)
    assert report.repaired and report.lost == [] and report.aside is None
    assert (report.replayed, report.items_erased) == (2, 4)
    assert not list(tmp_path.glob("agent.cdl.damaged-*")), "no copy of the erased sessions is kept"
    with open_store(database, ledger) as store:
        assert store.session_ids() == ["carol"]
        assert store.verify().ok
        store.erase_session("carol")
    assert len(ledger.read_bytes().splitlines()) == 3
    # The command, on a file rolled back again.
    (tmp_path / "again").mkdir()
    database2, ledger2 = rolled_back(tmp_path / "again")
    for name, value in {
        "CITADEL_PATH": database2,
        "CITADEL_KEY": KEY,
        "CITADEL_ERASURE_LEDGER": ledger2,
    }.items():
        monkeypatch.setenv(name, str(value))
    assert main(["repair", "--yes"]) == 0
    assert capsys.readouterr().out == (
        f"repaired {database2}: it lacked 2 erasures of its erasure ledger (its parts were put back "
        "from an older copy); erased again: 4 items; verified\n"
    )
    with open_store(database2, ledger2) as store:
        assert store.session_ids() == ["carol"]


def test_crash_after_crash_never_adds_up_to_a_rollback(tmp_path: Path) -> None:
    """Each crash after a ledger line leaves the file one entry behind; the open that follows
    takes that entry as the file's head, so the next crash leaves it one behind again, not two."""
    database, ledger, saved = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl", tmp_path / "saved"
    with open_store(database, ledger) as store:
        for session_id in ("alice", "bob", "carol"):
            add(store, session_id, f"{session_id} 1")
    for session_id in ("alice", "bob"):
        saved.mkdir()
        for name in database_files(str(database)):
            shutil.copy2(name, saved)
        with open_store(database, ledger) as store:
            store.erase_session(session_id)  # its line, then (as if it crashed here) ...
        for name in saved.iterdir():
            shutil.copy2(name, database.parent / name.name)  # ... the file as it was before
        shutil.rmtree(saved)
        with open_store(database, ledger) as store:  # one behind: served, and the entry taken
            assert store.erasure_ledger_head is not None
    assert len(ledger.read_bytes().splitlines()) == 2
