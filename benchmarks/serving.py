"""Many processes on one file: what going through the owner costs, and how long a handover takes.

    python benchmarks/serving.py            # full run: ~2 min on 2 cores
    python benchmarks/serving.py --quick    # tiny sizes, 2 workers only: ~35 s smoke test
    python benchmarks/serving.py --only handover --items 50000 --sessions 1000   # a bigger file

Three measurements, each on a file of its own:

* Latency, client against owner. This process fills a file (one session of
  --items items among --sessions others of --per-session items), owns it, and
  starts another process that opens the same file and so becomes its client. Each
  of ``add_items`` (one turn), ``get_items(limit=20)`` and ``pop_item`` on the big
  session is timed --reps times in each process, in pairs (one call in the owner,
  one in the client, the order alternating): the machine's speed drifts by more
  than a client adds over the seconds a block of calls takes. "Added" is the median
  of the pairs' differences.
* Throughput. The agent app (serving_app.py: one `Runner.run` turn per request, a
  `ScriptedModel`) under ``uvicorn --workers N`` on 127.0.0.1, for each N of
  --workers, once on a Citadel file and once on `agents.SQLiteSession`; --clients
  threads send --requests turns (after a warm-up of two per client) to 40 sessions.
  Requests per second, p50 and p95 of a request, and the CPU time each server process
  spent per request (Linux /proc): under Citadel the busiest is the owner. Beside each
  row, the machine's 1-minute load average as the timed requests begin, and the CPU that other
  work took during them, in cores (/proc/stat's busy time less the servers' and this process's):
  served throughput depends on the load beside it far more than on the backend, so a figure
  means little without it. --busy N runs N CPU-bound processes throughout, a stated load. With
  --sidecar, a third server: the ``serve`` command owns the file and every worker is
  its client. The last column is this process's CPU per request, sending the load: on
  a small machine it shares the cores with the servers. --sync-mode opens the Citadel
  files with that durability (Citadel's default is "full"). With --commit-stats, the
  owning worker times every Citadel commit it runs during the timed requests
  (serving_app.py; not with the sidecar, whose owner is the serve command):
  how many a second, how long each takes, of which on a CPU and waiting for one, and
  how many are under way at once on average (their total time over the window's).
* Handover. Another process owns a file (the default argon2 profile, so the KDF is
  paid as in production); this one is its client. The owner is SIGKILLed; the time
  runs from the kill to this process's next successful ``add_items``, the takeover
  (opening the file, the KDF, the open-time audit, serving it) included. On new
  files, and on the latency measurement's file (the audit reads every row).

Timing, not a test: nothing here asserts a time. Prints markdown tables and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KEY = "benchmark passphrase, not a secret"
SUBJECT = "user-subject"
SESSIONS_UNDER_LOAD = [f"user-{number:02d}" for number in range(40)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    env.update(extra)
    return env


def _summary(milliseconds: list[float]) -> tuple[float, float]:
    ordered = sorted(milliseconds)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


# -- latency: the same calls in the owner and in a client --------------------------------


def _calls(session: Any) -> dict[str, Callable[[], Awaitable[Any]]]:
    """The three timed operations on the big session."""
    import workload

    turns = workload.turns_from(1_000_000 + 1_000_000 * (os.getpid() % 1000))
    return {
        "add_items (1 turn)": lambda: session.add_items(next(turns)),
        "get_items(limit=20)": lambda: session.get_items(limit=20),
        "pop_item": session.pop_item,
    }


async def _timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


async def serve_timed_calls(path: Path) -> None:
    """The client's side: open the file (as a client of its owner), then time each call named on stdin."""
    from citadeldb_openai_agents import CitadelSessionStore

    store = CitadelSessionStore(path, KEY)
    try:
        calls = _calls(store.session(SUBJECT))
        print(json.dumps({"served by": store.served_by}), flush=True)
        for line in sys.stdin:
            print(json.dumps(await _timed(calls[line.strip()])), flush=True)
    finally:
        store.close()


