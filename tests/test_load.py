"""Many processes on one file, under load with real servers, while the owner is SIGKILLed.

The agent app (tests/asgi_turn_app.py: one `Runner.run` turn per request, a
`ScriptedModel`) runs under a real ``uvicorn --workers 4`` and a real ``gunicorn
--preload -w 4`` with uvicorn workers, on 127.0.0.1. Twenty client threads
(`http.client`) send turns to 40 sessions, each session driven by one client, one turn
at a time, and each turn's text is unique ("user-07 turn 12"). Afterwards the file is
opened and checked against what the servers acknowledged:

* every acknowledged turn (HTTP 200) is stored exactly once, with its answer, in its
  session's order; a turn whose request failed may be stored or not, never twice;
* `verify()` passes.

Under uvicorn the owner is one of the workers (the process holding the file's lock):
killed, another worker takes the file over and uvicorn starts a new worker, which
becomes a client. Under gunicorn --preload the owner is the master: killed, its workers
hold its file (and its lock) by inheritance and cannot take it over, so the test stops
sending; each request in flight must end, answered or failed (with an error that says to
restart the whole server), within its handover wait: none may hang. An operator's ``erase`` mid-load gets a confirmed receipt, and no other
session loses an item.

The kills land at the worst moments for a write in flight (the app's
``TURN_APP_HOLD_SWITCH``): while the owner holds a turn a client sent and has not
committed it (it must be sent again, and stored once: a client that dropped it, or an
owner that acknowledged it before applying it, loses an acknowledged turn), or right
after it committed it and before it answered (sent again, it must not be stored twice).
The default run kills the owning uvicorn worker twice, once at each moment, and
gunicorn's master once; the slow variant kills ten times, in turn at each moment and
whenever the kill lands (ten gunicorn runs on one file, since a killed master ends the
server); about 7 minutes on 2 shared cores (the default run: about 100 s):

    python -m pytest -m slow tests/test_load.py
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from citadeldb_openai_agents import CitadelSessionStore
from citadeldb_openai_agents.serving import orphans
from citadeldb_openai_agents.serving.address import socket_path
from citadeldb_openai_agents.storage.lockholder import find_lock_holder
from citadeldb_openai_agents.storage.process_state import gone

from conftest import KEY

TESTS = Path(__file__).parent  # where asgi_turn_app.py lives
# Seconds any one wait may take before the test fails instead of hanging. The slowest, uvicorn's
# four workers starting (each a new interpreter importing the SDK and opening the store), took
# 42 s under load (benchmarks/suite_under_load.py, 3 runs of this file, 2026-12-08); the load's
# last requests to be answered (Load.join), 18 s: 10x+ the slowest.
TIMEOUT = 600
# An HTTP request's timeout: one that takes this long hangs. The slowest answered one took 3.6 s
# under load (benchmarks/suite_under_load.py, 2026-12-08): 10x+ that.
REQUEST_SECONDS = 60
CLIENTS = 20
# How a request fails when the worker that took it is killed: the connection closes before the
# response (RemoteDisconnected), is reset, or closes mid-body after the headers went out
# (IncompleteRead: seen once in four runs on Python 3.13 with the suite running beside it), or
# closes while the client still sends its request (BrokenPipeError: CI's Python 3.13 run, stop 32).
KILLED_WORKERS_CONNECTION = (
    "RemoteDisconnected",
    "ConnectionResetError",
    "IncompleteRead",
    "BrokenPipeError",
)
# How long gunicorn's processes wait for an owner to serve the file (handover.HANDOVER_SECONDS,
# 10 s in the package): a minute here, so that a request that did not wait for one (its master
# is gone: none can come) is told from one that did by a wide margin.
SERVER_HANDOVER_SECONDS = 60.0
# How long a request may take to fail once gunicorn's master is gone: well under the handover
# wait, which a call whose owner cannot come must not sit out. The slowest failed request took
# 1.9 s under load (benchmarks/suite_under_load.py, 2026-12-08): this is 10x+ that.
FAILING_SECONDS = SERVER_HANDOVER_SECONDS / 2
# How long the requests in flight when gunicorn's master died may take to end, each answered or
# failed at once: 0.11 s at most under load (benchmarks/suite_under_load.py, 2026-12-08); a hang
# guard, as each request's own REQUEST_SECONDS is.
STOP_SECONDS = 60.0
# How long an orphaned gunicorn worker may take to shut down once it sent itself SIGTERM (what
# frees the file after its master was killed, beside the orphans.GRACE_SECONDS it waits first):
# 0.37 s at most under load (freed, less the grace; benchmarks/suite_under_load.py, 2026-12-08): 30x.
SHUTDOWN_SECONDS = 12.0
# Where a kill lands: in a write the owner serves, before or after its commit; anywhere.
MOMENTS = ["before", "after", None]
SESSIONS = [f"user-{number:02d}" for number in range(40)]
WORKERS = 4


# -- the servers ---------------------------------------------------------------------------

# `python -m gunicorn ARGS`, its processes waiting SERVER_HANDOVER_SECONDS (argv[1]) for an owner:
# the workers, forked from the master, inherit it.
GUNICORN = """
import runpy, sys
from citadeldb_openai_agents.serving import handover, shared_file
handover.HANDOVER_SECONDS = shared_file.HANDOVER_SECONDS = float(sys.argv[1])
sys.argv = ["gunicorn", *sys.argv[2:]]
runpy.run_module("gunicorn", run_name="__main__", alter_sys=True)
"""


class AppServer:
    """A web server running the agent app in a process group of its own; its log is kept."""

    def __init__(self, kind: str, directory: Path, database: Path, hold_switch: Path) -> None:
        with socket.socket() as probe:  # a free port, released for the server to bind
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.kind = kind
        self.database = database
        self.hold_switch = hold_switch
        env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
        env.update(CITADEL_PATH=str(database), CITADEL_KEY=KEY, CITADEL_ARGON2_PROFILE="iot")
        env.update(TURN_APP_HOLD_SWITCH=str(hold_switch), HOME=str(directory))  # gunicorn's ~/.gunicorn
        self.process = subprocess.Popen(
            self._command(kind),
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a process group of its own: every worker is stopped with it
        )
        self.log: list[str] = []
        self._logged = threading.Condition()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _command(self, kind: str) -> list[str]:
        if kind == "uvicorn":
            server = ["uvicorn", "--workers", str(WORKERS), "--host", "127.0.0.1", "--port", str(self.port)]
            options = ["--app-dir", str(TESTS), "--no-access-log"]
            return [sys.executable, "-m", *server, *options, "asgi_turn_app:app"]
        assert kind == "gunicorn --preload"
        server = ["--preload", "-w", str(WORKERS), "-k", "uvicorn_worker.UvicornWorker"]
        options = ["-b", f"127.0.0.1:{self.port}", "--pythonpath", str(TESTS), "--graceful-timeout", "10"]
        return [
            sys.executable,
            "-c",
            GUNICORN,
            str(SERVER_HANDOVER_SECONDS),
            *server,
            *options,
            "asgi_turn_app:app",
        ]

    def _read_log(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._logged:
                self.log.append(line)
                self._logged.notify_all()

    def text(self) -> str:
        with self._logged:
            return "".join(self.log)

    def wait_until_serving(self, workers: int = WORKERS) -> None:
        """Until `workers` workers have started since the server did (restarted ones count)."""

        def started() -> bool:
            return sum("Application startup complete" in line for line in self.log) >= workers

        with self._logged:
            if not self._logged.wait_for(lambda: started() or self.process.poll() is not None, TIMEOUT):
                raise AssertionError(f"{self.kind} did not start in {TIMEOUT} s:\n{''.join(self.log)}")
        assert started(), f"{self.kind} exited:\n{self.text()}"

    def owner(self) -> int:
        """The process holding the file's lock: the one that owns the file and serves it."""
        holder = find_lock_holder(self.database)
        assert holder is not None, f"no process holds {self.database}"
        return holder.pid

    def kill_owner(self, moment: str | None, load: Load | None = None) -> int:
        """SIGKILL the owner, while it holds a client's write `moment` its commit, or now (None).

        Only a write another worker sent the owner can be held, and the kernel picks the worker
        that takes each request: `load` keeps sending past its count until one was held.
        """
        held = Path(f"{self.hold_switch}.held")
        if moment is not None:
            with load.sending_until(held.exists) if load is not None else nullcontext():
                self.hold_switch.write_text(moment)
                wait_until(
                    held.exists,
                    lambda: f"the owner to hold in a client's write, {moment} its commit ({load})",
                )
        owner = self.owner()
        os.kill(owner, signal.SIGKILL)
        held.unlink(missing_ok=True)
        return owner

    def kill_worker(self) -> int:
        """SIGKILL one of the workers (gunicorn's master then forks another)."""
        worker = children(self.process.pid)[0]
        os.kill(worker, signal.SIGKILL)
        return worker

    def wait_for_new_owner(self, killed: list[int]) -> int:
        def new_owner() -> bool:
            holder = find_lock_holder(self.database)
            return holder is not None and holder.pid not in killed

        wait_until(new_owner, "another process to take the file over")
        return self.owner()

    def stop(self) -> None:
        """SIGTERM, as a deploy stops it; whatever is left of the group then gets SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(TIMEOUT)
        self.kill()

    def kill(self) -> None:
        """Every process of the server is gone, and with them their hold on the file."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(TIMEOUT)
        wait_until(lambda: find_lock_holder(self.database) is None, f"the {self.kind} processes to let go")


