"""Spans: one per public call (`traced`), one per operation where the file is (`operation`).

A public call (a session's ``add_items``, a store's ``erase_session``) is a span in the process
that makes it, role ``owner`` or ``client``. Each operation it runs on the file (``append``,
``newest``...) is a child span in the process that holds the file, role ``owner``: in this
process, or in the owner, which continues the client's trace from the context the call
carries over the socket (`carrier`, `continued`). Both follow OpenTelemetry's database
conventions: ``db.system.name`` ``citadeldb``, ``db.operation.name``, the file's path as
``db.namespace``.

What a span holds is counts and names: items and bytes, the role, the shard, an error's type.
Never an item's text, a session id or an owner (an error's message may name a session, so only
its type is kept), and nothing of a passphrase.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar, cast

from . import metrics
from .otel import API, on

F = TypeVar("F", bound=Callable[..., Any])
Counted = Callable[[tuple[Any, ...], Any], int]

SYSTEM = "citadeldb"
# W3C trace context: the only fields that cross the socket, each checked before it is read.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE_MAX = 512


def returned(args: tuple[Any, ...], result: Any) -> int:
    """`counted` for a call that returns its items."""
    return len(result)


def given(args: tuple[Any, ...], result: Any) -> int:
    """`counted` for a call whose first argument is its items."""
    return len(args[0]) if args else 0


class Traced(Protocol):
    """What a public call's object tells its span: the file, this process's role, the shard."""

    def _telemetry(self) -> tuple[str, str, str | None]: ...


def traced(name: str, *, counted: Counted | None = None) -> Callable[[F], F]:
    """Make each call of the decorated method (sync or async) a span named `name`, and time it
    (``db.client.operation.duration``). `counted(args, result)` gives the items it took or
    returned (``citadel.items``), computed only for a span that records."""

    def decorate(method: F) -> F:
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def run_async(self: Traced, *args: Any, **kwargs: Any) -> Any:
                if not on():
                    return await method(self, *args, **kwargs)
                with _public(self, name, counted, args) as done:
                    return done(await method(self, *args, **kwargs))

            return cast(F, run_async)

        @functools.wraps(method)
        def run(self: Traced, *args: Any, **kwargs: Any) -> Any:
            if not on():
                return method(self, *args, **kwargs)
            with _public(self, name, counted, args) as done:
                return done(method(self, *args, **kwargs))

        return cast(F, run)

    return decorate


@contextlib.contextmanager
def _public(
    target: Traced, name: str, counted: Counted | None, args: tuple[Any, ...]
) -> Iterator[Callable[[Any], Any]]:
    assert API is not None
    path, role, shard = target._telemetry()
    attributes: dict[str, Any] = {
        "db.system.name": SYSTEM,
        "db.operation.name": name,
        "db.namespace": path,
        "citadel.role": role,
    }
    if shard is not None:
        attributes["citadel.shard"] = shard
    started = time.perf_counter()
    error: str | None = None
    with API.tracer.start_as_current_span(
        name,
        kind=API.trace.SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:

        def done(result: Any) -> Any:
            if counted is not None and span.is_recording():
                span.set_attribute("citadel.items", counted(args, result))
            return result

        try:
            yield done
        except BaseException as exc:
            error = type(exc).__name__
            _failed(span, error)
            raise
        finally:
            # The role may have changed under the call (a takeover): the one at its end counts.
            role = target._telemetry()[1]
            if role != attributes["citadel.role"]:
                span.set_attribute("citadel.role", role)
            metrics.operation_took(time.perf_counter() - started, name, path, role, error)


@contextlib.contextmanager
def operation(
    name: str, path: str, parent: Any = None, session: str | None = None
) -> Iterator[Callable[[str, int], None]]:
    """The span of one operation run where the file is (role ``owner``), continuing `parent`
    (`continued`) when a client sent it; yields `note(attribute, value)` for its counts.
    `session` is the session's salted hash, never its id."""
    if not on():
        yield _ignore
        return
    assert API is not None
    attributes: dict[str, Any] = {
        "db.system.name": SYSTEM,
        "db.operation.name": name,
        "db.namespace": path,
        "citadel.role": "owner",
    }
    if session is not None:
        attributes["citadel.session.hash"] = session
    kind = API.trace.SpanKind.SERVER if parent is not None else API.trace.SpanKind.INTERNAL
    with API.tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span.set_attribute
        except BaseException as exc:
            _failed(span, type(exc).__name__)
            raise


def _failed(span: Any, error: str) -> None:
    assert API is not None
    span.set_attribute("error.type", error)
    span.set_status(API.trace.Status(API.trace.StatusCode.ERROR))  # no description: it may name a session


def _ignore(attribute: str, value: int) -> None:
    return None


def carrier() -> dict[str, str]:
    """The current trace context, to send with a call to the owner (empty when none is recording)."""
    if not on():
        return {}
    assert API is not None
    found: dict[str, str] = {}
    API.propagator.inject(found)
    return found


def continued(sent: Mapping[str, Any]) -> Any:
    """The context a client's call carried (already checked by `checked_carrier`), or None."""
    if not sent or not on():
        return None
    assert API is not None
    return API.propagator.extract(dict(sent))


def checked_carrier(value: Any) -> dict[str, str]:
    """A call's trace context from the wire, hostile until checked: only a well-formed W3C
    ``traceparent`` and a bounded ``tracestate`` are kept; anything else is dropped (the trace
    then starts again at the owner). A value that is not an object raises `ValueError`."""
    if not isinstance(value, dict):
        raise ValueError("a call's trace context is not an object")
    kept: dict[str, str] = {}
    parent, state = value.get("traceparent"), value.get("tracestate")
    if isinstance(parent, str) and len(parent) == 55 and _TRACEPARENT.fullmatch(parent):
        kept["traceparent"] = parent
        if isinstance(state, str) and len(state) <= _TRACESTATE_MAX and state.isprintable():
            kept["tracestate"] = state
    return kept
