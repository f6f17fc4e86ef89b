"""AdvancedSQLiteSession's branches, turns and usage on CitadelSession (issue 29).

One script runs against the SDK's own AdvancedSQLiteSession and against ours, in this
process and through another process that owns the file, and every answer is compared
(times aside: the SDK's come from SQLite's clock, ours from Citadel's). Then what the SDK
cannot show: a deleted branch's keys are destroyed, usage is encrypted, compaction and
search keep to the current branch, and everything survives a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, Runner
from agents.extensions.memory.advanced_sqlite_session import AdvancedSQLiteSession
from agents.testing import ScriptedModel, assistant_message
from agents.usage import Usage
from test_compaction import SDK_HAS_THE_HOOK
from test_erasure import memory_of, stored_ids, verdicts_after_recreating
from test_serving import owner_running

from citadeldb_openai_agents import (
    BranchError,
    CitadelSessionStore,
    MoveConflictError,
    export_all,
    export_sqlite,
    import_file,
    restore_backup,
)
from citadeldb_openai_agents.serving import operations as ops
from citadeldb_openai_agents.storage.memory_handle import MemoryHandle

from conftest import KEY


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "type": "message"}


def call(number: str, name: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": number, "name": name, "arguments": "{}"}


def output(number: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": number, "output": "ok"}


def run_result(requests: int, tokens_in: int, tokens_out: int) -> Any:
    """What `store_run_usage` reads of a `RunResult`: its context's usage."""
    usage = Usage(
        requests=requests,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        total_tokens=tokens_in + tokens_out,
    )
    return SimpleNamespace(context_wrapper=SimpleNamespace(usage=usage))


async def answers(session: Any) -> list[tuple[str, Any]]:
    """Every answer the script gets, times left out (SQLite's clock against Citadel's)."""
    log: list[tuple[str, Any]] = []

    async def attempt(label: str, step: Any, *, result: bool = True) -> None:
        """The step's result (or only that it succeeded), or its error."""
        try:
            done = await step
            log.append((label, done if result else "done"))
        except ValueError as exc:  # the SDK's errors are ValueErrors, ours BranchError (one too)
            log.append((label, f"ValueError: {exc}"))

    def turns(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(t["turn"], t["content"], t["full_content"], t["can_branch"]) for t in found]

    async def branches() -> list[tuple[Any, ...]]:
        listed = await session.list_branches()
        return sorted((b["branch_id"], b["message_count"], b["user_turns"], b["is_current"]) for b in listed)

    await session.add_items([user("hello there"), answer("hi")])
    await session.store_run_usage(run_result(1, 10, 5))
    await session.add_items(
        [user("what is the weather " + "x" * 120), call("c1", "weather"), output("c1"), answer("sunny")]
    )
    await session.store_run_usage(run_result(2, 20, 7))
    await session.store_run_usage(run_result(3, 30, 9))  # the same turn's again: replaces it
    await session.add_items([user("and tomorrow?"), call("c2", "weather"), output("c2"), call("c3", "news")])
    await session.add_items([output("c3"), answer("rain")])
    await session.store_run_usage(run_result(1, 5, 5))
    log.append(("turns", turns(await session.get_conversation_turns())))
    log.append(("by turns", await session.get_conversation_by_turns()))
    log.append(("tools", sorted(await session.get_tool_usage(), key=lambda row: (row[2], row[0]))))
    log.append(("found", turns(await session.find_turns_by_content("WEATHER"))))
    log.append(("usage", await session.get_session_usage()))
    log.append(("turn 2", await session.get_turn_usage(2)))
    log.append(("turn 9", await session.get_turn_usage(9)))
    log.append(("every turn", await session.get_turn_usage()))
    await attempt("branch", session.create_branch_from_turn(2, "alt"))
    log.append(("on alt", await session.get_items()))
    await session.add_items([user("what about snow"), answer("no snow")])
    await session.store_run_usage(run_result(4, 40, 4))
    log.append(("alt", await session.get_items()))
    log.append(("alt newest", await session.get_items(1)))
    log.append(("main", await session.get_items(branch_id="main")))
    log.append(("branches", await branches()))
    log.append(("alt usage", await session.get_turn_usage()))
    log.append(("main usage", await session.get_turn_usage(branch_id="main")))
    log.append(("all usage", await session.get_session_usage()))
    log.append(("alt's usage", await session.get_session_usage("alt")))
    await attempt("name used", session.create_branch_from_turn(1, "alt"))
    await attempt("no such turn", session.create_branch_from_turn(7, "other"))
    await attempt("by content", session.create_branch_from_content("snow", "snowy"))
    log.append(("snowy", await session.get_items()))
    await attempt("no content", session.create_branch_from_content("hail"))
    await attempt(
        "current", session.delete_branch("snowy"), result=False
    )  # ours returns a receipt, the SDK None
    await attempt("main", session.delete_branch("main"), result=False)  # ours returns a receipt, the SDK None
    await attempt("empty", session.delete_branch(""), result=False)  # ours returns a receipt, the SDK None
    await attempt("switch", session.switch_to_branch("alt"))
    log.append(("pops", [await session.pop_item(), await session.pop_item()]))  # turn 2 of alt empties
    log.append(("alt usage after", await session.get_turn_usage()))
    await attempt(
        "delete", session.delete_branch("snowy"), result=False
    )  # ours returns a receipt, the SDK None
    await attempt(
        "delete again", session.delete_branch("snowy"), result=False
    )  # ours returns a receipt, the SDK None
    await attempt("switch to deleted", session.switch_to_branch("snowy"))
    await attempt("name of a deleted branch", session.create_branch_from_turn(1, "snowy"))
    log.append(("branches after", await branches()))
    await attempt(
        "force", session.delete_branch("alt", force=True), result=False
    )  # ours returns a receipt, the SDK None
    log.append(("after force", await session.get_items(1)))
    await attempt("a branch to clear", session.create_branch_from_turn(2, "last"))
    await session.add_items([user("cleared with the rest"), answer("gone")])
    await session.clear_session()
    log.append(
        (
            "cleared",
            (await session.get_items(), await session.list_branches(), await session.get_session_usage()),
        )
    )
    return log


