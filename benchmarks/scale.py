"""Per-operation cost at scale: CitadelSession against agents.SQLiteSession, same run.

    python benchmarks/scale.py [--items 10000] [--sessions 200] [--per-session 50] [--reps 20]

Two files per backend: one session of --items items, and --sessions sessions of
--per-session items each. Prints a markdown table of medians (ms) and the ratio
of ours to SQLite's. Timing, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import SQLiteSession

from citadeldb_openai_agents import CitadelSessionStore

KEY = "benchmark passphrase"


def make_turn(i: int) -> list[dict[str, Any]]:
    """A deterministic turn: a ~200-char user message and a ~400-char assistant reply."""
    user = {"role": "user", "content": f"question {i}: " + ("lorem ipsum dolor sit amet " * 8)[:186]}
    reply = {
        "id": f"msg_{i:08d}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": ("consectetur adipiscing elit " * 15)[:400], "annotations": []}],
    }
    turn = [user, reply]
    if i % 5 == 0:
        turn.append({"type": "function_call_output", "call_id": f"call_{i}", "output": json.dumps({"ok": i})})
    return turn


def items(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < n:
        out.extend(make_turn(i))
        i += 1
    return out[:n]


class Backend:
    name = ""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def session(self, file: str, sid: str) -> Any: ...
    def reopen(self, file: str) -> None: ...
    def close(self) -> None: ...


class Citadel(Backend):
    name = "citadel"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.stores: dict[str, CitadelSessionStore] = {}

    def store(self, file: str) -> CitadelSessionStore:
        if file not in self.stores:
            self.stores[file] = CitadelSessionStore(self.directory / f"{file}.cdl", KEY)
        return self.stores[file]

    def session(self, file: str, sid: str) -> Any:
        return self.store(file).session(sid)

    def reopen(self, file: str) -> None:
        self.stores.pop(file).close()

    def close(self) -> None:
        for store in self.stores.values():
            store.close()


class SQLite(Backend):
    name = "sqlite"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.sessions: list[SQLiteSession] = []

    def session(self, file: str, sid: str) -> Any:
        session = SQLiteSession(sid, self.directory / f"{file}.db")
        self.sessions.append(session)
        return session

    def reopen(self, file: str) -> None:
        for session in self.sessions:
            session.close()
        self.sessions.clear()

    def close(self) -> None:
        self.reopen("")


async def median_ms(operation: Callable[[], Awaitable[Any]], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        await operation()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def fill(session: Any, n: int, batch: int = 100) -> None:
    data = items(n)
    for start in range(0, n, batch):
        await session.add_items(data[start : start + batch])


async def measure(backend: Backend, args: argparse.Namespace) -> dict[str, float]:
    r: dict[str, float] = {}
    reps = args.reps
    big = backend.session("big", "user-big")
    await fill(big, args.items)
    n = args.items
    r[f"add_items (1 turn) @{n}"] = await median_ms(lambda: big.add_items(make_turn(7)), reps)
    r[f"get_items(limit=20) @{n}"] = await median_ms(lambda: big.get_items(limit=20), reps)
    r[f"get_items() full @{n}"] = await median_ms(lambda: big.get_items(), max(3, reps // 4))
    r[f"pop_item @{n}"] = await median_ms(big.pop_item, reps)
    backend.reopen("big")
    gc.collect()
    start = time.perf_counter()
    big = backend.session("big", "user-big")
    await big.get_items(limit=20)
    r[f"reopen + get_items(limit=20) @{n}"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    await big.clear_session()
    r[f"clear_session @{n}"] = (time.perf_counter() - start) * 1000

    s, k = args.sessions, args.per_session
    sessions = [backend.session("many", f"user-{i}") for i in range(s)]
    data = items(k)
    for turn in range(0, k, 2):  # interleave the sessions, as live traffic does
        for session in sessions:
            await session.add_items(data[turn : turn + 2])
    label = f"{s}x{k}"
    one = sessions[s // 2]
    r[f"add_items (1 turn) {label}"] = await median_ms(lambda: one.add_items(make_turn(3)), reps)
    r[f"get_items(limit=20) {label}"] = await median_ms(lambda: one.get_items(limit=20), reps)
    r[f"get_items() full {label}"] = await median_ms(lambda: one.get_items(), reps)
    r[f"pop_item {label}"] = await median_ms(one.pop_item, reps)
    start = time.perf_counter()
    await one.clear_session()
    r[f"clear_session {label}"] = (time.perf_counter() - start) * 1000
    backend.close()
    return r


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--per-session", type=int, default=50)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    results = {}
    for cls in (SQLite, Citadel):
        with tempfile.TemporaryDirectory() as directory:
            results[cls.name] = await measure(cls(Path(directory)), args)
    print(f"| operation | SQLiteSession ms | CitadelSession ms | ratio |")
    print("|---|---:|---:|---:|")
    for op, ours in results["citadel"].items():
        base = results["sqlite"][op]
        print(f"| {op} | {base:.2f} | {ours:.2f} | {ours / base:.1f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
