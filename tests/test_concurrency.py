"""Threads, event loops and concurrent calls: nothing lost, nothing doubled."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from citadeldb_openai_agents import CitadelSession, CitadelSessionStore


async def test_fifty_concurrent_batches_stay_whole(store: CitadelSessionStore) -> None:
    session = store.session("s")
    await asyncio.gather(*(session.add_items([{"b": b, "i": i} for i in range(5)]) for b in range(50)))
    items = await session.get_items()
    assert len(items) == 250
    for start in range(0, 250, 5):
        batch = items[start : start + 5]
        assert len({item["b"] for item in batch}) == 1, "a batch was interleaved with another"
        assert [item["i"] for item in batch] == list(range(5))


async def test_concurrent_pops_never_return_an_item_twice(store: CitadelSessionStore) -> None:
    session = store.session("s")
    await session.add_items([{"n": n} for n in range(100)])
    other = store.session("s")  # a second object on the same session
    popped = await asyncio.gather(*(s.pop_item() for s in [session, other] * 75))
    got = [item["n"] for item in popped if item is not None]
    assert sorted(got) == list(range(100))
    assert popped.count(None) == 50


def test_sessions_work_from_many_threads_and_event_loops(db_path: Path, key: str) -> None:
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        async def run() -> None:
            session = CitadelSession(f"user-{i % 3}", db_path, key)
            try:
                for n in range(10):
                    await session.add_items([{"thread": i, "n": n}])
                    await session.get_items(limit=3)
            finally:
                session.close()

        try:
            asyncio.run(run())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    async def check() -> None:
        with CitadelSessionStore(db_path, key) as store:
            total = 0
            for sid in store.session_ids():
                items = await store.session(sid).get_items()
                total += len(items)
                for i in {item["thread"] for item in items}:
                    assert [x["n"] for x in items if x["thread"] == i] == list(range(10))
            assert total == 60

    asyncio.run(check())


async def test_the_event_loop_keeps_running_during_storage_work(store: CitadelSessionStore) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    session = store.session("s")
    await session.add_items([{"content": "x" * 1000, "n": n} for n in range(3000)])
    await session.get_items()
    done.set()
    await task
    assert ticks > 10, "the loop was blocked while Citadel worked"
