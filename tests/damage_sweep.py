"""Damage every file of a store, one case at a time, and classify what a user then sees.

A store of six sessions (40 items each, one of them popped once) is written once.
Each case copies it, flips 16 bytes at one offset of one of its five files (or
truncates one), then opens the copy and reads every session through the public
API, and runs `verify`. The case is:

* harmless: every session reads back identical, and verify is ok;
* reported: a `CitadelSessionError` at open or on a read, or verify not ok, and no
  read returned different data before that;
* silent: a read returned different data (a shortened history) without an error;
* raw: an exception that is not a `CitadelSessionError` reached the caller.

Run it as a script for the table (``python tests/damage_sweep.py --offsets 200``);
tests/test_damage.py runs it and asserts no case is silent or raw.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from citadeldb_openai_agents import CitadelSessionError, CitadelSessionStore

KEY = "correct horse battery staple"
FILES = ["", ".citadel-keys", ".citadel-regions", ".citadel-atomkeys", ".citadel-audit"]
SESSIONS = 6
ITEMS = 40
FLIP = 16
TRUNCATIONS = (0.0, 0.25, 0.5, 0.75, 0.99)


@dataclass
class Case:
    file: str
    damage: str
    outcome: str
    detail: str = ""


@dataclass
class Sweep:
    cases: list[Case] = field(default_factory=list)

    def counts(self) -> dict[str, Counter[str]]:
        table: dict[str, Counter[str]] = {name or ".cdl": Counter() for name in FILES}
        for case in self.cases:
            table[case.file or ".cdl"][case.outcome] += 1
        return table

    def table(self) -> str:
        lines = ["| file | cases | harmless | reported | silent | raw |", "|---|---:|---:|---:|---:|---:|"]
        for name, counts in self.counts().items():
            outcomes = [counts[o] for o in ("harmless", "reported", "silent", "raw")]
            lines.append(f"| `{name}` | {sum(outcomes)} | " + " | ".join(map(str, outcomes)) + " |")
        return "\n".join(lines)


def conversation(session: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"session {session} says {n}"}
        for n in range(ITEMS)
    ]


async def write_original(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The store every case damages a copy of; returns what each session holds."""
    held = {}
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        for number in range(SESSIONS):
            session = store.session(f"s{number}")
            items = conversation(number)
            for start in range(0, ITEMS, 2):
                await session.add_items(items[start : start + 2])
            held[session.session_id] = items
        # One pop, so the catalog records an erasure as well.
        last = store.session("s0")
        popped = await last.pop_item()
        held["s0"] = held["s0"][:-1]
        assert popped is not None
    return held


async def use(path: Path, held: dict[str, list[dict[str, Any]]]) -> str:
    """Open, read everything, verify; return the outcome (see the module docstring)."""
    different = False
    try:
        with CitadelSessionStore(path, KEY) as store:
            for session_id, items in held.items():
                session = store.session(session_id)
                if await session.get_items() != items or await session.get_items(limit=3) != items[-3:]:
                    different = True
            if sorted(store.session_ids()) != sorted(held):
                different = True
            report = store.verify()
    except CitadelSessionError:
        return "silent" if different else "reported"
    except Exception as exc:
        return f"raw:{type(exc).__module__}.{type(exc).__name__}"
    if different:
        return "silent"
    return "harmless" if report.ok else "reported"


def damaged_copy(original: Path, directory: Path, suffix: str, damage: str) -> Path:
    shutil.copytree(original.parent, directory)
    target = directory / (original.name + suffix)
    data = bytearray(target.read_bytes())
    kind, _, where = damage.partition("@")
    if kind == "flip":
        offset = min(int(where), max(0, len(data) - FLIP))
        for index in range(offset, min(offset + FLIP, len(data))):
            data[index] ^= 0xFF
    else:
        del data[int(where) :]
    target.write_bytes(bytes(data))
    return directory / original.name


def damages(size: int, offsets: int) -> list[str]:
    flips = sorted(
        {f"flip@{(size * k) // offsets}" for k in range(offsets)}, key=lambda d: int(d.split("@")[1])
    )
    cuts = sorted({f"truncate@{int(size * fraction)}" for fraction in TRUNCATIONS})
    return flips + cuts


async def sweep(workdir: Path, offsets: int, files: list[str] = FILES) -> Sweep:
    original = workdir / "original" / "agent.cdl"
    original.parent.mkdir(parents=True)
    held = await write_original(original)
    result = Sweep()
    number = 0
    for suffix in files:
        size = (original.parent / (original.name + suffix)).stat().st_size
        for damage in damages(size, offsets):
            number += 1
            copy = damaged_copy(original, workdir / f"case-{number}", suffix, damage)
            outcome = await use(copy, held)
            kind, _, detail = outcome.partition(":")
            result.cases.append(Case(suffix, damage, kind, detail))
            shutil.rmtree(copy.parent)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--offsets", type=int, default=40, help="flips per file (default 40)")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        started = time.monotonic()
        result = asyncio.run(sweep(Path(scratch), args.offsets))
    print(result.table())
    print(f"\n{len(result.cases)} cases in {time.monotonic() - started:.0f} s")
    for case in result.cases:
        if case.outcome in ("silent", "raw"):
            print(f"  {case.outcome}: {case.file or '.cdl'} {case.damage} {case.detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
