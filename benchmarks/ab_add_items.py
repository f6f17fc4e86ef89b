"""A/B: what does add_items pay for, over raw citadeldb, at 10,000 items in one session?

    python benchmarks/ab_add_items.py            # 10,000 items, 8 interleaved rounds of 30 turns: ~10 s
    python benchmarks/ab_add_items.py --items 1000

Four files in one process, filled with the same items (workload.py), then one turn
(2-3 items) added to each in turn, round after round (the machine is shared and noisy):

* raw, own text: raw_citadel.py, the floor of benchmarks/sessions.py (each item's own text);
* raw, question+own text: a reply's text after the user message before it, as keyword
  text and vector both (what the package did before 2026-11-30);
* raw, question in vector only: own text for the keyword index, the vector computed from
  question+own and handed to Citadel (what the package does now);
* ours: CitadelSessionStore's blocking add (no asyncio hop).

It showed that a longer keyword text, not our Python, made ours +20-30% slower than raw:
Citadel's embedding (MockEmbedder: ~4 us a call) is not the cost, the text is.
Timing only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import citadeldb
import raw_citadel
from backends import EMBEDDER_DIM, KEY
from workload import items, make_turn

from citadeldb_openai_agents import CitadelSessionStore


class RawInContext(raw_citadel.RawSession):
    """raw_citadel's session, with a reply's question in its keyword text, or in its vector only."""

    def __init__(self, file: raw_citadel.RawFile, session_id: str, vector_only: bool) -> None:
        super().__init__(file, session_id, file.session(session_id).hid)
        self.vector_only = vector_only
        self.question = ""

    def add_items(self, batch: list[Any]) -> None:
        memory = self.file.memory
        if self.catalog_id is None:
            entry = {"kind": "session", "text": "session", "payload": self.session_id}
            self.catalog_id = memory.remember(raw_citadel.CATALOG, entry)
        atoms = []
        for item in batch:
            own = raw_citadel._text(item)
            user = item.get("role") == "user"
            if user:
                self.question = own
            in_context = own if user or not self.question else f"{self.question}\n{own}"
            payload = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
            atom: dict[str, Any] = {"kind": raw_citadel.KIND, "text": in_context, "payload": payload}
            if self.vector_only:
                atom["text"] = own
                atom["embedding"] = self.file.embedder.embed_with_cancel([in_context], None)[0]
            atoms.append(atom)
        if not self.segments or len(self.known_tail_ids()) >= raw_citadel.CAPACITY:
            self.segments.append(self.segments[-1] + 1 if self.segments else 0)
            self.tail_ids = []
        self.tail_ids.extend(memory.remember_batch(self.region(self.segments[-1]), atoms))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--turns", type=int, default=30, help="turns added per backend per round")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="ab-add-items-")
    add: dict[str, Any] = {}
    for name, vector_only in (
        ("raw, own text", None),
        ("raw, question+own text", False),
        ("raw, question in vector only", True),
    ):
        file = raw_citadel.RawFile(
            f"{directory}/{len(add)}.cdl", KEY, citadeldb.MockEmbedder(dim=EMBEDDER_DIM)
        )
        session = file.session("s") if vector_only is None else RawInContext(file, "s", vector_only)
        add[name] = session.add_items
    store = CitadelSessionStore(
        f"{directory}/ours.cdl", KEY, embedder=citadeldb.MockEmbedder(dim=EMBEDDER_DIM)
    )
    add["ours"] = lambda batch: store._history("s", None).add_items(batch, None)
    data = items(args.items)
    for start in range(0, args.items, 100):
        for function in add.values():
            function(data[start : start + 100])
    medians: dict[str, list[float]] = {name: [] for name in add}
    turn = 1_000_000  # turns the fill did not use
    for round_number in range(args.rounds):
        order = list(add) if round_number % 2 == 0 else list(add)[::-1]
        for name in order:
            samples = []
            for _ in range(args.turns):
                batch = make_turn(turn)
                turn += 1
                started = time.perf_counter()
                add[name](batch)
                samples.append(time.perf_counter() - started)
            medians[name].append(statistics.median(samples) * 1000)
    floor = statistics.median(medians["raw, own text"])
    print(f"add_items of one turn at {args.items:,} items: median of {args.rounds} round medians, ms")
    for name, values in medians.items():
        median = statistics.median(values)
        print(
            f"  {name:30} {median:6.2f}  ({median / floor - 1:+.0%} vs raw, own text)   rounds: "
            + " ".join(f"{v:.2f}" for v in values)
        )
    store.close()


if __name__ == "__main__":
    main()
