"""A file held open by this process: its sessions, and the operations on the whole file.

`LocalFile` is what a store that owns its file stands on: it joins the process's open
file (registry.py), builds or shares its session layout (segments.py), and runs a
session's operation, a storage function of reads.py, writes.py or suffix.py
(`on_session`), in the calling thread, under the session's lock, with the file's
`Memory`. Items cross this boundary as JSON text (codec.py), ready for another process too.

Also here: `reembed`, done to a file that is not open for use (inspection.py checks
such a file, restore.py puts a backup in place).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import citadeldb
from citadeldb.memory import Memory

from ..embedders.protocol import Embedder, EmbedderIdentity
from ..errors import (
    BackupExistsError,
    CitadelSessionError,
    DatabaseNotFoundError,
    EmbedderMismatchError,
    LedgerError,
    WrongPassphraseError,
)
from ..options import StoreOptions
from ..results import (
    IntegrityReport,
    OwnerStatus,
    Progress,
    PurgeReport,
    ReembedSummary,
    SessionIntegrity,
    StatusReport,
)
from ..telemetry import metrics
from . import data_owners, file_status, owner_search, reads, registry, retention, suffix, writes
from .audit import ATOM_KEYS, check_before_memory
from .completeness import now_micros
from .ended import erase_ended, erase_one
from .engine import OpenDatabase, database_options
from .files import copy_watched, database_files, make_private, page_layout, private_files, resolve_path
from .inspection import integrity_report
from .ledger import LedgerEntry, LedgerHead, LedgerReading
from .reembed import reembed_file
from .search_upkeep import store_all_pending
from .segment_cache import SessionState
from .segments import SessionKey, SessionLayout
from .whole_file import audit_chain, backup_with_audit, rotate

T = TypeVar("T")
_log = logging.getLogger("citadeldb_openai_agents")


class LocalFile:
    """One file open in this process, and its sessions.

    Args:
        path: The database file; a relative path resolves against the working directory.
        key: The passphrase, forgotten once the file is open.
        embedder: The embedder the file's vectors are bound to.
        options: The store's options (options.py): Citadel's open options are made from it, and
            the erasure ledger (ledger.py) and how long sessions live (retention.py) read it.
        create: False refuses to create a missing file (`DatabaseNotFoundError`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        embedder: Embedder,
        options: StoreOptions,
        create: bool,
        refusal: str = "create=False forbids creating one",
        fix: str = ", or pass create=True to start a new, empty database",
    ) -> None:
        new = not os.path.exists(resolve_path(path))
        try:
            self._database = _acquire(
                path, key, database_options(options), create=create, refusal=refusal, fix=fix
            )
        finally:
            del key  # error trackers record a failed frame's locals
        try:
            # Citadel makes two companions of a new file at its first region and atom, which the
            # layout writes: made 0600 like the file (files.private_files).
            with private_files() if new else contextlib.nullcontext():
                self._layout = _shared_layout(self._database, embedder, options)
        except BaseException:
            registry.release(self._database)
            raise
        if new:
            make_private(self.path)
        # How this process serves the file, if it does (the server sets it): for `status`.
        self.serving: Callable[[], OwnerStatus] | None = None

    @property
    def path(self) -> str:
        return self._database.path

    @property
    def identity(self) -> EmbedderIdentity:
        return self._layout.identity

    @property
    def forked(self) -> bool:
        """True in a process forked from the one that opened the file."""
        return self._database.forked

    def check_process(self) -> None:
        """Raise `ForkedStoreError` in a process forked from the one that opened the file."""
        self._database.check_process()

    def release(self) -> None:
        """This store's share of the file is given back; the last one closes it."""
        registry.release(self._database)

    # -- every session ----------------------------------------------------------------

    def session_ids(self) -> list[str]:
        """Every session holding a live item, in any of its branches."""
        states = self._layout.states()
        return sorted({s.session_id for s in states if self._on_state(s, _listed, reads.has_live_item)})

    def summaries(
        self, owner: str | None = None, owned: bool | None = None, progress: Progress | None = None
    ) -> list[tuple[str, int, int, int, str | None, dict[str, Any] | None]]:
        """(id, items, first, last write, owner, labels) of every session holding an item (its branches'
        counted with it), sorted by id. Only `owner`'s, or (`owned`) those with or without an
        owner: chosen from the records this process holds, before any session is read."""
        layout = self._layout
        states = layout.states()
        if owner is not None or owned is not None:  # picked from the records, before any read
            states = [s for s in states if _owner_matches(data_owners.owner_of(layout, s), owner, owned)]
        found: dict[str, tuple[int, int, int]] = {}
        for state, summary in self._each(_listed, progress, reads.summary, states=states):
            if summary:
                held = found.get(state.session_id)
                found[state.session_id] = (
                    summary
                    if held is None
                    else (held[0] + summary[0], min(held[1], summary[1]), max(held[2], summary[2]))
                )
        return [
            (sid, *found[sid], *data_owners.recorded(layout, None, layout.state(sid)))
            for sid in sorted(found)
        ]

    def search_owner(self, owner: str, query: str, limit: int) -> list[tuple[str, str, int]]:
        """(session id, item, position) of the `limit` best matches for `query` over every
        session of `owner` (owner_search.py)."""
        layout = self._layout
        states = [layout.state(session_id) for session_id in data_owners.owned(layout, owner)]
        with self._database.operation() as memory:
            return owner_search.search_sessions(layout, memory, states, query, limit)

    def begin_owner_erasure(self, owner: str) -> tuple[list[str], bool]:
        """The ids of `owner`'s sessions, and whether an erasure of theirs began before (noted in
        the file first: data_owners.begin_erasure)."""
        with self._database.operation() as memory:
            return data_owners.begin_erasure(self._layout, memory, owner)

    def purge(self, progress: Progress | None = None) -> PurgeReport:
        """Erase the sessions past their TTL (session mode) or idle time, each with a receipt, then
        every item past its own TTL (`purge_expired`)."""
        expired = self.purge_expired(progress)
        ended = erase_ended(self._database, self._layout, "purge")
        return PurgeReport(expired, ended, self._layout.recent.take_swept())

    def purge_expired(self, progress: Progress | None = None) -> int:
        """Erase every expired atom; return the items erased (not their search data or markers).

        Counted from the pages, read once before and once after (each read scans the file's
        atom tables): the item rows that were there and are gone, and had expired.
        """
        names = [name for state in self._layout.states() for name in self._layout.segment_regions(state)]
        before = self._layout.completeness.rows(names) if names else {}
        self._each(writes.purge_expired, progress)
        after = self._layout.completeness.rows(names) if names else {}
        now = now_micros()
        erased = sum(
            1
            for name, rows in before.items()
            for atom, expires in rows.items()
            if expires is not None and expires <= now and atom not in after[name]
        )
        metrics.erased(erased, self.path, "ttl")
        return erased

    def status(self) -> StatusReport:
        """What `status` shows, read here (file_status.py), with how this process serves the file."""
        return file_status.live(
            self._database, self._layout, None if self.serving is None else self.serving()
        )

    def verify(self, progress: Progress | None = None) -> IntegrityReport:
        """Citadel's page check, the audit log's chain, and per session what the pages hold against
        what reads back; the result is recorded in the layout record, for `status`."""
        report = self._verify(progress)
        with self._database.operation() as memory:
            self._layout.update_meta(memory, last_verify=[time.time(), report.ok])
        return report

    def _verify(self, progress: Progress | None) -> IntegrityReport:
        pages, stats = self._database.alone(lambda db: (db.integrity_check(), db.stats()))
        chain = self._database.on_owner_thread(audit_chain)
        verdicts: dict[str, int] = {}
        counted: dict[str, tuple[int, int, int]] = {}  # a session's branches are counted with it
        for state, (expected, readable, found) in self._each(reads.inspect, progress):
            for verdict, count in found.items():
                verdicts[verdict] = verdicts.get(verdict, 0) + count
            not_authentic = sum(count for verdict, count in found.items() if verdict != "authentic")
            before = counted.get(state.session_id, (0, 0, 0))
            counted[state.session_id] = (
                before[0] + expected,
                before[1] + readable,
                before[2] + not_authentic,
            )
        sessions = [
            SessionIntegrity(
                session_id, expected, readable, wrong, ATOM_KEYS if readable < expected else None
            )
            for session_id, (expected, readable, wrong) in sorted(counted.items())
            if expected
        ]
        try:
            # The ledger reaches the head this file recorded, and its copies agree, or it is a finding.
            reading = None if self._layout.erasures.ledger is None else self._layout.erasures.ledger.read()
            held = self.erased_still_held([] if reading is None else reading.entries)
            ledgered = (
                [] if reading is None else [f"erasure ledger: {note}" for note in reading.disagreements]
            )
        except LedgerError as exc:  # reported, like any other damage found
            held, ledgered = {}, [str(exc)]
        ledgered += [
            f"session {session_id!r} holds {count} items the erasure ledger says were erased: "
            f"erase them again (erase {session_id} --yes), or restore the backup with its ledger"
            for session_id, count in held.items()
        ]
        return integrity_report(
            pages, chain, verdicts, sessions, ledgered, page_layout(self.path, int(stats["high_water_mark"]))
        )

    def erased_still_held(self, entries: list[LedgerEntry] | None = None) -> dict[str, int]:
        """Per session, the live items the ledger's `entries` (all of this file's) say were erased."""
        if entries is None:
            entries = [] if self._layout.erasures.ledger is None else self._layout.erasures.ledger.entries()
        by_hid: dict[str, list[LedgerEntry]] = {}
        for entry in entries:
            by_hid.setdefault(entry.session, []).append(entry)
        held: dict[str, int] = {}
        for state in self._layout.states():  # a session's branches are counted with it
            if state.hid in by_hid:
                count = len(self._on_state(state, suffix.ledger_erased, by_hid[state.hid]))
                if count:
                    held[state.session_id] = held.get(state.session_id, 0) + count
        return held

    def check_erasures_current(self) -> None:
        """`LedgerError` when the file is older than its erasure ledger (a rollback: its parts put
        back from an older copy); no ledger: nothing (`ErasureNotes.at_open`, issue 59)."""
        layout = self._layout
        write, head = layout.erasures.at_open(self.path, bool(layout.meta.get("ledger_heads")))
        if write:
            with self._database.operation() as memory:
                layout.adopt_ledger_head(memory, head)
                layout.update_meta(memory, ledger_heads=1)

    @property
    def ledger_head(self) -> LedgerHead | None:
        """The erasure ledger's head this file recorded (None: it recorded no erasure)."""
        return self._layout.erasures.head

    def ledger_reading(
        self, path: str, mirror: str | None = None, at_least: LedgerHead | None = None
    ) -> LedgerReading:
        """This file's entries in the erasure ledger at `path` (and `mirror`): `LedgerError` if
        none is authentic, or the longest falls short of this file's head or of `at_least`."""
        return self._layout.erasures.at(path, mirror).read(at_least)

    def adopt_ledger_head(self, head: LedgerHead | None) -> None:
        """Record `head` as this file's (a restored copy, once the ledger is replayed)."""
        with self._database.operation() as memory:
            self._layout.adopt_ledger_head(memory, head)

    def replay(self, entries: list[LedgerEntry]) -> dict[str, int]:
        """Erase what `entries` name (a restored backup's); per session the items erased."""
        held = self.erased_still_held(entries)
        for state in self._layout.states():
            if state.session_id in held:
                named = [entry for entry in entries if entry.session == state.hid]
                self._on_state(state, suffix.erase_ledgered, named)
        self.purge_expired()
        return held

    def backup(self, destination: str | os.PathLike[str], progress: Progress | None = None) -> list[str]:
        """Write a consistent copy of the file and its companions to `destination`; return their paths."""
        # Not resolved: a symlink at the destination is refused, never followed.
        target = Path(destination).expanduser().absolute()
        if not target.parent.is_dir():
            raise DatabaseNotFoundError(f"cannot back up to {target}: {target.parent} does not exist.")
        existing = [p for p in database_files(str(target)) if os.path.lexists(p)]
        if existing:
            raise BackupExistsError(
                f"refusing to overwrite {', '.join(existing)}: choose a new destination "
                "(a backup never replaces files)."
            )
        with self._database.exclusive(), copy_watched(self.path, str(target), progress, self._used_pages()):
            # Exclusive: the audit log must describe the data it goes with. The umask is set
            # on the owner's thread, which writes the copy.
            self._database.on_owner_thread(lambda db: _private_backup(db, self.path, str(target)))
        return [p for p in database_files(str(target)) if os.path.exists(p)]

    def _used_pages(self) -> int | None:
        """Pages the file uses (a backup copies these; the file itself grows by whole MiBs)."""
        try:
            return int(self._database.on_owner_thread(lambda db: db.stats()["high_water_mark"]))
        except (KeyError, TypeError, ValueError):
            return None

    def rotate_key(self, current_key: str, new_key: str) -> None:
        """Change the passphrase; raises `WrongPassphraseError` if `current_key` is not it."""
        keys = [current_key, new_key]
        del current_key, new_key  # only `keys` holds them, and it is emptied
        try:
            rotated = self._database.alone(lambda db: rotate(db, self.path, *keys))
        finally:
            keys.clear()
        if not rotated:
            raise WrongPassphraseError(
                f"the current passphrase given for {self.path} is wrong; nothing was changed."
            )

    # -- plumbing ---------------------------------------------------------------------

    def hashed(self, key: SessionKey) -> str:
        """The session's name in spans and log lines: a salted hash of its id, never the id
        (its branch, if any, is not named either)."""
        session_id = key if isinstance(key, str) else key[0]
        return self._layout.keyed(b"telemetry session", session_id)

    def on_session(self, key: SessionKey, operation: Callable[..., T], *args: Any) -> T:
        """`operation(layout, memory, state, *args)` on the session, under its lock (a storage
        function of reads.py, writes.py or suffix.py: serving/operations.py names which).

        `key` is the session's id, or ``(id, branch)`` for one of its branches (segments.py). A
        session (or branch) past its TTL or idle time is erased first: nothing reads it again.
        """
        state = self._layout.state(key)
        with self._database.operation() as memory, state.lock:
            if retention.ended(self._layout, memory, state):
                erase_one(self._layout, memory, state, "access")
            return operation(self._layout, memory, state, *args)

    def _on_state(self, state: SessionState, operation: Callable[..., T], *args: Any) -> T:
        with self._database.operation() as memory, state.lock:
            return operation(self._layout, memory, state, *args)

    def _each(
        self,
        operation: Callable[..., T],
        progress: Progress | None,
        *args: Any,
        states: list[SessionState] | None = None,
    ) -> list[tuple[SessionState, T]]:
        states = self._layout.states() if states is None else states
        done = []
        for number, state in enumerate(states, 1):
            done.append((state, self._on_state(state, operation, *args)))
            if progress is not None:
                progress(number, len(states))
        return done


