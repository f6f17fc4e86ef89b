"""What closing a store costs in an application's process (the Agents SDK loaded).

    python benchmarks/close_cost.py            # 15 closes, ~5 s
    PYTHONPATH=/path/to/other/checkout python benchmarks/close_cost.py   # another version, to compare

Each round opens a file (serve=False, argon2 "iot"), writes one item, and times `close()`.
A close used to run a full garbage collection every time (Citadel keeps its file lock until
its last `Memory` object is collected); it now runs one only when this process still holds
the lock after closing. Timing, not a test.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time

import agents  # noqa: F401  (an application's process: the SDK and its models are loaded)

from citadeldb_openai_agents import CitadelSessionStore

ROUNDS = 15


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "close.cdl")
        times = []
        for number in range(ROUNDS):
            store = CitadelSessionStore(
                path, "benchmark passphrase, not a secret", argon2_profile="iot", serve=False
            )
            asyncio.run(store.session("s").add_items([{"role": "user", "content": f"item {number}"}]))
            began = time.perf_counter()
            store.close()
            times.append(time.perf_counter() - began)
    print(
        f"close(): median {statistics.median(times) * 1000:.1f} ms, "
        f"min {min(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms over {ROUNDS} closes"
    )


if __name__ == "__main__":
    main()
