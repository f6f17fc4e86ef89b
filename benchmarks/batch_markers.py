"""Could Citadel's `remember_if_absent_keyed_batch` replace our batch markers? Cost and semantics.

    python benchmarks/batch_markers.py            # ~1 min
    python benchmarks/batch_markers.py --quick    # ~10 s

A write that may be sent again (a client's batch whose owner died before answering, an
import's chunk, a move's) carries an id. Today the batch's commit holds one more atom, a
marker with that id, and a resend first looks for the marker (`storage/writes.py`
`committed`: a filtered fetch in the session's last two segments). Citadel 2.7 offers
`remember_if_absent_keyed_batch`: every atom under an idempotency key, an exact replay
answered with the stored ids. This measures, in one file (the default sync mode, MockEmbedder
dim 128, regions of ~256 atoms as the layout keeps them), alternating the two ways:

* a first write of 2 items (a turn) and of 256 (an import chunk);
* a resend of the same batch (the marker's lookup, then nothing; or the keyed replay);

and then probes what the replacement would have to mean for the library: a replay after one
of the batch's items was erased (popped), and a replay whose atoms differ (another expiry).
Timing and observed outcomes only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import citadeldb

ITEM, MARKER = "item", "batch"


def atoms(count: int, expires_at: int | None = None) -> list[dict[str, Any]]:
    payload = json.dumps({"role": "user", "content": "y" * 200})
    made: list[dict[str, Any]] = [
        {"kind": ITEM, "text": f"hello there {n}", "payload": payload} for n in range(count)
    ]
    if expires_at is not None:
        for atom in made:
            atom["expires_at"] = expires_at
    return made


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


def with_marker(memory: Any, region: str, count: int) -> tuple[float, float]:
    """(first write, resend) in ms, the way writes.py does it today."""
    batch = uuid.uuid4().hex
    marker = {"kind": MARKER, "text": "batch", "payload": {"batch": batch}}
    first = timed(lambda: memory.remember_batch(region, [*atoms(count), marker]))

    def resend() -> None:
        assert memory.fetch(region, MARKER, payload_filter={"batch": batch}, limit=1)

    return first, timed(resend)


def keyed(memory: Any, region: str, count: int) -> tuple[float, float]:
    """(first write, resend) in ms, every atom under the key batch:position."""
    batch = uuid.uuid4().hex
    entries = [(atom, f"{batch}:{n}") for n, atom in enumerate(atoms(count))]
    first = timed(lambda: memory.remember_if_absent_keyed_batch(region, entries))
    return first, timed(lambda: memory.remember_if_absent_keyed_batch(region, entries))


def measure(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        db = citadeldb.connect(f"{directory}/b.cdl", key="benchmark", region_keys=True)
        memory, embedder = db.memory(), citadeldb.MockEmbedder(dim=128)
        print(f"{'batch':>5}  {'way':<28}{'first write ms':>15}{'resend ms':>11}")
        made: set[str] = set()
        for count in (2, 256):
            results: dict[str, list[tuple[float, float]]] = {"marker": [], "keyed": []}
            for number in range(rounds):
                for way, write in (("marker", with_marker), ("keyed", keyed)):
                    # A fresh region each ~256 atoms, as the layout's segments are.
                    region = f"{way}-{count}-{number * count // 256}"
                    if region not in made:
                        memory.create_encrypted_region(region, embedder)
                        made.add(region)
                    results[way].append(write(memory, region, count))
            for way, label in (("marker", "remember_batch + marker"), ("keyed", "if_absent_keyed_batch")):
                first = statistics.median(r[0] for r in results[way])
                again = statistics.median(r[1] for r in results[way])
                print(f"{count:>5}  {label:<28}{first:>15.2f}{again:>11.2f}")
        probe(memory, embedder)
        db.close()


def probe(memory: Any, embedder: Any) -> None:
    """What a keyed replay does where the library's resend must not store anything again."""
    region = "probe"
    memory.create_encrypted_region(region, embedder)
    entries = [(atom, f"b:{n}") for n, atom in enumerate(atoms(2, expires_at=2**62))]
    outcomes = memory.remember_if_absent_keyed_batch(region, entries)
    print(f"\nfirst write: {outcomes!r}")
    ids = [getattr(o, "id", None) or (o[0] if isinstance(o, (tuple, list)) else o) for o in outcomes]
    memory.forget(region, [ids[-1]])
    again = memory.remember_if_absent_keyed_batch(region, entries)
    live = memory.fetch(region, ITEM, limit=10)
    print(f"replay after the newest was popped: {again!r}; items now stored: {len(live)}")
    changed = [(dict(atom, expires_at=2**61), key) for atom, key in entries]
    try:
        result = memory.remember_if_absent_keyed_batch(region, changed)
        print(f"replay with another expiry: {result!r}")
    except Exception as exc:  # the outcome is what this probe reports
        print(f"replay with another expiry: {type(exc).__name__}: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 rounds instead of 200")
    measure(20 if parser.parse_args().quick else 200)


if __name__ == "__main__":
    main()
