"""CitadelSessionStore: one encrypted Citadel file holding many sessions."""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import citadeldb

from . import database as _database
from .damage import ATOM_KEYS, check_before_memory, inventory_of
from .damage import audit as audit_inventory
from .embedders import EmbedderIdentity, resolve_embedder
from .errors import (
    BackupExistsError,
    CitadelSessionError,
    DatabaseNotFoundError,
    EmbedderMismatchError,
    SessionClosedError,
    SessionNotFoundError,
    WrongPassphraseError,
)
from .items import decode_item, decode_items, encode_item, is_user_message, search_text
from .layout import Erasure, SessionLayout, SessionState, reembed_file
from .results import IntegrityReport, ReembedSummary, SessionIntegrity, SessionSummary

if TYPE_CHECKING:
    # Imported for annotations only: the operator CLI never needs the Agents SDK loaded.
    from agents.memory import SessionSettings

    from .session import CitadelSession

T = TypeVar("T")
_log = logging.getLogger("citadeldb_openai_agents")
Argon2Profile = Literal["iot", "desktop", "server"]
SyncMode = Literal["full", "normal", "off"]


class CitadelSessionStore:
    """An encrypted Citadel file shared by every session in it.

    Args:
        path: The database file (created when missing, unless ``create=False``; its
            directory must exist). A relative path resolves against the working
            directory. Creating a file is logged at INFO (logger
            ``citadeldb_openai_agents``) with its absolute path.
        key: The passphrase. Used to open the file and then forgotten.
        embedder: Embeds item text for `CitadelSession.search`; default
            ``citadeldb.MockEmbedder(dim=128)`` (no download). Any object with
            ``dim``, ``metric``, ``model_id`` and ``embed_with_cancel`` works; one
            with only ``embed`` / ``embed_queries`` is adapted.
        ttl: Seconds an item lives after it is written; None keeps items forever.
            Expired items are invisible at once and erased (keys destroyed) when
            their session is next written or by `purge_expired`.
        session_settings: Default `SessionSettings` for sessions minted here.
        argon2_profile: Citadel's key-derivation cost for a *new* file ("iot",
            "desktop", "server"); an existing file keeps the profile it was made with.
        sync_mode: Citadel's durability for a new file: "full" (default, each write
            fsynced), "normal", or "off" (fast, loses recent writes on power loss).
        cache_size: Citadel's page cache, in pages of ~8 KiB, for this process; default
            `DEFAULT_CACHE_PAGES` (16,384: at most ~128 MiB, filled only as pages are
            read). Search is fast only while the cache holds the file (a 1,000-item
            session's search with all-MiniLM-L6-v2: ~90 ms at Citadel's own default of
            under 1,000 pages, ~40 ms with the file cached).
        create: False refuses to create a new file: a missing one raises
            `DatabaseNotFoundError` instead, so a wrong path or working directory
            cannot silently start an empty database.

    Stores (and `CitadelSession` objects) on the same file in one process share
    one open database; a different passphrase for an open file is refused. A store
    belongs to the process that opened it: in a forked child, every call raises
    `ForkedStoreError` (and `close` only marks it closed).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        embedder: Any | None = None,
        ttl: float | None = None,
        session_settings: SessionSettings | None = None,
        argon2_profile: Argon2Profile | None = None,
        sync_mode: SyncMode | None = None,
        cache_size: int | None = None,
        create: bool = True,
    ) -> None:
        try:
            _database.check_passphrase(key)
            self._ttl = _check_ttl(ttl)
            self.session_settings = session_settings
            resolved_embedder = resolve_embedder(embedder)
            options = _database_options(argon2_profile, sync_mode, cache_size)
            self._closed = False
            self._close_lock = threading.Lock()
            self._database = _acquire(path, key, options, create=create)
        finally:
            # Gone from this frame on every path: error trackers record a failed frame's locals.
            del key
        try:
            self._layout = _shared_layout(self._database, resolved_embedder)
        except BaseException:
            self._database.release()
            raise

    @property
    def path(self) -> str:
        """The resolved path of the database file."""
        return self._database.path

    @property
    def ttl(self) -> float | None:
        """Seconds an item lives after it is written, or None."""
        return self._ttl

    @property
    def embedder_identity(self) -> EmbedderIdentity:
        """The model id, dimension and metric the file's vectors are bound to."""
        return self._layout.identity

    @property
    def closed(self) -> bool:
        return self._closed

    def session(
        self, session_id: str, *, session_settings: SessionSettings | None = None
    ) -> CitadelSession:
        """A session of this store (created on its first write; nothing is written now)."""
        from .session import CitadelSession

        self._check_open()
        settings = session_settings if session_settings is not None else self.session_settings
        return CitadelSession(session_id, store=self, session_settings=settings)

    def session_ids(self) -> list[str]:
        """The ids of the sessions holding at least one live item, sorted."""
        self._check_open()
        ids = []
        for state in self._layout.states():
            if self._on_session(state, SessionLayout.has_live_item):
                ids.append(state.session_id)
        return sorted(ids)

    def purge_expired(self) -> int:
        """Erase every expired item now (keys destroyed); return how many were erased."""
        self._check_open()
        return sum(
            self._on_session(state, SessionLayout.purge_expired) for state in self._layout.states()
        )

    def erase_session(self, session_id: str) -> Erasure:
        """Erase a session's items (keys destroyed) and return Citadel's evidence.

        The same erasure as `CitadelSession.clear_session`, plus a readback: each
        erased item is verified ``missing`` by Citadel. Counts only live items;
        expired ones still stored are erased too.

        Raises:
            SessionNotFoundError: the file holds nothing under this id.
        """
        self._check_open()
        erasure = self._on_session(self._state(session_id), SessionLayout.erase)
        if erasure is None:
            raise self._not_found(session_id)
        return erasure

    def sessions(self) -> list[SessionSummary]:
        """Every session holding a live item: its id, item count and first and last write."""
        self._check_open()
        summaries = (self._summary(state) for state in self._layout.states())
        return sorted((s for s in summaries if s is not None), key=lambda s: s.session_id)

    def summary(self, session_id: str) -> SessionSummary | None:
        """One session's item count and first and last write; None when it holds no live item."""
        self._check_open()
        return self._summary(self._state(session_id))

    def _summary(self, state: SessionState) -> SessionSummary | None:
        found = self._on_session(state, SessionLayout.summary)
        if found is None:
            return None
        count, first, last = found
        return SessionSummary(state.session_id, count, _from_micros(first), _from_micros(last))

    def export(self, session_id: str) -> list[Any]:
        """A session's items, oldest first, exactly as stored (for a data-access request).

        Raises:
            SessionNotFoundError: the session holds no live item.
        """
        self._check_open()
        items = self._get_items(session_id, None)
        if not items:
            raise self._not_found(session_id)
        return items

    def rotate_key(self, current_key: str, new_key: str) -> None:
        """Change the file's passphrase; every session stays readable with the new one only.

        Raises:
            WrongPassphraseError: `current_key` is not the file's passphrase.
            EmptyPassphraseError: `new_key` is empty.
        """
        keys = [current_key, new_key]
        del current_key, new_key  # see __init__: only `keys` holds them, and it is emptied
        try:
            self._check_open()
            _database.check_passphrase(keys[1])
            if keys[1] == keys[0]:
                raise ValueError("the new passphrase is the current one; choose a different one.")
            rotated = self._database.on_owner_thread(lambda db: _rotate(db, self.path, *keys))
        finally:
            keys.clear()
        if not rotated:
            raise WrongPassphraseError(
                f"the current passphrase given for {self.path} is wrong; nothing was changed."
            )

    def backup(self, destination: str | os.PathLike[str]) -> list[str]:
        """Write a consistent copy of the file and its companion files; return their paths.

        Refuses a destination that exists (or whose companion files do). Erasures made
        after the backup do not reach it: it keeps its own wrapped keys.
        """
        self._check_open()
        target = Path(destination).expanduser().resolve()
        if not target.parent.is_dir():
            raise DatabaseNotFoundError(f"cannot back up to {target}: {target.parent} does not exist.")
        existing = [p for p in _database.database_files(str(target)) if os.path.exists(p)]
        if existing:
            raise BackupExistsError(
                f"refusing to overwrite {', '.join(existing)}: choose a new destination "
                "(a backup never replaces files)."
            )
        with self._database.exclusive():  # the audit log must describe the data it goes with
            self._database.on_owner_thread(lambda db: _backup_with_audit(db, self.path, str(target)))
        return [p for p in _database.database_files(str(target)) if os.path.exists(p)]

    def verify(self) -> IntegrityReport:
        """Check the file: Citadel's page check, the audit log's chain, and every session.

        Per session, the items the file's pages hold are compared with those Citadel
        reads back, and each item read gets Citadel's verdict (authentic, tampered, ...).
        `ok` is False when a page, an item or the audit log is damaged or missing.
        """
        self._check_open()
        report, audit = self._database.on_owner_thread(lambda db: (db.integrity_check(), _audit_chain(db)))
        verdicts: dict[str, int] = {}
        sessions = []
        for state in self._layout.states():
            expected, readable, found = self._on_session(state, SessionLayout.inspect)
            if not expected:
                continue
            for verdict, count in found.items():
                verdicts[verdict] = verdicts.get(verdict, 0) + count
            not_authentic = sum(count for verdict, count in found.items() if verdict != "authentic")
            cause = ATOM_KEYS if readable < expected else None
            sessions.append(SessionIntegrity(state.session_id, expected, readable, not_authentic, cause))
        sessions.sort(key=lambda session: session.session_id or "")
        return integrity_report(report, audit, verdicts, sessions)

    def _not_found(self, session_id: str) -> SessionNotFoundError:
        return SessionNotFoundError(
            f"no session {session_id!r} with live items in {self.path}; "
            "`python -m citadeldb_openai_agents sessions` lists them."
        )

    def close(self) -> None:
        """Close the store; the file closes when the last store on it does. Idempotent.

        In a process forked from the one that opened the store, it only marks the store
        closed: the file belongs to the parent, which keeps using it.
        """
        if self._database.forked:
            # Before `_close_lock`, which another thread of the parent may have held at the fork.
            self._closed = True
            return
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._database.release()

    def __enter__(self) -> CitadelSessionStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<CitadelSessionStore {self.path!r} ttl={self._ttl} {state}>"

    # -- what sessions call (blocking; sessions run these in worker threads) -------

    def _check_process(self) -> None:
        """Raise `ForkedStoreError` in a process forked from the one that opened the store."""
        self._database.check_process()

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            raise SessionClosedError(
                f"this CitadelSessionStore ({self.path}) is closed; open a new one to continue."
            )

    def _on_session(
        self, state: SessionState, operation: Callable[..., T], *args: Any
    ) -> T:
        self._check_open()
        with self._database.operation() as memory, state.lock:
            return operation(self._layout, memory, state, *args)

    def _state(self, session_id: str) -> SessionState:
        return self._layout.state(session_id)

    def _add_items(self, session_id: str, items: list[Any]) -> None:
        payloads = [encode_item(item, position) for position, item in enumerate(items)]
        texts = [search_text(item) for item in items]
        from_user = [is_user_message(item) for item in items]
        expires_at = None
        if self._ttl is not None:
            expires_at = int((time.time() + self._ttl) * 1_000_000)
        self._on_session(self._state(session_id), SessionLayout.append, payloads, texts, from_user, expires_at)

    def _get_items(self, session_id: str, limit: int | None) -> list[Any]:
        state = self._state(session_id)
        if limit is None or limit < 0:
            payloads = self._on_session(state, SessionLayout.all_items)
        else:
            payloads = self._on_session(state, SessionLayout.newest, limit)
        return decode_items(payloads)

    def _pop_item(self, session_id: str) -> Any | None:
        payload = self._on_session(self._state(session_id), SessionLayout.pop)
        return None if payload is None else decode_item(payload)

    def _clear_session(self, session_id: str) -> None:
        self._on_session(self._state(session_id), SessionLayout.clear)

    def _search(self, session_id: str, query: str, limit: int) -> list[Any]:
        payloads = self._on_session(self._state(session_id), SessionLayout.search, query, limit)
        return decode_items(payloads)


