"""Does a session's search cost grow with the file around it?

    python benchmarks/search_scale.py                       # mock and all-MiniLM-L6-v2, 1k..100k items
    python benchmarks/search_scale.py --quick               # mock, 1k and 5k items: a CI smoke run
    PYTHONPATH=/path/to/an/older/checkout python benchmarks/search_scale.py --label before

One file grows: first the measured session (1,000 items of varied conversation,
embedded by the real model), then filler sessions of 1,000 items, and one
session of 10,000 items once the file passes 20,000. At each size (1, 10, 30 and
100 thousand items) the store is closed and reopened, and timed:

* cold: the first search of the measured session after the open;
* warm: ``await session.search(query, limit=5)`` for `--searches` distinct queries
  (the query's embedding included), median and p95;
* ``get_items(limit=20)`` of the same session, for comparison;
* the 10,000-item session's search (warm median), once it exists.

Filler items are embedded with random unit vectors under the model's identity
(name, dimension, metric): only their number matters to the measured session's
search cost, and embedding 100,000 texts with the real model would take most of
the run. The measured session and every query use the real embedder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import citadeldb

from citadeldb_openai_agents import CitadelSessionStore

KEY = "benchmark passphrase, not a secret"
SESSION_ITEMS = 1_000
BIG_SESSION_ITEMS = 10_000
_WORDS = [
    "order",
    "invoice",
    "refund",
    "shipping",
    "parcel",
    "courier",
    "address",
    "billing",
    "card",
    "account",
    "password",
    "login",
    "subscription",
    "plan",
    "upgrade",
    "discount",
    "coupon",
    "warranty",
    "repair",
    "battery",
    "screen",
    "charger",
    "cable",
    "laptop",
    "phone",
    "tablet",
    "printer",
    "router",
    "firmware",
    "update",
    "install",
    "error",
    "crash",
    "backup",
    "restore",
    "appointment",
    "doctor",
    "clinic",
    "pharmacy",
    "insurance",
    "claim",
    "policy",
    "deadline",
    "report",
    "meeting",
    "travel",
    "flight",
    "hotel",
    "booking",
    "visa",
    "passport",
    "luggage",
    "train",
    "ticket",
    "weather",
    "garden",
    "recipe",
    "oven",
]


def turn(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """A user question and its answer, of words drawn from a small vocabulary (turn `n`)."""
    topic = rng.sample(_WORDS, 4)
    question = f"question {n}: what about the {topic[0]} and the {topic[1]} for {rng.choice(_WORDS)}?"
    answer = (
        f"answer {n}: the {topic[0]} is handled; check {topic[2]} then {topic[3]} ({rng.randint(1, 999)})."
    )
    return [
        {"role": "user", "content": question},
        {
            "id": f"msg_{n:08d}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": answer, "annotations": []}],
        },
    ]


class RandomVectors:
    """Random unit vectors under another embedder's identity: filler costs no model time."""

    def __init__(self, like: Any) -> None:
        self.dim, self.metric, self.model_id = like.dim, like.metric, like.model_id
        self._rng = random.Random(7)

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        out = []
        for _ in texts:
            v = [self._rng.gauss(0.0, 1.0) for _ in range(self.dim)]
            norm = sum(x * x for x in v) ** 0.5
            out.append([x / norm for x in v])
        return out


def make_embedder(name: str) -> Any:
    if name == "mock":
        return citadeldb.MockEmbedder(dim=128)
    from citadeldb_openai_agents import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


def open_store(path: Path, embedder: Any) -> CitadelSessionStore:
    return CitadelSessionStore(path, KEY, embedder=embedder, argon2_profile="iot")


async def fill(store: CitadelSessionStore, session_id: str, count: int, seed: int, batch: int = 2) -> None:
    rng = random.Random(seed)
    session = store.session(session_id)
    pending: list[dict[str, Any]] = []
    n = 0
    while n * 2 < count:
        pending.extend(turn(rng, n))
        n += 1
        if len(pending) >= batch:
            await session.add_items(pending)  # type: ignore[arg-type]
            pending = []
    if pending:
        await session.add_items(pending)  # type: ignore[arg-type]


