"""A person, not only a session (issue 44): a session's owner, given when it is made, recorded
encrypted; one person's sessions listed and erased with one receipt, an erasure that a SIGKILL
cannot leave half-done and that running again finishes; an owner that cannot be stored refused
with the place it came from. In one process, through an owner process, and on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, SQLiteSession
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from citadeldb_openai_agents import (
    CitadelSession,
    CitadelSessionStore,
    ImportSourceError,
    InvalidLabelsError,
    InvalidOwnerError,
    OwnerMismatchError,
    OwnerNotFoundError,
    SessionNotFoundError,
    export_all,
    export_sqlite,
    from_config,
    import_file,
    restore_backup,
)
from citadeldb_openai_agents.cli.main import main
from citadeldb_openai_agents.serving.operations import BEGIN_OWNER_ERASURE, CLAIM_OWNER, ProtocolError, batch

from conftest import KEY

MakeStore = Callable[..., CitadelSessionStore]


def said(*texts: str) -> list[Any]:
    return [{"role": "user", "content": text} for text in texts]


def write(store: CitadelSessionStore, session_id: str, *texts: str, owner: str | None = None) -> None:
    asyncio.run(store.session(session_id, owner=owner).add_items(said(*texts)))


def listed(store: CitadelSessionStore, **which: Any) -> list[tuple[str, str | None]]:
    return [(found.session_id, found.owner) for found in store.sessions(**which)]


def test_a_sessions_owner_is_recorded_and_lists_pick_one_person_or_nobody(make_store: MakeStore) -> None:
    store = make_store()
    write(store, "alice-phone", "hi", owner="alice")
    write(store, "alice-web", "hello", owner="alice")
    write(store, "bob-1", "hey", owner="bob")
    write(store, "anon", "who am I")
    assert listed(store) == [
        ("alice-phone", "alice"),
        ("alice-web", "alice"),
        ("anon", None),
        ("bob-1", "bob"),
    ]
    assert listed(store, owner="alice") == [("alice-phone", "alice"), ("alice-web", "alice")]
    assert listed(store, owned=False) == [("anon", None)]
    assert listed(store, owned=True) == [("alice-phone", "alice"), ("alice-web", "alice"), ("bob-1", "bob")]
    assert listed(store, owner="carol") == []
    store.close()
    with make_store() as again:  # the owner is in the file, not in this process
        assert listed(again, owner="bob") == [("bob-1", "bob")]


def test_the_owner_never_appears_in_plain_text_in_any_file(make_store: MakeStore, db_path: Path) -> None:
    owner, other = "zq-owner-7731@example.com", "xv-owner-4402@example.com"
    with make_store() as store:
        write(store, "s1", "some words", owner=owner)
        store.set_owner("s1", other)
        write(store, "s2", "more words", owner=owner)
    files = [path for path in db_path.parent.rglob("*") if path.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        for name in (owner, other):
            assert name.encode() not in data and name.encode("utf-16-le") not in data, path


def test_an_owner_given_to_a_session_that_has_none_is_recorded(make_store: MakeStore) -> None:
    store = make_store()
    write(store, "old", "written before owners")
    assert asyncio.run(store.session("old", owner="dana").get_items()) == said("written before owners")
    assert listed(store, owner="dana") == [("old", "dana")]


def test_another_owner_than_the_recorded_one_raises_before_anything_is_read_or_written(
    make_store: MakeStore,
) -> None:
    store = make_store()
    write(store, "s", "mine", owner="alice")
    intruder = store.session("s", owner="mallory")
    with pytest.raises(OwnerMismatchError, match="nothing was read or written") as refused:
        asyncio.run(intruder.get_items())
    assert "alice" not in str(refused.value)  # the recorded owner is not told to whoever guessed wrong
    with pytest.raises(OwnerMismatchError):
        asyncio.run(intruder.add_items(said("not mine")))
    with pytest.raises(OwnerMismatchError):
        asyncio.run(intruder.pop_item())
    with pytest.raises(OwnerMismatchError):
        asyncio.run(intruder.clear_session())
    assert asyncio.run(store.session("s").get_items()) == said("mine")
    assert listed(store) == [("s", "alice")]


def test_the_owner_stays_when_a_session_is_emptied_and_written_again(make_store: MakeStore) -> None:
    store = make_store()
    session = store.session("s", owner="alice")
    asyncio.run(session.add_items(said("one")))
    asyncio.run(session.pop_item())  # the last item: the session's record goes with it
    asyncio.run(session.add_items(said("two")))
    asyncio.run(session.clear_session())
    asyncio.run(session.add_items(said("three")))
    assert listed(store) == [("s", "alice")]


def test_changing_an_owner_is_explicit_and_checks_every_id_first(make_store: MakeStore) -> None:
    store = make_store()
    write(store, "a", "x", owner="alice")
    write(store, "b", "y")
    with pytest.raises(SessionNotFoundError, match="no owner was changed"):
        store.set_owner(["a", "b", "ghost"], "carol")
    assert listed(store) == [("a", "alice"), ("b", None)]
    assert store.set_owner(["a", "b", "a"], "carol") == ["a", "b"]
    assert store.set_owner("a", "carol") == []  # already hers
    assert listed(store) == [("a", "carol"), ("b", "carol")]
    # The old owner's handle now refuses: the change is the file's, not this object's.
    with pytest.raises(OwnerMismatchError):
        asyncio.run(store.session("a", owner="alice").get_items())


def test_erase_owner_erases_every_session_of_one_person_and_nothing_else(make_store: MakeStore) -> None:
    store = make_store()
    for number in range(3):
        write(store, f"alice-{number}", f"alice said {number}", f"and more {number}", owner="alice")
    write(store, "bob", "alice said 1", owner="bob")  # a near-duplicate of hers stays
    write(store, "nobody", "no owner")
    erased = store.erase_owner("alice")
    assert [session_id for session_id, _ in erased.sessions] == ["alice-0", "alice-1", "alice-2"]
    assert erased.items_erased == 6 and erased.readback_confirmed and not erased.already_complete
    assert all(receipt.items_erased == 2 and receipt.readback_confirmed for _, receipt in erased.sessions)
    assert "alice" not in repr(erased)
    assert listed(store) == [("bob", "bob"), ("nobody", None)]
    assert asyncio.run(store.session("alice-1").get_items()) == []
    assert asyncio.run(store.session("bob").get_items()) == said("alice said 1")
    assert asyncio.run(store.session("nobody").get_items()) == said("no owner")
    again = store.erase_owner("alice")  # complete: said so, not "not found"
    assert again.already_complete and again.sessions == []
    store.close()
    with make_store() as reopened:
        assert reopened.erase_owner("alice").already_complete


def ledger_lines(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()]


def test_each_sessions_receipt_names_the_ledger_entries_that_record_its_erasure(
    make_store: MakeStore, tmp_path: Path
) -> None:
    ledger = tmp_path / "erasures.ledger"
    store = make_store(erasure_ledger=ledger)
    write(store, "alice-0", "one", "two", owner="alice")
    write(store, "alice-1", "three", owner="alice")
    write(store, "bob", "four", owner="bob")
    asyncio.run(store.session("bob").pop_item())  # entry 1: bob's item, not alice's
    erased = store.erase_owner("alice")
    lines = ledger_lines(ledger)
    assert [(line["n"], line["op"]) for line in lines] == [(1, "items"), (2, "session"), (3, "session")]
    assert [(sid, receipt.ledger, receipt.ledger_entries) for sid, receipt in erased.sessions] == [
        ("alice-0", str(ledger), (2,)),
        ("alice-1", str(ledger), (3,)),
    ]
    # Each entry is the one a restore replays for that session: one session's entry, another's not.
    assert lines[1]["session"] != lines[2]["session"] != lines[0]["session"]
    with make_store(tmp_path / "plain.cdl") as plain:  # no ledger: the receipt says none
        write(plain, "s", "x", owner="carol")
        ((_, receipt),) = plain.erase_owner("carol").sessions
        assert (receipt.ledger, receipt.ledger_entries) == (None, ())


def test_an_owner_the_file_never_held_is_not_found_and_nothing_changes(make_store: MakeStore) -> None:
    store = make_store()
    write(store, "s", "kept", owner="alice")
    with pytest.raises(OwnerNotFoundError, match="nothing was erased"):
        store.erase_owner("Alice")  # owners are case-sensitive
    assert listed(store) == [("s", "alice")]


@pytest.mark.parametrize(
    ("owner", "says"),
    [
        ("", "cannot be empty"),
        ("  ", "cannot be empty"),
        ("é" * 129, "at most 256 bytes"),
        ("a\ud800", "surrogate"),
    ],
)
def test_an_owner_that_cannot_be_stored_is_refused_naming_where_it_came_from(
    make_store: MakeStore, db_path: Path, owner: str, says: str
) -> None:
    store = make_store()
    write(store, "s", "kept", owner="alice")
    calls: list[tuple[str, Callable[[], object]]] = [
        ("store.session's owner=", lambda: store.session("t", owner=owner)),
        ("CitadelSession's owner=", lambda: CitadelSession("t", store=store, owner=owner)),
        ("sessions' owner=", lambda: store.sessions(owner=owner)),
        ("set_owner's owner", lambda: store.set_owner("s", owner)),
        ("erase_owner's owner", lambda: store.erase_owner(owner)),
    ]
    for source, call in calls:
        with pytest.raises(InvalidOwnerError, match=says) as refused:
            call()
        assert str(refused.value).startswith(f"{source}: "), refused.value
    assert listed(store) == [("s", "alice")]
    assert asyncio.run(store.session("s").get_items()) == said("kept")


def test_an_owner_is_exactly_256_bytes_at_most(make_store: MakeStore) -> None:
    store = make_store()
    write(store, "s", "x", owner="é" * 128)  # 256 bytes
    assert listed(store, owner="é" * 128) == [("s", "é" * 128)]


def test_a_runner_turn_writes_under_the_owner_and_the_next_conversation_is_his_too(
    make_store: MakeStore,
) -> None:
    store = make_store()
    agent = Agent(
        name="assistant",
        model=ScriptedModel([[assistant_message("Noted.")], [assistant_message("Hello again.")]]),
    )
    first = store.session("conv-1", owner="user-42")
    asyncio.run(Runner.run(agent, "my locker code is 2210", session=first))
    second = store.session("conv-2", owner="user-42")
    asyncio.run(Runner.run(agent, "hello", session=second))
    assert listed(store, owner="user-42") == [("conv-1", "user-42"), ("conv-2", "user-42")]
    assert store.erase_owner("user-42").items_erased == 4
    assert store.sessions() == []


# -- through an owner process ----------------------------------------------------------------

SERVING = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    ledger = sys.argv[3] if len(sys.argv) > 3 else None
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot", erasure_ledger=ledger)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


@contextlib.contextmanager
def serving(db_path: Path, *ledger: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that owns `db_path` (and serves it, recording erasures in `ledger` if given) until the block ends."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVING, str(db_path), KEY, *map(str, ledger)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        yield server
    finally:
        server.kill()
        server.wait(timeout=30)


def test_every_owner_call_works_on_a_live_file_through_its_owner_process(db_path: Path) -> None:
    with serving(db_path) as server, CitadelSessionStore(db_path, KEY) as client:
        assert client.served_by == server.pid
        write(client, "a", "one", owner="alice")
        write(client, "b", "two", owner="bob")
        with pytest.raises(OwnerMismatchError):
            asyncio.run(client.session("a", owner="bob").get_items())
        assert listed(client, owner="alice") == [("a", "alice")]
        assert client.set_owner("b", "carol") == ["b"]
        erased = client.erase_owner("alice")
        assert [session_id for session_id, _ in erased.sessions] == ["a"] and erased.readback_confirmed
        assert listed(client) == [("b", "carol")]
        with pytest.raises(OwnerNotFoundError):
            client.erase_owner("nobody")


def test_a_served_erasure_names_the_owner_processs_ledger_entries(db_path: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "erasures.ledger"
    with (
        serving(db_path, ledger) as server,
        CitadelSessionStore(db_path, KEY, erasure_ledger=ledger) as client,
    ):
        assert client.served_by == server.pid
        write(client, "a", "one", owner="alice")
        write(client, "b", "two", owner="alice")
        erased = client.erase_owner("alice")
    assert [(sid, receipt.ledger_entries) for sid, receipt in erased.sessions] == [("a", (1,)), ("b", (2,))]
    assert [line["n"] for line in ledger_lines(ledger)] == [1, 2]


@pytest.mark.parametrize("owner", ["", "x" * 257, 7, None])
def test_a_wire_owner_that_the_store_would_refuse_is_a_protocol_error(owner: Any) -> None:
    wired = {"payloads": ["{}"], "texts": [""], "from_user": [False], "expires_at": None}
    wired |= {"max_items": None, "retention": None, "owner": owner, "labels": None}
    if owner is None:
        assert batch(wired).owner is None  # no owner is a valid batch, and claim
        assert CLAIM_OWNER.arguments(["s", owner, None]) == ("s", None, None)
        with pytest.raises(ProtocolError):
            BEGIN_OWNER_ERASURE.arguments([owner])
        return
    with pytest.raises(ProtocolError):
        batch(wired)
    with pytest.raises(ProtocolError):
        CLAIM_OWNER.arguments(["s", owner, None])
    with pytest.raises(ProtocolError):
        BEGIN_OWNER_ERASURE.arguments([owner])


@pytest.mark.parametrize(
    "labels", ["support", {"a": [1]}, {"": 1}, {str(n): n for n in range(17)}, {"a": "\ud800"}]
)
def test_wire_labels_that_the_store_would_refuse_are_a_protocol_error(labels: Any) -> None:
    wired = {"payloads": ["{}"], "texts": [""], "from_user": [False], "expires_at": None}
    wired |= {"max_items": None, "retention": None, "owner": None, "labels": labels}
    with pytest.raises(ProtocolError):
        batch(wired)
    with pytest.raises(ProtocolError):
        CLAIM_OWNER.arguments(["s", None, labels])


# -- a SIGKILL at any moment -----------------------------------------------------------------

ERASING = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot")
    store.erase_owner("alice", progress=lambda done, total: print(done, flush=True))
    print("finished", flush=True)
    """
)


