"""Compaction under SIGKILL: a kill at any point of a replacement leaves the old suffix or the new one.

A child process (forked by test_crash.py's `Writers`, from a helper that imported the
package once) replaces a session's suffix again and again through the SDK's hook:
a snapshot of the current suffix, then ``replace_suffix(0, next generation)``. It prints
``start g`` before a replacement and ``ack g`` after it. The parent kills it at a random
moment, opens the file as a user would, and checks that the session holds its fixed
prefix followed by exactly one whole generation: the last acknowledged one, or the one in
flight; never neither, never both, never a mix. Citadel's check of every item and of the
pages (`verify`) must pass: an old item left stored but hidden, or half erased, fails it.

The default run kills 4 replacers; ``python -m pytest -m slow tests/test_compaction_crash.py``
kills 200. ``CRASH_SEED=<n>`` replays the kill delays (the seed is in the failure message; where a kill lands also depends on timing).
"""

from __future__ import annotations

import asyncio
import os
import random
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_crash import Writers

from citadeldb_openai_agents import CitadelSessionStore
from citadeldb_openai_agents.compaction import snapshot_type

from conftest import KEY

SESSION = "compacted"
PREFIX = [{"role": "user", "content": f"kept {i}"} for i in range(3)]

REPLACERS = textwrap.dedent(
    """
    import asyncio, os, sys
    from citadeldb_openai_agents import CitadelSession, CitadelSessionStore  # the SDK too, once

    path, key, session_id = sys.argv[1], sys.argv[2], sys.argv[3]

    def generation(g):
        # Mostly a turn's worth; every seventh spans a segment boundary (256 items a segment).
        size = 300 if g % 7 == 3 else 1 + (g * 37) % 40
        return [{"role": "assistant", "content": f"generation {g} item {i}", "at": [g, i, size]}
                for i in range(size)]

    async def replace_forever():
        store = CitadelSessionStore(path, key)
        session = store.session(session_id)
        current = [item for item in await session.get_items() if "at" in item]
        g = current[-1]["at"][0]
        while True:
            snapshot = await session._get_compaction_snapshot(len(current))
            assert snapshot.items == current and not snapshot.complete, "the snapshot is not the suffix"
            g += 1
            print(f"start {g}", flush=True)
            current = generation(g)
            assert await snapshot.replace_suffix(0, current)
            print(f"ack {g}", flush=True)

    print("imported", flush=True)
    for line in iter(sys.stdin.readline, ""):
        command, argument = line.split()
        if command == "start":
            pid = os.fork()
            if pid == 0:
                try:
                    asyncio.run(replace_forever())
                except BaseException as error:
                    print("error", repr(error).replace("\\n", " "), flush=True)
                os._exit(1)
            print(f"pid {pid}", flush=True)
        elif command == "reap":
            os.waitpid(int(argument), 0)
            print("reaped", flush=True)
    """
)


def generation(g: int) -> list[dict[str, Any]]:
    """The same generation the replacers write."""
    size = 300 if g % 7 == 3 else 1 + (g * 37) % 40
    return [
        {"role": "assistant", "content": f"generation {g} item {i}", "at": [g, i, size]} for i in range(size)
    ]


def printed(lines: list[str], word: str) -> list[int]:
    # A line cut short by the kill says nothing.
    return [int(line.split()[1]) for line in lines if line.startswith(f"{word} ") and line.endswith("\n")]


def held_generation(store: CitadelSessionStore, context: str) -> int:
    """The one whole generation the session holds after its prefix (fails on anything else)."""
    items = asyncio.run(store.session(SESSION).get_items())
    assert items[: len(PREFIX)] == PREFIX, f"{context}: the prefix changed: {items[:5]}"
    suffix = items[len(PREFIX) :]
    assert suffix, f"{context}: neither the old suffix nor the new one is there"
    g = suffix[0]["at"][0]
    found = dict(Counter(item["at"][0] for item in suffix))
    assert suffix == generation(g), f"{context}: not exactly generation {g}: items per generation {found}"
    return int(g)


def run_kills(tmp_path: Path, kills: int) -> Counter[str]:
    seed = int(os.environ.get("CRASH_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    path = tmp_path / "compaction.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        asyncio.run(store.session(SESSION).add_items(PREFIX + generation(0)))
    outcomes: Counter[str] = Counter()
    held = 0
    replacers = Writers(path, tmp_path / "replacers.log", REPLACERS, (SESSION,))
    try:
        for run in range(kills):
            lines = replacers.start_and_wait_for_first_ack(run)
            time.sleep(rng.uniform(0.0, 0.4))
            lines += replacers.kill()
            acked, started = printed(lines, "ack"), printed(lines, "start")
            context = f"kill {run + 1}/{kills} (CRASH_SEED={seed})"
            with CitadelSessionStore(path, KEY) as store:
                found = held_generation(store, context)
                report = store.verify()  # every item Citadel holds is read back; pages checked
                assert report.ok, f"{context}: {report}"
                record = store._file._local._layout.state(SESSION).record
                assert record.replacing is None and record.erasing == [], f"{context}: {record}"
            in_flight = started[-1] if started and started[-1] not in acked else None
            assert found in {acked[-1], in_flight}, f"{context}: generation {found}, acked {acked[-3:]}"
            if in_flight is None:
                outcomes["between replacements"] += 1
            else:
                outcomes["in flight: old suffix" if found == acked[-1] else "in flight: new suffix"] += 1
            held = found
    finally:
        replacers.close()
    assert held > kills, "the replacers barely replaced"
    print(f"\ncompaction crash run (CRASH_SEED={seed}): {kills} kills, {dict(outcomes)}")
    return outcomes


pytestmark = pytest.mark.skipif(snapshot_type() is None, reason="this SDK has no compaction hook")


def test_a_replacement_killed_4_times_leaves_the_old_suffix_or_the_new_one(tmp_path: Path) -> None:
    outcomes = run_kills(tmp_path, kills=4)
    assert outcomes["in flight: old suffix"] + outcomes["in flight: new suffix"] > 0, outcomes


@pytest.mark.slow
def test_a_replacement_killed_200_times_leaves_the_old_suffix_or_the_new_one(tmp_path: Path) -> None:
    outcomes = run_kills(tmp_path, kills=200)
    assert outcomes["in flight: old suffix"] > 0 and outcomes["in flight: new suffix"] > 0, outcomes