def queries(count: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    return [f"what about the {rng.choice(_WORDS)} and the {rng.choice(_WORDS)}?" for _ in range(count)]


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 2),
    }


async def measure(path: Path, embedder: Any, searches: int, big: bool, items_in_file: int) -> dict[str, Any]:
    asked = queries(searches + 1)
    row: dict[str, Any] = {"items_in_file": items_in_file}
    with open_store(path, embedder) as store:
        session = store.session("measured")
        started = time.perf_counter()
        await session.search(asked[0], limit=5)
        row["cold_ms"] = round((time.perf_counter() - started) * 1000, 2)
        times = []
        for query in asked[1:]:
            started = time.perf_counter()
            found = await session.search(query, limit=5)
            times.append(time.perf_counter() - started)
            assert len(found) == 5
        row["search"] = summary(times)
        times = []
        for _ in range(searches):
            started = time.perf_counter()
            await session.get_items(limit=20)
            times.append(time.perf_counter() - started)
        row["get_items_20"] = summary(times)
        if big:
            large = store.session("large")
            await large.search(asked[0], limit=5)
            times = []
            for query in asked[1:]:
                started = time.perf_counter()
                await large.search(query, limit=5)
                times.append(time.perf_counter() - started)
            row["search_10k_session"] = summary(times)
    return row


async def run_embedder(
    name: str, sizes: list[int], searches: int, directory: Path, log: Any
) -> list[dict[str, Any]]:
    embedder = make_embedder(name)
    filler = RandomVectors(embedder) if name != "mock" else embedder
    path = directory / f"{name}.cdl"
    with open_store(path, embedder) as store:
        await fill(store, "measured", SESSION_ITEMS, seed=1)
    held, number, rows, big = SESSION_ITEMS, 0, [], False
    for size in sizes:
        with open_store(path, filler) as store:
            while held < size:
                if not big and held + BIG_SESSION_ITEMS <= size and size >= 20_000:
                    await fill(store, "large", BIG_SESSION_ITEMS, seed=3, batch=100)
                    held, big = held + BIG_SESSION_ITEMS, True
                    continue
                await fill(store, f"filler-{number}", SESSION_ITEMS, seed=100 + number, batch=100)
                held, number = held + SESSION_ITEMS, number + 1
        row = await measure(path, embedder, searches, big, held)
        row["embedder"] = name
        rows.append(row)
        log(json.dumps(row))
    return rows


def table(rows: list[dict[str, Any]], label: str) -> str:
    lines = [
        f"| {label} | items in file | search median (ms) | p95 | first search after open | "
        "get_items(limit=20) | 10,000-item session |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        big = row.get("search_10k_session", {}).get("median_ms", "")
        lines.append(
            f"| {row['embedder']} | {row['items_in_file']:,} | {row['search']['median_ms']} | "
            f"{row['search']['p95_ms']} | {row['cold_ms']} | {row['get_items_20']['median_ms']} | {big} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="mock only, 1,000 and 5,000 items, 10 searches")
    parser.add_argument("--embedders", type=lambda s: s.split(","), default=["mock", "minilm"])
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1_000, 10_000, 30_000, 100_000]
    )
    parser.add_argument("--searches", type=int, default=30)
    parser.add_argument("--label", default="after", help="names this run in the table (before/after)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.embedders, args.sizes, args.searches = ["mock"], [1_000, 5_000], 10

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        for name in args.embedders:
            rows += asyncio.run(run_embedder(name, args.sizes, args.searches, Path(directory), log))
    print(table(rows, args.label))
    if args.json_out:
        machine = {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "citadeldb": citadeldb.__version__,
        }
        args.json_out.write_text(
            json.dumps({"label": args.label, "machine": machine, "rows": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