async def test_the_branch_turn_and_usage_api_answers_as_advanced_sqlite_session_does(
    tmp_path: Path, make_store: Any
) -> None:
    theirs = await answers(
        AdvancedSQLiteSession(session_id="s", db_path=str(tmp_path / "sdk.db"), create_tables=True)
    )
    ours = await answers(make_store().session("s"))
    assert [label for label, _ in ours] == [label for label, _ in theirs]
    for (label, mine), (_, sdk) in zip(ours, theirs, strict=True):
        assert mine == sdk, label


async def newer_answers(session: Any) -> list[Any]:
    """Where openai-agents changed its answers (0.24 against 0.21): we give 0.24's."""
    found: list[Any] = []
    await session.store_run_usage(run_result(1, 1, 1))  # no turn yet: 0.24 stores nothing
    found.append(await session.get_session_usage())
    await session.add_items([user("one"), answer("1")])
    try:
        await session.create_branch_from_turn(1, "  ")
    except ValueError as exc:
        found.append(str(exc))
    return found


async def test_where_the_sdk_changed_its_answers_ours_are_its_newest(tmp_path: Path, make_store: Any) -> None:
    ours = await newer_answers(make_store().session("s"))
    assert ours == [None, "Branch name cannot be empty"]
    release = tuple(int(part) for part in importlib.metadata.version("openai-agents").split(".")[:2])
    if release >= (0, 24):
        sdk = AdvancedSQLiteSession(session_id="s", db_path=str(tmp_path / "sdk.db"), create_tables=True)
        assert await newer_answers(sdk) == ours


