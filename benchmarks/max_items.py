"""What a cap on a session's items costs a write: add_items of one turn at the cap.

    python benchmarks/max_items.py             # 5 rounds, ~1 min here
    python benchmarks/max_items.py --rounds 1  # smoke

Each round, alternating: agents.SQLiteSession (the plaintext reference), ours without a cap,
and ours with `max_items=CAP` on a session already at its cap (so every turn of two items
erases two, keys destroyed). Each backend writes TURNS turns into a session of START items in
a fresh file; a cell is the median of every turn of every round. Timing, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents import SQLiteSession

from citadeldb_openai_agents import CitadelSessionStore

START, CAP, TURNS = 1_000, 1_000, 100
KEY = "benchmark passphrase, not a secret"


def turn(number: int) -> list[Any]:
    return [
        {"role": "user", "content": f"question {number}: what did we say about item {number}?"},
        {"role": "assistant", "content": f"answer {number}: item {number} was fine."},
    ]


async def timed(session: Any) -> list[float]:
    for start in range(0, START, 50):  # the session's history, 50 items a call
        await session.add_items([item for n in range(start, start + 50, 2) for item in turn(n)])
    samples = []
    for number in range(TURNS):
        began = time.perf_counter()
        await session.add_items(turn(START + number))
        samples.append(time.perf_counter() - began)
    return samples


async def sqlite(folder: Path) -> list[float]:
    session = SQLiteSession("s", str(folder / "sqlite.db"))
    try:
        return await timed(session)
    finally:
        session.close()


def ours(cap: int | None) -> Callable[[Path], Any]:
    async def run(folder: Path) -> list[float]:
        with CitadelSessionStore(folder / "agent.cdl", KEY, argon2_profile="iot", serve=False) as store:
            session = store.session("s", max_items=cap)
            samples = await timed(session)
            held = len(await session.get_items())
            assert held == (START + 2 * TURNS if cap is None else cap), held  # the cap did its work
            return samples

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    backends = {"SQLiteSession": sqlite, "ours, no cap": ours(None), f"ours, max_items={CAP}": ours(CAP)}
    samples: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(rounds):
        for name, run in backends.items():
            with tempfile.TemporaryDirectory() as folder:
                samples[name] += asyncio.run(run(Path(folder)))
    reference = statistics.median(samples["SQLiteSession"])
    print(f"add_items of one turn (2 items), session of {START:,} items, {rounds} rounds x {TURNS} turns")
    print("| backend | median ms | p90 ms | vs SQLiteSession |\n|---|---:|---:|---:|")
    for name, times in samples.items():
        median, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
        print(f"| {name} | {median * 1e3:.2f} | {p90 * 1e3:.2f} | x{median / reference:.1f} |")


if __name__ == "__main__":
    main()