def verify_file(path: str | os.PathLike[str], key: str) -> IntegrityReport:
    """`CitadelSessionStore.verify` for a file that is not open, changing nothing in it.

    The way to inspect a damaged file, which refuses to open for use: Citadel's page
    check, the audit log's chain, and per session the items the file holds, those
    Citadel can read, and its verdict on each, all read without starting Citadel's
    memory engine (which would delete what it cannot read).
    """
    try:
        return _database.inspect_file(path, key, _inspect)
    finally:
        del key  # see CitadelSessionStore.__init__


def _inspect(db: citadeldb.Database, path: str) -> IntegrityReport:
    pages, audit = db.integrity_check(), _audit_chain(db)
    inventory = inventory_of(db, path)
    verdict = audit_inventory(inventory)
    maintenance = db.memory_maintenance()
    verdicts: dict[str, int] = {}
    sessions = []
    for count in verdict.sessions:
        found: dict[str, int] = {}
        for name in count.segments:
            region = inventory.regions[name]
            ids = sorted(set(region.live_rows(inventory.taken_at)) - region.unreadable)
            for attestation in maintenance.verify(name, ids) if ids and not region.forgotten else []:
                found[attestation.verdict] = found.get(attestation.verdict, 0) + 1
        for name, number in found.items():
            verdicts[name] = verdicts.get(name, 0) + number
        not_authentic = sum(number for name, number in found.items() if name != "authentic")
        readable = count.expected - count.unreadable
        sessions.append(SessionIntegrity(count.session_id, count.expected, readable, not_authentic, count.cause))
    sessions.sort(key=lambda session: (session.session_id is None, session.session_id or ""))
    return integrity_report(pages, audit, verdicts, sessions, verdict.file)