OWNER = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot")
    print("ready", flush=True)
    sys.stdin.read()
    """
)


async def test_a_client_gets_the_same_answers_through_the_owner(tmp_path: Path, db_path: Path) -> None:
    theirs = await answers(
        AdvancedSQLiteSession(session_id="s", db_path=str(tmp_path / "sdk.db"), create_tables=True)
    )
    with owner_running(OWNER, db_path) as owner, CitadelSessionStore(db_path, KEY) as client:
        assert client.served_by == owner.pid
        ours = await answers(client.session("s"))
    assert ours == theirs


async def test_deleting_a_branch_destroys_its_items_keys_and_returns_a_receipt(make_store: Any) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items([user("one"), answer("1"), user("two"), answer("2")])
    await session.create_branch_from_turn(2, "alt")
    await session.add_items([user("a secret on the branch"), answer("kept there")])
    branch = stored_ids(store, ("s", "alt"))
    main = stored_ids(store, "s")
    await session.switch_to_branch("main")
    receipt = await session.delete_branch("alt")
    assert (receipt.items_erased, receipt.readback_confirmed) == (4, True)
    assert verdicts_after_recreating(store, branch) == {"missing"}, "erased, not hidden"
    assert stored_ids(store, "s") == main
    assert [b["branch_id"] for b in await session.list_branches()] == ["main"]


async def test_a_sessions_erasure_takes_every_branch_with_it(make_store: Any) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items([user("one"), answer("1"), user("two"), answer("2")])
    await session.create_branch_from_turn(2, "alt")
    await session.add_items([user("three"), answer("3")])
    held = {**stored_ids(store, "s"), **stored_ids(store, ("s", "alt"))}
    assert [(s.session_id, s.items) for s in store.sessions()] == [("s", 8)]
    receipt = store.erase_session("s")
    assert (receipt.items_erased, receipt.readback_confirmed) == (8, True)
    assert verdicts_after_recreating(store, held) == {"missing"}
    assert store.sessions() == [] and await session.list_branches() == []


async def test_clearing_a_session_destroys_every_branchs_keys(make_store: Any) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items([user("one"), answer("1"), user("two"), answer("2")])
    await session.create_branch_from_turn(2, "alt")
    await session.add_items([user("on the branch"), answer("also")])
    held = {**stored_ids(store, "s"), **stored_ids(store, ("s", "alt"))}
    await session.clear_session()
    assert session.current_branch == "main"
    assert await session.get_items(branch_id="alt") == [] and await session.list_branches() == []
    assert verdicts_after_recreating(store, held) == {"missing"}


def usage_atoms(store: CitadelSessionStore, session_id: str) -> dict[str, list[int]]:
    """The usage atoms Citadel holds for the session, by segment."""
    layout, memory = store._file._local._layout, memory_of(store)
    regions = layout.segment_regions(layout.state(session_id))
    return {region: [hit.id for hit in memory.fetch(region, "usage", limit=100)] for region in regions}


async def test_usage_is_encrypted_and_goes_with_its_turn(make_store: Any, db_path: Path) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items([answer("welcome"), user("one"), answer("1")])
    await session.store_run_usage(run_result(7, 912_345_678, 87_654_321))
    store.close()
    on_disk = b"".join(
        path.read_bytes() for path in db_path.parent.iterdir() if path.name.startswith(db_path.name)
    )
    assert b"912345678" not in on_disk and b"87654321" not in on_disk
    reopened = make_store()
    session = reopened.session("s")
    assert (await session.get_turn_usage(1))["input_tokens"] == 912_345_678
    spent = usage_atoms(reopened, "s")
    assert sum(map(len, spent.values())) == 1
    for _ in range(2):  # turn 1's answer, then its user message: the turn's usage goes with it
        await session.pop_item()
    assert await session.get_session_usage() is None
    assert await session.get_items() == [answer("welcome")]
    assert verdicts_after_recreating(reopened, spent) == {"missing"}, "its key destroyed, not hidden"


@pytest.mark.parametrize("erasure", ["the max_items cap", "a compaction replacing every item"])
async def test_a_turn_erased_by_a_cap_or_a_compaction_takes_its_usage_with_it(
    make_store: Any, erasure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only a pop: whatever erases the user message that began a turn erases the turn's
    usage in the same forget (keys destroyed), as the SDK deletes its usage rows with its items,
    and the record announces it first (a crash mid-forget is then not damage)."""
    store = make_store()
    unannounced: list[int] = []

    def forget(handle: MemoryHandle, region: str, ids: list[int]) -> Any:
        announced = set(store._file._local._layout.state("s").record.erasing)
        usage_ids = {atom for atoms in usage_atoms(store, "s").values() for atom in atoms}
        unannounced.extend(atom for atom in ids if atom in usage_ids and atom not in announced)
        return handle.__getattr__("forget")(region, ids)  # Citadel's own

    session = store.session("s", max_items=4) if erasure == "the max_items cap" else store.session("s")
    await session.add_items([user("one"), answer("1")])
    await session.store_run_usage(run_result(1, 10, 5))
    first = usage_atoms(store, "s")
    await session.add_items([user("two"), answer("2")])
    await session.store_run_usage(run_result(1, 20, 7))
    both = usage_atoms(store, "s")
    assert sum(map(len, both.values())) == 2
    monkeypatch.setattr(MemoryHandle, "forget", forget, raising=False)
    if erasure == "the max_items cap":
        await session.add_items([user("three"), answer("3")])  # turn 1's two items go
        assert await session.get_items() == [user("two"), answer("2"), user("three"), answer("3")]
        turns = await session.get_turn_usage()
        assert [(row["user_turn_number"], row["input_tokens"]) for row in turns] == [(1, 20)]
        erased, kept = first, 1
    else:
        assert await session._atomic_replace_items([user("summary"), answer("compacted")])
        assert await session.get_session_usage() is None
        erased, kept = both, 0
    monkeypatch.undo()
    assert not unannounced, "a usage atom forgotten before the record announced it"
    assert sum(map(len, usage_atoms(store, "s").values())) == kept
    assert verdicts_after_recreating(store, erased) == {"missing"}, "its key destroyed, not left behind"


