"""The OpenTelemetry API, when it is installed (the ``otel`` extra), and nothing of it when not.

`API` is None without ``opentelemetry-api``: every caller then returns at once, and no module
of OpenTelemetry is imported. With it, `on()` says whether the application configured a
tracer or meter provider (an SDK); until it does, the API's own proxies are no-ops and the
package skips the work of filling their attributes (the A/B figures are in docs/operations.md).
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

NAME = "citadeldb_openai_agents"


class _Api:
    """The API's modules and this package's tracer and meter (proxies until a provider is set)."""

    def __init__(self, trace: ModuleType, metrics: ModuleType, context: ModuleType) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace, self.metrics, self.context = trace, metrics, context
        self.tracer: Any = trace.get_tracer(NAME)
        self.meter: Any = metrics.get_meter(NAME)
        self.propagator = TraceContextTextMapPropagator()  # W3C trace context only: no baggage crosses
        self._set = False  # a provider, once set, stays set (the API takes one per process)
        internal = getattr(metrics, "_internal", None)
        # The API's own slots for the providers, read without the environment lookups that
        # get_*_provider make (~0.9 us each); where a release renames them, the public calls.
        self._slots = (
            (trace, "_TRACER_PROVIDER") if hasattr(trace, "_TRACER_PROVIDER") else None,
            (internal, "_METER_PROVIDER") if hasattr(internal, "_METER_PROVIDER") else None,
        )
        self._unset = (trace.get_tracer_provider(), metrics.get_meter_provider())

    def configured(self) -> bool:
        """A tracer or meter provider was set (an SDK, or another implementation of the API)."""
        if self._set:
            return True
        tracing, metering = self._slots
        if tracing is not None and metering is not None:
            found = getattr(*tracing) is not None or getattr(*metering) is not None
        else:
            found = (
                self.trace.get_tracer_provider() is not self._unset[0]
                or self.metrics.get_meter_provider() is not self._unset[1]
            )
        self._set = found
        return found


def _load() -> _Api | None:
    try:
        if importlib.util.find_spec("opentelemetry") is None:
            return None
        from opentelemetry import context, metrics, trace
    except (ImportError, ValueError):  # a broken or partial install, or one blocked: telemetry off
        return None
    return _Api(trace, metrics, context)


API = _load()


def on() -> bool:
    """Whether anything recorded now goes anywhere: spans or metrics."""
    return API is not None and API.configured()