def integrity_report(
    pages: dict[str, Any],
    audit: dict[str, Any],
    verdicts: dict[str, int],
    sessions: list[SessionIntegrity],
    findings: list[str] | None = None,
) -> IntegrityReport:
    """Assemble an `IntegrityReport` from Citadel's page check, audit-log check and the sessions'."""
    bad_items = sum(count for verdict, count in verdicts.items() if verdict != "authentic")
    findings = findings or []
    return IntegrityReport(
        ok=bool(pages["ok"]) and bad_items == 0 and bool(audit["chain_valid"])
        and all(session.ok for session in sessions) and not findings,
        pages_checked=int(pages["pages_checked"]),
        page_errors=[str(error["message"]) for error in pages["errors"]],
        item_verdicts=verdicts,
        audit_entries=int(audit["entries_verified"]),
        audit_break_at=None if audit["chain_valid"] else int(audit["chain_break_at"] or 0),
        sessions=sessions,
        findings=findings,
    )


def reembed(
    path: str | os.PathLike[str], key: str, embedder: Any
) -> ReembedSummary:
    """Re-embed a file's stored text with `embedder`, keeping every item.

    The fix for `EmbedderMismatchError`: after it, the file opens with `embedder`.
    The file must not be open elsewhere in this process or in another process.
    """
    try:
        resolved_embedder = resolve_embedder(embedder)
        database = _acquire(path, key, create=False, refusal="re-embedding never creates one", fix="")
    finally:
        del key  # see CitadelSessionStore.__init__
    try:
        with database.setup_lock:
            if database.layout is not None:
                raise CitadelSessionError(
                    f"{database.path} has open stores in this process; close them before re-embedding."
                )
            with database.operation() as memory:
                regions, items = reembed_file(memory, resolved_embedder, database.audit.leftovers)
    finally:
        database.release()
    return ReembedSummary(regions, items, EmbedderIdentity.of(resolved_embedder).model_id)


