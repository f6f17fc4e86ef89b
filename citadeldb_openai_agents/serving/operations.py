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

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

from ..errors import InvalidLabelsError, InvalidOwnerError
from ..options import SessionOptions
from ..people import check_labels, check_owner
from ..results import (
    EndedSession,
    Erasure,
    IntegrityReport,
    LastErasure,
    OwnerStatus,
    PageLayout,
    PurgeReport,
    SessionIntegrity,
    StatusReport,
)
from ..storage import branches, data_owners, reads, suffix, writes
from ..storage import usage as usage_store
from ..storage.codec import Batch
from ..storage.local_file import LocalFile
from ..storage.records import MAIN
from ..storage.segments import SessionKey

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


def number(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ProtocolError(f"expected a number, got {type(value).__name__}")
    return float(value)


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
_ERASURE = record(
    Erasure,
    items_erased=whole,
    regions_dropped=whole,
    algorithm=text,
    readback_confirmed=flag,
    ledger=optional(text),
    ledger_entries=lambda value: tuple(many(whole)(value)),
    receipt_id=text,
)
_ENDED = record(EndedSession, session_id=text, rule=text, erasure=_ERASURE, branch=text, at=optional(number))
_PURGE = record(
    PurgeReport,
    expired_items=whole,
    ended=many(_ENDED),
    swept=many(_ENDED),
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
    layout=optional(
        record(PageLayout, header_bytes=whole, page_size=whole, high_water_mark=whole, file_size=whole)
    ),
    damaged_pages=many(whole),
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
        batched: Its last two arguments are a batch id (`SharedFile.call` makes one) and `resent`.
        marks_local: The batch id is stored on a call of this process's own too.
        session: Its first argument is a session id: one session's operation, refused for a
            session another shard holds (shards.Ring).
        counts: The items it moves, counted where the file is (telemetry/): "written" (those of
            its batch) or "read" (those it returns); None: neither.
        search: It is a search (its time is ``citadel.search.duration``).
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
    counts: str | None = None
    search: bool = False

    def measure(self, args: tuple[Any, ...], result: Any) -> tuple[int, int]:
        """The items and the bytes of their JSON that the call moved, as `counts` says."""
        if self.counts == "written":
            payloads = next((a.payloads for a in args if isinstance(a, Batch)), [])
        else:  # a list of payloads, or of rows holding one (with ids, times, positions), maybe in a pair
            found = result[0] if isinstance(result, tuple) else result
            payloads = [row if isinstance(row, str) else _text_of(row) for row in found or ()]
        return len(payloads), sum(len(payload.encode("utf-8", "surrogatepass")) for payload in payloads)

    def arguments(self, values: Any) -> tuple[Any, ...]:
        """The call's arguments from the wire, each checked against its shape."""
        if not isinstance(values, list) or len(values) != len(self.params):
            raise ProtocolError(f"{self.name} takes {len(self.params)} arguments")
        return tuple(shape(value) for shape, value in zip(self.params, values, strict=True))


def _session_options(value: Any) -> SessionOptions:
    """A session's own options, each checked as `CitadelSession` checks its arguments."""
    try:
        return SessionOptions.from_payload(value)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(str(exc)) from None


def owner(value: Any) -> str:
    """An owner, checked as the store checks its arguments."""
    try:
        return check_owner(text(value), "the wire's owner")
    except InvalidOwnerError as exc:
        raise ProtocolError(str(exc)) from None


def labels(value: Any) -> dict[str, Any]:
    """A session's labels, checked as the store checks its arguments."""
    try:
        return check_labels(value, "the wire's labels")
    except InvalidLabelsError as exc:
        raise ProtocolError(str(exc)) from None


def _text_of(row: Any) -> str:
    return next((value for value in row if isinstance(value, str)), "")


_BATCH = record(
    Batch,
    payloads=many(text),
    texts=many(text),
    from_user=many(flag),
    expires_at=optional(whole),
    max_items=optional(whole),
    retention=optional(_session_options),
    owner=optional(owner),
    labels=optional(labels),
)


def session_key(value: Any) -> SessionKey:
    """A session's id, or one of its branches: ``[id, branch]``."""
    if isinstance(value, str):
        return value
    session_id, branch = pair(text, text)(value)
    if branch == MAIN:
        raise ProtocolError("MAIN is named by the session id alone")
    return session_id, branch


def _json_object(value: Any) -> dict[str, Any]:
    """An object of JSON values (token details: the SDK keeps whatever its `Usage` holds)."""

    def check(item: Any, depth: int) -> None:
        if depth > 8:
            raise ProtocolError("token details nest too deeply")
        if isinstance(item, dict):
            for key, inner in item.items():
                text(key)
                check(inner, depth + 1)
        elif isinstance(item, list):
            for inner in item:
                check(inner, depth + 1)
        elif item is not None and not isinstance(item, (int, float, str, bool)):
            raise ProtocolError(f"expected JSON data, got {type(item).__name__}")

    if not isinstance(value, dict):
        raise ProtocolError("expected an object")
    check(value, 0)
    return value


USAGE_FIELDS = ("requests", "input_tokens", "output_tokens", "total_tokens")


def usage(value: Any) -> dict[str, Any]:
    """A turn's usage: its four counts and its two token details (objects, or null)."""
    details = ("input_tokens_details", "output_tokens_details")
    if not isinstance(value, dict) or set(value) != {*USAGE_FIELDS, *details}:
        raise ProtocolError("expected a turn's usage")
    checked: dict[str, Any] = {name: whole(value[name]) for name in USAGE_FIELDS}
    checked.update({name: optional(_json_object)(value[name]) for name in details})
    return checked


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
        wired["retention"] = value.retention.to_payload()  # math.inf as options.NEVER
    return wired


S, N, ITEMS, KEY = text, whole, many(text), session_key
_APPEND = (KEY, batch, S, flag)  # the session (or branch), the batch, its id and `resent`

APPEND = Operation[None](
    "append", writes.append, _APPEND, nothing, resend=True, batched=True, marks_local=False, counts="written"
)
NEWEST = Operation[list[str]]("newest", reads.newest, (KEY, N), ITEMS, resend=True, counts="read")
ALL_ITEMS = Operation[list[str]](
    "all_items", reads.all_items, (KEY,), ITEMS, resend=True, reports=True, counts="read"
)
SEARCH_PLACED = Operation[tuple[list[tuple[str, int]], int]](
    "search_placed",
    reads.search_placed,
    (KEY, S, N),
    pair(many(pair(text, whole)), whole),
    resend=True,
    counts="read",
    search=True,
)
# Every branch of the session, as the whole session.
SUMMARY = Operation[tuple[int, int, int] | None](
    "summary", branches.summary_all, (S,), optional(pair(N, N, N)), resend=True
)
# Sent again only if the owner died before it noted the item it pops (SharedFile.pop).
POP = Operation[str | None]("pop", writes.pop, (KEY,), optional(text), resend=True, notes=True, noted=ROW)
# Likewise, before it noted MAIN's newest item (every branch goes). The receipt's algorithm stays in the owner.
CLEAR = Operation[str | None](
    "clear", branches.clear_all, (S,), nothing, resend=True, notes=True, noted=whole, to_wire=_none
)
# These name the atom noted: doing them again finds it gone.
POP_IF_NEWEST = Operation[str]("pop_if_newest", writes.pop_if_newest, (KEY, N), text, resend=True)
CLEAR_THROUGH = Operation[None]("clear_through", branches.clear_through_all, (S, N), nothing, resend=True)
NEWEST_ROWS = Operation[tuple[list[tuple[int, str]], bool]](
    "newest_rows", suffix.newest_rows, (KEY, N), pair(many(ROW), flag), resend=True, counts="read"
)
OLDEST_ROWS = Operation[list[tuple[int, str]]](
    "oldest_rows", suffix.oldest_rows, (KEY, N, N, N), many(ROW), resend=True, counts="read"
)
REPLACE_SUFFIX = Operation[bool](
    "replace_suffix",
    suffix.replace_suffix,
    (KEY, many(ROW), batch, many(whole), S, flag),
    flag,
    resend=True,
    batched=True,
    counts="written",
)
# A branch's items with their ids and creation times (its turns, AdvancedSQLiteSession's).
ITEM_ROWS = Operation[list[tuple[int, int, str]]](
    "item_rows", branches.item_rows, (KEY,), many(pair(whole, whole, text)), resend=True, counts="read"
)
BRANCHES = Operation[list[tuple[str, int, int, int]]](
    "branches", branches.listing, (S,), many(pair(text, whole, whole, whole)), resend=True
)
# Another attempt would find the name used: the caller looks (`list_branches`) and decides.
BRANCH = Operation[str]("branch", branches.create, (S, S, N, optional(text)), text, resend=False)
# Its receipt is lost with the owner, as an erasure's.
DELETE_BRANCH = Operation[Erasure](
    "delete_branch", branches.delete, (S, S), _ERASURE, resend=False, to_wire=_plain
)
# A turn's usage stored again replaces itself.
STORE_USAGE = Operation[bool](
    "store_usage", usage_store.store, (KEY, usage, optional(whole)), flag, resend=True
)
RESERVE = Operation[None]("reserve", branches.reserve, (S, many(text)), nothing, resend=True)
RESERVED = Operation[list[str]]("reserved", branches.reserved, (S,), many(text), resend=True)
USAGE = Operation[list[tuple[str, int, dict[str, Any]]]](
    "usage", branches.usage_of, (S, optional(text)), many(pair(text, whole, usage)), resend=True
)
# Its receipt is lost with the owner: the operator runs it again. Every branch goes.
ERASE = Operation[Erasure | None](
    "erase", branches.erase_all, (S, optional(text)), optional(_ERASURE), resend=False, to_wire=_plain
)
# The file's: every session, or none.
SESSION_IDS = Operation[list[str]](
    "session_ids", LocalFile.session_ids, (), ITEMS, resend=True, session=False
)
SUMMARIES = Operation[list[tuple[str, int, int, int, str | None, dict[str, Any] | None]]](
    "summaries",
    LocalFile.summaries,
    (optional(owner), optional(flag)),
    many(pair(S, N, N, N, optional(text), optional(labels))),
    resend=True,
    reports=True,
    session=False,
)
# A session's owner (data_owners.py): recorded on its first call, or changed explicitly.
CLAIM_OWNER = Operation[None](
    "claim_owner", data_owners.keep, (S, optional(owner), optional(labels)), nothing, resend=True
)
SET_OWNER = Operation[str]("set_owner", data_owners.set_owner, (S, owner), text, resend=True)
ABOUT = Operation[tuple[str | None, dict[str, Any] | None]](
    "about", data_owners.recorded, (S,), pair(optional(text), optional(labels)), resend=True
)
SEARCH_OWNER = Operation[list[tuple[str, str, int]]](
    "search_owner",
    LocalFile.search_owner,
    (owner, S, N),
    many(pair(S, text, N)),
    resend=True,
    session=False,
    search=True,
)
BEGIN_OWNER_ERASURE = Operation[tuple[list[str], bool]](
    "begin_owner_erasure",
    LocalFile.begin_owner_erasure,
    (owner,),
    pair(ITEMS, flag),
    resend=True,
    session=False,
)
PURGE = Operation[PurgeReport](
    "purge", LocalFile.purge, (), _PURGE, resend=True, reports=True, to_wire=_plain, session=False
)
# The erasure ledger's head the file records (storage/ledger.py): what a restore must reach.
LEDGER_HEAD = Operation[tuple[int, str] | None](
    "ledger_head", lambda file: file.ledger_head, (), optional(pair(whole, text)), resend=True, session=False
)
VERIFY = Operation[IntegrityReport](
    "verify", LocalFile.verify, (), _REPORT, resend=True, reports=True, to_wire=_plain, session=False
)
_STATUS = record(
    StatusReport,
    path=text,
    owner=optional(record(OwnerStatus, pid=whole, serving_since=number, clients=whole, socket=text)),
    sessions=whole,
    items=whole,
    last_erasure=optional(record(LastErasure, at=number, cause=text, receipt=_ERASURE)),
    ledger_head=optional(whole),
    last_verify=optional(pair(number, flag)),
    expired_items=whole,
    ended_sessions=whole,
    retention_erased=optional(whole),
    swept_waiting=optional(whole),
    ledger=optional(text),
    shard=optional(text),
    ring=optional(lambda value: tuple(many(text)(value))),
    moving_from=optional(lambda value: tuple(many(text)(value))),
)
# What `status` shows, read by the owner (it reads only).
STATUS = Operation[StatusReport](
    "status", LocalFile.status, (), _STATUS, resend=True, to_wire=_plain, session=False
)
# A second attempt would find the first one's files.
BACKUP = Operation[list[str]](
    "backup", LocalFile.backup, (S,), ITEMS, resend=False, reports=True, session=False
)

# Both passphrases cross the sealed channel; the owner then derives its socket's key anew
# (server.py). Not sent again: whether the file took the new passphrase is then unknown.
ROTATE_KEY = Operation[None]("rotate_key", LocalFile.rotate_key, (S, S), nothing, resend=False, session=False)

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
        ITEM_ROWS,
        BRANCHES,
        BRANCH,
        DELETE_BRANCH,
        STORE_USAGE,
        RESERVE,
        RESERVED,
        USAGE,
        ERASE,
        SESSION_IDS,
        SUMMARIES,
        CLAIM_OWNER,
        SET_OWNER,
        ABOUT,
        BEGIN_OWNER_ERASURE,
        SEARCH_OWNER,
        PURGE,
        LEDGER_HEAD,
        VERIFY,
        STATUS,
        BACKUP,
        ROTATE_KEY,
    )
}
