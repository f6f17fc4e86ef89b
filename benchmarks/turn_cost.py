"""What one agent turn costs the process that owns the file: a full read and two appends.

    python benchmarks/turn_cost.py                 # 40 sessions of 30 items, 5 turns each: ~10 s
    python benchmarks/turn_cost.py --warm 100      # the same in a bigger file

The SDK's `Runner` reads the whole session at the start of a turn and appends the
user's input and the answer; under many processes the owner does this for every
worker. The store's internal calls are timed in this thread (no event loop, no
socket), so the figures are the storage's own: wall and CPU milliseconds per turn.

Timing, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from citadeldb_openai_agents import CitadelSessionStore


def user(turn: int) -> list[dict[str, object]]:
    return [{"role": "user", "content": f"turn {turn} of the client: hello there"}]


def answer(turn: int) -> list[dict[str, object]]:
    text = f"noted: turn {turn}"
    return [
        {
            "id": f"msg_{turn}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--warm", type=int, default=15, help="turns stored in each session first")
    parser.add_argument("--turns", type=int, default=5, help="timed turns per session")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = CitadelSessionStore(Path(scratch) / "turns.cdl", "benchmark passphrase", argon2_profile="iot")
        try:
            ids = [f"user-{number:02d}" for number in range(args.sessions)]
            for turn in range(args.warm):
                for session_id in ids:
                    store._add_items(session_id, user(turn))
                    store._add_items(session_id, answer(turn))
            wall, cpu = time.perf_counter(), time.process_time()
            for turn in range(args.warm, args.warm + args.turns):
                for session_id in ids:
                    store._get_items(session_id, None)
                    store._add_items(session_id, user(turn))
                    store._add_items(session_id, answer(turn))
            turns = args.sessions * args.turns
            wall_ms = (time.perf_counter() - wall) * 1000 / turns
            cpu_ms = (time.process_time() - cpu) * 1000 / turns
        finally:
            store.close()
    items = args.sessions * (args.warm + args.turns) * 2  # a user message and an answer per turn
    print(
        f"`python benchmarks/turn_cost.py --sessions {args.sessions} --warm {args.warm} --turns {args.turns}`"
    )
    print(
        f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {items:,} items in the file at the end)\n"
    )
    print("| per turn (full read + 2 appends) | wall | CPU |\n|---|---:|---:|")
    print(f"| owner, in process | {wall_ms:.2f} ms | {cpu_ms:.2f} ms |")


if __name__ == "__main__":
    main()
