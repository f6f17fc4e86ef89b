"""Every operation a store runs on its file, declared once.

A declaration says what the owner may be asked for and what each side may assume:
whether a call may be sent again to the next owner after the owner died without
answering (`resend`), whether it reports progress or notes what it is about to erase,
whether it carries a batch id, and the shape of its arguments, notes and result on the
wire. The owner's whitelist, the client's resend policy, progress reporting, the local
and the remote transport all read these declarations, and nothing else.

On the wire everything is JSON data. Each value is checked against its declared shape
on arrival (`Shape`), so a frame can only ever become the plain values listed here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from ..options import TTL_MODES
from ..results import EndedSession, Erasure, IntegrityReport, PurgeReport, SessionIntegrity
from ..storage import reads, suffix, writes
from ..storage.codec import Batch
from ..storage.local_file import LocalFile
from ..storage.records import NEVER, Retention

T = TypeVar("T")


class ProtocolError(Exception):
    """A frame or a value that is not what the protocol allows: the connection is dropped."""


Shape = Callable[[Any], Any]  # checks a wire value and returns it as the Python value it stands for


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"expected text, got {type(value).__name__}")
    return value


def whole(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"expected an integer, got {type(value).__name__}")
    return value


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"expected true or false, got {type(value).__name__}")
    return value


def nothing(value: Any) -> None:
    if value is not None:
        raise ProtocolError(f"expected null, got {type(value).__name__}")


def optional(shape: Shape) -> Shape:
    return lambda value: None if value is None else shape(value)


def many(shape: Shape) -> Shape:
    def check(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise ProtocolError(f"expected a list, got {type(value).__name__}")
        return [shape(item) for item in value]

    return check


def pair(*shapes: Shape) -> Shape:
    """A tuple of fixed length (a list on the wire)."""

    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list) or len(value) != len(shapes):
            raise ProtocolError(f"expected a list of {len(shapes)}")
        return tuple(shape(item) for shape, item in zip(shapes, value, strict=True))

    return check


def record(cls: type[T], **fields: Shape) -> Shape:
    """A dataclass (an object on the wire with exactly these fields)."""

    def check(value: Any) -> T:
        if not isinstance(value, dict) or set(value) != set(fields):
            raise ProtocolError(f"expected a {cls.__name__}")
        return cls(**{name: shape(value[name]) for name, shape in fields.items()})

    return check


def counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ProtocolError("expected an object of counts")
    return {text(key): whole(number) for key, number in value.items()}


ROW = pair(whole, text)  # an item's atom id and payload
_ERASURE = record(Erasure, items_erased=whole, regions_dropped=whole, algorithm=text, readback_confirmed=flag)
_PURGE = record(
    PurgeReport,
    expired_items=whole,
    ended=many(record(EndedSession, session_id=text, rule=text, erasure=_ERASURE)),
)
_REPORT = record(
    IntegrityReport,
    ok=flag,
    pages_checked=whole,
    page_errors=many(text),
    item_verdicts=counts,
    audit_entries=whole,
    audit_break_at=optional(whole),
    sessions=many(
        record(
            SessionIntegrity,
            session_id=optional(text),
            expected=whole,
            readable=whole,
            not_authentic=whole,
            cause=optional(text),
        )
    ),
    findings=many(text),
)


def _plain(value: Any) -> Any:
    """A result as JSON data: dataclasses as objects (tuples become lists by themselves)."""
    return None if value is None else asdict(value)


def _same(value: Any) -> Any:
    return value


def _none(value: Any) -> None:
    return None


@dataclass(frozen=True)
class Operation(Generic[T]):
    """One operation on a file, as every process on it may call it.

    Attributes:
        name: Its name on the wire.
        run: What runs it where the file is open (transport.run_here): for a session's
            operation, the storage function, called with the session's layout, `Memory` and
            state, then the arguments after the session id; else a `LocalFile` method.
        params: The shape of each argument, in order (a batch id and `resent` included).
        result: The shape of what it returns.
        resend: May be sent again to the next owner after the owner died without answering.
        reports: Takes ``progress`` (called with done, total) after its arguments, reported to
            a caller that asks.
        notes: Takes ``note`` after its arguments, told what it is about to erase before it
            erases (shape `noted`).
        batched: Its last two arguments are a batch id and `resent` (see `SharedFile._call`).
        marks_local: The batch id is stored on a call of this process's own too.
        session: Its first argument is a session id: one session's operation, refused for a
            session another shard holds (shards.Ring).
    """

    name: str
    run: Callable[..., T]
    params: tuple[Shape, ...]
    result: Shape
    resend: bool
    reports: bool = False
    notes: bool = False
    noted: Shape = _same
    batched: bool = False
    marks_local: bool = True
    session: bool = True
    to_wire: Callable[[Any], Any] = _same

    def arguments(self, values: Any) -> tuple[Any, ...]:
        """The call's arguments from the wire, each checked against its shape."""
        if not isinstance(values, list) or len(values) != len(self.params):
            raise ProtocolError(f"{self.name} takes {len(self.params)} arguments")
        return tuple(shape(value) for shape, value in zip(self.params, values, strict=True))


