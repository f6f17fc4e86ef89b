"""How fast `python -m citadeldb_openai_agents import` moves a 10,000-item source file.

    python benchmarks/import_speed.py                  # 1 session x 10,000 and 50 x 200, 3 rounds each
    python benchmarks/import_speed.py --rounds 1       # one round each
    python benchmarks/import_speed.py --original       # the same from files citadeldb-openai-agents 2.x wrote

The source is written by the SDK's own `SQLiteSession.add_items` (tests/sdk_sources.py:
questions, reasoning, function calls and their outputs, replies) or, with --original, by
citadeldb-openai-agents 2.7.0 itself in its own virtual environment (tests/legacy_files/make.py:
the same kinds of items, MockEmbedder, region 'sessions'; the import embeds with the target's
`mock`, the default). Each round imports it
into a new database (argon2 "iot", the default sync mode: every chunk fsynced) with the
real command in a subprocess, timing the whole command (interpreter start and opening the
file included), then into another with the library call `import_file`, timing the import
alone. Prints items per second; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "legacy_files"))

from make import KEY as ORIGINAL_KEY
from make import generate_sized

from citadeldb_openai_agents import CitadelSessionStore, import_file, import_original

from sdk_sources import write_sqlite_source

KEY = "benchmark passphrase, not a secret"


def one_round(source: Path, scratch: Path, number: int, original: bool) -> tuple[float, float]:
    """(seconds for the command, seconds for the library call alone) for one import."""
    command_db, library_db = (
        scratch / f"{source.stem}-{kind}-{number}.cdl" for kind in ("command", "library")
    )
    for path in (command_db, library_db):
        CitadelSessionStore(path, KEY, argon2_profile="iot").close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    env |= {"CITADEL_PATH": str(command_db), "CITADEL_KEY": KEY}
    if original:
        env["CITADEL_SOURCE_KEY"] = ORIGINAL_KEY
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", "import", str(source), "--json"],
        env=env,
        check=True,
        capture_output=True,
    )
    command = time.perf_counter() - started
    with CitadelSessionStore(library_db, KEY) as store:
        started = time.perf_counter()
        if original:
            import_original(store, source, ORIGINAL_KEY)
        else:
            import_file(store, source)
        library = time.perf_counter() - started
    return command, library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--original", action="store_true", help="sources written by citadeldb-openai-agents 2.7.0"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        for sessions, items in ((1, 10_000), (50, 200)):
            if args.original:
                source = scratch / f"original-{sessions}x{items}.cdl"
                generate_sized(source, sessions, items)
            else:
                source = scratch / f"source-{sessions}x{items}.db"
                write_sqlite_source(source, sessions, items)
            total = sessions * items
            rounds = [one_round(source, scratch, n, args.original) for n in range(args.rounds)]
            command = statistics.median(r[0] for r in rounds)
            library = statistics.median(r[1] for r in rounds)
            print(
                f"{'2.x file, ' if args.original else ''}{sessions} x {items:,} items: the command {command:.2f} s ({total / command:,.0f} items/s), "
                f"the import alone {library:.2f} s ({total / library:,.0f} items/s); "
                f"median of {args.rounds} round(s)"
            )


if __name__ == "__main__":
    main()
