"""What the storage layout is built on: raw citadeldb costs against a region's size.

    python benchmarks/citadel_primitives.py             # both tables: ~1 min
    python benchmarks/citadel_primitives.py --commits   # the commits by sync mode alone: ~5 s

For regions of 256, 1,000 and 10,000 atoms (one file, the default sync mode), the
median cost of each memory call a session makes. The layout (citadeldb_openai_agents/
storage/segments.py) keeps every region a session touches at most ~256 atoms because the calls
marked "scans" grow with the region. Then a commit of two atoms (an item and its search
block, as an append writes them) in a new file opened with each sync mode, with the store's
page cache: its wall and CPU time. A file's commits run one at a time, so this is what a
file's write rate is made of. Timing only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import citadeldb


def median_ms(call: Callable[[], Any], reps: int = 15) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def commits_by_sync_mode(commits: int = 200) -> None:
    """Median wall and CPU of a two-atom `remember_batch`, in a new file opened with each mode."""
    vector = [0.1] * 128
    atom = {"kind": "item", "text": "hello there " * 3, "embedding": vector, "payload": {"t": "x" * 200}}
    print("| sync_mode | a commit of 2 atoms, wall p50 | CPU p50 |\n|---|---:|---:|")
    for mode in ("full", "normal", "off"):
        with tempfile.TemporaryDirectory() as directory:
            options = citadeldb.DatabaseOptions(argon2_profile="iot", sync_mode=mode, cache_size=16_384)
            db = citadeldb.connect(f"{directory}/c.cdl", key="benchmark", region_keys=True, options=options)
            memory, embedder = db.memory(), citadeldb.MockEmbedder(dim=128)
            regions = [f"r{number}" for number in range(40)]
            for region in regions:
                memory.create_encrypted_region(region, embedder)
            walls, cpus = [], []
            for number in range(commits):
                start, cpu = time.perf_counter(), time.thread_time()
                memory.remember_batch(regions[number % len(regions)], [atom, atom])
                walls.append((time.perf_counter() - start) * 1000)
                cpus.append((time.thread_time() - cpu) * 1000)
            del memory
            db.close()
        print(f"| {mode} | {statistics.median(walls):.2f} ms | {statistics.median(cpus):.2f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", action="store_true", help="the commits by sync mode alone")
    if parser.parse_args().commits:
        commits_by_sync_mode()
        return
    sizes = (256, 1_000, 10_000)
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        db = citadeldb.connect(f"{directory}/p.cdl", key="benchmark", region_keys=True)
        memory, embedder = db.memory(), citadeldb.MockEmbedder(dim=128)
        payload = json.dumps({"role": "user", "content": "y" * 200})
        for size in sizes:
            region = f"r{size}"
            memory.create_encrypted_region(region, embedder)
            ids: list[int] = []
            for _ in range(0, size, 100):
                ids += memory.remember_batch(
                    region, [{"kind": "item", "text": "hello there", "payload": payload}] * 100
                )
            ids = ids[:size]
            victims = iter(ids[-200:-100])
            measured = {
                "remember_batch, 3 atoms": lambda region=region: memory.remember_batch(
                    region, [{"kind": "item", "text": "hi", "payload": payload}] * 3
                ),
                "fetch(newest=True, limit=20) (scans)": lambda region=region: memory.fetch(
                    region, "item", limit=20, newest=True
                ),
                "fetch(after_id=known, limit=20) (seeks)": lambda region=region, ids=ids: memory.fetch(
                    region, "item", limit=20, after_id=ids[-30]
                ),
                "fetch_one(id) (seeks)": lambda region=region, ids=ids: memory.fetch_one(region, ids[-1]),
                "count (scans)": lambda region=region: memory.count(region, "item"),
                "forget 1 id (scans)": lambda region=region, victims=victims: memory.forget(
                    region, [next(victims)]
                ),
                "evict(expired), none expired": lambda region=region: memory.evict(
                    region, citadeldb.EvictionPolicy.expired()
                ),
            }
            for name, call in measured.items():
                rows.setdefault(name, []).append(median_ms(call))
            start = time.perf_counter()
            memory.drop_region(region)
            rows.setdefault("drop_region (once)", []).append((time.perf_counter() - start) * 1000)
        db.close()
    print("| call, median ms | " + " | ".join(f"{s:,} atoms" for s in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    print()
    commits_by_sync_mode()


if __name__ == "__main__":
    main()