@contextmanager
def serving(kind: str, directory: Path, database: Path) -> Iterator[AppServer]:
    server = AppServer(kind, directory, database, directory / "hold")
    try:
        server.wait_until_serving()
        yield server
    finally:
        server.kill()  # whatever happened: no process of the test outlives it


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: Linux only, like the lock's holder)."""
    found = []
    for entry in Path("/proc").iterdir():
        with suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def wait_until(condition: Callable[[], bool], what: str | Callable[[], str]) -> None:
    """Poll another process's state (a file, a lock): no event crosses the process boundary."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, (
            f"waited {TIMEOUT} s for {what if isinstance(what, str) else what()}"
        )
        time.sleep(0.01)


# -- the clients ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    text: str
    outcome: str  # "200", or why it failed: "500 StorageError", "RemoteDisconnected", "TimeoutError"
    seconds: float  # from sending the request to its outcome

    @property
    def acknowledged(self) -> bool:
        return self.outcome == "200"


def post_turn(port: int, session_id: str, text: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_SECONDS)
    try:
        connection.request("POST", f"/turn?session={session_id}", body=text.encode())
        response = connection.getresponse()
        body = response.read().decode()
    except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out
        return type(error).__name__
    finally:
        connection.close()
    return "200" if response.status == 200 else f"{response.status} {body}"


class Load:
    """CLIENTS threads sending turns, each to its own sessions in turn, one request at a time.

    `turns` keeps every session's turns across runs (a new server on the same file
    continues the numbering); a run ends when `requests` were sent or on `stop()`.
    """

    def __init__(self) -> None:
        self.turns: dict[str, list[Turn]] = {session: [] for session in SESSIONS}
        self._busy = {session: threading.Lock() for session in SESSIONS}
        self._left_out: set[str] = set()
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []

    def start(self, port: int, requests: int) -> None:
        self._port, self._requests = port, requests
        self.sent = self.answered = 0
        self._stopping = False
        self._until: Callable[[], bool] = lambda: False
        self._threads = [
            threading.Thread(target=self._client, args=(SESSIONS[number::CLIENTS],), daemon=True)
            for number in range(CLIENTS)
        ]
        for thread in self._threads:
            thread.start()

    def _client(self, sessions: list[str]) -> None:
        for session in itertools.cycle(sessions):
            with self._busy[session]:
                if session in self._left_out:
                    continue
                with self._changed:
                    if self._stopping or (self.sent >= self._requests and not self._until()):
                        return
                    self.sent += 1
                text = f"{session} turn {len(self.turns[session])}"
                sent = time.monotonic()
                outcome = post_turn(self._port, session, text)
                self.turns[session].append(Turn(text, outcome, time.monotonic() - sent))
            with self._changed:
                self.answered += 1
                self._changed.notify_all()
            if outcome == "ConnectionRefusedError":
                return  # the server is gone

    def wait_answered(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.answered >= count, TIMEOUT), (
                f"{self.answered} of {count} requests answered in {TIMEOUT} s"
            )

    @contextmanager
    def sending_until(self, done: Callable[[], bool]) -> Iterator[None]:
        """Past the run's count, clients keep sending until `done()` (checked before each request)."""
        with self._changed:
            assert any(thread.is_alive() for thread in self._threads), f"the load already ended ({self})"
            self._until = lambda: not done()
        try:
            yield
        finally:
            with self._changed:
                self._until = lambda: False

    def __str__(self) -> str:
        outcomes = Counter(turn.outcome for turns in self.turns.values() for turn in turns)
        alive = sum(thread.is_alive() for thread in self._threads)
        return f"{self.sent} of {self._requests} sent, {self.answered} answered, {alive} clients left, {dict(outcomes)}"

    def leave_out(self, session: str) -> None:
        """No request for `session` from now on; returns once the one in flight, if any, ended."""
        self._left_out.add(session)
        with self._busy[session]:
            pass

    def stop(self) -> None:
        with self._changed:
            self._stopping = True

    def join(self) -> None:
        for thread in self._threads:
            thread.join(TIMEOUT)
            assert not thread.is_alive(), f"a client still waits after {TIMEOUT} s"

    def failed(self) -> list[Turn]:
        return [turn for turns in self.turns.values() for turn in turns if not turn.acknowledged]

    def latencies(self) -> str:
        """The slowest failed and acknowledged request, to show beside an assertion."""
        every = [turn for turns in self.turns.values() for turn in turns]
        failed = max((turn.seconds for turn in every if not turn.acknowledged), default=0.0)
        answered = max((turn.seconds for turn in every if turn.acknowledged), default=0.0)
        return f"slowest failed request {failed:.2f} s, slowest answered {answered:.2f} s"


