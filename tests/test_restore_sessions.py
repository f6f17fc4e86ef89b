"""Some sessions back from a backup into the live file, every other left as it is (issue 45):
`restore_sessions` and `restore BACKUP --session ID... | --owner X [--replace]`, with the erasure
ledger replayed on the backup's copy so nothing erased since comes back, in one process and
through the live file's owner.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_owners import serving

from citadeldb_openai_agents import (
    CitadelSessionStore,
    ConfigurationError,
    LedgerError,
    SessionNotEmptyError,
    SessionNotFoundError,
    restore_sessions,
)
from citadeldb_openai_agents.cli.main import main

from conftest import KEY


def said(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text} for text in texts]


def write(store: CitadelSessionStore, session_id: str, *texts: str, owner: str | None = None) -> None:
    asyncio.run(store.session(session_id, owner=owner).add_items(said(*texts)))


def everything(store: CitadelSessionStore) -> dict[str, tuple[str | None, list[Any]]]:
    return {s.session_id: (s.owner, store.export(s.session_id)) for s in store.sessions()}


@pytest.fixture
def live(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A file (with its ledger) and a backup of it, then erasures and writes made after the backup."""
    database, ledger, backup = tmp_path / "agent.cdl", tmp_path / "erasures.ledger", tmp_path / "backup.cdl"
    with CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger) as store:
        write(store, "alice", "a1", "a2", owner="ann")
        write(store, "bob", "b1", "b2", "b3", owner="ben")
        write(store, "carol", "c1", owner="ann")
        store.backup(backup)
        store.erase_session("alice")  # erased since the backup: never comes back
        asyncio.run(store.session("bob").pop_item())  # b3 erased since the backup
        write(store, "bob", "b4")
        write(store, "carol", "c2")
        write(store, "dave", "d1", owner="ben")  # made after the backup
    return database, ledger, backup


def opened(database: Path, ledger: Path | None) -> CitadelSessionStore:
    return CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger)


def test_a_named_session_comes_back_without_what_was_erased_since_and_nothing_else_changes(
    live: tuple[Path, Path, Path],
) -> None:
    database, ledger, backup = live
    with opened(database, ledger) as store:
        before = everything(store)  # carol's "c2" was written by mistake: the backup's carol is wanted
        with pytest.raises(
            SessionNotEmptyError, match=r"sessions 'carol', 'bob' are in .* now: pass replace=True"
        ):
            restore_sessions(store, backup, KEY, session_ids=["carol", "bob"])
        assert everything(store) == before  # refused before anything was written
        report = restore_sessions(store, backup, KEY, session_ids=["carol", "bob", "alice"], replace=True)
        assert [moved.session_id for moved in report.restored] == ["carol", "bob"]
        assert report.skipped == {
            "alice": "erased after the backup was taken (the erasure ledger): it stays erased"
        }
        assert report.erased == {"alice": 2, "bob": 1} and report.ledger == str(ledger)
        assert list(report.replaced) == ["carol", "bob"] and report.replaced["bob"].readback_confirmed
        after = everything(store)
        assert after["carol"] == ("ann", said("c1"))  # as the backup held it, with its owner
        assert after["bob"] == ("ben", said("b1", "b2"))  # the pop made since stays made
        assert "alice" not in after
        assert after["dave"] == before["dave"]  # every other session as it was


def test_a_persons_sessions_come_back_and_an_unknown_session_restores_nothing(
    live: tuple[Path, Path, Path],
) -> None:
    database, ledger, backup = live
    with opened(database, ledger) as store:
        store.erase_session("carol")
        before = everything(store)
        with pytest.raises(SessionNotFoundError, match="holds no session 'nobody'; nothing was restored"):
            restore_sessions(store, backup, KEY, session_ids=["bob", "nobody"], replace=True)
        with pytest.raises(SessionNotFoundError, match="no session of this owner"):
            restore_sessions(store, backup, KEY, owner="ann")  # alice and carol: both erased since
        assert everything(store) == before
        report = restore_sessions(store, backup, KEY, owner="ben", replace=True)
        assert [moved.session_id for moved in report.restored] == ["bob"]  # dave is not in the backup
        assert everything(store)["dave"] == before["dave"]
        with pytest.raises(ValueError, match="session_ids or owner"):
            restore_sessions(store, backup, KEY)


