"""The agent app benchmarks/serving.py runs under ``uvicorn --workers N``: one agent turn per request.

``POST /turn?session=<id>`` with the user's text as the body runs one `Runner.run` turn (a
`ScriptedModel`: no network, no API key) against the session and answers 200. The
session is ``BENCH_BACKEND``'s: "citadel", a store opened at import from ``CITADEL_*``
variables (the first worker owns the file, the others become its clients); or "sqlite",
`agents.SQLiteSession` on the file at ``BENCH_SQLITE_PATH`` (SQLite serves many
processes by itself). One session object per id and process, for both.
"""

from __future__ import annotations

import atexit
import os
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
