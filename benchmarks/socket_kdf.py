"""What testing one passphrase guess costs: against the file, and against the owner's socket.

    python benchmarks/socket_kdf.py              # 7 rounds of each, every argon2 profile
    python benchmarks/socket_kdf.py --rounds 15

A fake client of a served file gets the owner's proof (serving/handshake.py); testing a
guess against it costs one derivation of the socket's key (serving/address.py, scrypt).
A guess against the file costs one open: Citadel's argon2id at the profile the file was
made with. The socket must be no cheaper than the file for every profile, so for each
one this creates a file with that profile and times opening it with the passphrase
(`citadeldb.connect`, closed at once), and times deriving the socket's key, interleaved
round by round (the machine's speed drifts). It prints the min and the median of each
and the ratios socket/file: both must be at least 1.0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import citadeldb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from citadeldb_openai_agents.serving.address import SCRYPT_COST, Secret, SocketKey

PROFILES = ("iot", "desktop", "server")
KEY = "a passphrase guess"


def timed(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    print(f"scrypt {SCRYPT_COST}; {rounds} rounds each, interleaved")
    print(
        f"{'profile':8} {'file min':>9} {'file med':>9} {'sock min':>9} {'sock med':>9} {'min/min':>8} {'med/med':>8}"
    )
    with tempfile.TemporaryDirectory() as scratch:
        for profile in PROFILES:
            path = str(Path(scratch) / f"{profile}.cdl")
            options = citadeldb.DatabaseOptions(argon2_profile=profile)
            citadeldb.connect(path, key=KEY, options=options).close()
            files: list[float] = []
            sockets: list[float] = []
            for _ in range(rounds):
                files.append(timed(lambda path=path: citadeldb.connect(path, key=KEY).close()))
                sockets.append(
                    timed(lambda path=path: SocketKey(Secret(KEY.encode()), path).derive(bytes(32)))
                )
            file_min, file_med = min(files), statistics.median(files)
            sock_min, sock_med = min(sockets), statistics.median(sockets)
            print(
                f"{profile:8} {file_min * 1000:7.0f}ms {file_med * 1000:7.0f}ms {sock_min * 1000:7.0f}ms "
                f"{sock_med * 1000:7.0f}ms {sock_min / file_min:8.2f} {sock_med / file_med:8.2f}"
            )


if __name__ == "__main__":
    main()
