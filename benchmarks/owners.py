"""A person's sessions in a big file: listing one owner's, and erasing one owner's (issue 44).

    python benchmarks/owners.py                 # 10,000 sessions (500 owners x 20), then 100 x 100 items
    python benchmarks/owners.py --sessions 2000 # smaller, for a quick look

Prints the p50 / p90 of `store.sessions(owner=X)` (one owner's 20 sessions) beside the p50 of
`store.sessions()` (every session), of `store.search(query, owner=X)` over one owner's 20
sessions, and the wall time of `store.erase_owner(X)` for an owner of
100 sessions of 100 items each, with the receipt's counts. The files are built with
sync_mode "off" (to build them quickly) and measured reopened with the default ("full").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from citadeldb_openai_agents import CitadelSessionStore

KEY = "benchmark passphrase"


def said(text: str, count: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{text} {i}"} for i in range(count)]


async def build(path: Path, sessions: int, per_owner: int) -> None:
    with CitadelSessionStore(path, KEY, argon2_profile="iot", sync_mode="off") as store:
        for number in range(sessions):
            owner = f"user-{number // per_owner:05d}"
            await store.session(f"{owner}-conv-{number % per_owner}", owner=owner).add_items(said("hello", 2))


async def build_erasable(path: Path, sessions: int, items: int) -> None:
    with CitadelSessionStore(path, KEY, argon2_profile="iot", sync_mode="off") as store:
        for number in range(sessions):
            await store.session(f"leaving-{number}", owner="leaving").add_items(said("words", items))
        await store.session("staying", owner="staying").add_items(said("kept", 10))


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--per-owner", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        listing = Path(directory) / "listing.cdl"
        started = time.perf_counter()
        asyncio.run(build(listing, args.sessions, args.per_owner))
        print(f"built {args.sessions:,} sessions in {time.perf_counter() - started:.1f} s")
        owners = args.sessions // args.per_owner
        with CitadelSessionStore(listing, KEY) as store:
            one: list[float] = []
            for repeat in range(args.repeats):
                owner = f"user-{(repeat * 37) % owners:05d}"
                began = time.perf_counter()
                found = store.sessions(owner=owner)
                one.append((time.perf_counter() - began) * 1000)
                assert len(found) == args.per_owner, (owner, len(found))
            searched: list[float] = []
            for repeat in range(args.repeats):
                owner = f"user-{(repeat * 41) % owners:05d}"
                began = time.perf_counter()
                hits = store.search("hello 1", owner=owner, limit=5)
                searched.append((time.perf_counter() - began) * 1000)
                assert hits and all(hit.session_id.startswith(owner) for hit in hits)
            every: list[float] = []
            for _ in range(3):
                began = time.perf_counter()
                assert len(store.sessions()) == args.sessions
                every.append((time.perf_counter() - began) * 1000)
        print(
            f"sessions(owner=X), {args.per_owner} of {args.sessions:,}: p50 {statistics.median(one):.1f} ms, "
            f"p90 {percentile(one, 0.9):.1f} ms ({args.repeats} calls); "
            f"sessions() of all: p50 {statistics.median(every):.0f} ms (3 calls)"
        )
        print(
            f"search(query, owner=X, limit=5) over {args.per_owner} sessions: p50 {statistics.median(searched):.1f} ms, "
            f"p90 {percentile(searched, 0.9):.1f} ms ({args.repeats} calls, the query embedding included)"
        )
        erasable = Path(directory) / "erase.cdl"
        asyncio.run(build_erasable(erasable, 100, 100))
        with CitadelSessionStore(erasable, KEY) as store:
            began = time.perf_counter()
            erased = store.erase_owner("leaving")
            took = time.perf_counter() - began
            assert [s.session_id for s in store.sessions()] == ["staying"]
        print(
            f"erase_owner: {len(erased.sessions)} sessions, {erased.items_erased:,} items in {took:.2f} s "
            f"(readback confirmed: {erased.readback_confirmed})"
        )


if __name__ == "__main__":
    main()