def test_without_a_ledger_it_is_refused_unless_asked_to_take_the_backup_as_it_is(
    live: tuple[Path, Path, Path],
) -> None:
    database, _, backup = live
    with opened(database, None) as store:
        with pytest.raises(ConfigurationError, match="keeps no erasure ledger"):
            restore_sessions(store, backup, KEY, session_ids=["alice"])
        assert "alice" not in everything(store)
        report = restore_sessions(store, backup, KEY, session_ids=["alice"], without_ledger=True)
        assert report.ledger is None and everything(store)["alice"] == ("ann", said("a1", "a2"))


def test_sessions_come_back_into_a_served_file_through_its_owner(live: tuple[Path, Path, Path]) -> None:
    database, ledger, backup = live
    with serving(database, ledger) as server, opened(database, ledger) as client:
        assert client.served_by == server.pid
        report = restore_sessions(client, backup, KEY, session_ids=["bob", "alice"], replace=True)
        assert [moved.session_id for moved in report.restored] == ["bob"] and list(report.skipped) == [
            "alice"
        ]
        assert everything(client)["bob"] == ("ben", said("b1", "b2"))
        client.erase_session("bob")  # an erasure through the owner is in the ledger: bob stays erased
        again = restore_sessions(client, backup, KEY, session_ids=["bob"])
        assert again.restored == [] and list(again.skipped) == ["bob"] and "bob" not in everything(client)


def test_the_cli_restores_named_sessions_and_says_which_stay_erased(
    live: tuple[Path, Path, Path], clean_environment: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    database, ledger, backup = live
    monkeypatch.chdir(database.parent)
    monkeypatch.setenv("CITADEL_KEY", KEY)
    Path("citadel.toml").write_text(f'path = "{database}"\nerasure_ledger = "{ledger}"\n')
    assert main(["restore", str(backup), "--session", "bob", "--session", "alice"]) == 1
    assert "'bob' is in" in capsys.readouterr().err
    assert main(["restore", str(backup), "--owner", "ben", "--replace", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [moved["session_id"] for moved in shown["restored"]] == ["bob"] and list(shown["replaced"]) == [
        "bob"
    ]
    assert shown["erased"] == {"bob": 1} and shown["replaced"]["bob"]["readback_confirmed"]
    assert main(["restore", str(backup), "--session", "carol", "--session", "alice", "--replace"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == f"restored 1 session, 1 item from {backup} into {database}; every other session is as it was"
    )
    assert out[1:4] == [
        "  carol: 1 item",
        "  skipped alice: erased after the backup was taken (the erasure ledger): it stays erased",
        "replaced the live session carol:",
    ]
    # bob's replacement was an erasure too: the backup's bob no longer comes back.
    assert main(["restore", str(backup), "--session", "bob"]) == 0
    assert "  skipped bob: erased after the backup was taken" in capsys.readouterr().out
    with pytest.raises(SystemExit) as mixed:
        main(["restore", str(backup), "--owner", "ben", "--session", "bob"])
    assert mixed.value.code == 2 and "--session IDs or --owner, not both" in capsys.readouterr().err
    assert main(["restore", str(backup), "--owner", ""]) == 1
    assert "--owner: an owner cannot be empty" in capsys.readouterr().err


def test_a_ledger_cut_short_of_the_live_files_head_restores_nothing(live: tuple[Path, Path, Path]) -> None:
    """The backup's copy recorded no erasure: only the live file's head, asked of its owner, shows
    that the ledger was emptied; without it, alice (erased since the backup) would come back."""
    database, ledger, backup = live
    ledger.write_bytes(b"")
    with serving(database, ledger), opened(database, ledger) as client:
        assert client.erasure_ledger_head is not None and client.erasure_ledger_head[0] == 2
        before = everything(client)
        with pytest.raises(LedgerError, match=r"ends at entry 0 .* but the file recorded entry 2"):
            restore_sessions(client, backup, KEY, session_ids=["alice"])
        assert everything(client) == before and "alice" not in before
