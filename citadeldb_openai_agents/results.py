"""What the store's operator methods return: receipts, summaries and reports."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# A long operation's progress: called with (done, total) as it goes.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LockHolder:
    """The process holding a file's lock, and its command line shortened (None if unreadable)."""

    pid: int
    command: str | None = None

    def __str__(self) -> str:
        return f"PID {self.pid}" if self.command is None else f"PID {self.pid} ({self.command})"


@dataclass(frozen=True)
class Erasure:
    """What erasing a session removed, with Citadel's evidence that the keys are gone.

    `readback_confirmed` is True when Citadel, asked afterwards for each erased item,
    reports it ``missing`` (no row, no key). `ledger_entries` are the numbers, in this
    file's chain of the erasure ledger at `ledger`, of the entries that record the erasure
    (what a restore replays); both are empty when no `erasure_ledger` is configured.
    `receipt_id` names this receipt in the log line the erasure wrote (``citadel_receipt``),
    so an auditor can match the two.
    """

    items_erased: int
    regions_dropped: int
    algorithm: str
    readback_confirmed: bool
    ledger: str | None = None
    ledger_entries: tuple[int, ...] = ()
    receipt_id: str = ""


@dataclass(frozen=True)
class EndedSession:
    """A session erased whole because it ended: `rule` names the setting that ended it, as
    `StoreOptions.session_limit` gives it (the TTL counted per session, or the idle time)."""

    session_id: str
    rule: str
    erasure: Erasure
    branch: str = "main"  # each branch ends by its own writes
    at: float | None = None  # when it was erased (seconds since the epoch)


@dataclass(frozen=True)
class PurgeReport:
    """What `purge` erased: items past their own TTL one by one, and whole sessions that ended.

    `swept` is what retention erased by itself since the last purge, each with its receipt:
    sessions the owner's sweep found ended, or a call found ended before it read them (kept by
    the owner that erased them; a new owner starts with none). `items_erased` counts only what
    this purge erased.
    """

    expired_items: int
    ended: list[EndedSession] = field(default_factory=list)
    swept: list[EndedSession] = field(default_factory=list)

    @property
    def items_erased(self) -> int:
        """Every item erased: the expired ones and those of the sessions that ended."""
        return self.expired_items + sum(session.erasure.items_erased for session in self.ended)


@dataclass(frozen=True)
class SessionSummary:
    """One session as `CitadelSessionStore.sessions` lists it."""

    session_id: str
    items: int
    first_write: datetime
    last_write: datetime
    owner: str | None = None  # the person the session is about, if one was given
    labels: dict[str, Any] | None = None  # the session's labels, if it was given some

    @classmethod
    def from_micros(
        cls,
        session_id: str,
        items: int,
        first: int,
        last: int,
        owner: str | None = None,
        labels: dict[str, Any] | None = None,
    ) -> SessionSummary:
        """From the file's figures: the first and last write in microseconds since the epoch."""
        return cls(session_id, items, _utc(first), _utc(last), owner, labels)


@dataclass(frozen=True)
class OwnerErasure:
    """One person's erasure (`CitadelSessionStore.erase_owner`): each of their sessions with its
    receipt. `sessions` is empty when an earlier run had already erased everything
    (`already_complete`)."""

    owner: str
    sessions: list[tuple[str, Erasure]]
    already_complete: bool = False

    @property
    def items_erased(self) -> int:
        return sum(erasure.items_erased for _, erasure in self.sessions)

    @property
    def readback_confirmed(self) -> bool:
        """Whether Citadel read back every erased item of every session as missing."""
        return all(erasure.readback_confirmed for _, erasure in self.sessions)

    def __repr__(self) -> str:  # the owner is personal data: an error tracker's frames keep reprs
        return f"OwnerErasure(sessions={len(self.sessions)}, items_erased={self.items_erased})"


def _utc(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, tz=timezone.utc)


