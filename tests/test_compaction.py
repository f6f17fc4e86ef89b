"""Compaction: the SDK's `OpenAIResponsesCompactionSession` over a CitadelSession, atomic and erasing.

The SDK asks the session it wraps for the private hook ``_get_compaction_snapshot``
(openai-agents 0.24); older SDKs, and a hook that answers None, replace the whole history
with ``clear_session()`` then ``add_items()``. Each test names the promise it keeps; the
crash test is in tests/test_compaction_crash.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, Runner, SQLiteSession, set_tracing_disabled
from agents.memory import OpenAIResponsesCompactionSession, SessionSettings
from agents.testing import ModelStep, ScriptedModel, assistant_message
from test_erasure import memory_of, stored_ids, verdicts_after_recreating
from test_serving import Service

from citadeldb_openai_agents import CitadelSession, CitadelSessionStore
from citadeldb_openai_agents.compaction import SNAPSHOT_FIELDS, snapshot_type

from conftest import KEY

set_tracing_disabled(True)
SDK_HAS_THE_HOOK = snapshot_type() is not None
EVERYTHING = 10**6
TURNS = 8


class FakeResponses:
    """`client.responses.compact`, offline: the last user message and a compaction item derived from the input."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def compact(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        given = list(kwargs.get("input") or [])
        digest = hashlib.sha256(json.dumps(given, sort_keys=True).encode()).hexdigest()[:16]
        users = [item for item in given if isinstance(item, dict) and item.get("role") == "user"]
        compacted = {"type": "compaction", "encrypted_content": f"compacted {len(given)} items {digest}"}
        return SimpleNamespace(output=[*users[-1:], compacted], usage=None)


class HookSpy:
    """Records every call of CitadelSession's hook and what each `replace_suffix` answered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.replaced: list[bool] = []
        real = CitadelSession._get_compaction_snapshot

        async def spy(session: CitadelSession, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((args, kwargs))
            snapshot = await real(session, *args, **kwargs)
            if snapshot is None:
                return None

            async def replace_suffix(start: int, output: list[Any]) -> bool:
                replaced = await snapshot.replace_suffix(start, output)
                self.replaced.append(replaced)
                return bool(replaced)

            return dataclasses.replace(snapshot, replace_suffix=replace_suffix)

        monkeypatch.setattr(CitadelSession, "_get_compaction_snapshot", spy)


async def run_turns(underlying: Any, outer: Any = None) -> tuple[list[str], FakeResponses]:
    """TURNS runs of a scripted agent through a compaction session (inside `outer(session)`, if given);
    the stored history (as JSON text, read through the outermost session) after each."""
    responses = FakeResponses()
    session = OpenAIResponsesCompactionSession(
        underlying.session_id,
        underlying,
        client=SimpleNamespace(responses=responses),
        compaction_mode="input",
        should_trigger_compaction=lambda context: len(context["compaction_candidate_items"]) >= 3,
    )
    steps = [ModelStep.respond(lambda call, n=n: [assistant_message(f"answer {n}")]) for n in range(TURNS)]
    agent = Agent(name="assistant", instructions="Be brief.", model=ScriptedModel(steps))
    reader = underlying if outer is None else outer(session)
    histories = []
    for turn in range(TURNS):
        await Runner.run(agent, f"question {turn}", session=session if outer is None else reader)
        # As JSON text: key order counts too.
        histories.append(json.dumps(await reader.get_items(limit=EVERYTHING)))
    return histories, responses


@pytest.mark.parametrize("prompt_limit", [None, 4], ids=["whole-history", "partial-suffix"])
async def test_compaction_stores_what_it_stores_over_sqlite_session(
    store: CitadelSessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prompt_limit: int | None
) -> None:
    settings = SessionSettings(limit=prompt_limit)
    spy = HookSpy(monkeypatch)
    citadel, compacted = await run_turns(store.session("user-1", session_settings=settings))
    sqlite, reference = await run_turns(
        SQLiteSession("user-1", tmp_path / "sdk.db", session_settings=settings)
    )
    assert citadel == sqlite
    assert len(compacted.calls) == len(reference.calls) >= 2, "the fake client must have compacted"
    assert any('"compaction"' in history for history in citadel)
    if SDK_HAS_THE_HOOK:
        # The hook, not the fallback, did every replacement, and each one succeeded.
        assert spy.calls and all(args and type(args[0]) is int and not kwargs for args, kwargs in spy.calls)
        assert spy.replaced and all(spy.replaced)
    else:
        assert spy.calls == []  # an SDK before the hook: its clear-and-add fallback, same history
    assert store.verify().ok


# Before the hook, EncryptedSession's compaction sent its ciphertexts (random IVs) to be compacted.
@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
async def test_encrypted_session_over_citadel_compacts_as_over_sqlite_session(
    store: CitadelSessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`EncryptedSession` calls the hook with ``prune_prefix`` (its expired items): same history."""
    pytest.importorskip("cryptography")
    from agents.extensions.memory import EncryptedSession

    def encrypted(session: Any) -> Any:
        return EncryptedSession("user-1", session, encryption_key="k" * 44, ttl=3600)

    spy = HookSpy(monkeypatch)
    citadel, compacted = await run_turns(store.session("user-1"), encrypted)
    sqlite, reference = await run_turns(SQLiteSession("user-1", tmp_path / "sdk.db"), encrypted)
    assert citadel == sqlite
    assert len(compacted.calls) == len(reference.calls) >= 2
    assert spy.calls and all(callable(kwargs.get("prune_prefix")) for _, kwargs in spy.calls)
    assert spy.replaced and all(spy.replaced)
    assert store.verify().ok


