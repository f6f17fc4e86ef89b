"""What crosses the owner's socket once the handshake (handshake.py) has keyed the connection.

Every message is a JSON array, sealed (channel.py):

* client -> owner, once: ``["hello", ClientHello]``; the owner answers ``["welcome", OwnerHello]``
  or ``["refused", reason]``;
* client -> owner, per call: ``["call", operation, arguments, reporting]``, the operation
  one of those declared in operations.py and its arguments checked against their shapes;
  the owner answers with any number of ``["progress", done, total]`` (only when
  `reporting`), ``["noted", value]`` (a pop or a clear says what it is about to erase,
  so a client that loses the owner mid-call knows how to finish it) and ``["alive"]``
  (every `HEARTBEAT_SECONDS` while a call runs), then ``["ok", result]`` or
  ``["error", name, message, details]``.

Errors cross as the name of one of this package's exceptions (`ERRORS`) with its message
and the few fields it carries; any other exception crosses as a `StorageError` telling it.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import asdict, dataclass
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
from ..options import (
    DEFAULT_SYNC_MODE,
    check_idle_ttl,
    check_sync_mode,
    check_ttl,
    check_ttl_mode,
    format_duration,
)
from ..results import LockHolder
from .operations import ProtocolError, flag, optional, pair, record, text, whole

HEARTBEAT_SECONDS = 1.0  # the owner's "alive" while a call runs; a client gives up after a silence


def wire_identity(embedder: EmbedderIdentity) -> tuple[str, int, str]:
    """An embedder's identity as the hellos carry it: model id, dimension, metric."""
    return (embedder.model_id, embedder.dim, embedder.metric)


@dataclass(frozen=True)
class Terms:
    """A store's settings that every process on one file must share, besides its embedder.

    The owner's apply to every call it serves: the TTL of what it writes, and the sync
    mode, which Citadel applies at each open (not once per file), so a client's would
    otherwise be silently replaced by the owner's, and by the next owner's after a handover.
    """

    ttl: float | None
    sync_mode: str
    # The erasure ledger's absolute path: a client whose erasures the owner records in no
    # ledger, or in another one, would find them back after a restore.
    erasure_ledger: str | None = None
    # How long sessions live (storage/retention.py): the owner ends every session by its own.
    ttl_mode: str = "item"
    idle_ttl: float | None = None

    @classmethod
    def of(
        cls,
        ttl: Any,
        sync_mode: Any,
        erasure_ledger: str | os.PathLike[str] | None,
        ttl_mode: Any,
        idle_ttl: Any,
    ) -> Terms:
        """A store's terms from its arguments, each checked (`ValueError` naming the argument)."""
        ledger = None if erasure_ledger is None else os.path.abspath(os.path.expanduser(erasure_ledger))
        return cls(
            check_ttl(ttl),
            check_sync_mode(sync_mode) or DEFAULT_SYNC_MODE,
            ledger,
            check_ttl_mode(ttl_mode) or "item",
            check_idle_ttl(idle_ttl),
        )


@dataclass(frozen=True)
class ClientHello:
    """Who is asking, and the settings fixed per file that must agree with the owner's."""

    pid: int
    program: str
    terms: Terms
    identity: tuple[str, int, str]  # the embedder: model id, dimension, metric


@dataclass(frozen=True)
class OwnerHello:
    """The owner's side of the handshake."""

    pid: int
    path: str
    terms: Terms
    identity: tuple[str, int, str]


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"expected a number of seconds, got {type(value).__name__}")
    return float(value)


_TERMS = record(
    Terms,
    ttl=optional(_seconds),
    sync_mode=text,
    erasure_ledger=optional(text),
    ttl_mode=text,
    idle_ttl=optional(_seconds),
)
_IDENTITY = pair(text, whole, text)
CLIENT_HELLO = record(ClientHello, pid=whole, program=text, terms=_TERMS, identity=_IDENTITY)
OWNER_HELLO = record(OwnerHello, pid=whole, path=text, terms=_TERMS, identity=_IDENTITY)


def hello_to_wire(hello: ClientHello | OwnerHello) -> dict[str, Any]:
    return asdict(hello)


def disagreements(owner: OwnerHello, mine: ClientHello, adopted: Collection[str] = ()) -> list[str]:
    """The settings fixed per file on which a client differs from its owner, each with both values.

    A setting in `adopted` is the owner's to decide: it never disagrees.
    """
    problems = []
    if "ttl" not in adopted and owner.terms.ttl != mine.terms.ttl:
        problems.append(
            f"ttl: this process has {_ttl(mine.terms.ttl)}, the owner has {_ttl(owner.terms.ttl)}"
        )
    if "embedder" not in adopted and tuple(owner.identity) != tuple(mine.identity):
        problems.append(
            f"embedder: this process has {_identity(mine.identity)}, the owner has {_identity(owner.identity)}"
        )
    if "sync_mode" not in adopted and owner.terms.sync_mode != mine.terms.sync_mode:
        problems.append(
            f"sync_mode: this process has {mine.terms.sync_mode!r}, the owner has {owner.terms.sync_mode!r}"
        )
    if "ttl_mode" not in adopted and owner.terms.ttl_mode != mine.terms.ttl_mode:
        problems.append(
            f"ttl_mode: this process has {mine.terms.ttl_mode!r}, the owner has {owner.terms.ttl_mode!r}"
        )
    if "idle_ttl" not in adopted and owner.terms.idle_ttl != mine.terms.idle_ttl:
        problems.append(
            f"idle_ttl: this process has {_idle(mine.terms.idle_ttl)}, the owner has {_idle(owner.terms.idle_ttl)}"
        )
    if "erasure_ledger" not in adopted and owner.terms.erasure_ledger != mine.terms.erasure_ledger:
        problems.append(
            f"erasure_ledger: this process has {_ledger(mine.terms.erasure_ledger)}, "
            f"the owner has {_ledger(owner.terms.erasure_ledger)}"
        )
    return problems


def _ledger(path: str | None) -> str:
    return "none" if path is None else repr(path)


def _idle(idle: float | None) -> str:
    return "none (never for idleness)" if idle is None else format_duration(idle)


def _ttl(ttl: float | None) -> str:
    return "no ttl (keep forever)" if ttl is None else f"ttl {format_duration(ttl)}"


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
