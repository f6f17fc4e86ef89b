"""The erasure ledger's cost: one append (an erasure's record, fsynced) as the ledger grows.

    python benchmarks/ledger.py              # 3,000 appends, ~5 s
    python benchmarks/ledger.py --entries 300

Each erasure is recorded before it starts (storage/ledger.py): the line is MAC'd, chained to
the one before and fsynced. The append finds the chain's head from what this process wrote
last while the ledger is as it left it, so its cost should stay flat as the ledger grows;
reading the whole ledger (what a restore and `verify` do) is linear. Timing only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from citadeldb_openai_agents.storage.ledger import ErasureLedger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=3000)
    entries = parser.parse_args().entries
    with tempfile.TemporaryDirectory() as directory:
        ledger = ErasureLedger(os.path.join(directory, "erasures.jsonl"), os.urandom(32))
        times = []
        for n in range(entries):
            started = time.perf_counter()
            ledger.record_items("h" * 32, [(n, 1_700_000_000_000_000 + n)])
            times.append(time.perf_counter() - started)
        third = max(1, entries // 3)
        for start in range(0, entries, third):
            part = times[start : start + third]
            print(f"appends {start + 1}-{start + len(part)}: median {statistics.median(part) * 1000:.2f} ms")
        started = time.perf_counter()
        count = len(ledger.entries())
        print(f"reading and checking all {count} entries: {(time.perf_counter() - started) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
