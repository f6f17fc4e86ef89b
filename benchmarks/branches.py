"""Branches of a 10,000-item session: creating one, switching to it, reading it.

    python benchmarks/branches.py              # 3 rounds, ~2 min here
    python benchmarks/branches.py --rounds 1 --items 1000   # smoke

Each round, alternating, in a fresh file: the SDK's own AdvancedSQLiteSession (the plaintext
reference) and ours (a CitadelSession, serve=False, the mock embedder) fill one session with
ITEMS items (a user message and an answer per turn, 100 items a call), then time:
creating a branch from the last turn but one (ours copies the items before it, the SDK
copies their structure rows), switching to it and back, get_items(limit=20) and the full
get_items() on the branch and on main, list_branches, get_conversation_turns and
get_tool_usage on the branch.
A cell is the median over every round (the reads: REPS each). Timing, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents.extensions.memory.advanced_sqlite_session import AdvancedSQLiteSession

from citadeldb_openai_agents import CitadelSessionStore

KEY = "benchmark passphrase, not a secret"
REPS = 20
OPERATIONS = (
    "create_branch_from_turn",
    "switch_to_branch",
    "get_items(limit=20) on the branch",
    "get_items(limit=20) on main",
    "get_items() on the branch",
    "list_branches",
    "get_conversation_turns on the branch",
    "get_tool_usage on the branch",
)


def turn(number: int) -> list[Any]:
    return [
        {"role": "user", "content": f"question {number}: what did we say about item {number}?"},
        {"role": "assistant", "content": f"answer {number}: item {number} was fine.", "type": "message"},
    ]


async def timed(step: Callable[[], Awaitable[Any]], reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        began = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - began)
    return samples


async def measure(session: Any, items: int) -> dict[str, list[float]]:
    turns = items // 2
    for start in range(0, turns, 50):
        await session.add_items([item for n in range(start, min(start + 50, turns)) for item in turn(n)])
    found: dict[str, list[float]] = {}
    began = time.perf_counter()
    await session.create_branch_from_turn(turns - 1, "alt")  # the items of every turn but the last two
    found["create_branch_from_turn"] = [time.perf_counter() - began]
    await session.add_items(turn(turns))

    async def switch() -> None:
        await session.switch_to_branch("main")
        await session.switch_to_branch("alt")

    found["switch_to_branch"] = [s / 2 for s in await timed(switch, REPS)]
    found["get_items(limit=20) on the branch"] = await timed(lambda: session.get_items(20), REPS)
    found["get_items(limit=20) on main"] = await timed(lambda: session.get_items(20, "main"), REPS)
    found["get_items() on the branch"] = await timed(lambda: session.get_items(), max(3, REPS // 4))
    found["list_branches"] = await timed(session.list_branches, max(3, REPS // 4))
    found["get_conversation_turns on the branch"] = await timed(
        session.get_conversation_turns, max(3, REPS // 4)
    )
    found["get_tool_usage on the branch"] = await timed(session.get_tool_usage, max(3, REPS // 4))
    return found


async def sdk(folder: Path, items: int) -> dict[str, list[float]]:
    session = AdvancedSQLiteSession(session_id="s", db_path=str(folder / "sdk.db"), create_tables=True)
    try:
        return await measure(session, items)
    finally:
        session.close()


async def ours(folder: Path, items: int) -> dict[str, list[float]]:
    with CitadelSessionStore(folder / "agent.cdl", KEY, argon2_profile="iot", serve=False) as store:
        return await measure(store.session("s"), items)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=10_000)
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {"sdk": {}, "ours": {}}
    for round_number in range(args.rounds):
        for name, run in (
            (("sdk", sdk), ("ours", ours)) if round_number % 2 == 0 else (("ours", ours), ("sdk", sdk))
        ):
            with tempfile.TemporaryDirectory() as folder:
                for operation, found in asyncio.run(run(Path(folder), args.items)).items():
                    samples[name].setdefault(operation, []).extend(found)
    print(f"`python benchmarks/branches.py --rounds {args.rounds} --items {args.items}`")
    print()
    print(f"| operation, one session of {args.items:,} items | AdvancedSQLiteSession | ours | ratio |")
    print("|---|---:|---:|---:|")
    for operation in OPERATIONS:
        theirs, mine = (statistics.median(samples[name][operation]) * 1000 for name in ("sdk", "ours"))
        print(f"| {operation} | {theirs:.2f} ms | {mine:.2f} ms | {mine / theirs:.1f}x |")


if __name__ == "__main__":
    main()
