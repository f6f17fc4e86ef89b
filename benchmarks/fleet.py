"""Turns per second through nginx with 1, 2 and 3 shards (examples/fleet), on this machine.

    python benchmarks/fleet.py                      # 1, 2, 3 shards; 20 clients, 600 turns each: ~2 min
    python benchmarks/fleet.py --shards 1,3 --requests 200

For each shard count, examples/fleet/run.py starts the fleet (uvicorn --workers 2 per
shard, nginx in front, 127.0.0.1); --clients threads send --requests turns to --sessions
sessions, after a warm-up of one turn per session. A request whose first hop is not the
session's shard is answered 421 by the guard and sent on by nginx: the share of requests
that took that second hop is counted from nginx's access log. Requests per second, p50 and
p95. Every shard shares the machine's cores with the others and with this process, so
more shards on one machine add processes, not capacity: on real machines, one shard each,
a fleet's throughput is about the shards' count times one shard's (each is one file's
owner: docs/deployment.md), less the second hops nginx pays.

Timing, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = HERE.parent / "examples" / "fleet" / "run.py"
LOG_FORMAT = "    log_format hops '$upstream_status';\n    access_log {dir}/access.log hops;"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", default="1,2,3", help="shard counts to measure, comma-separated")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=600, help="timed turns per fleet")
    parser.add_argument("--sessions", type=int, default=40)
    args = parser.parse_args()
    print(f"`python benchmarks/fleet.py` (2 cores, load {os.getloadavg()[0]:.1f})\n")
    print("| shards | requests/s | p50 | p95 | second hops | errors |")
    print("|---|---|---|---|---|---|")
    for count in [int(n) for n in args.shards.split(",")]:
        row = measure(count, args)
        print(
            f"| {count} | {row['rps']:.1f} | {row['p50']:.1f} ms | {row['p95']:.1f} ms | "
            f"{row['hops']:.0%} | {row['errors']} |",
            flush=True,
        )
    return 0


def measure(count: int, args: argparse.Namespace) -> dict[str, float]:
    names = [chr(ord("a") + n) for n in range(count)]
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        port = _free_ports(count + 1)
        fleet = subprocess.Popen(
            [sys.executable, str(RUN), "--shards", ",".join(names), "--port", str(port), "--dir", str(root)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "FLEET_NGINX_LOG": LOG_FORMAT},
        )
        try:
            assert fleet.stdout is not None and fleet.stdout.readline().strip() == "ready"
            sessions = [f"bench-{n}" for n in range(args.sessions)]
            token = (root / "token").read_text().strip()  # run.py's: the app wants it on every turn
            with ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(lambda s: _turn(port, s, token), sessions))  # warm-up: every session exists
                log = root / "access.log"
                warm = len(log.read_text().splitlines()) if log.exists() else 0
                started = time.perf_counter()
                results = list(
                    pool.map(lambda n: _turn(port, random.choice(sessions), token), range(args.requests))
                )
                elapsed = time.perf_counter() - started
            lines = log.read_text().splitlines()[warm:] if log.exists() else []
        finally:
            fleet.send_signal(signal.SIGTERM)
            try:
                fleet.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(fleet.pid, signal.SIGKILL)
    times = sorted(seconds for status, seconds in results if status == 200)
    return {
        "rps": args.requests / elapsed,
        "p50": statistics.median(times) * 1000,
        "p95": times[int(len(times) * 0.95) - 1] * 1000,
        "hops": sum("421" in line for line in lines) / max(1, len(lines)),
        "errors": sum(status != 200 for status, _ in results),
    }


def _turn(port: int, session_id: str, token: str) -> tuple[int, float]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"session_id": session_id, "text": "hello"})
    connection.request("POST", "/turn", body, {"Authorization": f"Bearer {token}"})
    response = connection.getresponse()
    response.read()
    return response.status, time.perf_counter() - started


def _free_ports(count: int) -> int:
    for _ in range(100):
        base = random.randrange(20000, 40000)
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise SystemExit("no free ports")


if __name__ == "__main__":
    sys.exit(main())