def test_the_hook_has_the_shape_the_installed_sdk_calls() -> None:
    """Pinned across the supported range: 0.24 has `_CompactionSnapshot(items, complete, replace_suffix)`
    and looks the hook up with getattr; 0.21 has neither, and compacts by clear and add."""
    import agents.memory.openai_responses_compaction_session as sdk
    import agents.memory.session as protocol

    source = Path(sdk.__file__).read_text()
    if SDK_HAS_THE_HOOK:
        fields = tuple(field.name for field in dataclasses.fields(protocol._CompactionSnapshot))
        assert fields == SNAPSHOT_FIELDS
        assert 'getattr(self.underlying_session, "_get_compaction_snapshot", None)' in source
        assert "read_snapshot(len(model_items) + 1)" in source
        assert "snapshot.replace_suffix(suffix_start, output_items)" in source
    else:
        assert not hasattr(protocol, "_CompactionSnapshot")
        assert "_get_compaction_snapshot" not in source
    assert "self.underlying_session.clear_session()" in source  # the fallback, in every version


async def test_the_snapshot_holds_the_newest_items_and_says_whether_that_is_all(
    store: CitadelSessionStore,
) -> None:
    session = store.session("s")
    if not SDK_HAS_THE_HOOK:
        assert await session._get_compaction_snapshot(3) is None
        return
    await session.add_items([{"n": n} for n in range(5)])
    partial = await session._get_compaction_snapshot(3)
    assert (partial.items, partial.complete) == ([{"n": 2}, {"n": 3}, {"n": 4}], False)
    whole = await session._get_compaction_snapshot(5)
    assert (whole.items, whole.complete) == ([{"n": n} for n in range(5)], True)
    empty = await store.session("nobody")._get_compaction_snapshot(3)
    assert (empty.items, empty.complete) == ([], True)
    assert await empty.replace_suffix(0, [{"new": 1}]) is False  # nothing to replace, as SQLiteSession says


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
@pytest.mark.parametrize(
    "change",
    ["add", "pop", "pop-and-add-the-same", "clear", "replaced-elsewhere"],
)
async def test_replace_suffix_returns_false_and_changes_nothing_when_the_suffix_changed(
    store: CitadelSessionStore, change: str
) -> None:
    session = store.session("s")
    await session.add_items([{"n": n} for n in range(6)])
    snapshot = await session._get_compaction_snapshot(4)
    if change == "add":
        await session.add_items([{"n": 6}])
    elif change == "pop":
        await session.pop_item()
    elif change == "pop-and-add-the-same":
        await session.add_items([await session.pop_item()])  # same item, a new atom
    elif change == "clear":
        await session.clear_session()
    else:
        assert await (await session._get_compaction_snapshot(4)).replace_suffix(2, [{"other": 1}])
    before = await session.get_items()
    state = store._file._local._layout.state("s")
    record_before = None if state.record is None else dict(vars(state.record))
    assert await snapshot.replace_suffix(1, [{"compacted": True}]) is False
    assert await session.get_items() == before
    assert (None if state.record is None else dict(vars(state.record))) == record_before
    assert store.verify().ok


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
async def test_the_replaced_items_keys_are_destroyed(store: CitadelSessionStore) -> None:
    session = store.session("s")
    await session.add_items([{"n": n} for n in range(10)])
    [(region, ids)] = stored_ids(store, "s").items()
    snapshot = await session._get_compaction_snapshot(6)
    assert await snapshot.replace_suffix(2, [{"summary": "of n=6..9"}])
    assert await session.get_items() == [{"n": n} for n in range(6)] + [{"summary": "of n=6..9"}]
    verdicts = [a.verdict for a in memory_of(store).verify(region, ids)]
    assert verdicts == ["authentic"] * 6 + ["missing"] * 4  # no row, no key: erased, not hidden
    assert store.verify().ok


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
async def test_a_replacement_across_segments_erases_the_segments_it_empties(
    store: CitadelSessionStore,
) -> None:
    session = store.session("s")
    for start in range(0, 640, 128):  # a segment takes batches until it holds 256 items: three
        await session.add_items([{"n": n} for n in range(start, start + 128)])
    regions = stored_ids(store, "s")
    assert [len(ids) for ids in regions.values()] == [256, 256, 128]
    snapshot = await session._get_compaction_snapshot(590)
    assert await snapshot.replace_suffix(0, [{"summary": 1}])
    assert await session.get_items() == [{"n": n} for n in range(50)] + [{"summary": 1}]
    first, middle, tail = regions.items()
    assert [a.verdict for a in memory_of(store).verify(first[0], first[1])] == ["authentic"] * 50 + [
        "missing"
    ] * (len(first[1]) - 50)
    assert verdicts_after_recreating(store, dict([middle])) == {"missing"}  # dropped with its keys
    assert {a.verdict for a in memory_of(store).verify(tail[0], tail[1])} == {"missing"}
    assert store.verify().ok


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
@pytest.mark.parametrize("stop", ["before the commit point", "after the commit point"])
async def test_a_replacement_interrupted_is_undone_or_finished_when_the_file_opens(
    make_store, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """The crash test's two outcomes, each made certain: a process dies right before the new items
    are written (the record announces the replacement), or right after (nothing is erased yet)."""
    from citadeldb_openai_agents.storage import suffix as compaction

    store = make_store()
    session = store.session("s")
    await session.add_items([{"n": n} for n in range(5)])
    [(region, ids)] = stored_ids(store, "s").items()
    snapshot = await session._get_compaction_snapshot(3)

    def die(*args: Any) -> None:
        raise SystemExit("killed")

    monkeypatch.setattr(compaction, "append" if stop.startswith("before") else "_finish", die)
    with pytest.raises(SystemExit):
        await snapshot.replace_suffix(0, [{"summary": 1}])
    assert store._file._local._layout.state("s").record.replacing is not None
    store.close()
    monkeypatch.undo()
    reopened = make_store()
    items = await reopened.session("s").get_items()
    verdicts = [a.verdict for a in memory_of(reopened).verify(region, ids)]
    if stop.startswith("before"):
        assert items == [{"n": n} for n in range(5)]
        assert verdicts == ["authentic"] * 5
    else:
        assert items == [{"n": 0}, {"n": 1}, {"summary": 1}]
        assert verdicts == ["authentic"] * 2 + ["missing"] * 3
    record = reopened._file._local._layout.state("s").record
    assert (record.replacing, record.erasing) == (None, [])
    assert reopened.verify().ok


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
async def test_prune_prefix_erases_the_oldest_items_it_accepts_in_the_same_replacement(
    store: CitadelSessionStore,
) -> None:
    session = store.session("s")
    items = [
        {"old": True, "n": 0},
        {"old": True, "n": 1},
        {"n": 2},
        {"old": True, "n": 3},
        {"n": 4},
        {"n": 5},
    ]
    await session.add_items(items)
    [(region, ids)] = stored_ids(store, "s").items()
    snapshot = await session._get_compaction_snapshot(2, prune_prefix=lambda item: bool(item.get("old")))
    assert await snapshot.replace_suffix(0, [{"summary": 1}])
    # Up to the first item it refuses, as SQLiteSession's transaction deletes them.
    assert await session.get_items() == [{"n": 2}, {"old": True, "n": 3}, {"summary": 1}]
    verdicts = [a.verdict for a in memory_of(store).verify(region, ids)]
    assert verdicts == ["missing", "missing", "authentic", "authentic", "missing", "missing"]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((3, "extra"), {}),
        ((3,), {"unknown": 1}),
        (("3",), {}),
        ((True,), {}),
        ((0,), {}),
        ((3,), {"prune_prefix": 1}),
    ],
)
async def test_a_call_of_another_shape_gets_none_the_sdks_fallback(
    store: CitadelSessionStore, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    session = store.session("s")
    await session.add_items([{"n": n} for n in range(4)])
    assert await session._get_compaction_snapshot(*args, **kwargs) is None
    assert await session.get_items() == [{"n": n} for n in range(4)]


async def test_compaction_still_works_when_the_snapshot_protocol_changes(
    store: CitadelSessionStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A future SDK whose snapshot has other fields: the hook answers None, the SDK falls back."""
    import agents.memory.session as protocol

    @dataclasses.dataclass(frozen=True)
    class OtherSnapshot:
        items: list[Any]
        complete: bool
        replace_suffix: Any
        version: int

    monkeypatch.setattr(protocol, "_CompactionSnapshot", OtherSnapshot, raising=False)
    assert snapshot_type() is None
    spy = HookSpy(monkeypatch)
    citadel, compacted = await run_turns(store.session("user-1"))
    sqlite, _ = await run_turns(SQLiteSession("user-1", tmp_path / "sdk.db"))
    assert citadel == sqlite and len(compacted.calls) >= 2
    assert spy.replaced == []  # never through the hook
    assert store.verify().ok


async def test_a_manual_run_compaction_replaces_everything_at_once(
    store: CitadelSessionStore, tmp_path: Path
) -> None:
    """``run_compaction()`` uses ``_atomic_replace_items`` (0.24) or clear and add (0.21): same history."""
    histories = []
    for underlying in (store.session("s"), SQLiteSession("s", tmp_path / "sdk.db")):
        responses = FakeResponses()
        session = OpenAIResponsesCompactionSession(
            "s", underlying, client=SimpleNamespace(responses=responses), compaction_mode="input"
        )
        await session.add_items([{"role": "user", "content": f"q{n}"} for n in range(5)])
        await session.run_compaction({"force": True})
        histories.append(json.dumps(await underlying.get_items()))
    assert histories[0] == histories[1]
    assert "compaction" in histories[0]
    regions = stored_ids(store, "s")
    assert sum(map(len, regions.values())) == 2  # the five originals are erased, not hidden


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
async def test_compaction_works_through_a_client_process(db_path: Path) -> None:
    service = Service(db_path)
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            assert client.served_by == service.pid
            session = client.session("s")
            await session.add_items([{"n": n} for n in range(6)])
            stale = await session._get_compaction_snapshot(3)
            snapshot = await session._get_compaction_snapshot(3)
            assert snapshot.items == [{"n": 3}, {"n": 4}, {"n": 5}] and not snapshot.complete
            assert await snapshot.replace_suffix(1, [{"summary": 1}])
            assert await stale.replace_suffix(1, [{"summary": 2}]) is False
            assert await session.get_items() == [{"n": n} for n in range(4)] + [{"summary": 1}]
            assert await session._atomic_replace_items([{"all": 1}])
            assert await session.get_items() == [{"all": 1}]
            # The owner commits a replacement and dies before answering: the client takes the
            # file over, sends it again, and it is made once.
            assert service.ask("die-after-next replace_suffix") == "armed"
            snapshot = await session._get_compaction_snapshot(1)
            assert await snapshot.replace_suffix(0, [{"once": 1}])
            assert client.served_by is None  # this process owns the file now
            assert await session.get_items() == [{"once": 1}]
            assert client.verify().ok
    finally:
        if service.process.poll() is None:
            service.stop()


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
async def test_a_replacement_whose_answer_was_lost_is_sent_again_and_made_once(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner made the replacement but its answer never came back: the client sends it again
    to the owner, which finds it made (its batch id) and answers True without making it twice."""
    from citadeldb_openai_agents.serving.client import RemoteOwner
    from citadeldb_openai_agents.serving.transport import OwnerGone

    service = Service(db_path)
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            session = client.session("s")
            await session.add_items([{"n": n} for n in range(5)])
            real, sent = RemoteOwner.call, []

            def answer_lost(self: RemoteOwner, operation: Any, args: tuple[Any, ...], *rest: Any) -> Any:
                result = real(self, operation, args, *rest)
                if operation.name == "replace_suffix":
                    sent.append((args[-2], args[-1]))  # (batch id, sent again)
                    if len(sent) == 1:
                        raise OwnerGone("the connection dropped before the answer")
                return result

            monkeypatch.setattr(RemoteOwner, "call", answer_lost)
            snapshot = await session._get_compaction_snapshot(3)
            assert await snapshot.replace_suffix(1, [{"summary": 1}])
            (batch, first), (again, resent) = sent
            assert (again, first, resent) == (batch, False, True)
            assert client.served_by == service.pid  # still the owner's client
            assert await session.get_items() == [{"n": 0}, {"n": 1}, {"n": 2}, {"summary": 1}]
    finally:
        service.stop()
