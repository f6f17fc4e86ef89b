"""The SDK's full read at every turn is answered from payloads the process kept, never wrongly.

A segment's payloads are kept once a read or this process's own writes have seen them all
(storage/segment_cache.py). These tests hold them to what the file holds: the same items in
the same order after appends and pops, none past its expiry, none of an erased item, none
after a write by another path, and no more than the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from citadeldb_openai_agents import CitadelSessionStore


def items(session_id: str, count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"{session_id} {n}"}
        for n in range(start, start + count)
    ]


def count_file_reads(store: CitadelSessionStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The segments whose items a read fetches from the file, as they are fetched."""
    layout = store._file._local._layout
    fetched: list[int] = []
    real = layout.live_hits
    monkeypatch.setattr(
        layout,
        "live_hits",
        lambda memory, state, number: fetched.append(number) or real(memory, state, number),
    )
    return fetched


def held_texts(store: CitadelSessionStore, session_id: str) -> list[str]:
    state = store._file._local._layout.state(session_id)
    return [payload for kept in state.cache.values() for payload in (kept.payloads or {}).values()]


async def test_reads_after_this_processs_appends_and_pops_are_answered_from_memory_and_match_the_file(
    make_store: Callable[..., CitadelSessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items(items("s", 10))
    assert await session.get_items() == items("s", 10)  # read from the file once
    fetched = count_file_reads(store, monkeypatch)
    expected = items("s", 10)
    for turn in range(5):
        new = items("s", 2, start=10 + 2 * turn)
        await session.add_items(new[:1])
        await session.add_items(new[1:])
        expected += new
        assert await session.get_items() == expected
    assert await session.pop_item() == expected.pop()
    assert await session.get_items() == expected
    assert fetched == [], "a read after this process's own writes went to the file"
    store.close()
    assert await make_store().session("s").get_items() == expected  # what the file holds


async def test_a_segment_filled_and_a_new_one_opened_is_still_read_whole(
    make_store: Callable[..., CitadelSessionStore],
) -> None:
    store = make_store()
    session = store.session("s")
    expected: list[dict[str, Any]] = []
    for batch in range(6):  # 600 items: a batch is never split, so 300 in each of two segments
        expected += items("s", 100, start=100 * batch)
        await session.add_items(expected[-100:])
        assert await session.get_items() == expected
    assert len(store._file._local._layout.state("s").segments) == 2


async def test_an_expired_item_is_not_answered_from_memory(
    make_store: Callable[..., CitadelSessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(ttl=1.5)
    session = store.session("s")
    await session.add_items(items("s", 3))
    assert await session.get_items() == items("s", 3)
    fetched = count_file_reads(store, monkeypatch)
    time.sleep(1.6)
    assert await session.get_items() == []  # expired with no write since: as Citadel hides them
    assert fetched == [], "the read went to the file: the kept payloads were not what answered"
    await session.add_items(items("s", 1, start=3))  # erases the expired ones first
    assert await session.get_items() == items("s", 1, start=3)


async def test_a_store_with_a_ttl_keeps_its_payloads_across_appends(
    make_store: Callable[..., CitadelSessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every append of a store with a TTL first evicts what has expired; one that evicts
    # nothing changes nothing, so it must not send the next read to the file.
    store = make_store(ttl=3600)
    session = store.session("s")
    await session.add_items(items("s", 3))
    assert await session.get_items() == items("s", 3)
    fetched = count_file_reads(store, monkeypatch)
    await session.add_items(items("s", 2, start=3))
    assert await session.get_items() == items("s", 5)
    assert fetched == [], "a read after an append that evicted nothing went to the file"


async def test_a_kept_segment_missing_a_payload_is_read_from_the_file(
    make_store: Callable[..., CitadelSessionStore],
) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items(items("s", 4))
    state = store._file._local._layout.state("s")
    kept = state.cache[state.segments[-1]]
    assert kept.payloads is not None and len(kept.payloads) == 4
    del kept.payloads[min(kept.payloads)]  # as a write path that forgot to keep its payloads would
    assert await session.get_items() == items("s", 4)


async def test_an_erased_items_text_is_not_kept(make_store: Callable[..., CitadelSessionStore]) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items(items("s", 4))
    assert await session.get_items() == items("s", 4)
    popped = await session.pop_item()
    assert popped == items("s", 4)[-1]
    assert all('"s 3"' not in text for text in held_texts(store, "s"))
    assert len(held_texts(store, "s")) == 3
    await session.clear_session()
    assert held_texts(store, "s") == []
    await store.session("t").add_items(items("t", 1))  # the next segment held looks at the oldest
    held = store._file._local._layout.caches._held
    assert all(ref() is not None for ref, *_ in held.values()), "an erased session's rows are still counted"


async def test_a_write_by_another_path_sends_the_next_read_to_the_file(
    make_store: Callable[..., CitadelSessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items(items("s", 5))
    assert await session.get_items() == items("s", 5)
    layout = store._file._local._layout
    tail = layout.segment_regions(layout.state("s"))[-1]
    memory = store._file._local._database.memory
    second = memory.fetch(tail, "item", limit=100)[1].id
    fetched = count_file_reads(store, monkeypatch)
    memory.forget(tail, [second])  # counted where Citadel is called, told to no kept payload
    assert await session.get_items() == [items("s", 5)[0], *items("s", 5)[2:]]
    assert fetched, "the read after another path's write did not go to the file"
    assert all('"s 1"' not in text for text in held_texts(store, "s"))


async def test_payloads_kept_stay_within_the_budget_and_reads_stay_whole(
    make_store: Callable[..., CitadelSessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    caches = store._file._local._layout.caches
    monkeypatch.setattr(caches, "budget", 600)  # about two sessions of 5 items
    names = [f"user-{n}" for n in range(6)]
    for name in names:
        await store.session(name).add_items(items(name, 5))
    for _ in range(2):
        for name in names:
            assert await store.session(name).get_items() == items(name, 5)
            assert caches.held_bytes <= 600
    held = [name for name in names if held_texts(store, name)]
    assert 0 < len(held) < len(names)
    assert sum(len(text) for name in names for text in held_texts(store, name)) <= 600
