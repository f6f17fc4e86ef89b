"""The agent app benchmarks/serving.py runs under ``uvicorn --workers N``: one agent turn per request.

``POST /turn?session=<id>`` with the user's text as the body runs one `Runner.run` turn (a
`ScriptedModel`: no network, no API key) against the session and answers 200. The
session is ``BENCH_BACKEND``'s: "citadel", a store opened at import from ``CITADEL_*``
variables (the first worker owns the file, the others become its clients); or "sqlite",
`agents.SQLiteSession` on the file at ``BENCH_SQLITE_PATH`` (SQLite serves many
processes by itself). One session object per id and process, for both.

With ``BENCH_COMMIT_STATS`` (a directory), each worker times every Citadel commit
(``remember_batch``) it runs, which in the owner is every process's, and writes at
shutdown ``<pid>.json``: per commit, the wall time, the thread's time on a CPU and
its time waiting for one (Linux ``/proc/thread-self/schedstat``). This reaches into
the package's storage handle: a measurement, not an API.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from agents import Agent, Runner, SQLiteSession, set_tracing_disabled
from agents.memory import Session
from agents.testing import ScriptedModel, assistant_message

from citadeldb_openai_agents import from_config

set_tracing_disabled(True)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_sessions: dict[str, Session] = {}
# One timed commit: its start (monotonic seconds), then its wall, on-CPU and waiting-for-a-CPU ms.
Commit = tuple[float, float, float, float]
_commits: list[Commit] = []


def _time_commits() -> None:
    """Wrap the storage handle's writes so that every commit is timed (BENCH_COMMIT_STATS)."""
    from citadeldb_openai_agents.storage import memory_handle as handle

    write = handle.MemoryHandle._write
    lock = threading.Lock()

    def _schedstat() -> tuple[float, float]:
        with open("/proc/thread-self/schedstat") as stat:
            on_cpu, waiting, _ = stat.read().split()
        return int(on_cpu) / 1e6, int(waiting) / 1e6

    def timed(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name != "remember_batch":
            return write(self, name, *args, **kwargs)
        cpu, waited = _schedstat()
        start = time.monotonic()  # the same clock in every process: the benchmark's window
        try:
            return write(self, name, *args, **kwargs)
        finally:
            wall = (time.monotonic() - start) * 1000
            cpu_after, waited_after = _schedstat()
            with lock:
                _commits.append((start, wall, cpu_after - cpu, waited_after - waited))

    handle.MemoryHandle._write = timed  # type: ignore[method-assign]


def _write_commit_stats() -> None:
    path = os.path.join(os.environ["BENCH_COMMIT_STATS"], f"{os.getpid()}.json")
    with open(path, "w") as out:
        json.dump(_commits, out)


if os.environ.get("BENCH_COMMIT_STATS"):
    _time_commits()

if os.environ["BENCH_BACKEND"] == "citadel":
    store = from_config()
    atexit.register(store.close)

    def _open(session_id: str) -> Session:
        return store.session(session_id)

else:

    def _open(session_id: str) -> Session:
        return SQLiteSession(session_id, os.environ["BENCH_SQLITE_PATH"])


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        if os.environ.get("BENCH_COMMIT_STATS"):
            _write_commit_stats()  # uvicorn's workers end without running atexit
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http" or scope["path"] != "/turn":
        await _respond(send, 404)
        return
    session_id = parse_qs(scope["query_string"].decode())["session"][0]
    text = b""
    while True:
        message = await receive()
        text += message.get("body", b"")
        if not message.get("more_body"):
            break
    session = _sessions.get(session_id) or _sessions.setdefault(session_id, _open(session_id))
    agent = Agent(name="assistant", model=ScriptedModel([[assistant_message(f"noted: {text.decode()}")]]))
    await Runner.run(agent, text.decode(), session=session)
    await _respond(send, 200)


async def _respond(send: Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
