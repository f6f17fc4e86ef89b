"""One session's hot calls in one process, for comparing two versions of the package alternately.

    python benchmarks/in_process.py
    # two versions, alternating (a worktree of the older one at /tmp/old):
    for i in 1 2 3 4; do PYTHONPATH=/tmp/old python benchmarks/in_process.py; python benchmarks/in_process.py; done

A 10,000-item session (sync_mode "off": the commits' fsyncs would drown what the code costs),
then, 7 times each: get_items(limit=20) x 200, an add_items of a turn and two pops x 100, the
full get_items() x 10; the median per call is printed, and for the full read the minimum too.
`benchmarks/sessions.py` times the same calls against SQLiteSession, but its runs differ by
30-50% on a shared machine; these differ by a few percent. Timing, not a test.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from citadeldb_openai_agents import CitadelSessionStore

ITEMS = 10_000


async def per_call(call: Callable[[], Awaitable[Any]], calls: int) -> list[float]:
    await call()
    samples = []
    for _ in range(7):
        began = time.perf_counter()
        for _ in range(calls):
            await call()
        samples.append((time.perf_counter() - began) / calls * 1000)
    return samples


async def main() -> None:
    folder = tempfile.mkdtemp()
    with CitadelSessionStore(
        os.path.join(folder, "agent.cdl"), "benchmark passphrase", sync_mode="off"
    ) as store:
        session = store.session("s")
        items = [
            {"role": "user" if n % 2 == 0 else "assistant", "content": f"message number {n} about something"}
            for n in range(ITEMS)
        ]
        for start in range(0, ITEMS, 250):
            await session.add_items(items[start : start + 250])

        async def turn_and_pops() -> None:
            await session.add_items(items[:2])
            await session.pop_item()
            await session.pop_item()

        newest = await per_call(lambda: session.get_items(20), 200)
        writes = await per_call(turn_and_pops, 100)
        full = await per_call(session.get_items, 10)
    print(
        f"get_items(20) {statistics.median(newest):.3f} ms, add + 2 pops {statistics.median(writes):.3f} ms, "
        f"get_items() {statistics.median(full):.3f} ms (min {min(full):.3f})",
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