async def test_branches_names_and_usage_outlive_a_restart(make_store: Any) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items([user("one"), answer("1"), user("two"), answer("2")])
    await session.create_branch_from_turn(2, "alt")
    await session.add_items([user("three"), answer("3")])
    await session.store_run_usage(run_result(1, 2, 3))
    await session.delete_branch("alt", force=True)
    await session.create_branch_from_turn(1, "kept")
    store.close()
    reopened = make_store().session("s")
    assert sorted(b["branch_id"] for b in await reopened.list_branches()) == ["main"]  # "kept" holds no item
    with pytest.raises(BranchError, match="'alt' has already been used"):
        await reopened.create_branch_from_turn(2, "alt")
    await reopened.create_branch_from_turn(2, "later")
    assert await reopened.get_items() == [user("one"), answer("1")]
    assert reopened.current_branch == "later"


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this openai-agents has no compaction snapshot hook")
async def test_compaction_and_search_keep_to_the_current_branch(make_store: Any) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items([user("the main line about apples"), answer("apples noted")])
    await session.add_items([user("second"), answer("2")])
    await session.create_branch_from_turn(2, "alt")
    await session.add_items([user("the branch talks about pears"), answer("pears noted")])
    found = [item["content"] for item in await session.search("pears", limit=2)]
    assert sorted(found) == ["pears noted", "the branch talks about pears"]
    snapshot = await session._get_compaction_snapshot(4)
    assert await snapshot.replace_suffix(0, [answer("a summary of the branch")])
    assert await session.get_items() == [answer("a summary of the branch")]
    assert await session.get_items(branch_id="main") == [
        user("the main line about apples"),
        answer("apples noted"),
        user("second"),
        answer("2"),
    ]
    await session.switch_to_branch("main")
    assert "pears" not in json.dumps(await session.search("pears", limit=5))


async def branched(store: CitadelSessionStore) -> Any:
    """Session "s" with MAIN (4 items), branch "alt" (2 copied, 2 its own) and a turn's usage on each."""
    session = store.session("s")
    await session.add_items([user("one"), answer("1"), user("two"), answer("2")])
    await session.store_run_usage(run_result(1, 10, 5))
    await session.create_branch_from_turn(2, "alt")
    await session.add_items([user("said on the branch"), answer("there")])
    await session.store_run_usage(run_result(2, 30, 7))
    await session.switch_to_branch("main")
    return session


async def whole(session: Any) -> tuple[Any, ...]:
    """Everything a user reads of a branched session, times aside."""
    names = [b["branch_id"] for b in await session.list_branches()]
    items = {name: await session.get_items(branch_id=name) for name in names}
    usage = {name: await session.get_session_usage(branch_id=name) for name in names}
    return names, items, usage, await session.get_turn_usage(branch_id="alt")


