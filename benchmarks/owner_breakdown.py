"""Where a served request's wall time goes in the process that owns the file.

    python benchmarks/owner_breakdown.py                                  # full and off, 2 workers: ~1 min
    python benchmarks/owner_breakdown.py --sync-modes full --py-spy 6     # with py-spy on the owner
    python benchmarks/owner_breakdown.py --sync-modes full --py-spy 6 --gil   # who holds its GIL
    python benchmarks/owner_breakdown.py --group                          # and a group commit, sized

The agent app of benchmarks/serving.py (serving_app.py: one `Runner.run` turn per request,
a `ScriptedModel`) under ``uvicorn --workers N`` on 127.0.0.1, on a Citadel file (argon2
"iot"), for each sync mode of --sync-modes; --clients threads send --requests turns to 40
sessions after a warm-up. Every worker imports this module as its app (``owner_breakdown:app``,
which imports serving_app), and this module first wraps timers around the steps a call takes
(a measurement that reaches into the package's internals, not an API):

* the owner's server threads: a call's frame received, decoded (`Channel.receive`), run
  (`server.run_here`), its reply encoded and sent (`Channel.send`);
* every session operation in the owner, served or its own (`LocalFile.on_session`,
  re-timed step by step): waiting to enter the file's `operation()` (paused by
  `exclusive()`/`alone()`), waiting for the session's lock, the TTL check, the body;
* inside the body, each Citadel call (`MemoryHandle`): commits (``remember_batch``), other
  writes, reads; the body less these is the package's own Python;
* in a client worker, each call sent to the owner (`RemoteOwner.call`), and per request the
  calls a turn makes (a context variable the SDK's `asyncio.to_thread` calls inherit).

Each step records its wall time and the thread's time on a CPU and waiting for a CPU
(``/proc/thread-self/schedstat``); the rest of a step's wall is time off the CPU: blocked on
the disk, Citadel's own lock, a Python lock or the GIL. The owner's commits are also read as
a queue: the time at least one commit is under way (their union) over the window, and how
long a commit waited for the one before it to end. The driver reads each thread's CPU from
``/proc/<pid>/task`` over the window and names it from the worker's `threading` list.

Prints, per sync mode: requests/s, the machine's load (1-minute load average, the CPU other
work took and the whole machine's busy time, in cores), the owner's CPU per request by thread, the owner's time per
request step by step (calls, wall, on a CPU, waiting for one, off the CPU), the commits as
a queue, and the round trips a turn makes with what each costs the client beyond the owner's
handling. With --py-spy SECONDS, py-spy (``record --idle --threads --nonblocking``) samples
the owner for that long during the timed requests and the leaf frames of its samples are
counted by thread kind (with --gil, only the thread holding the GIL: the share of ticks
sampled is the share of time the GIL was held). With --group, raw citadeldb alone sizes a
group commit: k appends committed one by one against one commit of their atoms.
Timing, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# One recorded step: (kind, name, start in monotonic seconds, wall ms, on-CPU ms, waiting-for-CPU ms).
Step = tuple[str, str, float, float, float, float]
_steps: list[Step] = []
_record_lock = threading.Lock()
_turn_calls: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("turn_calls", default=None)
_local = threading.local()
_names: dict[str, str] = {}  # native thread id -> its name, noted when it records (threads may end)


# -- in each worker: the timers -----------------------------------------------------------


def _schedstat() -> tuple[float, float]:
    # One descriptor per thread, read again from its start: opening the file each time cost
    # about a tenth of the owner's GIL-held samples (py-spy --gil) in a first version.
    descriptor = getattr(_local, "schedstat", None)
    if descriptor is None:
        descriptor = _local.schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    on_cpu, waiting, _ = os.pread(descriptor, 100, 0).split()
    return int(on_cpu) / 1e6, int(waiting) / 1e6


def _now() -> tuple[float, float, float]:
    cpu, waiting = _schedstat()
    return time.monotonic(), cpu, waiting


def _record(kind: str, name: str, since: tuple[float, float, float]) -> None:
    end = _now()
    step = (kind, name, since[0], (end[0] - since[0]) * 1000, end[1] - since[1], end[2] - since[2])
    with _record_lock:
        _steps.append(step)
        _names[str(threading.get_native_id())] = threading.current_thread().name


@contextmanager
def _timed(kind: str, name: str) -> Iterator[None]:
    since = _now()
    try:
        yield
    finally:
        _record(kind, name, since)


def _served_thread() -> bool:
    return threading.current_thread().name == "citadel-client"


def _install() -> None:
    """Wrap the owner's and the client's steps in timers (BENCH_BREAKDOWN)."""
    from citadeldb_openai_agents.serving import channel, client, server, transport
    from citadeldb_openai_agents.storage import local_file, memory_handle

    frame, receive, send = channel.Channel._frame, channel.Channel.receive, channel.Channel.send

    def timed_frame(self: Any, cap: int, deadline: float | None) -> bytes:
        data = frame(self, cap, deadline)
        _local.frame = _now()  # the call's bytes are in: the owner's work on it starts
        return data

    def timed_receive(self: Any, deadline: float | None = None) -> Any:
        message = receive(self, deadline)
        if _served_thread() and isinstance(message, list) and message[:1] == ["call"]:
            _local.call = (_local.frame, str(message[1]))
            _record("served", "decode", _local.frame)
        return message

    def timed_send(self: Any, message: Any, *, wait: bool = True) -> None:
        if not (_served_thread() and isinstance(message, list) and message[:1] in (["ok"], ["error"])):
            return send(self, message, wait=wait)
        with _timed("served", "reply"):
            send(self, message, wait=wait)
        since, name = _local.call
        _record("served call", name, since)  # frame in to reply sent

    channel.Channel._frame = timed_frame  # type: ignore[method-assign]
    channel.Channel.receive = timed_receive  # type: ignore[method-assign]
    channel.Channel.send = timed_send  # type: ignore[method-assign]

    run_here = transport.run_here

    def timed_run_here(local: Any, operation: Any, *args: Any) -> Any:
        served = _served_thread()
        if not served:
            calls = _turn_calls.get()
            if calls is not None:
                calls.append(f"local {operation.name}")
        with _timed("served" if served else "own", "run " + operation.name):
            return run_here(local, operation, *args)

    server.run_here = timed_run_here  # type: ignore[assignment]
    transport.run_here = timed_run_here

    def timed_on_session(self: Any, key: Any, operation: Callable[..., Any], *args: Any) -> Any:
        state = self._layout.state(key)
        since = _now()
        with self._database.operation() as memory:
            _record("session", "enter operation()", since)
            since = _now()
            with state.lock:
                _record("session", "session lock", since)
                with _timed("session", "TTL check"):
                    if local_file.retention.ended(self._layout, memory, state):
                        local_file.writes.clear(self._layout, memory, state)
                with _timed("session", "body"):
                    return operation(self._layout, memory, state, *args)

    local_file.LocalFile.on_session = timed_on_session  # type: ignore[method-assign]

    handle = memory_handle.MemoryHandle
    write, getattr_ = handle._write, handle.__getattr__

    def timed_write(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        with _timed("citadel", "commit" if name == "remember_batch" else f"write {name}"):
            return write(self, name, *args, **kwargs)

    def timed_getattr(self: Any, name: str) -> Any:
        found = getattr_(self, name)
        if name not in memory_handle.MEMORY_READS:
            return found

        def read(*args: Any, **kwargs: Any) -> Any:
            with _timed("citadel", f"read {name}"):
                return found(*args, **kwargs)

        return read

    handle._write = timed_write  # type: ignore[method-assign]
    handle.__getattr__ = timed_getattr  # type: ignore[method-assign]

    call = client.RemoteOwner.call

    def timed_call(self: Any, operation: Any, *args: Any) -> Any:
        calls = _turn_calls.get()
        if calls is not None:
            calls.append(f"remote {operation.name}")
        with _timed("remote", operation.name):
            return call(self, operation, *args)

    client.RemoteOwner.call = timed_call  # type: ignore[method-assign]


def _dump() -> None:
    threads = {**_names, **{str(thread.native_id): thread.name for thread in threading.enumerate()}}
    path = Path(os.environ["BENCH_BREAKDOWN"]) / f"{os.getpid()}.json"
    path.write_text(json.dumps({"steps": _steps, "threads": threads}))


def _make_app() -> Callable[..., Any]:
    _install()
    import serving_app

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":

            async def dumping_receive() -> Any:
                message = await receive()
                if message["type"] == "lifespan.shutdown":
                    _dump()  # uvicorn's workers end without running atexit
                return message

            await serving_app.app(scope, dumping_receive, send)
            return
        calls: list[str] = []
        token = _turn_calls.set(calls)
        since = _now()
        try:
            await serving_app.app(scope, receive, send)
        finally:
            _turn_calls.reset(token)
            _record("request", ",".join(calls), since)

    return app


if os.environ.get("BENCH_BREAKDOWN"):
    app = _make_app()


# -- the driver ---------------------------------------------------------------------------


def _tasks(pid: int) -> dict[str, tuple[float, float]]:
    """Each thread of `pid`: (on-CPU ms, waiting-for-CPU ms) so far (/proc/<pid>/task/*/schedstat)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            on_cpu, waiting, _ = (task / "schedstat").read_text().split()
        except OSError:
            continue
        found[task.name] = (int(on_cpu) / 1e6, int(waiting) / 1e6)
    return found


def _workers(group: int) -> list[int]:
    return [pid for pid in serving._cpu_seconds(group) if pid != group]


def _thread_kind(name: str | None) -> str:
    if name is None:
        return "not a Python thread (Citadel's, or gone)"
    if name.startswith("asyncio_"):
        return "to_thread workers (its own turns' session calls)"
    if name == "MainThread":
        return "event loop (HTTP, the agent's run)"
    if name == "citadel-client":
        return "server threads (clients' calls)"
    return name.split(":")[0]


def _py_spy(pid: int, seconds: int, out: Path, gil: bool) -> subprocess.Popen[bytes]:
    beside = Path(sys.executable).parent / "py-spy"  # the venv's, else the PATH's
    command = [str(beside) if beside.exists() else "py-spy", "record", "--threads", "--nonblocking"]
    command += ["--format", "raw", "--gil" if gil else "--idle"]
    return subprocess.Popen(
        [*command, "-r", "100", "-d", str(seconds), "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run_mode(mode: str, args: argparse.Namespace, directory: Path) -> list[str]:
    run = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=directory))
    (run / "steps").mkdir(parents=True)
    port = serving._free_port()
    env = serving._env(BENCH_BACKEND="citadel", BENCH_BREAKDOWN=str(run / "steps"))
    env.update(CITADEL_PATH=str(run / "agent.cdl"), CITADEL_KEY=serving.KEY, CITADEL_ARGON2_PROFILE="iot")
    env.update(CITADEL_SYNC_MODE=mode)
    command = [sys.executable, "-m", "uvicorn", "--workers", str(args.workers), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--app-dir", str(HERE), "--no-access-log", "--log-level", "warning"]
    process = subprocess.Popen(
        [*command, "owner_breakdown:app"], cwd=run, env=env, stdin=subprocess.DEVNULL, start_new_session=True
    )
    spy = None
    try:
        serving._wait_until_up(port, process)
        serving.drive(port, args.clients, 2 * args.clients)
        workers = _workers(process.pid)
        load = os.getloadavg()[0]
        before = {pid: _tasks(pid) for pid in workers}
        busy, driving = serving._machine_busy_seconds(), time.process_time()
        start = time.monotonic()
        if args.py_spy:
            owner_guess = max(workers, key=lambda pid: sum(cpu for cpu, _ in _tasks(pid).values()))
            spy = _py_spy(owner_guess, args.py_spy, run / "py-spy.txt", args.gil)
        seconds, latencies = serving.drive(port, args.clients, args.requests)
        end = time.monotonic()
        after = {pid: _tasks(pid) for pid in workers}
        busy, driving = serving._machine_busy_seconds() - busy, time.process_time() - driving
        if spy is not None:
            spy.wait(60)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    dumps = {int(p.stem): json.loads(p.read_text()) for p in (run / "steps").glob("*.json")}
    owner = max(dumps, key=lambda pid: sum(1 for s in dumps[pid]["steps"] if s[0] == "served call"))
    window = {pid: [s for s in dump["steps"] if start <= s[2] <= end] for pid, dump in dumps.items()}
    requests = len(latencies)
    ours = sum(c - before[pid].get(t, (0.0, 0.0))[0] for pid in after for t, (c, _) in after[pid].items())
    other = max(0.0, busy - ours / 1000 - driving) / (end - start)
    lines = [
        f"### sync_mode {mode}: {args.workers} workers, {requests} requests, {requests / seconds:.1f} req/s, "
        f"p50 {statistics.median(latencies):.1f} ms; load average {load:.2f}, other work {other:.2f} cores, "
        f"the machine busy {busy / (end - start):.2f} cores (the load's sender {driving / (end - start):.2f}), "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        "",
    ]
    lines += _cpu_table(owner, before, after, dumps, requests, end - start)
    lines += _step_table(window[owner], requests)
    lines += _queue(window[owner], end - start, requests)
    lines += _round_trips([s for pid in window if pid != owner for s in window[pid]], window[owner])
    if spy is not None and (run / "py-spy.txt").exists():
        lines += _py_spy_summary(run / "py-spy.txt", args.py_spy if args.gil else 0)
    return lines


def _cpu_table(
    owner: int,
    before: dict[int, dict[str, tuple[float, float]]],
    after: dict[int, dict[str, tuple[float, float]]],
    dumps: dict[int, Any],
    requests: int,
    seconds: float,
) -> list[str]:
    rows = [
        "CPU per request of the whole server, by process and thread (/proc/<pid>/task over the window):",
        "",
        "| process | threads | on a CPU, ms/request | waiting for a CPU, ms/request | cores |",
        "|---|---|---:|---:|---:|",
    ]
    for pid in sorted((p for p in after if p in dumps), key=lambda p: p != owner):
        kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        names = dumps.get(pid, {}).get("threads", {})
        for tid, (cpu, waiting) in after[pid].items():
            was = before[pid].get(tid, (0.0, 0.0))
            kind = kinds[_thread_kind(names.get(tid))]
            kind[0] += cpu - was[0]
            kind[1] += waiting - was[1]
        role = "owner" if pid == owner else "client"
        for kind, (cpu, waiting) in sorted(kinds.items(), key=lambda item: -item[1][0]):
            rows.append(
                f"| {role} | {kind} | {cpu / requests:.2f} | {waiting / requests:.2f} "
                f"| {cpu / 1000 / seconds:.2f} |"
            )
        total = sum(k[0] for k in kinds.values()), sum(k[1] for k in kinds.values())
        rows.append(
            f"| {role} | all | {total[0] / requests:.2f} | {total[1] / requests:.2f} "
            f"| {total[0] / 1000 / seconds:.2f} |"
        )
    return [*rows, ""]


def _step_table(steps: list[Step], requests: int) -> list[str]:
    groups: dict[tuple[str, str], list[Step]] = defaultdict(list)
    for step in steps:
        if step[0] != "request":
            name = step[1]
            if step[0] in ("served call", "remote"):
                name = "(all)"
            groups[(step[0], name)].append(step)
    rows = [
        "The owner's steps, summed over the window and divided by the requests served (both workers'):",
        "",
        "| step | calls/request | wall ms/request | mean wall | on a CPU | waiting for a CPU | off the CPU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    order = ["served call", "served", "own", "session", "citadel"]
    for (kind, name), group in sorted(groups.items(), key=lambda item: (order.index(item[0][0]), item[0][1])):
        wall, cpu, waiting = (sum(s[i] for s in group) for i in (3, 4, 5))
        rows.append(
            f"| {kind}: {name} | {len(group) / requests:.2f} | {wall / requests:.2f} | {wall / len(group):.2f} ms "
            f"| {cpu / requests:.2f} | {waiting / requests:.2f} | {(wall - cpu - waiting) / requests:.2f} |"
        )
    body = sum(s[3] for s in groups.get(("session", "body"), []))
    body_cpu = sum(s[4] for s in groups.get(("session", "body"), []))
    body_wait = sum(s[5] for s in groups.get(("session", "body"), []))
    citadel = [s for (kind, _), group in groups.items() if kind == "citadel" for s in group]
    ours = (
        body - sum(s[3] for s in citadel),
        body_cpu - sum(s[4] for s in citadel),
        body_wait - sum(s[5] for s in citadel),
    )
    rows.append(
        f"| the bodies less Citadel's calls (the package's Python) | | {ours[0] / requests:.2f} | "
        f"| {ours[1] / requests:.2f} | {ours[2] / requests:.2f} | {(ours[0] - ours[1] - ours[2]) / requests:.2f} |"
    )
    return [*rows, ""]


def _queue(steps: list[Step], seconds: float, requests: int) -> list[str]:
    """The owner's commits as one queue: how much of the window one was under way, and waits."""
    commits = sorted(
        (s[2], s[2] + s[3] / 1000, s[4], s[5]) for s in steps if tuple(s[:2]) == ("citadel", "commit")
    )
    if not commits:
        return []
    union, reach = 0.0, 0.0
    for begin, finish, _, _ in commits:
        if finish > reach:
            union += finish - max(begin, reach)
            reach = finish
    ends = sorted(c[1] for c in commits)
    # A commit that starts while others are under way waits for them: Citadel runs one at a time.
    queued = []
    for begin, finish, _, _ in commits:
        earlier = [e for e in ends if begin < e < finish]
        queued.append((max(earlier) - begin) * 1000 if earlier else 0.0)
    service = [
        (finish - begin) * 1000 - wait for (begin, finish, _, _), wait in zip(commits, queued, strict=True)
    ]
    walls = [(finish - begin) * 1000 for begin, finish, _, _ in commits]
    return [
        f"Commits as a queue: {len(commits)} commits, {len(commits) / requests:.2f} a request, "
        f"{len(commits) / seconds:.0f}/s; at least one under way {100 * union / seconds:.0f}% of the window; "
        f"a commit's wall p50 {statistics.median(walls):.2f} ms, mean {statistics.mean(walls):.2f} ms, "
        f"of which waiting for commits that began before it to end {statistics.mean(queued):.2f} ms (mean), "
        f"and from the last of those ending to its own end {statistics.mean(service):.2f} ms "
        f"(p50 {statistics.median(service):.2f}); on a CPU {statistics.mean(c[2] for c in commits):.2f} ms, "
        f"waiting for a CPU {statistics.mean(c[3] for c in commits):.2f} ms (means).",
        "",
    ]


def _round_trips(client: list[Step], owner: list[Step]) -> list[str]:
    turns = [s for s in client if s[0] == "request"]
    if not turns:
        return []
    shapes = Counter(s[1] for s in turns)
    remote: dict[str, list[Step]] = defaultdict(list)
    served: dict[str, list[Step]] = defaultdict(list)
    for step in client:
        if step[0] == "remote":
            remote[step[1]].append(step)
    for step in owner:
        if step[0] == "served call":
            served[step[1]].append(step)
    rows = [
        f"Round trips: the client worker's {len(turns)} turns made "
        + "; ".join(f"{count} x [{shape}]" for shape, count in shapes.most_common(3))
        + ".",
        "",
        "| call | per turn | client's wall, mean | owner's, frame in to reply sent, mean | beyond the owner "
        "(socket, waking, the client's side) | client's CPU a call |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, group in sorted(remote.items()):
        wall = statistics.mean(s[3] for s in group)
        there = statistics.mean(s[3] for s in served[name]) if served[name] else float("nan")
        rows.append(
            f"| {name} | {len(group) / len(turns):.2f} | {wall:.2f} ms | {there:.2f} ms | {wall - there:.2f} ms "
            f"| {statistics.mean(s[4] for s in group):.2f} ms |"
        )
    return [*rows, ""]


def _py_spy_summary(path: Path, gil_seconds: int) -> list[str]:
    """py-spy's raw samples: per thread kind, the leaf frames (where each sampled thread was).

    With --gil py-spy keeps only the thread holding the GIL at each sample, so the samples
    over the ticks (100 a second) are the share of the time some thread held it.
    """
    kinds: dict[str, Counter[str]] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        text = stack
        if "_calls (citadeldb_openai_agents/serving/server.py" in text:
            kind = "server threads"
        elif "_worker (concurrent/futures/thread.py" in text:
            kind = "to_thread workers"
        elif "_own (citadeldb_openai_agents/storage/engine.py" in text:
            kind = "owner thread"
        elif "uvicorn" in text or "run_forever" in text:
            kind = "event loop"
        else:
            kind = "other"
        where = frames[-1].split(" (")[0]
        if "remember_batch" in text:
            where = "in a commit: " + where
        elif "citadeldb_openai_agents" in text and kind != "owner thread":
            where = "in the package: " + where
        kinds[kind][where] += int(count)
    sampled = sum(sum(counter.values()) for counter in kinds.values())
    what = (
        "--idle"
        if not gil_seconds
        else f"--gil: some thread held the GIL in {sampled} of {100 * gil_seconds} ticks"
    )
    lines = [f"py-spy on the owner (100 Hz, {what}): per thread kind, the top leaf frames:", ""]
    for kind, counter in sorted(kinds.items(), key=lambda item: -sum(item[1].values())):
        total = sum(counter.values())
        top = ", ".join(f"{where} {100 * n / total:.0f}%" for where, n in counter.most_common(6))
        lines.append(f"- {kind} ({total} samples): {top}")
    return [*lines, ""]


def group_commits(modes: list[str], commits: int = 240) -> list[str]:
    """Raw citadeldb, alone: k appends as k commits (one a region) against one commit of their atoms.

    An append's commit holds its item and its search block (two atoms; a client's, a third:
    its batch marker). Citadel 2.7.0 commits one region a call, so one commit of k appends'
    atoms in one region stands in for what a group commit across sessions could cost.
    """
    import citadeldb

    vector = [0.1] * 128
    atom = {"kind": "item", "text": "hello there " * 3, "embedding": vector, "payload": {"t": "x" * 200}}
    rows = [
        "Group commit, sized on raw citadeldb in one process (no load beside it): per append (3 atoms),",
        "k appends committed one by one (k regions) or as one commit of 3k atoms (one region):",
        "",
        "| sync_mode | k | one by one: wall per append | CPU per append | one commit: wall per append "
        "| CPU per append |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in modes:
        with tempfile.TemporaryDirectory() as directory:
            options = citadeldb.DatabaseOptions(argon2_profile="iot", sync_mode=mode, cache_size=16_384)
            db = citadeldb.connect(f"{directory}/g.cdl", key="benchmark", region_keys=True, options=options)
            memory, embedder = db.memory(), citadeldb.MockEmbedder(dim=128)
            regions = [f"r{number}" for number in range(40)]
            for region in regions:
                memory.create_encrypted_region(region, embedder)
            for k in (1, 2, 4, 8):
                separate, grouped = [], []
                for number in range(commits // k):
                    start, cpu = time.perf_counter(), time.thread_time()
                    for one in range(k):
                        memory.remember_batch(regions[(number * k + one) % len(regions)], [atom] * 3)
                    separate.append(((time.perf_counter() - start) / k, (time.thread_time() - cpu) / k))
                    start, cpu = time.perf_counter(), time.thread_time()
                    memory.remember_batch(regions[number % len(regions)], [atom] * (3 * k))
                    grouped.append(((time.perf_counter() - start) / k, (time.thread_time() - cpu) / k))
                rows.append(
                    f"| {mode} | {k} | {1000 * statistics.median(w for w, _ in separate):.2f} ms "
                    f"| {1000 * statistics.median(c for _, c in separate):.2f} ms "
                    f"| {1000 * statistics.median(w for w, _ in grouped):.2f} ms "
                    f"| {1000 * statistics.median(c for _, c in grouped):.2f} ms |"
                )
            del memory
            db.close()
    return [*rows, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sync-modes", nargs="+", default=["full", "off"], choices=["full", "normal", "off"])
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers")
    parser.add_argument("--clients", type=int, default=20, help="concurrent HTTP clients")
    parser.add_argument("--requests", type=int, default=600, help="timed requests per run")
    parser.add_argument(
        "--py-spy", type=int, default=0, metavar="SECONDS", help="sample the owner with py-spy"
    )
    parser.add_argument("--gil", action="store_true", help="py-spy samples only the thread holding the GIL")
    parser.add_argument("--group", action="store_true", help="then size a group commit on raw citadeldb")
    args = parser.parse_args()
    print(
        f"`python benchmarks/owner_breakdown.py {' '.join(sys.argv[1:])}` ({os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})\n"
    )
    with tempfile.TemporaryDirectory(prefix="owner-breakdown-") as scratch:
        for mode in args.sync_modes:
            print("\n".join(run_mode(mode, args, Path(scratch))), flush=True)
    if args.group:
        print("\n".join(group_commits(sorted(set(args.sync_modes)))), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import serving

    main()