async def fill(path: Path, items: int, sessions: int, per_session: int) -> None:
    import workload

    from citadeldb_openai_agents import CitadelSessionStore

    with CitadelSessionStore(path, KEY) as store:
        data = workload.items(items)
        subject = store.session(SUBJECT)
        for at in range(0, len(data), 100):
            await subject.add_items(data[at : at + 100])
        others = workload.items(per_session)
        for number in range(sessions):
            await store.session(f"user-{number:04d}").add_items(others)


def latency(args: argparse.Namespace, directory: Path) -> list[str]:
    path = directory / "latency.cdl"
    asyncio.run(fill(path, args.items, args.sessions, args.per_session))
    owner, client, added = asyncio.run(paired(path, args.reps))
    rows = [
        "| call | owner p50 | owner p95 | client p50 | client p95 | added: p50 of pairs | p25..p75 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in owner:
        owner_p50, owner_p95 = _summary(owner[name])
        client_p50, client_p95 = _summary(client[name])
        q1, _, q3 = statistics.quantiles(added[name], n=4)
        rows.append(
            f"| {name} | {owner_p50:.2f} ms | {owner_p95:.2f} ms | {client_p50:.2f} ms | {client_p95:.2f} ms "
            f"| {statistics.median(added[name]):+.3f} ms | {q1:+.2f}..{q3:+.2f} |"
        )
    return rows


async def paired(
    path: Path, reps: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    """Each call timed in this process (the owner) and, right before or after, in a client.

    The machine's speed drifts by more than a client adds over the seconds a block of
    calls takes, so the calls are paired instead: one in the owner, one in the client,
    the order alternating, and the cell is the median of the pairs' differences. The
    session's length stays the same across a round (two adds, two pops).
    """
    from citadeldb_openai_agents import CitadelSessionStore

    store = CitadelSessionStore(path, KEY)
    child = subprocess.Popen(
        [sys.executable, __file__, "--time-calls", str(path)],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert store.served_by is None, "this process does not own the file"
        hello = json.loads(child.stdout.readline())
        assert hello["served by"] == os.getpid(), "the other process is not a client of this one"
        calls = _calls(store.session(SUBJECT))
        owner: dict[str, list[float]] = {name: [] for name in calls}
        client: dict[str, list[float]] = {name: [] for name in calls}
        for rep in range(reps):
            for name, call in calls.items():
                if rep % 2:
                    owner[name].append(await _timed(call))
                child.stdin.write(name + "\n")
                child.stdin.flush()
                client[name].append(float(json.loads(child.stdout.readline())))
                if not rep % 2:
                    owner[name].append(await _timed(call))
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        store.close()
    added = {name: [c - o for o, c in zip(owner[name], client[name], strict=True)] for name in owner}
    return owner, client, added


# -- throughput: the agent app under uvicorn --workers N ---------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _post(port: int, session_id: str, text: str) -> float:
    """One turn; its milliseconds (raises on anything but 200)."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", f"/turn?session={session_id}", body=text.encode())
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"a turn failed: HTTP {response.status}")
    return (time.perf_counter() - start) * 1000


def _wait_until_up(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the server exited at start")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/")
            connection.getresponse().read()
            connection.close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start in 120 s")


def drive(port: int, clients: int, requests: int) -> tuple[float, list[float]]:
    """`clients` threads, each one request at a time to its own sessions: (seconds, latencies)."""
    latencies: list[float] = []
    sent = iter(range(requests))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(number: int) -> None:
        mine = SESSIONS_UNDER_LOAD[number::clients] or [f"extra-{number}"]
        turn = 0
        while True:
            with lock:
                if next(sent, None) is None:
                    return
            try:
                elapsed = _post(port, mine[turn % len(mine)], f"turn {turn} of client {number}")
            except BaseException as exc:  # reported once the threads are done
                errors.append(exc)
                return
            with lock:
                latencies.append(elapsed)
            turn += 1

    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start, latencies


def serve_and_drive(
    backend: str, workers: int, args: argparse.Namespace, directory: Path
) -> tuple[str, str | None]:
    """The server's throughput row, and with --commit-stats (Citadel, the first worker owning) its owner's commits."""
    run = directory / f"{backend}-{workers}"
    run.mkdir()
    port = _free_port()
    env = _env(BENCH_BACKEND=backend, BENCH_SQLITE_PATH=str(run / "agent.sqlite"))
    env.update(CITADEL_PATH=str(run / "agent.cdl"), CITADEL_KEY=KEY, CITADEL_ARGON2_PROFILE="iot")
    if args.sync_mode:
        env["CITADEL_SYNC_MODE"] = args.sync_mode
    timed_commits = args.commit_stats and backend == "citadel"  # the sidecar's owner is not the app
    if timed_commits:
        (run / "commits").mkdir()
        env["BENCH_COMMIT_STATS"] = str(run / "commits")
    sidecar = None
    if backend == "sidecar":
        # `python -m citadeldb_openai_agents serve` owns the file: every worker is its client.
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "citadeldb_openai_agents", "serve"],
            cwd=run,
            env={**env, "BENCH_BACKEND": "citadel"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert sidecar.stdout is not None
        if not sidecar.stdout.readline().startswith(b"serving"):
            raise RuntimeError("the serve command did not start")
        env["BENCH_BACKEND"] = "citadel"
    server = [sys.executable, "-m", "uvicorn", "--workers", str(workers), "--host", "127.0.0.1"]
    options = ["--port", str(port), "--app-dir", str(HERE), "--no-access-log", "--log-level", "warning"]
    process = subprocess.Popen(
        [*server, *options, "serving_app:app"],
        cwd=run,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    groups = [process.pid] + ([sidecar.pid] if sidecar is not None else [])
    try:
        _wait_until_up(port, process)
        drive(port, args.clients, 2 * args.clients)  # warm-up: every worker started, sessions opened
        load_average = os.getloadavg()[0]
        before = {pid: cpu for group in groups for pid, cpu in _cpu_seconds(group).items()}
        busy = _machine_busy_seconds()
        driving = time.process_time()
        window = time.monotonic()
        seconds, latencies = drive(port, args.clients, args.requests)
        window_end = time.monotonic()
        driving = time.process_time() - driving  # this process's, sending the requests
        busy = _machine_busy_seconds() - busy
        after = {pid: cpu for group in groups for pid, cpu in _cpu_seconds(group).items()}
    finally:
        for group in groups:
            os.killpg(group, signal.SIGTERM)
        process.wait(60)
        if sidecar is not None:
            sidecar.wait(60)
    p50, p95 = _summary(latencies)
    label = {"citadel": "citadel", "sidecar": "citadel, `serve` sidecar", "sqlite": "SQLiteSession"}[backend]
    # Each worker's CPU per request served by the whole server, busiest first: under Citadel
    # the busiest is the owner, which runs every session call (with a sidecar, the sidecar).
    cpu = sorted(((after[pid] - before.get(pid, 0.0)) * 1000 / len(latencies) for pid in after), reverse=True)
    shares = ", ".join(f"{ms:.1f}" for ms in cpu[: len(groups) - 1 + workers]) if cpu else "-"
    # Every CPU-second the machine spent in the window that neither the servers nor this process
    # spent: other work, in cores (the machine's load beside the benchmark, measured, not assumed).
    ours = sum(after[pid] - before.get(pid, 0.0) for pid in after) + driving
    other = max(0.0, busy - ours) / (window_end - window)
    row = (
        f"| {label} | {workers} | {len(latencies) / seconds:.1f} | {p50:.1f} ms | {p95:.1f} ms "
        f"| {sum(cpu):.1f} ms | {shares} | {driving * 1000 / len(latencies):.1f} ms "
        f"| {load_average:.2f} | {other:.2f} |"
    )
    return row, _commit_row(workers, run / "commits", window, window_end) if timed_commits else None


def _commit_row(workers: int, directory: Path, start: float, end: float) -> str:
    """The owner's commits during the timed requests: the worker that ran the most is the owner."""
    runs = [json.loads(path.read_text()) for path in directory.glob("*.json")]
    commits = [c for c in max(runs, key=len, default=[]) if start <= c[0] <= end]
    if not commits:
        return f"| {workers} | no commit timed | | | | |"
    seconds = end - start
    walls = [c[1] for c in commits]
    on_cpu = statistics.mean(c[2] for c in commits)
    waiting = statistics.mean(c[3] for c in commits)
    return (
        f"| {workers} | {len(commits) / seconds:.0f} | {statistics.median(walls):.2f} ms | {on_cpu:.2f} ms | {waiting:.2f} ms "
        f"| {statistics.mean(walls) - on_cpu - waiting:.2f} ms | {sum(walls) / 1000 / seconds:.1f} |"
    )


def _machine_busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy since boot, every core (Linux /proc/stat)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(group: int) -> dict[int, float]:
    """CPU seconds (user + system) of each live process of a process group, from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == group:  # the fields after the name: state, ppid, pgrp, ...
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def throughput(args: argparse.Namespace, directory: Path) -> list[str]:
    rows = [
        "| backend | workers | requests/s | p50 | p95 | CPU/request | per worker (busiest first) | the load's CPU "
        "| load average (1 min) | other work, cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    commit_rows = []
    backends = ("citadel", "sidecar", "sqlite") if args.sidecar else ("citadel", "sqlite")
    for workers in args.workers:
        for backend in backends:
            row, commit_row = serve_and_drive(backend, workers, args, directory)
            rows.append(row)
            if commit_row is not None:
                commit_rows.append(commit_row)
            print(f"measured: {backend}, {workers} worker(s)", file=sys.stderr, flush=True)
    if commit_rows:
        rows += [
            "",
            "The owning worker's Citadel commits during the timed requests (`remember_batch`; --commit-stats):",
            "",
            "| workers | commits/s | a commit, p50 | on a CPU, mean | waiting for a CPU, mean "
            "| the rest (disk, Citadel's lock, the GIL), mean | commits under way at once |",
            "|---|---|---|---|---|---|---|",
            *commit_rows,
        ]
    return rows


# -- handover: the owner SIGKILLed, until a client's next successful write ---------------


def hold(path: str) -> None:
    """Own the file (the default argon2 profile) until killed; say so on stdout."""
    from citadeldb_openai_agents import CitadelSessionStore

    CitadelSessionStore(path, KEY)
    print("owning", flush=True)
    threading.Event().wait()


async def one_handover(path: Path) -> float:
    import workload

    from citadeldb_openai_agents import CitadelSessionStore

    owner = subprocess.Popen(
        [sys.executable, __file__, "--hold", str(path)], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None and owner.stdout.readline() == "owning\n"
    store = CitadelSessionStore(path, KEY)
    try:
        assert store.served_by == owner.pid, "this process is not the owner's client"
        session = store.session(SUBJECT)
        held = len(await session.get_items())
        await session.add_items(workload.make_turn(0))
        start = time.perf_counter()
        owner.kill()
        await session.add_items(workload.make_turn(1))
        elapsed = (time.perf_counter() - start) * 1000
        assert store.served_by is None, "this process did not take the file over"
        added = len(workload.make_turn(0)) + len(workload.make_turn(1))
        assert len(await session.get_items()) == held + added
        for _ in range(added):  # the session as it was, for the next run on this file
            await session.pop_item()
        return elapsed
    finally:
        owner.wait()
        store.close()


def handover(args: argparse.Namespace, directory: Path) -> list[str]:
    rows = [
        "| handover (SIGKILL to next write), default argon2 profile | p50 | max | runs |",
        "|---|---|---|---|",
    ]
    # Taking a file over opens it, and the open-time audit reads every row: the file's size counts.
    items = args.items + args.sessions * args.per_session
    if not (directory / "latency.cdl").exists():  # --only handover
        asyncio.run(fill(directory / "latency.cdl", args.items, args.sessions, args.per_session))
    for what, paths in [
        ("a new file", [directory / f"handover-{rep}.cdl" for rep in range(args.handover_reps)]),
        (f"the latency file ({items:,} items)", [directory / "latency.cdl"] * args.handover_reps),
    ]:
        times = [asyncio.run(one_handover(path)) for path in paths]
        p50, _ = _summary(times)
        rows.append(f"| {what} | {p50:.0f} ms | {max(times):.0f} ms | {len(times)} |")
    return rows


# -- command line ------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 workers only: a smoke test")
    parser.add_argument("--items", type=int, default=10_000, help="items in the timed session")
    parser.add_argument("--sessions", type=int, default=300, help="other sessions in the file")
    parser.add_argument("--per-session", type=int, default=20, help="items in each other session")
    parser.add_argument("--reps", type=int, default=200, help="timed calls of each operation")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="uvicorn worker counts")
    parser.add_argument("--clients", type=int, default=20, help="concurrent HTTP clients")
    parser.add_argument("--requests", type=int, default=600, help="timed requests per server")
    parser.add_argument("--handover-reps", type=int, default=5, help="owners killed")
    parser.add_argument(
        "--only", choices=["latency", "throughput", "handover"], nargs="+", help="these measurements alone"
    )
    parser.add_argument(
        "--sidecar",
        action="store_true",
        help="also with the `serve` command owning the file, every worker a client",
    )
    parser.add_argument(
        "--sync-mode",
        choices=["full", "normal", "off"],
        help="durability of the throughput's Citadel files (default: full)",
    )
    parser.add_argument(
        "--commit-stats", action="store_true", help="time the owner's Citadel commits under the load"
    )
    parser.add_argument("--workdir", help="where the files go (default: a temporary directory)")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="run N CPU-bound processes throughout (a stated load beside the benchmark)",
    )
    parser.add_argument("--time-calls", help=argparse.SUPPRESS)  # the client's side of the latency
    parser.add_argument("--hold", help=argparse.SUPPRESS)  # the owner of the handover
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.time_calls:
        asyncio.run(serve_timed_calls(Path(args.time_calls)))
        return
    if args.hold:
        hold(args.hold)
        return
    if args.quick:
        args.items, args.sessions, args.per_session, args.reps = 200, 20, 10, 20
        args.workers, args.requests, args.handover_reps = [2], 60, 1
    command = " ".join(["python", "benchmarks/serving.py", *sys.argv[1:]])
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(args.busy)
    ]
    try:
        _measure(args, command)
    finally:
        for burner in burners:
            os.killpg(burner.pid, signal.SIGKILL)
            burner.wait()


def _measure(args: argparse.Namespace, command: str) -> None:
    with tempfile.TemporaryDirectory(prefix="serving-", dir=args.workdir) as scratch:
        directory = Path(scratch)
        sections = [
            (f"Latency, one session of {args.items:,} items among {args.sessions} others", latency),
            (f"Throughput, {args.clients} clients, {args.requests} requests per server", throughput),
            ("Handover", handover),
        ]
        busy = f", {args.busy} CPU-bound process(es) beside it" if args.busy else ""
        print(f"`{command}` ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}{busy})\n")
        for title, measure in sections:
            if args.only and measure.__name__ not in args.only:
                continue
            print(f"{title}:\n")
            print("\n".join(measure(args, directory)) + "\n", flush=True)


if __name__ == "__main__":
    main()