async def test_a_move_carries_every_branch_and_its_usage_and_erases_them_all_at_the_source(
    make_store: Any, tmp_path: Path
) -> None:
    store, other = make_store(), make_store(tmp_path / "other.cdl")
    session = await branched(store)
    await session.create_branch_from_turn(2, "deleted")
    await session.switch_to_branch("main")
    await session.delete_branch("deleted")  # its name stays used, and moves with the session
    before = await whole(session)
    erased = {branch: stored_ids(store, key) for branch, key in (("main", "s"), ("alt", ("s", "alt")))}
    done: list[tuple[int, int]] = []
    summary = store.move_session("s", other, progress=lambda n, total: done.append((n, total)))
    assert (summary.items, summary.copied, summary.erasure and summary.erasure.items_erased) == (8, 8, 8)
    assert done[-1] == (8, 8)
    assert await whole(other.session("s")) == before
    assert store.session_ids() == [] and await store.session("s").list_branches() == []
    for ids in erased.values():
        assert verdicts_after_recreating(store, ids) == {"missing"}
    for name in ("alt", "deleted"):  # the names came with it
        with pytest.raises(BranchError, match="already been used"):
            await other.session("s").create_branch_from_turn(1, name)


async def test_a_move_through_an_owner_carries_the_branches_too(db_path: Path, tmp_path: Path) -> None:
    with owner_running(OWNER, db_path) as owner, CitadelSessionStore(db_path, KEY) as client:
        assert client.served_by == owner.pid
        session = await branched(client)
        await session.create_branch_from_turn(2, "deleted")
        await session.switch_to_branch("main")
        await session.delete_branch("deleted")
        before = await whole(session)
        with CitadelSessionStore(tmp_path / "other.cdl", KEY, argon2_profile="iot") as other:
            assert client.move_session("s", other).items == 8
            assert await whole(other.session("s")) == before
            with pytest.raises(BranchError, match="already been used"):  # read through the owner
                await other.session("s").create_branch_from_turn(1, "deleted")
        assert client.session_ids() == []


async def test_a_move_refuses_a_target_with_another_branch_and_resumes_an_erase_cut_short(
    make_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, other = make_store(), make_store(tmp_path / "other.cdl")
    session = await branched(store)
    stranger = other.session("s")
    await stranger.add_items([user("one")])
    await stranger.create_branch_from_turn(1, "elsewhere")
    await stranger.add_items([user("another conversation")])
    with pytest.raises(MoveConflictError, match="already holds other items"):
        store.move_session("s", other)
    assert len(await session.get_items(branch_id="alt")) == 4, "nothing erased at the source"
    other.erase_session("s")

    class Cut(Exception):
        pass

    calls = store._file.call

    def cut(operation: Any, *args: Any, **kwargs: Any) -> Any:  # copied, usage too, and compared
        if operation is ops.ERASE:  # the erase is the next step
            raise Cut
        return calls(operation, *args, **kwargs)

    with monkeypatch.context() as patched, pytest.raises(Cut):
        patched.setattr(store._file, "call", cut)
        store.move_session("s", other)
    before = await whole(session)
    await session.delete_branch("alt")  # as an erase that a crash stopped after the branches, before MAIN
    summary = store.move_session("s", other)
    assert (summary.items, summary.copied, summary.erasure is not None) == (4, 0, True)
    assert await whole(other.session("s")) == before
    assert store.session_ids() == []


@pytest.mark.parametrize("change", ["a branch made", "a turn's usage stored"])
def test_a_change_at_the_source_after_the_compare_stops_the_erase(
    make_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    store, other = make_store(), make_store(tmp_path / "other.cdl")
    session = asyncio.run(branched(store))
    calls = other._file.call  # its ops.ALL_ITEMS is the compare's read, the last step before the erase

    def then_a_change(operation: Any, *args: Any, **kwargs: Any) -> Any:
        found = calls(operation, *args, **kwargs)
        if operation is ops.ALL_ITEMS and args[0] == ("s", "alt"):
            if change == "a branch made":
                asyncio.run(session.create_branch_from_turn(2, "late"))
            else:
                asyncio.run(session.store_run_usage(run_result(3, 99, 1)))
        return found

    monkeypatch.setattr(other._file, "call", then_a_change)
    with pytest.raises(MoveConflictError, match="changed after the move copied"):
        store.move_session("s", other)
    monkeypatch.undo()
    assert len(asyncio.run(session.get_items(branch_id="alt"))) == 4, "nothing erased"
    if change == "a branch made":
        names = [b["branch_id"] for b in asyncio.run(session.list_branches())]
        assert sorted(names) == ["alt", "late", "main"]
    else:
        assert asyncio.run(session.get_turn_usage(2))["input_tokens"] == 99


async def test_a_real_run_stores_its_usage_on_the_current_turn(make_store: Any) -> None:
    usage = Usage(requests=1, input_tokens=11, output_tokens=4, total_tokens=15)
    model = ScriptedModel([[assistant_message("Hello!")]], default_usage=usage)
    session = make_store().session("s")
    result = await Runner.run(Agent(name="a", model=model), "hi", session=session)
    await session.store_run_usage(result)
    assert (await session.get_turn_usage(1))["input_tokens"] == 11
    assert [t["content"] for t in await session.get_conversation_turns()] == ["hi"]


async def test_a_restore_erases_again_a_branch_deleted_after_the_backup(tmp_path: Path) -> None:
    database, ledger, backup = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl", tmp_path / "backup.cdl"
    with CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger) as store:
        session = store.session("s")
        await session.add_items([user("one"), answer("1"), user("two"), answer("2")])
        await session.create_branch_from_turn(2, "alt")
        await session.add_items([user("said on the branch"), answer("and erased")])
        store.backup(backup)
        await session.delete_branch("alt", force=True)
    report = restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    assert report.erased == {"s": 4}
    with CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger) as store:
        session = store.session("s")
        assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
        assert len(await session.get_items()) == 4


