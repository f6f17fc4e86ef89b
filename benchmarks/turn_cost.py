"""What one agent turn costs the process that owns the file: a full read and two appends.

    python benchmarks/turn_cost.py                 # 40 sessions of 30 items, 5 turns each: ~15 s
    python benchmarks/turn_cost.py --warm 100      # the same in a bigger file
    python benchmarks/turn_cost.py --ceiling       # and the turns/s the file takes from 1-8 threads
    python benchmarks/turn_cost.py --ceiling --sync-mode off   # the same with Citadel's lightest commit

The SDK's `Runner` reads the whole session at the start of a turn and appends the
user's input and the answer; under many processes the owner does this for every
worker. The store's internal calls are timed in this thread (no event loop), so the
figures are the storage's own: wall and CPU milliseconds per turn. Then another process,
a client of this one, runs the same number of turns through the socket: its own wall and
CPU per turn, and the CPU this process (the owner) spent serving each.

Timing, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from citadeldb_openai_agents import CitadelSessionStore

KEY = "benchmark passphrase"


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


def timed_turns(store: CitadelSessionStore, ids: list[str], turns: range) -> tuple[float, float]:
    """Wall and CPU milliseconds per turn of this process, over `turns` of every session."""
    wall, cpu = time.perf_counter(), time.process_time()
    for turn in turns:
        for session_id in ids:
            store._history(session_id, None).get_items(None)
            store._history(session_id, None).add_items(user(turn), None)
            store._history(session_id, None).add_items(answer(turn), None)
    count = len(ids) * len(turns)
    return (time.perf_counter() - wall) * 1000 / count, (time.process_time() - cpu) * 1000 / count


def ceiling(store: CitadelSessionStore, ids: list[str], threads: int, turns: int, *, reads: bool) -> float:
    """Turns per second of `threads` threads of this process, each on its share of the sessions.

    One file's ceiling: the turns it takes whoever sends them, since every process's calls
    run in its owner. Each turn appends two items, with the SDK's full read first if `reads`.
    """
    shares = [ids[number::threads] for number in range(threads)]

    def work(mine: list[str]) -> None:
        for turn in range(turns):
            session_id = mine[turn % len(mine)]
            if reads:
                store._history(session_id, None).get_items(None)
            store._history(session_id, None).add_items(user(turn), None)
            store._history(session_id, None).add_items(answer(turn), None)

    workers = [threading.Thread(target=work, args=(mine,)) for mine in shares]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * turns / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--warm", type=int, default=15, help="turns stored in each session first")
    parser.add_argument("--turns", type=int, default=5, help="timed turns per session")
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also the file's turns/s with 1, 2, 4 and 8 threads in the owner",
    )
    parser.add_argument(
        "--sync-mode", choices=["full", "normal", "off"], help="Citadel's durability (default: full)"
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the file, opened as a client of its owner
    args = parser.parse_args()
    ids = [f"user-{number:02d}" for number in range(args.sessions)]
    if args.client:
        with CitadelSessionStore(args.client, KEY, argon2_profile="iot", sync_mode=args.sync_mode) as store:
            assert store.served_by is not None, "this process owns the file: it was to be a client"
            start = args.warm + args.turns
            print(json.dumps(timed_turns(store, ids, range(start, start + args.turns))))
        return
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "turns.cdl"
        store = CitadelSessionStore(path, KEY, argon2_profile="iot", sync_mode=args.sync_mode)
        try:
            for turn in range(args.warm):
                for session_id in ids:
                    store._history(session_id, None).add_items(user(turn), None)
                    store._history(session_id, None).add_items(answer(turn), None)
            owner = timed_turns(store, ids, range(args.warm, args.warm + args.turns))
            # The same turns from another process, a client of this one: what each side spends.
            cpu = time.process_time()
            child = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--client", str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            served = (time.process_time() - cpu) * 1000 / (args.sessions * args.turns)
            client_wall, client_cpu = json.loads(child.stdout)
            rows, ceiling_items = [], 0
            if args.ceiling:
                per_thread = args.sessions * args.turns
                for threads in (1, 2, 4, 8):
                    appends = ceiling(store, ids, threads, per_thread // threads, reads=False)
                    turns = ceiling(store, ids, threads, per_thread // threads, reads=True)
                    rows.append(f"| {threads} | {appends:.0f} | {turns:.0f} |")
                    ceiling_items += 4 * threads * (per_thread // threads)
        finally:
            store.close()
    items = args.sessions * (args.warm + 2 * args.turns) * 2 + ceiling_items  # 2 items a turn
    print(
        f"`python benchmarks/turn_cost.py --sessions {args.sessions} --warm {args.warm} --turns {args.turns}"
        + (" --ceiling" if args.ceiling else "")
        + (f" --sync-mode {args.sync_mode}`" if args.sync_mode else "`")
    )
    print(
        f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {items:,} items in the file at the end)\n"
    )
    print(
        "| per turn (full read + 2 appends) | wall | CPU, the caller | CPU, the owner |\n|---|---:|---:|---:|"
    )
    print(f"| in the owner | {owner[0]:.2f} ms | {owner[1]:.2f} ms | (the same) |")
    print(f"| in a client | {client_wall:.2f} ms | {client_cpu:.2f} ms | {served:.2f} ms |")
    if rows:
        print("\nThe file's ceiling, threads of the owner each on its share of the sessions (turns/s):\n")
        print("| threads | 2 appends a turn | full read + 2 appends |\n|---:|---:|---:|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