def _acquire(
    path: str | os.PathLike[str],
    key: str,
    options: citadeldb.DatabaseOptions | None = None,
    *,
    create: bool,
    refusal: str = "create=False forbids creating one",
    fix: str = ", or pass create=True to start a new, empty database",
) -> _database.OpenDatabase:
    """`database.acquire`, with the one rule about new files: refused, or logged."""
    resolved = _database.resolve_path(path)
    existed = os.path.exists(resolved)
    try:
        if not existed and not create:
            relative = "" if os.path.isabs(os.path.expanduser(path)) else (
                f" ({os.fspath(path)} is relative, so it resolved against the working directory)"
            )
            raise DatabaseNotFoundError(
                f"there is no database at {resolved}{relative}, and {refusal}. Correct the "
                f"path{fix}.",
                creation_refused=True,
            )
        database = _database.acquire(resolved, key, options, check_before_memory)
    finally:
        del key  # see CitadelSessionStore.__init__
    if not existed:
        # Worth a line in the service's log: a new empty file where one was expected is
        # how a wrong path or working directory shows (the conversations are elsewhere).
        _log.info("created a new Citadel database at %s", resolved)
    return database


def _shared_layout(database: _database.OpenDatabase, embedder: Any) -> SessionLayout:
    with database.setup_lock:
        layout = database.layout
        if layout is None:
            with database.operation() as memory:
                layout = SessionLayout(memory, embedder, database.audit, database.region_rows, database.path)
            database.layout = layout
        elif layout.identity != EmbedderIdentity.of(embedder):
            raise EmbedderMismatchError(
                f"{database.path} is already open in this process with embedder "
                f"{layout.identity.model_id!r} (dim {layout.identity.dim}); this store asked for "
                f"{EmbedderIdentity.of(embedder).model_id!r}. Use one embedder per file."
            )
        return layout