async def sdk_file_with_branches(path: Path) -> AdvancedSQLiteSession:
    """A real AdvancedSQLiteSession file: two sessions, one with a branch, a deleted one, and usage."""
    sdk = AdvancedSQLiteSession(session_id="s", db_path=str(path), create_tables=True)
    await sdk.add_items([user("hello there"), answer("hi")])
    await sdk.store_run_usage(run_result(1, 10, 5))
    await sdk.add_items([user("the weather?"), call("c1", "weather"), output("c1"), answer("sunny")])
    await sdk.store_run_usage(run_result(2, 20, 7))
    await sdk.create_branch_from_turn(2, "gone")
    await sdk.add_items([user("on a branch deleted later"), answer("gone")])
    await sdk.switch_to_branch("main")
    await sdk.create_branch_from_turn(2, "alt")
    await sdk.delete_branch("gone")
    await sdk.add_items([user("snow?"), answer("no snow")])
    await sdk.store_run_usage(run_result(4, 40, 4))
    other = AdvancedSQLiteSession(session_id="t", db_path=str(path))
    await other.add_items([user("another session"), answer("plain")])
    return sdk


async def what_it_holds(session: Any) -> dict[str, Any]:
    """Every answer a session gives about its branches, turns and usage (times left out)."""
    listed = await session.list_branches()
    names = sorted(b["branch_id"] for b in listed)
    return {
        "branches": sorted((b["branch_id"], b["message_count"], b["user_turns"]) for b in listed),
        "items": {name: await session.get_items(branch_id=name) for name in names},
        "turns": {
            name: [(t["turn"], t["full_content"]) for t in await session.get_conversation_turns(name)]
            for name in names
        },
        "structure": {name: await session.get_conversation_by_turns(name) for name in names},
        "turn usage": {name: await session.get_turn_usage(branch_id=name) for name in names},
        "usage": await session.get_session_usage(),
    }