def assert_no_request_waited_to_fail(load: Load) -> None:
    """No request waits for an owner to fail (SERVER_HANDOVER_SECONDS): once gunicorn's master is
    gone, a call fails at once with the error naming the fix (or as its worker's dropped connection)."""
    slow = [turn for turn in load.failed() if turn.seconds >= FAILING_SECONDS]
    assert not slow, (load.latencies(), slow[:5])


# -- the check -----------------------------------------------------------------------------


def transcript(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each stored item as (role, text): a user's text, or the assistant's output text."""
    return [
        (
            item["role"],
            item["content"]
            if isinstance(item["content"], str)
            else "".join(part["text"] for part in item["content"]),
        )
        for item in items
    ]


def assert_turns_stored(session_id: str, turns: list[Turn], stored: list[tuple[str, str]]) -> None:
    """Every acknowledged turn once, with its answer, in the order sent; a failed one at most once."""
    texts = [turn.text for turn in turns]
    acknowledged = {turn.text for turn in turns if turn.acknowledged}
    at = 0  # the first turn sent that the next item stored may be
    position = 0
    while position < len(stored):
        role, text = stored[position]
        assert role == "user" and text in texts[at:], (
            f"{session_id}: item {position}, {stored[position]!r}, was not sent after the turn stored "
            f"before it: stored twice, out of order, or never sent; stored: {stored}"
        )
        found = texts.index(text, at)
        skipped = [skipped for skipped in texts[at:found] if skipped in acknowledged]
        assert not skipped, f"{session_id}: acknowledged turns missing: {skipped}; stored: {stored}"
        at = found + 1
        answered = stored[position + 1 : position + 2] == [("assistant", f"noted: {text}")]
        assert answered or text not in acknowledged, (
            f"{session_id}: {text!r} was acknowledged, but its answer is not stored after it: {stored}"
        )
        position += 2 if answered else 1
    lost = [text for text in texts[at:] if text in acknowledged]
    assert not lost, f"{session_id}: acknowledged turns missing: {lost}; stored: {stored}"


def assert_every_acknowledged_turn_stored(database: Path, load: Load, erased: str | None = None) -> None:
    with CitadelSessionStore(database, KEY) as store:
        assert store.served_by is None, "every server process is gone: this one owns the file"
        held = set(store.session_ids())
        for session_id, turns in load.turns.items():
            if session_id == erased:
                assert session_id not in held and store.summary(session_id) is None
                continue
            stored = transcript(store.export(session_id)) if session_id in held else []
            assert_turns_stored(session_id, turns, stored)
        report = store.verify()
        assert report.ok and report.audit_break_at is None, report


# -- the tests -----------------------------------------------------------------------------


def test_uvicorn_stopped_by_sigterm_closes_the_store_in_its_lifespan_and_leaves_no_socket(
    tmp_path: Path,
) -> None:
    """uvicorn re-raises SIGTERM once shut down, so atexit never runs: the app closes the store in its lifespan."""
    database = tmp_path / "agent.cdl"
    with serving("uvicorn", tmp_path, database) as server:
        assert post_turn(server.port, "alice", "hello") == "200"
        address = socket_path(str(database.resolve()))
        assert os.path.exists(address)
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(TIMEOUT)
        assert server.process.returncode == 0, server.text()
        assert not os.path.exists(address), f"the owner left its socket behind:\n{server.text()}"
        assert find_lock_holder(database) is None


@pytest.mark.parametrize("kills", [1, pytest.param(10, marks=pytest.mark.slow)])
def test_uvicorn_workers_keep_every_acknowledged_turn_when_the_owning_worker_is_killed(
    tmp_path: Path, kills: int
) -> None:
    database = tmp_path / "agent.cdl"
    load = Load()
    killed: list[int] = []
    with serving("uvicorn", tmp_path, database) as server:
        first_owner = server.owner()
        load.start(server.port, requests=560 + 100 * (kills - 1))
        for kill in range(kills):
            load.wait_answered(200 + 100 * kill)
            killed.append(server.kill_owner(MOMENTS[kill % len(MOMENTS)], load))
            server.wait_for_new_owner(killed)
        load.join()
        server.stop()

    assert killed[0] == first_owner
    log = server.text()
    for pid in killed:  # a worker: uvicorn saw it die and started another
        assert f"Child process [{pid}] died" in log, log
    assert load.sent >= 500
    # Only the killed worker's own requests in flight may fail: every other worker's calls
    # are handed over to the new owner.
    failed = load.failed()
    assert len(failed) <= CLIENTS * kills, failed
    # The unexpected ones alone, so that the message shows them (a list of 40 is cut short).
    unexpected = [turn for turn in failed if turn.outcome not in KILLED_WORKERS_CONNECTION]
    assert not unexpected, (unexpected, [line for line in log.splitlines() if "turn failed" in line][:5])
    assert "turn failed" not in log, log
    assert_every_acknowledged_turn_stored(database, load)


@pytest.mark.parametrize("kills", [1, pytest.param(10, marks=pytest.mark.slow)])
def test_gunicorn_preload_keeps_every_acknowledged_turn_when_the_master_is_killed(
    tmp_path: Path, kills: int
) -> None:
    database = tmp_path / "agent.cdl"
    load = Load()
    for kill in range(kills):  # a killed master ends the server: one server per kill
        with serving("gunicorn --preload", tmp_path, database) as server:
            master = server.process.pid
            assert server.owner() == master
            requests = 520 if kills == 1 else 150
            load.start(server.port, requests=requests + 200)
            # gunicorn replaces a worker that dies (or times out, or reaches --max-requests) with
            # a fork of the master, which by then serves the file to the other workers.
            load.wait_answered(requests // 3)
            server.kill_worker()
            server.wait_until_serving(WORKERS + 1)
            load.wait_answered(requests)
            assert server.kill_owner(MOMENTS[kill % len(MOMENTS)]) == master
            load.stop()  # the workers cannot take the file over: their inherited copy holds its lock
            started = time.monotonic()
            load.join()
            ended = time.monotonic() - started
            server.kill()  # the workers outlive their master (the uvicorn worker does not watch it)
        assert load.sent >= requests
        # Each request in flight when the master died is answered or fails; none hangs.
        hung = [turn for turn in load.failed() if turn.outcome == "TimeoutError"]
        assert not hung and ended < STOP_SECONDS, (ended, hung)
        # A request fails as the killed worker's dropped connection, or with an error naming the fix.
        outcomes = {turn.outcome for turn in load.failed()}
        assert outcomes <= {*KILLED_WORKERS_CONNECTION, "500 DatabaseLockedError"}, outcomes
        failures = [line for line in server.text().splitlines() if "turn failed" in line]
        assert all("Restart the whole server" in line for line in failures), failures
        if MOMENTS[kill % len(MOMENTS)] is not None:
            assert failures, "the turn whose write the master held was answered"
        assert_no_request_waited_to_fail(load)
    assert_every_acknowledged_turn_stored(database, load)


def test_after_its_master_is_sigkilled_a_restarted_gunicorn_serves_within_seconds(tmp_path: Path) -> None:
    """gunicorn --preload's master owns the file; SIGKILLed, its orphaned workers still hold the
    file's lock through their inherited copy and can never take it over. They name themselves as
    the holder (not the dead master), stop themselves within seconds, and a restart serves."""
    database = tmp_path / "agent.cdl"
    load = Load()
    with serving("gunicorn --preload", tmp_path, database) as server:
        master = server.process.pid
        assert server.owner() == master
        workers = children(master)
        load.start(server.port, requests=400)
        load.wait_answered(100)
        os.kill(master, signal.SIGKILL)
        server.process.wait(TIMEOUT)
        killed = time.monotonic()
        load.stop()
        load.join()
        holder = find_lock_holder(database)
        assert holder is None or holder.pid in workers, (holder, workers)
        wait_until(lambda: find_lock_holder(database) is None, "the orphaned workers to let go")
        # A worker lets go of the file when its shutdown closes the store, a moment before it exits.
        wait_until(lambda: all(gone(pid) for pid in workers), "the orphaned workers to exit")  # or be zombies
        freed = time.monotonic() - killed
        with socket.socket() as probe:  # the workers' listening socket is closed too
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", server.port))
        log = server.text()
    # Each orphaned worker stops itself GRACE_SECONDS after its master exited, then shuts down.
    assert freed < orphans.GRACE_SECONDS + SHUTDOWN_SECONDS, freed
    assert f"stops itself (SIGTERM) in {orphans.GRACE_SECONDS:g} s" in log, log
    outcomes = {turn.outcome for turn in load.failed()}
    unexpected = [line for line in log.splitlines() if "turn failed" in line and "DatabaseLocked" not in line]
    assert outcomes <= {*KILLED_WORKERS_CONNECTION, "500 DatabaseLockedError", "ConnectionRefusedError"}, (
        outcomes,
        unexpected[:3],
    )
    acknowledged = sum(turn.acknowledged for turns in load.turns.values() for turn in turns)
    with serving("gunicorn --preload", tmp_path, database) as again:
        load.start(again.port, requests=100)
        load.join()
        again.stop()
    assert sum(turn.acknowledged for turns in load.turns.values() for turn in turns) == acknowledged + 100
    assert_no_request_waited_to_fail(load)
    assert_every_acknowledged_turn_stored(database, load)


def test_an_operator_erases_a_session_mid_load_and_no_other_session_loses_an_item(tmp_path: Path) -> None:
    database = tmp_path / "agent.cdl"
    erased = SESSIONS[7]
    load = Load()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    env.update(CITADEL_PATH=str(database), CITADEL_KEY=KEY)
    erase = [sys.executable, "-m", "citadeldb_openai_agents", "erase", erased, "--yes", "--json"]
    with serving("gunicorn --preload", tmp_path, database) as server:
        load.start(server.port, requests=500)
        load.wait_answered(150)
        load.leave_out(erased)
        held = 2 * len(load.turns[erased])
        answered = load.answered
        done = subprocess.run(erase, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)
        during = load.answered - answered
        load.join()
        server.stop()

    assert done.returncode == 0, done.stdout + done.stderr
    [receipt] = json.loads(done.stdout)
    assert receipt["session_id"] == erased
    assert (receipt["items_erased"], receipt["readback_confirmed"]) == (held, True), receipt
    assert during > 0, "the erasure ran while the other sessions were being written"
    assert load.sent == 500 and not load.failed(), load.failed()
    assert_every_acknowledged_turn_stored(database, load, erased=erased)
