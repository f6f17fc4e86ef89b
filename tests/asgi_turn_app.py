"""A small ASGI agent app for tests/test_fork.py and tests/test_load.py: one agent turn per request.

It opens its store at import, from ``CITADEL_*`` variables, as an app does with a
module-level ``store = from_config()``: under ``gunicorn --preload`` the master opens
it and the workers inherit it. ``POST /turn?session=<id>`` with the user's text as the
body runs one `Runner.run` turn (a `ScriptedModel`: no network, no API key) against
``store.session(id)`` and answers 200 with the session's item count, or 500 with the
error's type, which it also logs (stderr, through the "turn_app" logger). No web framework.

With ``TURN_APP_HOLD_SWITCH`` set to a path, the process that owns the file holds still
in a write another process sent it, once per time a file appears at that path (renamed to
``<path>.held`` when it holds): just before it commits the write if the file says
"before", just after it committed it, before it answers, if it says "after". Those are
the moments at which tests/test_load.py kills the owner: a write in flight that must be
sent again, and one that must not be applied twice.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message

from citadeldb_openai_agents import from_config
from citadeldb_openai_agents.serving import operations

set_tracing_disabled(True)

log = logging.getLogger("turn_app")
log.addHandler(logging.StreamHandler(sys.stderr))
log.setLevel(logging.INFO)


def hold_served_writes(switch: str) -> None:
    """In the owner, stop in a write a client sent, once per switch file (see above)."""
    declared = operations.OPERATIONS["append"]

    def append(*args: Any) -> None:
        # Only a write this process serves (serving/server.py names the thread), not its own.
        served = threading.current_thread().name == "citadel-client"
        if served and _switched(switch, "before"):
            threading.Event().wait()  # never committed, never answered: until the test kills this process
        declared.run(*args)
        if served and _switched(switch, "after"):
            threading.Event().wait()  # committed, never answered: until the test kills this process

    # The table the owner's server looks a client's call up in (its own calls use APPEND itself).
    operations.OPERATIONS["append"] = dataclasses.replace(declared, run=append)


def _switched(switch: str, moment: str) -> bool:
    """Whether the switch is set for `moment`; one write takes it, the others carry on."""
    try:
        with open(switch, encoding="utf-8") as file:
            if file.read().strip() != moment:
                return False
        os.rename(switch, f"{switch}.held")
    except FileNotFoundError:
        return False
    return True


if os.environ.get("TURN_APP_HOLD_SWITCH"):
    hold_served_writes(os.environ["TURN_APP_HOLD_SWITCH"])

store = from_config()
# Closed in the ASGI lifespan's shutdown (each worker's, in uvicorn and gunicorn), where a
# SIGTERM lands: uvicorn re-raises it once shut down, so atexit never runs there. atexit
# stays for gunicorn's master, which runs no lifespan. In a forked worker, close only marks
# the inherited store closed.
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
            store.close()
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