async def test_an_sdk_file_with_branches_and_usage_goes_in_and_comes_out_as_it_was(
    tmp_path: Path, make_store: Any
) -> None:
    sdk = await sdk_file_with_branches(tmp_path / "sdk.db")
    original = await what_it_holds(sdk)
    assert original["branches"] == [("alt", 4, 2), ("main", 6, 2)]
    store = make_store()
    report = import_file(store, tmp_path / "sdk.db")
    assert [(s.session_id, s.written) for s in report.sessions] == [("s", 6), ("t", 2)]
    imported = store.session("s")
    assert await what_it_holds(imported) == original
    if "branch_reservations" in sqlite_tables(tmp_path / "sdk.db"):  # openai-agents 0.24 keeps used names
        with pytest.raises(BranchError, match="'gone' has already been used"):
            await imported.create_branch_from_turn(1, "gone")
    assert await store.session("t").get_items() == [user("another session"), answer("plain")]
    assert import_file(store, tmp_path / "sdk.db", mode="append").written == 0, "a rerun adds nothing"
    assert await what_it_holds(imported) == original
    summary = export_sqlite(store, tmp_path / "out.db")
    assert summary.sessions == {"s": 6, "t": 2}
    read_back = AdvancedSQLiteSession(session_id="s", db_path=str(tmp_path / "out.db"))  # claims the tables
    assert await what_it_holds(read_back) == original
    plain = AdvancedSQLiteSession(session_id="t", db_path=str(tmp_path / "out.db"))
    assert await plain.get_items() == [user("another session"), answer("plain")]
    if "branch_reservations" in sqlite_tables(tmp_path / "sdk.db"):  # the deleted branch's name went out too
        with pytest.raises(ValueError, match="'gone' has already been used"):
            await read_back.create_branch_from_turn(1, "gone")
        again = make_store(tmp_path / "again.cdl")
        import_file(again, tmp_path / "out.db")
        with pytest.raises(BranchError, match="'gone' has already been used"):
            await again.session("s").create_branch_from_turn(1, "gone")


def sqlite_tables(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


async def test_export_all_writes_each_branch_and_the_usage_in_json_lines(
    tmp_path: Path, make_store: Any
) -> None:
    await sdk_file_with_branches(tmp_path / "sdk.db")
    store = make_store()
    import_file(store, tmp_path / "sdk.db")
    export_all(store, tmp_path / "out", ["s"])
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    main, alt = index
    assert (main["session_id"], main["items"], "branch" in main) == ("s", 6, False)
    assert (alt["session_id"], alt["branch"], alt["items"]) == ("s", "alt", 4)
    assert [u["user_turn_number"] for u in main["usage"]] == [1, 2] and alt["usage"][0]["requests"] == 4
    if "branch_reservations" in sqlite_tables(tmp_path / "sdk.db"):  # openai-agents 0.24 keeps used names
        assert main["used_branch_names"] == ["alt", "gone"]
    lines = (tmp_path / "out" / alt["file"]).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        user("hello there"),
        answer("hi"),
        user("snow?"),
        answer("no snow"),
    ]


# Fills a session, then dies (SIGKILL) in the middle of copying its items into a new branch.
DIES_MID_COPY = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from citadeldb_openai_agents import CitadelSessionStore
    from citadeldb_openai_agents.storage import writes

    async def main():
        store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot")
        session = store.session("s")
        for turn in range(300):
            await session.add_items([{"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": f"a{turn}"}])
        append, copied = writes.append, []
        def dying(*args, **kwargs):
            append(*args, **kwargs)
            copied.append(1)
            if len(copied) == 2:  # two chunks of the copy written, the rest not
                os.kill(os.getpid(), signal.SIGKILL)
        writes.append = dying
        await session.create_branch_from_turn(300, "alt")

    asyncio.run(main())
    """
)


async def test_a_branch_whose_copy_a_crash_cut_off_is_erased_and_its_name_stays_free(db_path: Path) -> None:
    died = subprocess.run(
        [sys.executable, "-c", DIES_MID_COPY, str(db_path), KEY], capture_output=True, timeout=120
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot") as store:
        session = store.session("s")
        assert store._file._local._layout.branches("s") == [], "nothing of the cut copy is left"
        assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
        main = await session.get_items()
        assert len(main) == 600
        assert await session.create_branch_from_turn(300, "alt") == "alt"
        assert store.verify().ok
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot") as reopened:  # read from the file again
        assert await reopened.session("s").get_items(branch_id="alt") == main[:598]


async def test_a_branch_name_no_file_can_store_is_refused_before_anything_is_written(make_store: Any) -> None:
    session = make_store().session("s")
    await session.add_items([user("one"), answer("1")])
    with pytest.raises(BranchError, match="lone surrogate"):
        await session.create_branch_from_turn(1, "branch\ud800")
    assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
    assert session.current_branch == "main"