@pytest.mark.parametrize("killed_after", [0, 1, 4])
def test_an_erasure_killed_leaves_each_session_whole_or_erased_and_a_rerun_finishes(
    make_store: MakeStore, db_path: Path, killed_after: int
) -> None:
    with make_store() as store:
        for number in range(8):
            write(store, f"alice-{number}", *(f"alice {number}.{i}" for i in range(5)), owner="alice")
        write(store, "bob", "bob's", owner="bob")
    eraser = subprocess.Popen(
        [sys.executable, "-c", ERASING, str(db_path), KEY], stdout=subprocess.PIPE, text=True
    )
    assert eraser.stdout is not None
    for _ in range(killed_after + 1):  # "0" once the erasure is noted, then one line a session
        assert eraser.stdout.readline().strip().isdigit()
    eraser.send_signal(signal.SIGKILL)
    eraser.wait(timeout=30)
    with make_store() as store:
        for number in range(8):
            held = asyncio.run(store.session(f"alice-{number}").get_items())
            assert held in ([], said(*(f"alice {number}.{i}" for i in range(5)))), held
        assert asyncio.run(store.session("bob").get_items()) == said("bob's")
        left = len(store.sessions(owner="alice"))
        assert left <= 8 - killed_after
        rerun = store.erase_owner("alice")
        assert len(rerun.sessions) == left and rerun.readback_confirmed
        assert store.sessions(owner="alice") == [] and listed(store) == [("bob", "bob")]
        assert store.erase_owner("alice").already_complete