def _audit_chain(db: citadeldb.Database) -> dict[str, Any]:
    """Citadel's check of the audit log's HMAC chain; an intact empty chain without a log."""
    if db.audit_log_path() is None:
        return {"entries_verified": 0, "chain_valid": True, "chain_break_at": None}
    return dict(db.verify_audit_log())


def _backup_with_audit(db: citadeldb.Database, path: str, target: str) -> None:
    """`db.backup`, plus a copy of the audit log, which Citadel's backup leaves out.

    The log records erasures and backups; an auditor reading a restored file needs it.
    A backup opens and appends to its copy like the original (tests/test_operations.py).
    """
    db.backup(target)
    audit = path + _database.AUDIT_SUFFIX
    if os.path.exists(audit):
        shutil.copyfile(audit, target + _database.AUDIT_SUFFIX)


def _rotate(db: citadeldb.Database, path: str, current_key: str, new_key: str) -> bool:
    """Change the passphrase and check that only the new one opens the file; False if `current_key` is wrong."""
    if not db.verify_passphrase(current_key):
        return False
    db.change_passphrase(current_key, new_key)
    if not db.verify_passphrase(new_key) or db.verify_passphrase(current_key):
        raise CitadelSessionError(
            f"the passphrase of {path} did not verify after the change; "
            "restore the file from a backup before using it."
        )
    return True


def _from_micros(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, tz=timezone.utc)


def _check_ttl(ttl: float | None) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(
            f"ttl must be a positive number of seconds or None (keep forever), not {ttl!r}"
        )
    return float(ttl)


# Citadel's own default (under 1,000 pages) does not hold a 1,000-item session's segments,
# and recall then re-reads and re-decrypts pages on every search (benchmarks/search_quality).
DEFAULT_CACHE_PAGES = 16_384


def _database_options(
    argon2_profile: Argon2Profile | None, sync_mode: SyncMode | None, cache_size: int | None = None
) -> citadeldb.DatabaseOptions:
    if cache_size is None:
        cache_size = DEFAULT_CACHE_PAGES
    if argon2_profile not in (None, "iot", "desktop", "server"):
        raise ValueError(f"argon2_profile must be 'iot', 'desktop' or 'server', not {argon2_profile!r}")
    if sync_mode not in (None, "full", "normal", "off"):
        raise ValueError(f"sync_mode must be 'full', 'normal' or 'off', not {sync_mode!r}")
    if cache_size is not None and (isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size <= 0):
        raise ValueError(f"cache_size must be a positive number of pages, not {cache_size!r}")
    return citadeldb.DatabaseOptions(argon2_profile=argon2_profile, sync_mode=sync_mode, cache_size=cache_size)