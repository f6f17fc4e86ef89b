"""A/B: what would a copy of each item's vector in its payload cost a full read?

    python benchmarks/ab_vectors_in_payload.py     # ~1 min

Citadel 2.7.0 has no call that returns stored vectors, so a search that ranks in memory
(15-18 ms instead of Citadel's recall) would need each item's payload to carry its vector.
This writes 10,000 workload items into 40 encrypted regions of 250 twice, in one file:
payload = the item's JSON text (the package's layout), and payload = {"i": text, "v":
base64 of 384 float16} (all-MiniLM-L6-v2's width); then times a full read of each (fetch
every region, decode the items), 6 rounds interleaved. Raw citadeldb calls, the store's
page cache. Timing only; nothing is asserted.
"""

from __future__ import annotations

import base64
import json
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import citadeldb
from workload import items

REGIONS, PER_REGION, DIM = 40, 250, 384


def main() -> None:
    directory = tempfile.mkdtemp(prefix="ab-vectors-")
    options = citadeldb.DatabaseOptions(argon2_profile="iot", cache_size=16_384)
    db = citadeldb.connect(f"{directory}/p.cdl", key="benchmark", region_keys=True, options=options)
    memory = db.memory()
    data = items(REGIONS * PER_REGION)
    rng = random.Random(0)
    vector = base64.b64encode(struct.pack(f"<{DIM}e", *[rng.random() for _ in range(DIM)])).decode()
    for layout in ("text", "text+vector"):
        for number in range(REGIONS):
            region = f"{layout}.{number}"
            memory.create_encrypted_region(region, citadeldb.MockEmbedder(dim=64))
            atoms = []
            for item in data[number * PER_REGION : (number + 1) * PER_REGION]:
                text = json.dumps(item, separators=(",", ":"))
                payload = text if layout == "text" else {"i": text, "v": vector}
                atoms.append({"kind": "item", "text": "x", "payload": payload, "embedding": [1.0] * 64})
            memory.remember_batch(region, atoms)
    samples: dict[str, list[float]] = {"text": [], "text+vector": []}
    for _ in range(6):
        for layout in samples:
            started = time.perf_counter()
            texts = []
            for number in range(REGIONS):
                for hit in memory.fetch(f"{layout}.{number}", "item", limit=2**63 - 1):
                    texts.append(hit.payload if layout == "text" else hit.payload["i"])
            json.loads("[" + ",".join(texts) + "]")
            samples[layout].append((time.perf_counter() - started) * 1000)
    for layout, values in samples.items():
        print(
            f"full read of {len(data):,} items, payload = {layout:12}: median {statistics.median(values):.1f} ms "
            f"(rounds: {' '.join(f'{v:.0f}' for v in values)})"
        )
    db.close()


if __name__ == "__main__":
    main()