def _owner_matches(found: str | None, owner: str | None, owned: bool | None) -> bool:
    return (owner is None or found == owner) and (owned is None or (found is not None) == owned)


def _listed(layout: SessionLayout, memory: Memory, state: SessionState, read: Callable[..., T]) -> T | None:
    """`read` of a session the file's listings show: None for one past its deadline (retention.py)."""
    return None if retention.ended(layout, memory, state) else read(layout, memory, state)


def _private_backup(db: citadeldb.Database, path: str, target: str) -> None:
    with private_files():
        backup_with_audit(db, path, target)
    make_private(target)


def reembed(
    path: str | os.PathLike[str], key: str, embedder: Embedder, progress: Progress | None = None
) -> ReembedSummary:
    """Re-embed a file's stored text with `embedder`, keeping every item (reembed.py)."""
    try:
        database = _acquire(path, key, None, create=False, refusal="re-embedding never creates one", fix="")
    finally:
        del key
    try:
        with database.setup_lock:
            if database.layout is not None:
                raise CitadelSessionError(
                    f"{database.path} has open stores in this process; close them before re-embedding."
                )
            with database.operation() as memory:
                regions, items = reembed_file(memory, embedder, database.audit.leftovers, progress)
    finally:
        registry.release(database)
    return ReembedSummary(regions, items, EmbedderIdentity.of(embedder).model_id)