def _idle_seconds(value: Any) -> float:
    """A session's own idle_ttl on the wire: positive seconds, or `NEVER` (math.inf)."""
    if value == NEVER and not isinstance(value, bool):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ProtocolError("expected a positive number of seconds")
    return float(value)


def _mode(value: Any) -> str:
    if value not in TTL_MODES:
        raise ProtocolError(f"expected a TTL mode, got {value!r}")
    return str(value)


_RETENTION = record(Retention, ttl_mode=optional(_mode), idle_ttl=optional(_idle_seconds))
_BATCH = record(
    Batch,
    payloads=many(text),
    texts=many(text),
    from_user=many(flag),
    expires_at=optional(whole),
    max_items=optional(whole),
    retention=optional(_RETENTION),
)


def batch(value: Any) -> Batch:
    """A `Batch`: its lists of one length, its expiry an integer or null, its cap at least 1 or null."""
    try:
        result: Batch = _BATCH(value)
    except ValueError as exc:  # Batch's own check: lists of different lengths
        raise ProtocolError(str(exc)) from None
    return result


def wire_argument(value: Any) -> Any:
    """An argument as JSON data (a `Batch` as an object; the rest is data already)."""
    if not isinstance(value, Batch):
        return value
    wired = asdict(value)
    if value.retention is not None:
        wired["retention"] = value.retention.to_payload()  # math.inf as NEVER
    return wired


S, N, ITEMS = text, whole, many(text)
_APPEND = (S, batch, S, flag)  # the session, the batch, its id and `resent`

APPEND = Operation[None](
    "append", writes.append, _APPEND, nothing, resend=True, batched=True, marks_local=False
)
NEWEST = Operation[list[str]]("newest", reads.newest, (S, N), ITEMS, resend=True)
ALL_ITEMS = Operation[list[str]]("all_items", reads.all_items, (S,), ITEMS, resend=True, reports=True)
SEARCH_PLACED = Operation[tuple[list[tuple[str, int]], int]](
    "search_placed", reads.search_placed, (S, S, N), pair(many(pair(text, whole)), whole), resend=True
)
SUMMARY = Operation[tuple[int, int, int] | None](
    "summary", reads.summary, (S,), optional(pair(N, N, N)), resend=True
)
# Sent again only if the owner died before it noted the item it pops (SharedFile.pop).
POP = Operation[str | None]("pop", writes.pop, (S,), optional(text), resend=True, notes=True, noted=ROW)
# Likewise, before it noted the newest item. The receipt's algorithm stays in the owner.
CLEAR = Operation[str | None](
    "clear", writes.clear, (S,), nothing, resend=True, notes=True, noted=whole, to_wire=_none
)
# These name the atom noted: doing them again finds it gone.
POP_IF_NEWEST = Operation[str]("pop_if_newest", writes.pop_if_newest, (S, N), text, resend=True)
CLEAR_THROUGH = Operation[None]("clear_through", writes.clear_through, (S, N), nothing, resend=True)
NEWEST_ROWS = Operation[tuple[list[tuple[int, str]], bool]](
    "newest_rows", suffix.newest_rows, (S, N), pair(many(ROW), flag), resend=True
)
OLDEST_ROWS = Operation[list[tuple[int, str]]](
    "oldest_rows", suffix.oldest_rows, (S, N, N, N), many(ROW), resend=True
)
REPLACE_SUFFIX = Operation[bool](
    "replace_suffix",
    suffix.replace_suffix,
    (S, many(ROW), batch, many(whole), S, flag),
    flag,
    resend=True,
    batched=True,
)
# Its receipt is lost with the owner: the operator runs it again.
ERASE = Operation[Erasure | None](
    "erase", writes.erase, (S, optional(text)), optional(_ERASURE), resend=False, to_wire=_plain
)
# The file's: every session, or none.
SESSION_IDS = Operation[list[str]](
    "session_ids", LocalFile.session_ids, (), ITEMS, resend=True, session=False
)
SUMMARIES = Operation[list[tuple[str, int, int, int]]](
    "summaries", LocalFile.summaries, (), many(pair(S, N, N, N)), resend=True, reports=True, session=False
)
PURGE = Operation[PurgeReport](
    "purge", LocalFile.purge, (), _PURGE, resend=True, reports=True, to_wire=_plain, session=False
)
VERIFY = Operation[IntegrityReport](
    "verify", LocalFile.verify, (), _REPORT, resend=True, reports=True, to_wire=_plain, session=False
)
# A second attempt would find the first one's files.
BACKUP = Operation[list[str]](
    "backup", LocalFile.backup, (S,), ITEMS, resend=False, reports=True, session=False
)

OPERATIONS: dict[str, Operation[Any]] = {
    operation.name: operation
    for operation in (
        APPEND,
        NEWEST,
        ALL_ITEMS,
        SEARCH_PLACED,
        SUMMARY,
        POP,
        CLEAR,
        POP_IF_NEWEST,
        CLEAR_THROUGH,
        NEWEST_ROWS,
        OLDEST_ROWS,
        REPLACE_SUFFIX,
        ERASE,
        SESSION_IDS,
        SUMMARIES,
        PURGE,
        VERIFY,
        BACKUP,
    )
}
