"""Session backends side by side: how much slower is encrypted?

    python benchmarks/sessions.py            # full run: ~30 min on 2 shared cores, peer included
    python benchmarks/sessions.py --quick    # N=100 and 10x10, one round, no peer: ~30 s smoke test

Backends, each in a subprocess of its own, on the same deterministic items
(workload.py): agents.SQLiteSession on a file (the plaintext reference);
the SDK's EncryptedSession over it (needs `pip install cryptography`); the
published citadeldb-openai-agents 2.7.0, installed by this script into a
virtual environment of its own (it has our import name); raw citadeldb calls in
our layout (raw_citadel.py: the floor our adapter adds to); ours. The raw and
our backends also run without the asyncio.to_thread hop ("sync").

For N = 100, 1,000, 10,000 items in one session, and 200 sessions x 50 items in
one file, each worker times: opening a new file, add_items per turn (2-3
items), get_items(limit=20), get_items() full, pop_item, reopening the file and
the first get_items(limit=20), clear_session; and reports its peak RSS and the
bytes on disk after close and after clear. Rounds interleave the backends (the
machine is shared and noisy); a cell is the median of every sample of every
round, and the headline is its ratio to SQLiteSession in the same run.

Writes benchmarks/results/<timestamp>.json and prints markdown tables and the
targets of the issue, met or not. Timing, not a test: nothing here asserts a
time. A worker mode (--worker) runs one backend on one scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEER_REQUIREMENT = "citadeldb-openai-agents==2.7.0"
SUBJECT = "user-subject"

OPS = (
    "open new file",
    "fill",
    "add_items (1 turn)",
    "get_items(limit=20)",
    "get_items() full",
    "pop_item",
    "reopen + get_items(limit=20)",
    "clear_session",
)
ORDER = ("sqlite", "encrypted", "peer", "raw", "ours", "raw-sync", "ours-sync")


# -- worker: one backend, one scenario, in this process -------------------------------


async def _samples(call: Callable[[], Awaitable[Any]], reps: int, budget_s: float) -> list[float]:
    """Milliseconds per call; stops early (after 3) once the calls have taken `budget_s`."""
    gc.collect()
    times: list[float] = []
    spent = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        await call()
        elapsed = time.perf_counter() - start
        times.append(elapsed * 1000)
        spent += elapsed
        if spent > budget_s and len(times) >= 3:
            break
    return times


def _disk(directory: Path) -> dict[str, int]:
    """Bytes of the file and of each companion file (everything in its directory)."""
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}


async def run_scenario(backend: Any, config: dict[str, Any]) -> dict[str, Any]:
    import workload

    work = Path(config["workdir"])
    reps, budget = config["reps"], config["budget_s"]
    ops: dict[str, list[float]] = {op: [] for op in OPS}

    for k in range(config["open_reps"]):
        directory = work / f"open-{k}"
        directory.mkdir()
        start = time.perf_counter()
        backend.open(directory)
        backend.session(SUBJECT)
        ops["open new file"].append((time.perf_counter() - start) * 1000)
        backend.close()
        gc.collect()
        shutil.rmtree(directory)

    directory = work / "main"
    directory.mkdir()
    backend.open(directory)
    start = time.perf_counter()
    sessions: list[Any] | None = None
    session: Any = None
    if config["kind"] == "single":
        subject_id = SUBJECT
        subject = backend.session(subject_id)
        data = workload.items(config["n"])
        for at in range(0, len(data), 100):
            await subject.add_items(data[at : at + 100])
        stored = len(data)
    else:
        subject_id = f"user-{config['sessions'] // 2:04d}"
        sessions = [backend.session(f"user-{i:04d}") for i in range(config["sessions"])]
        subject = sessions[config["sessions"] // 2]
        data = workload.items(config["per_session"])
        for at in range(0, len(data), 25):  # interleaved, as live traffic is (in two passes)
            for session in sessions:
                await session.add_items(data[at : at + 25])
        stored = len(data)
    ops["fill"].append((time.perf_counter() - start) * 1000)

    turns = workload.turns_from(1_000_000)
    added: list[int] = []

    async def add_turn() -> None:
        turn = next(turns)
        added.append(len(turn))
        await subject.add_items(turn)

    async def timed(op: str, call: Callable[[], Awaitable[Any]], count: int) -> None:
        ops[op] = await _samples(call, count, budget)
        if len(ops[op]) < count:
            cut[op] = f"{len(ops[op])} of {count}"

    cut: dict[str, str] = {}
    await timed("add_items (1 turn)", add_turn, reps)
    stored += sum(added)
    await timed("get_items(limit=20)", lambda: subject.get_items(limit=20), reps)
    # A full read of thousands of items is not a cheap operation: a quarter of the reps.
    await timed(
        "get_items() full", lambda: subject.get_items(), reps if stored <= 1_000 else max(5, reps // 4)
    )
    _check(
        len(await subject.get_items(limit=20)) == min(20, stored),
        "get_items(limit=20) returned too few items",
    )
    _check(len(await subject.get_items()) == stored, f"get_items() did not return the {stored} items stored")
    await timed("pop_item", lambda: subject.pop_item(), min(reps, max(1, stored - 20)))
    stored -= len(ops["pop_item"])
    # A session object may keep the file's engine alive (and a reopen free): drop them first.
    subject = sessions = session = None
    backend.close()
    disk_after_close = _disk(directory)

    for k in range(config["reopen_reps"]):
        if k:
            subject = None
            backend.close()
        gc.collect()
        start = time.perf_counter()
        backend.open(directory)
        subject = backend.session(subject_id)
        first = await subject.get_items(limit=20)
        ops["reopen + get_items(limit=20)"].append((time.perf_counter() - start) * 1000)
        _check(len(first) == min(20, stored), "the first read after reopening returned too few items")

    start = time.perf_counter()
    await subject.clear_session()
    ops["clear_session"].append((time.perf_counter() - start) * 1000)
    _check(await subject.get_items() == [], "clear_session left items behind")
    subject = None
    backend.close()
    disk_after_clear = _disk(directory)

    # Is the space a clear frees reused? Write as much again into another session, clear it.
    backend.open(directory)
    subject = backend.session("user-refill")
    for at in range(0, len(data), 100):
        await subject.add_items(data[at : at + 100])
    await subject.clear_session()
    subject = None
    backend.close()
    return {
        "ops": ops,
        "stored_at_end": stored,
        "cut_by_budget": cut,
        "disk_after_close": disk_after_close,
        "disk_after_clear": disk_after_clear,
        "disk_after_refill_clear": _disk(directory),
    }


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"the backend misbehaved, its numbers would mean nothing: {message}")


def worker(name: str, config: dict[str, Any], json_out: Path) -> None:
    sys.path.insert(0, str(HERE))
    import agents  # noqa: F401  (every backend's process holds the SDK: baselines compare)
    from backends import BACKENDS, Skipped

    result: dict[str, Any] = {"backend": name, "scenario": config["name"]}
    try:
        backend = BACKENDS[name]()
    except Skipped as exc:
        result["skipped"] = str(exc)
    else:
        result["label"] = backend.label
        result["version"] = getattr(backend, "version", None)
        result["rss_baseline_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result["loadavg_1min"] = [os.getloadavg()[0]]
        result.update(asyncio.run(run_scenario(backend, config)))
        result["rss_peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result["loadavg_1min"].append(os.getloadavg()[0])
    json_out.write_text(json.dumps(result))


# -- the peer's virtual environment ------------------------------------------------------


def peer_python(venv: Path, install: bool) -> tuple[Path | None, str]:
    """The peer venv's interpreter (created and installed on first use), or None and why."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('citadeldb-openai-agents'))"]
    if python.exists():
        found = subprocess.run(probe, capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip() == PEER_REQUIREMENT.split("==")[1]:
            return python, f"peer: {PEER_REQUIREMENT} from {venv}"
    if not install:
        return None, f"peer skipped: no {PEER_REQUIREMENT} in {venv} (run without --no-peer-install)"
    print(f"installing {PEER_REQUIREMENT} into {venv} (once) ...", file=sys.stderr, flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", PEER_REQUIREMENT],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()[-1:]
        return None, f"peer skipped: could not install {PEER_REQUIREMENT} into {venv} ({' '.join(detail)})"
    return peer_python(venv, install=False)


def default_peer_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "citadeldb-openai-agents" / f"bench-peer-{PEER_REQUIREMENT.split('==')[1]}"


# -- orchestration ---------------------------------------------------------------------


def scenarios(args: argparse.Namespace) -> list[dict[str, Any]]:
    common = {
        "reps": args.reps,
        "budget_s": args.budget,
        "open_reps": args.open_reps,
        "reopen_reps": args.reopen_reps,
    }
    out = [{"name": f"N={n:,}", "kind": "single", "n": n, **common} for n in args.sizes]
    if args.sessions:
        name = f"{args.sessions}x{args.per_session}"
        out.append(
            {
                "name": name,
                "kind": "many",
                "sessions": args.sessions,
                "per_session": args.per_session,
                **common,
            }
        )
    return out


def run_worker(
    python: Path, name: str, config: dict[str, Any], workdir: Path, timeout: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"{name}-", dir=workdir) as scratch:
        out = Path(scratch) / "result.json"
        files = Path(scratch) / "files"
        files.mkdir()
        command = [
            str(python),
            str(HERE / "sessions.py"),
            "--worker",
            name,
            "--config",
            json.dumps({**config, "workdir": str(files)}),
            "--json-out",
            str(out),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            return {"backend": name, "scenario": config["name"], "error": f"timed out after {timeout:.0f} s"}
        if done.returncode != 0 or not out.exists():
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            return {"backend": name, "scenario": config["name"], "error": f"exit {done.returncode}: {tail}"}
        return json.loads(out.read_text())


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    notes: list[str] = []
    pythons = {name: Path(sys.executable) for name in args.backends}
    if "peer" in args.backends:
        python, note = peer_python(args.peer_venv, install=not args.no_peer_install)
        notes.append(note)
        if python is None:
            args.backends.remove("peer")
        else:
            pythons["peer"] = python
    if args.no_peer:
        notes.append(f"peer left out ({'--quick' if args.quick else '--no-peer'})")
    workdir = Path(args.workdir or tempfile.gettempdir())
    runs: list[dict[str, Any]] = []
    started = time.time()
    for round_index in range(args.rounds):
        for scenario in scenarios(args):
            # Rotate the order each round, so no backend always runs first (or last).
            shift = round_index % len(args.backends)
            for name in args.backends[shift:] + args.backends[:shift]:
                if name == "peer" and not _peer_runs(args, scenario, round_index):
                    continue
                t0 = time.time()
                result = run_worker(pythons[name], name, scenario, workdir, args.worker_timeout)
                result["round"] = round_index
                runs.append(result)
                status = result.get("error") or result.get("skipped") or "ok"
                print(
                    f"round {round_index + 1}/{args.rounds} {scenario['name']:>9} {name:<10} "
                    f"{time.time() - t0:6.1f} s  {status}",
                    file=sys.stderr,
                    flush=True,
                )
    if "peer" in args.backends:
        rounds = min(args.peer_rounds, args.rounds)
        larger = [s["name"] for s in scenarios(args) if not _peer_runs(args, s, 0)]
        notes.append(
            f"peer: {PEER_REQUIREMENT} in {rounds} of {args.rounds} round(s)"
            + (
                f"; not run on {', '.join(larger)} (--peer-max-items {args.peer_max_items:,})"
                if larger
                else ""
            )
        )
    notes.append(
        f"a timed series stops early (after at least 3 samples) once it has taken {args.budget:g} s "
        "(--budget); 'n' in the JSON is how many samples each median has"
    )
    return {
        "command": " ".join(["python", "benchmarks/sessions.py", *sys.argv[1:]]),
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "machine": machine(pythons.get("peer")),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "notes": notes,
        "runs": runs,
    }


def _peer_runs(args: argparse.Namespace, scenario: dict[str, Any], round_index: int) -> bool:
    size = scenario["n"] if scenario["kind"] == "single" else scenario["sessions"] * scenario["per_session"]
    return round_index < args.peer_rounds and size <= args.peer_max_items


def machine(peer: Path | None) -> dict[str, Any]:
    from importlib.metadata import version

    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "citadeldb": version("citadeldb"),
        "openai-agents": version("openai-agents"),
        "citadeldb-openai-agents (ours)": version("citadeldb-openai-agents"),
    }
    try:
        info["cryptography"] = version("cryptography")
    except Exception:
        info["cryptography"] = None
    if peer is not None:
        info["peer"] = PEER_REQUIREMENT
    try:
        meminfo = Path("/proc/meminfo").read_text().split()
        info["memory_gib"] = round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1)
        cpu = [
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        ]
        info["cpu"] = cpu[0].split(":", 1)[1].strip() if cpu else platform.processor()
    except (OSError, ValueError):
        pass
    return info


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N=100 and 10x10 only, 1 round, 5 reps, no peer")
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1_000, 10_000]
    )
    parser.add_argument(
        "--sessions", type=int, default=200, help="sessions in the many-sessions file (0: skip it)"
    )
    parser.add_argument("--per-session", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20, help="repetitions of a cheap operation per round")
    parser.add_argument("--open-reps", type=int, default=3, help="new files opened per round")
    parser.add_argument("--reopen-reps", type=int, default=3, help="reopens per round")
    parser.add_argument(
        "--budget", type=float, default=20.0, help="seconds after which a timed series stops early"
    )
    parser.add_argument("--backends", type=lambda s: s.split(","), default=list(ORDER))
    parser.add_argument("--no-peer", action="store_true", help="leave the published peer out")
    parser.add_argument(
        "--no-peer-install", action="store_true", help="use the peer's venv only if it exists"
    )
    parser.add_argument("--peer-venv", type=Path, default=default_peer_venv())
    parser.add_argument("--peer-max-items", type=int, default=10_000, help="largest scenario the peer runs")
    parser.add_argument(
        "--peer-rounds",
        type=int,
        default=2,
        help="rounds the peer takes part in (its costs are seconds: noise matters little)",
    )
    parser.add_argument("--workdir", help="where the database files go (default: the temp directory)")
    parser.add_argument("--worker-timeout", type=float, default=3600)
    parser.add_argument(
        "--json-out", type=Path, help="the JSON's path (default: benchmarks/results/<time>.json)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        worker(args.worker, json.loads(args.config), args.json_out)
        return
    if args.quick:
        args.sizes, args.sessions, args.per_session = [100], 10, 10
        args.rounds, args.reps, args.open_reps, args.reopen_reps = 1, 5, 1, 1
        args.no_peer = True
    if args.no_peer and "peer" in args.backends:
        args.backends.remove("peer")
    unknown = set(args.backends) - set(ORDER)
    if unknown:
        parser.error(f"unknown backend(s) {sorted(unknown)}; choose from {', '.join(ORDER)}")
    if "sqlite" not in args.backends:
        parser.error("the sqlite backend is the reference every ratio is to; keep it in --backends")

    sys.path.insert(0, str(HERE))
    import report

    data = orchestrate(args)
    summary = report.summarise(data)
    data["summary"] = summary
    out = args.json_out or HERE / "results" / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(report.markdown(data, summary))
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
