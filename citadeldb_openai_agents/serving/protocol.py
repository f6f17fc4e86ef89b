"""What crosses the owner's socket once the handshake (handshake.py) has keyed the connection.

Every message is a JSON array, sealed (channel.py):

* client -> owner, once: ``["hello", ClientHello]``; the owner answers ``["welcome", OwnerHello]``
  or ``["refused", reason]``;
* client -> owner, per call: ``["call", operation, arguments, reporting, trace]``, the
  operation one of those declared in operations.py and its arguments checked against their
  shapes; `trace` the caller's W3C trace context (``traceparent``, ``tracestate``; ``{}`` when
  none), kept only if well formed (telemetry/spans.py), so the owner's span continues it;
  the owner answers with any number of ``["progress", done, total]`` (only when
  `reporting`), ``["noted", value]`` (a pop or a clear says what it is about to erase,
  so a client that loses the owner mid-call knows how to finish it) and ``["alive"]``
  (every `HEARTBEAT_SECONDS` while a call runs), then ``["ok", result]`` or
  ``["error", name, message, details]``.

Errors cross as the name of one of this package's exceptions (`ERRORS`) with its message
and the few fields it carries; any other exception crosses as a `StorageError` telling it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..embedders.protocol import EmbedderIdentity
from ..errors import (
    CitadelSessionError,
    ConfigurationError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    ForkedStoreError,
    StorageError,
)
from ..options import StoreOptions
from ..results import LockHolder
from .operations import ProtocolError, flag, optional, pair, record, text, whole

HEARTBEAT_SECONDS = 1.0  # the owner's "alive" while a call runs; a client gives up after a silence


def wire_identity(embedder: EmbedderIdentity) -> tuple[str, int, str]:
    """An embedder's identity as the hellos carry it: model id, dimension, metric."""
    return (embedder.model_id, embedder.dim, embedder.metric)


@dataclass(frozen=True)
class ClientHello:
    """Who is asking, and the settings fixed per file that must agree with the owner's."""

    pid: int
    program: str
    terms: StoreOptions  # the settings fixed per file are compared; the others are told
    identity: tuple[str, int, str]  # the embedder: model id, dimension, metric


@dataclass(frozen=True)
class OwnerHello:
    """The owner's side of the handshake."""

    pid: int
    path: str
    terms: StoreOptions  # the settings fixed per file are compared; the others are told
    identity: tuple[str, int, str]


def _terms(value: Any) -> StoreOptions:
    """A store's options from the wire, each checked as the store checks its own arguments."""
    if not isinstance(value, dict) or set(value) != {option.name for option in fields(StoreOptions)}:
        raise ProtocolError("expected a store's options")
    try:
        return StoreOptions.of(**value)
    except (TypeError, ValueError) as exc:  # TypeError: a path that is not text
        raise ProtocolError(str(exc)) from None


_IDENTITY = pair(text, whole, text)
CLIENT_HELLO = record(ClientHello, pid=whole, program=text, terms=_terms, identity=_IDENTITY)
OWNER_HELLO = record(OwnerHello, pid=whole, path=text, terms=_terms, identity=_IDENTITY)


def hello_to_wire(hello: ClientHello | OwnerHello) -> dict[str, Any]:
    return asdict(hello)


def disagreements(owner: OwnerHello, mine: ClientHello, adopted: Collection[str] = ()) -> list[str]:
    """The settings fixed per file on which a client differs from its owner, each with both values.

    A setting in `adopted` is the owner's to decide: it never disagrees.
    """
    problems = []
    if "embedder" not in adopted and tuple(owner.identity) != tuple(mine.identity):
        problems.append(
            f"embedder: this process has {_identity(mine.identity)}, the owner has {_identity(owner.identity)}"
        )
    theirs = owner.terms.shared()
    for name, value in mine.terms.shared().items():
        if name not in adopted and value != theirs[name]:
            mine_told, theirs_told = StoreOptions.told(name, value), StoreOptions.told(name, theirs[name])
            problems.append(f"{name}: this process has {mine_told}, the owner has {theirs_told}")
    return problems


def _identity(identity: tuple[str, int, str]) -> str:
    model_id, dim, metric = identity
    return f"{model_id!r} (dim {dim}, {metric})"


def _tree(cls: type[CitadelSessionError]) -> list[type[CitadelSessionError]]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _tree(child))]


# The exceptions that cross by name: this package's own (errors.py); any other is told in a StorageError.
ERRORS: dict[str, type[CitadelSessionError]] = {
    cls.__name__: cls
    for cls in _tree(CitadelSessionError)
    if cls.__module__ == CitadelSessionError.__module__
}


def error_to_wire(exc: BaseException) -> list[Any]:
    """``["error", name, message, details]`` for `exc`."""
    if ERRORS.get(type(exc).__name__) is not type(exc):
        return ["error", "StorageError", f"{type(exc).__name__}: {exc}", {}]
    details: dict[str, Any] = {}
    if isinstance(exc, ConfigurationError):
        details["problems"] = exc.problems
    elif isinstance(exc, DatabaseLockedError) and exc.holder is not None:
        details["holder"] = [exc.holder.pid, exc.holder.command]
    elif isinstance(exc, DatabaseNotFoundError):
        details["creation_refused"] = exc.creation_refused
    elif isinstance(exc, ForkedStoreError):
        details["path"], details["owner_pid"] = exc.path, exc.owner_pid
    elif isinstance(exc, (CorruptDatabaseError, StorageError)):
        details["cause"], details["advice"] = exc.cause, exc.advice
    return ["error", type(exc).__name__, str(exc), details]


def error_from_wire(name: Any, message: Any, details: Any) -> CitadelSessionError:
    """The exception the owner raised, rebuilt from its name and fields (an unknown name: StorageError)."""
    message = text(message)
    cls = ERRORS.get(text(name), StorageError)
    if not isinstance(details, dict):
        raise ProtocolError("an error's details are not an object")
    if cls is ConfigurationError:
        return ConfigurationError([text(problem) for problem in details.get("problems", [message])])
    if cls is DatabaseLockedError:
        holder = details.get("holder")
        found = None if holder is None else LockHolder(*pair(whole, optional(text))(holder))
        return DatabaseLockedError(message, holder=found)
    if cls is DatabaseNotFoundError:
        return DatabaseNotFoundError(message, creation_refused=flag(details.get("creation_refused", False)))
    if cls is ForkedStoreError:
        return ForkedStoreError(message, text(details.get("path", "")), whole(details.get("owner_pid", 0)))
    if cls in (CorruptDatabaseError, StorageError) and "cause" in details:
        return cls(text(details["cause"]), text(details.get("advice", "")))
    return cls(message)
