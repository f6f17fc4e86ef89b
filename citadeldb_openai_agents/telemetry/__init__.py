"""What the package tells an operator: OpenTelemetry spans and metrics, and its log lines.

* otel.py: the OpenTelemetry API if installed (the ``otel`` extra), and whether an SDK is set;
* spans.py: a span per public call and per operation, the trace context across the socket;
* metrics.py: the instruments, each event recorded once, by the process where it happens;
* events.py: the log lines an operator acts on, with structured fields.

Without ``opentelemetry-api`` nothing of it is imported and each call returns at once; with
it and no SDK configured (its no-op), the package skips filling attributes. Nothing recorded
holds an item's text, a session id or an owner in clear, or anything of a passphrase. This
package imports nothing of ours: every layer may report through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from . import events, metrics
from .otel import on
from .spans import carrier, checked_carrier, continued, given, operation, returned, traced

# Why the erasures made now are made: "erase" (a request), "retention" (with the rule that ended
# the session and who found it), set by whoever starts them, read where the keys are destroyed
# (storage/writes.py).
_CAUSE: ContextVar[tuple[str, dict[str, str]]] = ContextVar("citadel_erasure_cause", default=("erase", {}))


@contextlib.contextmanager
def erasing_for(cause: str, **detail: str) -> Iterator[None]:
    """The erasures made inside are counted and logged for `cause`, their log line with `detail`
    (retention's ``rule`` and ``trigger``)."""
    token = _CAUSE.set((cause, detail))
    try:
        yield
    finally:
        _CAUSE.reset(token)


def erasure_cause() -> str:
    """The cause of the erasures made now (`erasing_for`)."""
    return _CAUSE.get()[0]


def erasure_detail() -> dict[str, str]:
    """What `erasing_for` was told beside the cause."""
    return _CAUSE.get()[1]


__all__ = [
    "carrier",
    "checked_carrier",
    "continued",
    "erasing_for",
    "erasure_cause",
    "erasure_detail",
    "events",
    "given",
    "metrics",
    "on",
    "operation",
    "returned",
    "traced",
]
