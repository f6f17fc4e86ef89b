"""A small ASGI agent app for tests/test_fork.py: one agent turn per request, no web framework.

It opens its store at import, from ``CITADEL_*`` variables, as an app does with a
module-level ``store = from_config()``: under ``gunicorn --preload`` the master opens
it and the workers inherit it. ``POST /turn?session=<id>`` with the user's text as the
body runs one `Runner.run` turn (a `ScriptedModel`: no network, no API key) against
``store.session(id)`` and answers 200 with the session's item count, or 500 with the
error's type, which it also logs (stderr, through the "turn_app" logger).
"""

from __future__ import annotations

import atexit
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message

from citadeldb_openai_agents import from_config

set_tracing_disabled(True)

log = logging.getLogger("turn_app")
log.addHandler(logging.StreamHandler(sys.stderr))
log.setLevel(logging.INFO)

store = from_config()
# The process that opened the store closes it at exit (gunicorn's master on SIGTERM); in a
# forked worker, close only marks the inherited store closed.
atexit.register(store.close)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/turn":
        await _respond(send, 404, "not found")
        return
    session_id = parse_qs(scope["query_string"].decode())["session"][0]
    text = await _body(receive)
    try:
        session = store.session(session_id)
        agent = Agent(name="assistant", model=ScriptedModel([[assistant_message(f"noted: {text}")]]))
        await Runner.run(agent, text, session=session)
        count = len(await session.get_items())
    except Exception as error:  # the test reads the log for the error's type
        log.error("turn failed in session %s: %s: %s", session_id, type(error).__name__, error)
        await _respond(send, 500, type(error).__name__)
        return
    await _respond(send, 200, str(count))


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _body(receive: Receive) -> str:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks).decode()


async def _respond(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
