"""One shard of a fleet: an ASGI agent app, one agent turn per request, no API key.

``POST /turn`` with ``{"session_id": ..., "text": ...}`` runs one `Runner.run` turn (a
`ScriptedModel` that answers from its input: no network) against the session and answers
200 with ``{"reply": ..., "items": N}``, N the session's item count after the turn. The
store comes from `from_config()`: its citadel.toml names the fleet's ``shards`` and this
process's ``shard``. A session of another shard is refused before anything is read
(`WrongShardError`) and answered 421 with an ``X-Shard-Owner`` header naming its shard:
the router in front (nginx.conf.template) sends the request there. A session moving to
another shard during a ring change (`ShardMovingError`) is answered 503 with
``Retry-After: 1``; nothing of that turn is stored. ``GET /health``
answers ``{"shard": name}``. No web framework. With ``FLEET_METRICS_DIR`` set (run.py sets it),
each process exposes its metrics for Prometheus on a port of its own (`_expose_metrics`).

What it trusts: a ``POST /turn`` must carry ``Authorization: Bearer TOKEN``, the token in the
file ``FLEET_TOKEN_FILE`` names (run.py writes a random one, mode 600), compared in constant
time; any other request is answered 401 and reads nothing. Whoever holds the token may
write to and read from any session (this example has no per-user identity: put a real
authentication in front, or check the user's own token here, before serving people). The
body is at most 64 KiB of JSON: a bigger one, or one nested past what `json` parses, is a 400.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message

from citadeldb_openai_agents import CitadelSettings, ShardMovingError, WrongShardError, from_config

set_tracing_disabled(True)
settings = CitadelSettings()


def _expose_metrics() -> Path | None:
    """This process's metrics on a port of its own, for Prometheus, when FLEET_METRICS_DIR is set
    and the SDK and its Prometheus exporter are installed; the target file it writes there.

    Every process of a shard (uvicorn's workers: the file's owner and its clients) exposes its own
    series, and the package records each event once, where it happens (the owner counts the
    file's work, each process its own calls' time), so a sum over a shard's targets counts each
    write once. The target file is in Prometheus's file_sd format, labelled with the shard and
    the pid; Prometheus finds each process there (docs/operations.md has the scrape config).
    """
    directory = os.environ.get("FLEET_METRICS_DIR")
    if not directory:
        return None
    try:
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from prometheus_client import start_http_server
    except ImportError:  # the example runs without them, unmeasured
        return None
    instance = f"{settings.shard}-{os.getpid()}"
    resource = Resource.create({"service.name": "agent-fleet", "service.instance.id": instance})
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()]))
    server, _ = start_http_server(0, addr="127.0.0.1")  # a free port of this process's, on loopback
    target = Path(directory) / f"{instance}.json"
    labels = {"shard": str(settings.shard), "pid": str(os.getpid())}
    draft = target.with_suffix(".tmp")
    draft.write_text(json.dumps([{"targets": [f"127.0.0.1:{server.server_port}"], "labels": labels}]))
    os.replace(draft, target)  # Prometheus never reads half a file
    return target


metrics_target = _expose_metrics()
store = from_config(settings)
TOKEN = open(os.environ["FLEET_TOKEN_FILE"], "rb").read().strip()  # noqa: SIM115 (read once)
MAX_BODY = 64 * 1024

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """The ASGI entry point: the lifespan (the store closes at shutdown) and ``POST /turn``."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/health":
        await _respond(send, 200, {"shard": settings.shard})
        return
    if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/turn":
        await _respond(send, 404, {"error": "not found"})
        return
    if not _authorized(scope):
        await _respond(send, 401, {"error": "a bearer token is required"}, [(b"www-authenticate", b"Bearer")])
        return
    try:
        request = json.loads(await _body(receive))
        session_id, text = request["session_id"], request["text"]
        if not isinstance(session_id, str) or not isinstance(text, str):
            raise TypeError("session_id and text are strings")
    except RecursionError:
        await _respond(send, 400, {"error": "the JSON body is nested too deeply"})
        return
    except (ValueError, KeyError, TypeError) as exc:
        await _respond(send, 400, {"error": f"expected {{'session_id': ..., 'text': ...}}: {exc}"})
        return
    try:
        session = store.session(session_id)
        history = await session.get_items()
        # The model knows only its input: the reply says how many items the stored history fed it.
        reply = f"{text!r} noted, after {len(history)} stored items"
        agent = Agent(name="assistant", model=ScriptedModel([[assistant_message(reply)]]))
        await Runner.run(agent, text, session=session)
    except ShardMovingError as exc:  # before WrongShardError, its base class
        await _respond(send, 503, {"error": str(exc), "owner": exc.owner}, [(b"retry-after", b"1")])
        return
    except WrongShardError as exc:
        owner = [(b"x-shard-owner", exc.owner.encode())]
        await _respond(send, 421, {"error": str(exc), "owner": exc.owner}, owner)
        return
    # The turn is stored (its question and the reply): counted, not read again, since a ring
    # change begun meanwhile would refuse the read, and the stored turn would look failed.
    await _respond(send, 200, {"reply": reply, "items": len(history) + 2})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            store.close()
            if metrics_target is not None:
                metrics_target.unlink(missing_ok=True)  # this process's series end with it
            await send({"type": "lifespan.shutdown.complete"})
            return


def _authorized(scope: dict[str, Any]) -> bool:
    given = dict(scope["headers"]).get(b"authorization", b"")
    return hmac.compare_digest(given, b"Bearer " + TOKEN)


async def _body(receive: Receive) -> bytes:
    """The request's body; a ValueError (a 400) past MAX_BODY, read no further."""
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ValueError(f"the body is over {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _respond(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    head += headers or []
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": data})