def _acquire(
    path: str | os.PathLike[str],
    key: str,
    options: citadeldb.DatabaseOptions | None,
    *,
    create: bool,
    refusal: str = "create=False forbids creating one",
    fix: str = ", or pass create=True to start a new, empty database",
) -> OpenDatabase:
    """`registry.acquire`, with the one rule about new files: refused, or logged."""
    resolved = resolve_path(path)
    existed = os.path.exists(resolved)
    try:
        if not existed and not create:
            relative = (
                ""
                if os.path.isabs(os.path.expanduser(path))
                else f" ({os.fspath(path)} is relative, so it resolved against the working directory)"
            )
            raise DatabaseNotFoundError(
                f"there is no database at {resolved}{relative}, and {refusal}. Correct the path{fix}.",
                creation_refused=True,
            )
        database = registry.acquire(resolved, key, options, check_before_memory)
    finally:
        del key
    if not existed:
        # Worth a line in the service's log: a new empty file where one was expected is
        # how a wrong path or working directory shows (the conversations are elsewhere).
        _log.info("created a new Citadel database at %s", resolved)
    return database


def _shared_layout(database: OpenDatabase, embedder: Embedder, options: StoreOptions) -> SessionLayout:
    with database.setup_lock:
        layout = database.layout
        if layout is None:
            with database.operation() as memory:
                layout = SessionLayout(
                    memory,
                    embedder,
                    database.audit,
                    database.region_rows,
                    database.region_writes,
                    database.path,
                )
                layout.erasures.keep(
                    options.erasure_ledger, options.ledger_mirror
                )  # before recovery, which may finish an erasure
                layout.keep_retention(options)
                suffix.recover(layout, memory)  # before any read: old suffix or new, never both
            database.layout = layout
            database.before_close = lambda memory: store_all_pending(layout, memory)
            sweeper = retention.Sweeper(
                lambda: erase_ended(database, layout, "sweep"),
                lambda: retention.sweep_period(layout, layout.states()),
            )
            database.stop_background = sweeper.stop
        elif layout.identity != EmbedderIdentity.of(embedder):
            raise EmbedderMismatchError(
                f"{database.path} is already open in this process with embedder "
                f"{layout.identity.model_id!r} (dim {layout.identity.dim}); this store asked for "
                f"{EmbedderIdentity.of(embedder).model_id!r}. Use one embedder per file."
            )
        else:
            layout.keep_retention(options)
        return layout  # type: ignore[no-any-return]  # OpenDatabase.layout is set here only


__all__ = ["LocalFile", "database_options", "reembed"]
