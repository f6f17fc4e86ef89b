"""Which part of Citadel's recall grows with the file: the keyword rank, the vectors, or the fetch?

    python benchmarks/recall_profile.py                  # 0, 10,000 and 30,000 other atoms, same and other dimension
    python benchmarks/recall_profile.py --others 10000 --dim 64

Raw citadeldb, MockEmbedder: four 250-atom encrypted regions (the searched session), then
other regions of 250 atoms filling the file, with vectors of the same dimension (so the
same atom table) or another. Times `recall` of the four regions with text only, vector
only and both (k=15), and `fetch` of their atoms; median ms of 8 rounds. The profile
behind issue 17's design (docs/performance.md, "Search against the file's size").
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from typing import Any

import citadeldb

TARGETS, PER_REGION = 4, 250
_WORDS = [f"w{i}" for i in range(2000)]


def build(others: int, other_dim: int) -> tuple[Any, Any]:
    directory = tempfile.mkdtemp(prefix="recall-profile-")
    options = citadeldb.DatabaseOptions(argon2_profile="iot", cache_size=16384, sync_mode="off")
    db = citadeldb.connect(f"{directory}/a.cdl", key="benchmark key", region_keys=True, options=options)
    memory = db.memory()
    rng = random.Random(0)

    def fill(name: str, dim: int) -> None:
        embedder = citadeldb.MockEmbedder(dim=dim)
        memory.create_encrypted_region(name, embedder)
        texts = [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(PER_REGION)]
        vectors = embedder.embed_with_cancel(texts)
        atoms = [
            {"kind": "item", "text": t, "embedding": list(v), "payload": {"t": t}}
            for t, v in zip(texts, vectors, strict=True)
        ]
        memory.remember_batch(name, atoms)

    for number in range(TARGETS):
        fill(f"target.{number}", 128)
    for number in range(others // PER_REGION):
        fill(f"other.{number}", other_dim)
    return db, memory


def median_ms(call: Any) -> float:
    samples = []
    for _ in range(8):
        started = time.perf_counter()
        for number in range(TARGETS):
            call(f"target.{number}")
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 1)


def profile(others: int, other_dim: int) -> str:
    db, memory = build(others, other_dim)
    query = "w1 w2 w3 w4"
    vector = list(citadeldb.MockEmbedder(dim=128).embed_with_cancel([query])[0])
    try:
        text = median_ms(lambda region: memory.recall(region, k=15, kinds=["item"], text=query))
        vectors = median_ms(lambda region: memory.recall(region, k=15, kinds=["item"], embedding=vector))
        both = median_ms(
            lambda region: memory.recall(region, k=15, kinds=["item"], text=query, embedding=vector)
        )
        fetch = median_ms(lambda region: memory.fetch(region, "item", limit=PER_REGION + 50))
    finally:
        db.close()
    return f"| {others:,} | {other_dim} | {text} | {vectors} | {both} | {fetch} |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--others", type=int, help="other atoms in the file (default: 0, 10,000 and 30,000)")
    parser.add_argument("--dim", type=int, default=128, help="their dimension (128: the same atom table)")
    args = parser.parse_args()
    runs = (
        [(args.others, args.dim)]
        if args.others is not None
        else [(0, 128), (10_000, 128), (30_000, 128), (10_000, 64), (30_000, 64)]
    )
    print("| other atoms | their dim | recall, text (ms) | recall, vector | recall, both | fetch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for others, dim in runs:
        print(profile(others, dim), flush=True)


if __name__ == "__main__":
    main()
