"""Metrics, each event counted once, by the process where it happens.

The processes of one file (its owner, its clients, and a new owner after a handover) report
without counting anything twice because each instrument has one recorder:

* the process that makes a call times it (``db.client.operation.duration``, its role an
  attribute): a client's latency includes the socket, the owner's does not;
* the process that holds the file counts what the file does: items written, read and erased,
  erasures and their readback, retention's erasures, search time, handshake refusals;
* the process that takes a file over counts the handover; one that is refused a damaged file,
  the refusal.

A client never counts its owner's work, and an owner never counts its clients' calls, so the sum
over every process of a shard (``sum by (db_namespace)`` in PromQL) is the shard's. Each process
exports its own series (its ``service.instance.id``); a handover ends the old owner's series and
the new owner's start at zero, which `rate()` and `increase()` read as the reset they are.
"""

from __future__ import annotations

from typing import Any

from .otel import API, on

_instruments: dict[str, Any] = {}

# Name: (kind, unit, description). The names follow OpenTelemetry's conventions where one exists.
INSTRUMENTS: dict[str, tuple[str, str, str]] = {
    "db.client.operation.duration": (
        "histogram",
        "s",
        "how long a public call (a session's or a store's) took, in the process that made it",
    ),
    "citadel.items.written": ("counter", "{item}", "items written to the file, by its owner"),
    "citadel.items.read": ("counter", "{item}", "items read from the file, by its owner"),
    "citadel.items.erased": (
        "counter",
        "{item}",
        "items erased, their keys destroyed, by cause (erase, pop, clear, max_items, ttl, retention, compaction)",
    ),
    "citadel.erasures": (
        "counter",
        "{erasure}",
        "erasures with a readback, by cause and by whether Citadel read every erased atom back as missing",
    ),
    "citadel.retention.erasures": (
        "counter",
        "{session}",
        "sessions erased because they ended (ttl_mode=session or idle_ttl), by rule and trigger",
    ),
    "citadel.handovers": ("counter", "{handover}", "files taken over from an owner that stopped"),
    "citadel.handshake.refusals": (
        "counter",
        "{refusal}",
        "peers the owner refused or turned away at the handshake, by cause",
    ),
    "citadel.opens.refused": ("counter", "{open}", "opens refused because the file is damaged"),
    "citadel.search.duration": ("histogram", "s", "how long a search took where the file is"),
}


def _instrument(name: str) -> Any:
    found = _instruments.get(name)
    if found is None:
        assert API is not None
        kind, unit, description = INSTRUMENTS[name]
        make = API.meter.create_histogram if kind == "histogram" else API.meter.create_counter
        found = _instruments[name] = make(name, unit=unit, description=description)
    return found


def _add(name: str, amount: float, attributes: dict[str, Any]) -> None:
    if on() and amount:
        _instrument(name).add(amount, attributes)


def operation_took(seconds: float, operation: str, path: str, role: str, error: str | None) -> None:
    """A public call's duration, recorded by the process that made it."""
    if not on():
        return
    attributes = {"db.system.name": "citadeldb", "db.operation.name": operation, "db.namespace": path}
    attributes["citadel.role"] = role
    if error is not None:
        attributes["error.type"] = error
    _instrument("db.client.operation.duration").record(seconds, attributes)


def items(direction: str, count: int, path: str) -> None:
    """`count` items `direction` ("written" or "read") where the file is."""
    _add(f"citadel.items.{direction}", count, {"db.namespace": path})


def erased(count: int, path: str, cause: str) -> None:
    """`count` items erased (keys destroyed) where the file is, for `cause`."""
    _add("citadel.items.erased", count, {"db.namespace": path, "citadel.erasure.cause": cause})


def erasure(path: str, cause: str, confirmed: bool) -> None:
    """One erasure with a readback, and its result."""
    readback = "confirmed" if confirmed else "failed"
    _add(
        "citadel.erasures",
        1,
        {"db.namespace": path, "citadel.erasure.cause": cause, "citadel.readback": readback},
    )


def retention_erased(path: str, rule: str, trigger: str) -> None:
    """A session erased because it ended, by `rule` (ttl, idle_ttl), found by `trigger` (sweep, purge, access)."""
    _add(
        "citadel.retention.erasures",
        1,
        {"db.namespace": path, "citadel.retention.rule": rule, "citadel.retention.trigger": trigger},
    )


def handover(path: str) -> None:
    """This process took the file over from an owner that stopped."""
    _add("citadel.handovers", 1, {"db.namespace": path})


def handshake_refused(path: str, cause: str) -> None:
    """The owner refused or turned away a peer at its handshake, for `cause`."""
    _add("citadel.handshake.refusals", 1, {"db.namespace": path, "citadel.refusal.cause": cause})


def open_refused(path: str) -> None:
    """An open refused because the file is damaged."""
    _add("citadel.opens.refused", 1, {"db.namespace": path, "citadel.refusal.cause": "damage"})


def search_took(seconds: float, path: str) -> None:
    """A search's time where the file is."""
    if on():
        _instrument("citadel.search.duration").record(seconds, {"db.namespace": path})