# -- the operator's commands -----------------------------------------------------------------


@pytest.fixture
def configured(tmp_path: Path, clean_environment: None, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A configuration in the working directory, and a file with two people's sessions and one of nobody's."""
    (tmp_path / "citadel.toml").write_text(
        'path = "agent.cdl"\nargon2_profile = "iot"\nerasure_ledger = "erasures.ledger"\n', encoding="utf-8"
    )
    monkeypatch.setenv("CITADEL_KEY", KEY)
    ledger = tmp_path / "erasures.ledger"
    with CitadelSessionStore(
        tmp_path / "agent.cdl", KEY, argon2_profile="iot", erasure_ledger=ledger
    ) as store:
        write(store, "alice-phone", "one", "two", owner="alice")
        write(store, "alice-web", "three", owner="alice")
        write(store, "bob", "four", owner="bob")
        write(store, "anon", "five")
    return tmp_path / "agent.cdl"


def test_the_cli_lists_one_persons_sessions_or_nobodys(configured: Path, capsys: Any) -> None:
    assert main(["sessions", "--owner", "alice", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(row["session_id"], row["owner"], row["items"]) for row in shown] == [
        ("alice-phone", "alice", 2),
        ("alice-web", "alice", 1),
    ]
    assert main(["sessions", "--unowned"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SESSION", "ITEMS", "FIRST", "WRITE", "(UTC)", "LAST", "WRITE", "(UTC)"]
    assert lines[1].startswith("anon ") and lines[2] == f"1 session, 1 item in {configured}"
    assert main(["sessions"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].endswith("OWNER") and table[1].endswith("  alice") and table[3].endswith("  -")


def test_the_cli_erases_one_person_with_one_receipt_and_says_when_it_is_complete(
    configured: Path, capsys: Any
) -> None:
    assert main(["erase", "--owner", "alice", "--yes", "--json"]) == 0
    receipt = json.loads(capsys.readouterr().out)
    assert receipt["owner"] == "alice" and receipt["items_erased"] == 3 and receipt["readback_confirmed"]
    assert [s["session_id"] for s in receipt["sessions"]] == ["alice-phone", "alice-web"]
    assert all(s["readback_confirmed"] and s["algorithm"] for s in receipt["sessions"])
    ledger = str(configured.parent / "erasures.ledger")
    assert [(s["erasure_ledger"], s["ledger_entries"]) for s in receipt["sessions"]] == [
        (ledger, [1]),
        (ledger, [2]),
    ]
    assert main(["erase", "--owner", "bob", "--yes"]) == 0
    assert f"  erasure ledger:     #3 in {ledger}\n" in capsys.readouterr().out
    assert main(["erase", "--owner", "alice", "--yes"]) == 0
    assert (
        capsys.readouterr().out
        == f"the erasure of owner 'alice' is complete: {configured} holds none of their sessions\n"
    )
    assert main(["erase", "--owner", "zed", "--yes"]) == 1
    assert (
        "holds no session of this owner, and never erased one; nothing was erased" in capsys.readouterr().err
    )
    with CitadelSessionStore(configured, KEY) as store:
        assert listed(store) == [("anon", None)]


def test_the_cli_refuses_a_bad_owner_or_a_mixed_request_and_changes_nothing(
    configured: Path, capsys: Any
) -> None:
    for argv in (
        ["erase", "--owner", "", "--yes"],
        ["sessions", "--owner", "x" * 257],
        ["owner", "set", "anon", "--owner", " "],
    ):
        assert main(argv) == 1
        assert capsys.readouterr().err.startswith("error: --owner: "), argv
    with pytest.raises(SystemExit) as usage:
        main(["erase", "--owner", "bob", "anon", "--yes"])
    assert usage.value.code == 2
    with pytest.raises(SystemExit):
        main(["sessions", "--owner", "bob", "--unowned"])
    with CitadelSessionStore(configured, KEY) as store:
        assert len(store.sessions()) == 4


def test_the_cli_changes_an_owner_explicitly(configured: Path, capsys: Any) -> None:
    assert main(["owner", "set", "anon", "bob", "--owner", "bob"]) == 0
    assert capsys.readouterr().out == "recorded the owner of 1 session; 1 session already had it\n"
    assert main(["owner", "set", "ghost", "anon", "--owner", "carol"]) == 1
    assert "no owner was changed" in capsys.readouterr().err
    with CitadelSessionStore(configured, KEY) as store:
        assert listed(store, owner="bob") == [("anon", "bob"), ("bob", "bob")]


# -- owners travel with their sessions -------------------------------------------------------


def test_a_moved_session_keeps_its_owner_and_the_persons_erasure_finds_it_there(
    make_store: MakeStore, tmp_path: Path
) -> None:
    source, target = make_store(), make_store(tmp_path / "other.cdl")
    asyncio.run(source.session("a", owner="alice", labels={"agent": "support"}).add_items(said("one", "two")))
    write(source, "b", "three", owner="bob")
    moved = source.move_sessions(["a", "b"], target)
    assert target.summary("a").labels == {"agent": "support"}  # type: ignore[union-attr]
    assert [summary.session_id for summary in moved] == ["a", "b"]
    assert listed(target) == [("a", "alice"), ("b", "bob")] and listed(source) == []
    assert [session_id for session_id, _ in target.erase_owner("alice").sessions] == ["a"]


def test_an_sqlite_export_carries_owners_and_labels_and_an_import_records_them(
    make_store: MakeStore, tmp_path: Path
) -> None:
    source = make_store()
    asyncio.run(source.session("a", owner="alice", labels={"agent": "support"}).add_items(said("one", "two")))
    write(source, "b", "three", owner="bob")
    write(source, "anon", "four")
    export_sqlite(source, tmp_path / "out.db")
    # Still the SDK's own file: SQLiteSession reads it, and ignores the owners' table.
    assert asyncio.run(SQLiteSession("a", str(tmp_path / "out.db")).get_items()) == said("one", "two")
    with sqlite3.connect(tmp_path / "out.db") as db:
        assert db.execute("SELECT * FROM citadel_session_owners ORDER BY session_id").fetchall() == [
            ("a", "alice", '{"agent": "support"}'),
            ("b", "bob", None),
        ]
    with make_store(tmp_path / "target.cdl") as target:
        report = import_file(target, tmp_path / "out.db")
        assert [(s.session_id, s.owner) for s in report.sessions] == [
            ("a", "alice"),
            ("anon", None),
            ("b", "bob"),
        ]
        assert listed(target) == [("a", "alice"), ("anon", None), ("b", "bob")]
        assert target.summary("a").labels == {"agent": "support"}  # type: ignore[union-attr]
        assert [session_id for session_id, _ in target.erase_owner("alice").sessions] == ["a"]
        # Replaced, a session keeps its owner: every chunk of the import carries it.
        write(target, "b", "added since")
        import_file(target, tmp_path / "out.db", session_id="b", mode="replace")
        assert listed(target, owner="bob") == [("b", "bob")] and target.export("b") == said("three")


def test_an_import_records_the_owner_given_and_refuses_a_conflict_before_writing(
    make_store: MakeStore, tmp_path: Path
) -> None:
    sdk = SQLiteSession("p1", str(tmp_path / "sdk.db"))
    asyncio.run(sdk.add_items(said("mine")))
    asyncio.run(SQLiteSession("p2", str(tmp_path / "sdk.db")).add_items(said("also mine")))
    with make_store() as store:
        write(store, "p2", "older", owner="zoe")
        with pytest.raises(OwnerMismatchError, match=r"'p2'.*another owner"):
            import_file(store, tmp_path / "sdk.db", owner="carol", mode="append")
        assert listed(store) == [("p2", "zoe")] and store.export("p2") == said("older")  # nothing written
        report = import_file(store, tmp_path / "sdk.db", session_id="p1", owner="carol")
        assert [(s.session_id, s.owner) for s in report.sessions] == [("p1", "carol")]
        assert listed(store, owner="carol") == [("p1", "carol")]
        export_sqlite(store, tmp_path / "out.db", ["p1"])
        with pytest.raises(
            ImportSourceError, match="records another owner than the one given for session 'p1'"
        ):
            import_file(make_store(tmp_path / "t.cdl"), tmp_path / "out.db", owner="dan")


@pytest.mark.parametrize(
    ("owner", "labels", "why"),
    [
        ("", None, "cannot be empty"),
        ("x" * 257, None, "256 bytes"),
        ("ok", "[1]", "labels are a dict"),
        ("ok", "{", ""),
    ],
)
def test_an_owners_table_the_store_would_refuse_imports_nothing(
    make_store: MakeStore, tmp_path: Path, owner: str, labels: str | None, why: str
) -> None:
    with make_store() as source:
        write(source, "s", "hello", owner="alice")
        export_sqlite(source, tmp_path / "out.db")
    with sqlite3.connect(tmp_path / "out.db") as db:  # a hostile or damaged file
        db.execute("UPDATE citadel_session_owners SET owner = ?, labels = ?", (owner, labels))
    with make_store(tmp_path / "target.cdl") as target:
        with pytest.raises(
            ImportSourceError, match=f"citadel_session_owners, session 's'.*{why}.*nothing was imported"
        ):
            import_file(target, tmp_path / "out.db")
        assert target.sessions() == []


def test_the_cli_imports_with_an_owner_and_says_so(configured: Path, tmp_path: Path, capsys: Any) -> None:
    asyncio.run(SQLiteSession("old-1", str(tmp_path / "sdk.db")).add_items(said("from before")))
    assert main(["import", str(tmp_path / "sdk.db"), "--owner", "carol"]) == 0
    assert "  1 session with their owner recorded (1 owner)\n" in capsys.readouterr().out
    assert main(["import", str(tmp_path / "sdk.db"), "--owner", "", "--json"]) == 1
    assert "--owner: an owner cannot be empty" in capsys.readouterr().err
    assert main(["sessions", "--owner", "carol", "--json"]) == 0
    assert [row["session_id"] for row in json.loads(capsys.readouterr().out)] == ["old-1"]


def test_a_move_into_a_session_of_another_owner_is_refused_and_erases_nothing(
    make_store: MakeStore, tmp_path: Path
) -> None:
    source, target = make_store(), make_store(tmp_path / "other.cdl")
    write(source, "a", "one", owner="alice")
    write(target, "a", "one", owner="mallory")  # the same item under the same id, another person's
    with pytest.raises(OwnerMismatchError):
        source.move_sessions(["a"], target)
    assert listed(source) == [("a", "alice")] and listed(target) == [("a", "mallory")]


def test_a_restored_backup_keeps_owners_and_never_brings_an_erased_person_back(
    make_store: MakeStore, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    store = make_store(erasure_ledger=ledger)
    write(store, "a", "alice's", owner="alice")
    write(store, "b", "bob's", owner="bob")
    store.backup(tmp_path / "backup.cdl")
    store.erase_owner("alice")
    store.close()
    restore_backup(tmp_path / "backup.cdl", tmp_path / "restored.cdl", KEY, erasure_ledger=ledger)
    with make_store(tmp_path / "restored.cdl", erasure_ledger=ledger) as restored:
        assert listed(restored) == [("b", "bob")]
        assert asyncio.run(restored.session("a").get_items()) == []


# -- an access request -----------------------------------------------------------------------


def test_an_access_request_exports_every_session_of_one_person_and_nothing_of_another(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    write(store, "alice-phone", "alice's secret", "more of hers", owner="alice")
    write(store, "alice-web", "alice again", owner="alice")
    write(store, "bob", "bob's secret", owner="bob")
    summary = export_all(store, tmp_path / "request", owner="alice")
    assert summary.sessions == {"alice-phone": 2, "alice-web": 1}
    files = sorted((tmp_path / "request").iterdir())
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in files)
    assert not any(b"bob" in path.read_bytes() for path in files)
    index = json.loads((tmp_path / "request" / "index.json").read_text())
    assert [(entry["session_id"], entry["owner"], entry["items"]) for entry in index] == [
        ("alice-phone", "alice", 2),
        ("alice-web", "alice", 1),
    ]
    assert all(entry["first_write"] <= entry["last_write"] for entry in index)
    with pytest.raises(OwnerNotFoundError):
        export_all(store, tmp_path / "nobody", owner="carol")
    assert not (tmp_path / "nobody").exists()


def test_the_cli_answers_an_access_request_into_a_new_directory(configured: Path, capsys: Any) -> None:
    assert main(["export", "--owner", "alice", "--out", "request", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sessions"] == {"alice-phone": 2, "alice-web": 1}
    index = json.loads((configured.parent / "request" / "index.json").read_text())
    assert {entry["owner"] for entry in index} == {"alice"}
    assert main(["export", "--owner", "zed", "--out", "other"]) == 1
    assert not (configured.parent / "other").exists()
    for argv in (["export", "--owner", "alice"], ["export", "--owner", "alice", "bob", "--out", "x"]):
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 2
    assert not (configured.parent / "x").exists()


# -- labels ---------------------------------------------------------------------------------


def test_a_sessions_labels_are_recorded_listed_and_exported(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    support = store.session("s1", owner="alice", labels={"agent": "support", "tier": 2})
    asyncio.run(support.add_items(said("help")))
    write(store, "s2", "plain", owner="alice")
    assert [(s.session_id, s.labels) for s in store.sessions(owner="alice")] == [
        ("s1", {"agent": "support", "tier": 2}),
        ("s2", None),
    ]
    assert store.summary("s1").labels == {"agent": "support", "tier": 2}  # type: ignore[union-attr]
    asyncio.run(support.clear_session())
    asyncio.run(support.add_items(said("again")))  # emptied and written again: still labelled
    assert store.summary("s1").labels == {"agent": "support", "tier": 2}  # type: ignore[union-attr]
    relabelled = store.session("s1", labels={"agent": "sales"})
    asyncio.run(relabelled.get_items())
    assert store.summary("s1").labels == {"agent": "sales"}  # type: ignore[union-attr]
    export_all(store, tmp_path / "out", owner="alice")
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert [entry["labels"] for entry in index] == [{"agent": "sales"}, None]


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        ("support", "labels are a dict"),
        ({"a": [1]}, "holds a list"),
        ({"": 1}, "non-empty text"),
        ({str(n): n for n in range(17)}, "at most 16 labels"),
        ({"a": "x" * 3000}, "at most 2048 bytes"),
        ({"a": "\ud800"}, "lone surrogate"),
        ({"a": float("nan")}, "holds a float"),
    ],
)
def test_labels_that_cannot_be_stored_are_refused_naming_where_they_came_from(
    make_store: MakeStore, labels: Any, says: str
) -> None:
    store = make_store()
    with pytest.raises(InvalidLabelsError, match=says) as refused:
        store.session("s", labels=labels)
    assert str(refused.value).startswith("CitadelSession's labels=: ")
    assert store.sessions() == []


# -- files written before owners: owner_pattern ---------------------------------------------

PATTERN = "^(?P<owner>[^:]+):"


def test_new_sessions_follow_the_pattern_and_apply_pattern_records_it_for_older_ones(
    make_store: MakeStore,
) -> None:
    with make_store() as before:
        for session_id in ("u1:phone", "u1:web", "u2:web", "no-prefix"):
            write(before, session_id, "written before owners")
    store = make_store(owner_pattern=PATTERN)
    assert store.apply_owner_pattern(dry_run=True) == {"u1:phone": "u1", "u1:web": "u1", "u2:web": "u2"}
    assert listed(store, owned=True) == []  # a dry run changes nothing
    store.set_owner("u2:web", "someone-else")  # recorded explicitly: the pattern leaves it
    assert store.apply_owner_pattern() == {"u1:phone": "u1", "u1:web": "u1"}
    assert store.apply_owner_pattern() == {}
    write(store, "u3:new", "after")  # no owner given: the rule's
    write(store, "u4:new", "after", owner="explicit")  # given: the code's
    assert listed(store) == [
        ("no-prefix", None),
        ("u1:phone", "u1"),
        ("u1:web", "u1"),
        ("u2:web", "someone-else"),
        ("u3:new", "u3"),
        ("u4:new", "explicit"),
    ]


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("^(?P<owner>[^:]+", "not a regular expression"),
        ("^([^:]+):", "no group named owner"),
        (7, "must be a regular expression"),
    ],
)
def test_a_pattern_that_does_not_compile_or_has_no_owner_group_is_refused(
    make_store: MakeStore, pattern: Any, says: str
) -> None:
    with pytest.raises(InvalidOwnerError, match=says) as refused:
        make_store(owner_pattern=pattern)
    assert str(refused.value).startswith("owner_pattern ")
    with make_store() as store, pytest.raises(ValueError, match="no owner_pattern is set"):
        store.apply_owner_pattern()


def test_the_pattern_comes_from_the_configuration_and_a_bad_one_names_its_source(
    configured: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with CitadelSessionStore(configured, KEY) as store:
        write(store, "carol:1", "old")
    assert main(["owner", "apply-pattern"]) == 1  # none configured
    assert "no owner_pattern is configured" in capsys.readouterr().err
    monkeypatch.setenv("CITADEL_OWNER_PATTERN", "^([^:]+):")
    assert main(["owner", "apply-pattern", "--dry-run"]) == 1
    assert (
        "owner_pattern (from environment variable CITADEL_OWNER_PATTERN): the value '^([^:]+):' has no group named owner"
        in capsys.readouterr().err
    )
    monkeypatch.setenv("CITADEL_OWNER_PATTERN", PATTERN)
    assert main(["owner", "apply-pattern", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would record an owner for 1 session by owner_pattern in ")
    assert main(["owner", "apply-pattern", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == {"carol:1": "carol"}
    with from_config() as store:
        write(store, "dave:1", "new")
        assert listed(store, owner="dave") == [("dave:1", "dave")]


# -- search across one person's conversations ------------------------------------------------


def near_duplicates(store: CitadelSessionStore) -> None:
    """Two people whose conversations say almost the same things."""
    for person, code in (("alice", "2210"), ("bob", "2211")):
        write(store, f"{person}-gym", f"My locker code is {code}.", "Where is the sauna?", owner=person)
        write(store, f"{person}-travel", f"My flight to Oslo leaves at {code[:2]}:{code[2:]}.", owner=person)


def test_a_search_over_one_persons_sessions_names_each_hits_session_and_never_another_persons(
    make_store: MakeStore,
) -> None:
    store = make_store()
    near_duplicates(store)
    hits = store.search("locker code", owner="alice", limit=10)
    assert {hit.session_id for hit in hits} == {"alice-gym", "alice-travel"}
    assert (hits[0].session_id, hits[0].position, hits[0].text) == ("alice-gym", 1, "My locker code is 2210.")
    assert not any("2211" in hit.text or "22:11" in hit.text for hit in hits)
    assert [hit.session_id for hit in store.search("flight to Oslo", owner="bob", limit=1)] == ["bob-travel"]
    assert store.search("locker code", owner="carol") == []
    with pytest.raises(InvalidOwnerError, match=r"^search's owner=: "):
        store.search("locker", owner="")


def test_a_session_tool_widened_to_its_owner_recalls_an_earlier_conversation_and_nothing_of_another(
    make_store: MakeStore,
) -> None:
    store = make_store()
    near_duplicates(store)
    today = store.session("alice-today", owner="alice")
    tool = today.search_tool(across_owner=True)
    assert list(tool.params_json_schema["properties"]) == ["query"]  # no argument names an owner
    context = ToolContext(context=None, tool_name=tool.name, tool_call_id="call", tool_arguments="{}")
    output = str(asyncio.run(tool.on_invoke_tool(context, '{"query": "locker code"}')))
    assert "conversation 'alice-gym', #1, user: My locker code is 2210." in output
    assert "2211" not in output and "bob" not in output
    with pytest.raises(ValueError, match="was given none"):
        store.session("anon").search_tool(across_owner=True)


def test_an_agent_recalls_what_its_person_said_in_an_earlier_conversation(make_store: MakeStore) -> None:
    store = make_store()
    near_duplicates(store)

    def ask(call: Any) -> list[Any]:
        return [function_call("search_history", {"query": "locker code"}, call_id="call-search")]

    def answer(call: Any) -> list[Any]:
        outputs = [i for i in call.input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        found = re.search(r"locker code is (\d+)", str(outputs[-1]["output"]) if outputs else "")
        return [assistant_message(f"Your code is {found.group(1)}." if found else "I could not find it.")]

    for person, code in (("alice", "2210"), ("bob", "2211")):
        session = store.session(f"{person}-new", owner=person)
        model = ScriptedModel([ModelStep.respond(ask), ModelStep.respond(answer)])
        agent = Agent(name="assistant", model=model, tools=[session.search_tool(across_owner=True)])
        result = asyncio.run(Runner.run(agent, "What is my locker code?", session=session))
        assert result.final_output == f"Your code is {code}."


def test_a_persons_search_works_through_the_owner_process(db_path: Path) -> None:
    with serving(db_path) as server, CitadelSessionStore(db_path, KEY) as client:
        assert client.served_by == server.pid
        near_duplicates(client)
        hits = client.search("locker code", owner="bob", limit=3)
        assert hits[0].session_id == "bob-gym" and "2211" in hits[0].text
        assert all(hit.session_id.startswith("bob-") for hit in hits)


def test_the_cli_asks_before_erasing_a_person_and_erases_nothing_unconfirmed(
    configured: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # an answer, but no terminal to ask on
    assert main(["erase", "--owner", "alice"]) == 1
    assert (
        "not erasing without a confirmation: stdin is not a terminal; pass --yes" in capsys.readouterr().err
    )
    with CitadelSessionStore(configured, KEY) as store:
        assert len(store.sessions(owner="alice")) == 2


def test_the_pattern_reads_only_the_first_1024_characters_of_an_id(make_store: MakeStore) -> None:
    """Bounded before matching (issue 59: an unanchored pattern took 1.41 s on a 20,000-character
    id): what lies past the first 1,024 characters never makes an owner."""
    store = make_store(owner_pattern="(?P<owner>u[^:]{0,30}):")  # unanchored: tried at every position
    inside = "-" * 1000 + "u7:chat"
    past = "-" * 1024 + "u7:chat"
    write(store, inside, "hi")
    write(store, past, "hi")
    write(store, "x" * 20_000, "hi")  # no colon at all: the worst case for an unanchored search
    owners = dict(listed(store))
    assert owners[inside] == "u7"
    assert owners[past] is None and owners["x" * 20_000] is None