@dataclass(frozen=True)
class SessionIntegrity:
    """One session as `verify` found it: the items the file holds and those Citadel reads back.

    `session_id` is None for items whose session cannot be named (its catalog record
    is unreadable). `missing` items are held by the file's pages but cannot be read
    (their keys are damaged); `not_authentic` ones read back but fail Citadel's check.
    """

    session_id: str | None
    expected: int
    readable: int
    not_authentic: int = 0
    cause: str | None = None

    @property
    def missing(self) -> int:
        return self.expected - self.readable

    @property
    def ok(self) -> bool:
        return not self.missing and not self.not_authentic


@dataclass(frozen=True)
class PageLayout:
    """Where a database file's pages lie, so that an operator can find a damaged page's bytes.

    Citadel 2.7.0 (measured): a header of `header_bytes` (512), then pages of `page_size`
    bytes (8208: 8192 and a 16-byte authentication tag), counted from 0. Page N is bytes
    ``header_bytes + N * page_size`` to ``header_bytes + (N + 1) * page_size - 1``: Citadel's
    own number ("page:N" in its messages), kept as it is. Pages 0 to `high_water_mark` - 1 are
    the file's used range; the bytes from `used_end` to the end of the file (`file_size`) lie
    past the high-water mark: unused, they hold no data and nothing reads them.
    """

    header_bytes: int
    page_size: int
    high_water_mark: int
    file_size: int

    def page_span(self, page: int) -> tuple[int, int]:
        """The first and last byte of `page` in the file."""
        first = self.header_bytes + page * self.page_size
        return first, first + self.page_size - 1

    def named(self, message: str) -> str:
        """`message` (Citadel's) with each "page:N" as "page N (bytes A-B)", its number kept."""

        def name(match: re.Match[str]) -> str:
            first, last = self.page_span(int(match.group(1)))
            return f"page {match.group(1)} (bytes {first}-{last})"

        return re.sub(r"\b(?:page )?page:(\d+)", name, message)

    @property
    def used_end(self) -> int:
        """The first byte past the high-water mark (the file's size if nothing lies past it)."""
        return min(self.header_bytes + self.high_water_mark * self.page_size, self.file_size)

    @property
    def file_pages(self) -> int:
        """The whole pages the file's size holds (the file grows by 1 MiB, not by pages)."""
        return max(0, (self.file_size - self.header_bytes) // self.page_size)


@dataclass(frozen=True)
class IntegrityReport:
    """What `CitadelSessionStore.verify` (or `verify_file`) found.

    `pages_checked` counts Citadel's page reads: it authenticates each page the file's current
    and previous commit reach (a page both reach is counted twice). A page below the high-water
    mark that neither reaches is free: it holds no data, nothing reads it, Citadel rewrites it
    whole before using it again, and damage to it is not detected (nor harmful). `page_errors`
    are Citadel's messages, each once; `damaged_pages` the pages they name, numbered as
    `layout` says (from 0).
    """

    ok: bool
    pages_checked: int
    page_errors: list[str]
    item_verdicts: dict[str, int]
    # Citadel's audit log (erasures, backups) is an HMAC chain: entries verified, and the
    # first entry that breaks it, counted from 1 as the log's entries are (entry 1 is the
    # first): `audit_entries + 1`. None when intact, or when the file keeps no log.
    audit_entries: int = 0
    audit_break_at: int | None = None
    # Every session holding items, with what could be read of it.
    sessions: list[SessionIntegrity] = field(default_factory=list)
    # Damage not tied to one session (the layout record, the catalog's key).
    findings: list[str] = field(default_factory=list)
    # Where the pages lie and how many are in use (None when the file's header does not say).
    layout: PageLayout | None = None
    damaged_pages: list[int] = field(default_factory=list)

    @property
    def damaged_sessions(self) -> list[SessionIntegrity]:
        return [session for session in self.sessions if not session.ok]


@dataclass(frozen=True)
class ReembedSummary:
    """What `reembed` did: regions re-embedded, items kept, and the new model id."""

    regions: int
    items: int
    model_id: str


@dataclass(frozen=True)
class ImportSummary:
    """What `CitadelSessionStore.import_items` did for one session.

    `already_held` items of this import were in the session before the call (a run that
    was interrupted, or one that completed): they were not written again.
    """

    session_id: str
    items: int
    written: int
    already_held: int = 0
    replaced: bool = False
    # An AdvancedSQLiteSession's: its branches other than main, and the turns whose usage came with it.
    branches: int = 0
    usage_turns: int = 0
    owner: str | None = None  # the owner recorded for the session by the import, if any


@dataclass(frozen=True)
class ImportReport:
    """What importing a file did: its kind, and each session imported from it.

    `skipped` rows of an SDK file are not JSON: the SDK's own sessions skip them too.
    """

    source: str
    kind: str
    sessions: list[ImportSummary]
    skipped: int = 0

    @property
    def written(self) -> int:
        return sum(session.written for session in self.sessions)


@dataclass(frozen=True)
class SourceErasure:
    """The erasure of an imported region of an original (2.x) file: Citadel's forget receipts,
    summed over every atom of the region, expired ones included, then read back."""

    region: str
    atoms: int
    expired: int  # of `atoms`: hidden from every read, their keys alive until this forget
    cryptographic: bool  # every receipt was a cryptographic erasure (per-atom keys destroyed)
    readback_confirmed: bool  # every receipt read back, and no atom of the region is left
    algorithm: str


@dataclass(frozen=True)
class OriginalImportReport(ImportReport):
    """What `import_original` did with a file of citadeldb-openai-agents 2.x (or, with `dry_run`,
    would do: then each summary's `written` counts what would be written, and nothing was).

    `expired` items had passed their time and were not imported; `refused` sessions already hold
    other items (mode "new": a real run refuses them all); `source_erasure` is the receipt of the
    source's erasure when it was asked for.
    """

    region: str = ""
    expired: int = 0
    dry_run: bool = False
    refused: list[str] = field(default_factory=list)
    source_erasure: SourceErasure | None = None


@dataclass(frozen=True)
class ExportSummary:
    """What an export to files wrote: the file or directory, and each session with its item count.

    `files` maps each session to its file's name in the directory (one file per session).
    """

    destination: str
    sessions: dict[str, int]
    files: dict[str, str] = field(default_factory=dict)

    @property
    def items(self) -> int:
        return sum(self.sessions.values())


@dataclass(frozen=True)
class SessionExport:
    """A session whole: each branch's items ("main" first) with their creation time (µs since the
    epoch), each turn's stored usage as (branch, user turn, usage), and every branch name the
    session has used but "main", deleted branches' included (none can be used again)."""

    session_id: str
    branches: dict[str, list[tuple[Any, int]]]
    usage: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    reserved: list[str] = field(default_factory=list)

    @property
    def items(self) -> list[Any]:
        """The main branch's items."""
        return [item for item, _ in self.branches.get("main", [])]


@dataclass(frozen=True)
class HistoryHit:
    """A search hit with where it stands in its session: `positions` count from 1, the oldest item.

    Identical items found by one search are one hit, with each of their positions.
    """

    positions: list[int]
    item: Any
    text: str


@dataclass(frozen=True)
class OwnerHit:
    """A search hit over one person's sessions (`CitadelSessionStore.search`): the session it is
    in, its position there (1: the oldest item), the item and its text."""

    session_id: str
    position: int
    item: Any
    text: str


@dataclass(frozen=True)
class MoveSummary:
    """What `CitadelSessionStore.move_session` did for one session, from one file to another.

    `copied` items were written to the target now, `already_in_target` were there from an
    earlier run (interrupted, or complete): the target holds `items` in all, compared item
    by item with the source before it was erased. `erasure` is the source's receipt; None
    when an earlier run had already erased it (`finished_before`).
    """

    session_id: str
    source: str
    target: str
    items: int
    copied: int
    already_in_target: int
    erasure: Erasure | None

    @property
    def finished_before(self) -> bool:
        """True when an earlier run had finished the move: nothing was left to copy or erase."""
        return self.erasure is None


@dataclass(frozen=True)
class RestoreReport:
    """What `restore_backup` did: the backup put at `path`, and what the ledger erased again."""

    path: str
    backup: str
    sessions: int  # sessions holding items after the restore
    ledger_entries: int  # this file's entries in the erasure ledger (0 without one)
    erased: dict[str, int]  # per session, items the backup held that the ledger erased
    ledger: str | None
    # Where the ledger's copies disagree, or why the live file's head was not compared.
    ledger_notes: tuple[str, ...] = ()

    @property
    def items_erased(self) -> int:
        return sum(self.erased.values())


@dataclass(frozen=True)
class SessionLoss:
    """What `repair` could not keep of one session: `session_id`, or when its own record was the
    damage, `hid` (its hashed name, as the segments' region names hold it)."""

    session_id: str | None
    hid: str | None
    items_lost: int
    items_stored: int  # unexpired items the damaged file held for it
    cause: str
    items_restored: int = 0  # of those lost, put back from a backup (repair --from-backup)

    @property
    def name(self) -> str:
        return repr(self.session_id) if self.session_id is not None else f"the session hashed {self.hid}"


@dataclass(frozen=True)
class RepairReport:
    """What `repair_file` did: the file at `path` rebuilt from what could be read, verified.

    `repaired` is False when the file was not damaged (nothing changed). `lost`: each session that
    lost items; every other session kept every item. `aside`: where the damaged files were moved.
    `replayed`: the erasure ledger's entries a rolled-back file lacked, erased again (`items_erased`).
    """

    path: str
    repaired: bool
    lost: list[SessionLoss]
    aside: str | None
    damage: str  # the audit's description of what was found
    backup: str | None = None  # the backup lost items were taken from
    notes: tuple[str, ...] = ()  # sessions the backup could not complete, with why; the ledger's notes
    replayed: int = 0  # the ledger's entries the file lacked (put back from an older copy), done again
    items_erased: int = 0  # what those entries erased again

    @property
    def items_lost(self) -> int:
        return sum(loss.items_lost for loss in self.lost)


@dataclass(frozen=True)
class SessionsRestoreReport:
    """What `restore_sessions` did: some sessions of `backup` brought back into the file at `path`.

    `restored`: each session moved in from the backup's copy (its items, compared). `replaced`:
    the live sessions erased first to make room (``replace=True``), with their receipts.
    `skipped`: sessions named that are not restored, with why (erased since the backup).
    `erased`: per session restored or skipped, the items the backup held that the ledger
    erased again. `ledger`: the ledger replayed, None when the backup was taken as it is.
    """

    path: str
    backup: str
    restored: list[MoveSummary]
    replaced: dict[str, Erasure]
    skipped: dict[str, str]
    erased: dict[str, int]
    ledger: str | None


@dataclass(frozen=True)
class OwnerStatus:
    """The process that owns and serves a file: its pid, since when it serves it (seconds since the
    epoch), the clients connected now, and its socket."""

    pid: int
    serving_since: float
    clients: int
    socket: str


@dataclass(frozen=True)
class LastErasure:
    """The newest erasure the owner made since it opened the file: when (seconds since the epoch),
    why (erase, retention, move...), and its receipt."""

    at: float
    cause: str
    receipt: Erasure


@dataclass(frozen=True)
class StatusReport:
    """What `status` shows of a file (`status_from_config`, ``python -m citadeldb_openai_agents status``).

    `owner` is None when no process serves the file: it was then read without being opened
    for use (only Citadel's audit entry for the open is written), and what only an owner keeps
    in memory (`last_erasure`, `retention_erased`, `swept_waiting`) is None. `ledger_head` is
    the erasure ledger's newest entry the file records. `last_verify` is the newest `verify`
    run through a store on this file: (when, ok). `expired_items` are items past their TTL
    still stored until a purge (Citadel hides them); `ended_sessions`, sessions past their
    TTL (session mode) or idle time not yet erased: retention's backlog. `swept_waiting`: the
    receipts of what retention erased by itself, kept for the next `purge` to report.
    """

    path: str
    owner: OwnerStatus | None
    sessions: int
    items: int
    last_erasure: LastErasure | None
    ledger_head: int | None
    last_verify: tuple[float, bool] | None
    expired_items: int
    ended_sessions: int
    retention_erased: int | None = None
    swept_waiting: int | None = None
    ledger: str | None = None  # the configured erasure ledger, if any
    shard: str | None = None  # this configuration's shard of a fleet
    ring: tuple[str, ...] | None = None  # the ring it follows
    moving_from: tuple[str, ...] | None = None  # the ring before a change under way
