"""CitadelSessionStore: one encrypted Citadel file holding many sessions, the package's facade.

It checks what callers give it (options.py), turns items into JSON text and back (storage/codec.py),
and hands every operation to its file (serving/shared_file.py). Sessions call its private methods.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from . import options as checks
from .embedders.protocol import EmbedderIdentity
from .embedders.providers import resolve_embedder
from .errors import KEY_ARGUMENT, SessionClosedError, SessionNotFoundError, WrongPassphraseError
from .history import History
from .options import Argon2Profile, SyncMode, TtlMode
from .results import Erasure, IntegrityReport, Progress, PurgeReport, SessionSummary
from .serving.protocol import Terms
from .serving.shared_file import SharedFile
from .shards import Ring, RingFile
from .storage.local_file import database_options
from .storage.records import Retention
from .transfers import Transfers

if TYPE_CHECKING:
    # Imported for annotations only: the operator CLI never needs the Agents SDK loaded.
    from agents.memory import SessionSettings

    from .session import CitadelSession, RunContextHook


class CitadelSessionStore(Transfers):
    """An encrypted Citadel file shared by every session in it (its export, import and move
    methods are in transfers.py).

    Args:
        path: The database file (created when missing, unless ``create=False``; its directory
            must exist). A relative path resolves against the working directory. Creating a
            file is logged at INFO (logger ``citadeldb_openai_agents``) with its absolute path.
        key: The passphrase. Kept for the store's life in a private buffer zeroed on close
            (taking the file over from an owner that went means opening it again).
        embedder: Embeds item text for `CitadelSession.search`; default
            ``citadeldb.MockEmbedder(dim=128)`` (no download). Any object with ``dim``, ``metric``,
            ``model_id`` and ``embed_with_cancel`` works; one with ``embed`` / ``embed_queries`` is adapted.
        ttl, ttl_mode: Seconds each item lives after its own write (``ttl_mode="item"``, the
            default), or the whole session after its last write, which every add or pop pushes
            forward (``"session"``); None keeps items forever. Expired items are invisible at once
            and erased (keys destroyed) when their session is next written or by `purge`; an
            expired session when next used, by `purge`, or by the file's owner within a minute.
        idle_ttl: Seconds a session may go without a write before it is erased whole (as a session
            TTL erases it), whatever the mode. None: never for idleness.
        session_settings: Default `SessionSettings` for sessions minted here.
        argon2_profile: Citadel's key-derivation cost for a *new* file ("iot", "desktop",
            "server"); an existing file keeps its own.
        sync_mode: Citadel's durability for writes while this process owns the file: "full"
            (default: each commit flushes the key file and, twice, the pages), "normal" (the pages
            once) or "off" (the key file only: a killed process loses nothing, a power cut may
            lose recent writes). Applied at every open: every process on one file needs the same.
        cache_size: Citadel's page cache in ~8 KiB pages for this process; default
            `DEFAULT_CACHE_PAGES` (16,384: at most ~128 MiB, filled as pages are read).
            Search is fast only while the cache holds the file (docs/performance.md).
        create: False refuses to create a new file (`DatabaseNotFoundError`): a wrong path or
            working directory cannot silently start an empty database.
        serve: True (the default): the process that opens the file first owns it and serves it
            to the other processes that open it, which become its clients with no change to
            their code, and take it over if it goes. False: the file is this process's alone
            (another gets `DatabaseLockedError`); a forked child's store raises `ForkedStoreError`.
        adopt: Settings fixed per file (`FIXED_PER_FILE`: ttl, embedder, sync_mode, erasure_ledger)
            taken from the owner when this store is its client, not refused if they differ (`adopted`
            says what was taken; a takeover keeps them). `from_config` adopts those it leaves unset.
        shards, shard: The fleet's shard names and this process's (`shard_for` places each
            session on one): an operation on another shard's session raises `WrongShardError`.
            Or `ring_file` in place of `shards`: a file an operator rewrites to change the ring live.
        erasure_ledger: A file outside the database where the owner records every erasure
            before it starts (`LedgerError` if it cannot), so `restore_backup` erases it again.
        max_items: The most items a session keeps: each `add_items` erases the oldest beyond it,
            as `pop_item` erases (keys destroyed). None: no cap. `session(...)` may give a session
            its own ``max_items``, ``ttl_mode`` and ``idle_ttl``.

    Stores on one file in one process share one open database (another passphrase is refused);
    every process on it needs the same passphrase, TTL rules, embedder, sync mode and ledger, or adopts them.
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
        serve: bool = True,
        adopt: Collection[str] = (),
        shards: Sequence[str] | None = None,
        shard: str | None = None,
        erasure_ledger: str | os.PathLike[str] | None = None,
        ring_file: str | os.PathLike[str] | None = None,
        max_items: int | None = None,
        ttl_mode: TtlMode | None = None,
        idle_ttl: float | None = None,
    ) -> None:
        wrong = None
        try:
            checks.check_passphrase(key)
            self.max_items = checks.check_max_items(max_items)
            adopted = checks.check_adopt(adopt)
            ring = Ring.of(shards, shard) if ring_file is None else RingFile.of(ring_file, shards, shard)
            self.session_settings = session_settings
            resolved_embedder = resolve_embedder(embedder)
            options = database_options(argon2_profile, sync_mode, cache_size)
            self._closed, self._close_lock = False, threading.Lock()
            self._file = SharedFile(
                path,
                key,
                embedder=resolved_embedder,
                options=options,
                create=create,
                terms=Terms.of(ttl, sync_mode, erasure_ledger, ttl_mode, idle_ttl),
                serve=serve,
                adopt=adopted,
                options_for=lambda mode: database_options(argon2_profile, mode, cache_size),  # type: ignore[arg-type]
                ring=ring,
            )
        except WrongPassphraseError as exc:  # told here, raised below: no frame of the layers under us
            wrong = exc.came_from(KEY_ARGUMENT)
        finally:
            del key  # gone from this frame on every path: error trackers record its locals
        if wrong is not None:
            raise wrong from None

    @property
    def path(self) -> str:
        """The resolved path of the database file."""
        return self._file.path

    @property
    def ttl(self) -> float | None:
        """Seconds an item lives after it is written, or None (the owner's, when adopted)."""
        return self._file.terms.ttl

    @property
    def ttl_mode(self) -> str:
        """How the TTL counts: "item" or "session" (the owner's, when adopted)."""
        return self._file.terms.ttl_mode

    @property
    def idle_ttl(self) -> float | None:
        """Seconds a session may go without a write before it is erased, or None (the owner's, when adopted)."""
        return self._file.terms.idle_ttl

    @property
    def adopted(self) -> dict[str, Any]:
        """The settings this store took from the file's owner (see ``adopt``), with their values."""
        return self._file.adopted

    @property
    def embedder_identity(self) -> EmbedderIdentity:
        """The model id, dimension and metric the file's vectors are bound to."""
        return self._file.identity

    @property
    def served_by(self) -> int | None:
        """The process that owns the file when this store is its client; None when this one owns it."""
        self._check_open()
        return self._file.served_by

    @property
    def closed(self) -> bool:
        return self._closed

    def session(
        self,
        session_id: str,
        *,
        session_settings: SessionSettings | None = None,
        on_run_context: RunContextHook | None = None,
        max_items: int | None = None,
        ttl_mode: TtlMode | None = None,
        idle_ttl: float | None = None,
    ) -> CitadelSession:
        """A session (created on its first write); `WrongShardError` for another shard's.
        `on_run_context`, and `max_items`, `ttl_mode`, `idle_ttl` in place of the store's: as
        `CitadelSession` takes them."""
        from .session import CitadelSession

        self._check_open()
        self._file.check_shard(session_id)
        settings = self.session_settings if session_settings is None else session_settings
        session = CitadelSession(
            session_id,
            store=self,
            session_settings=settings,
            max_items=max_items,
            ttl_mode=ttl_mode,
            idle_ttl=idle_ttl,
        )
        session.on_run_context = on_run_context
        return session

    def session_ids(self) -> list[str]:
        """The ids of the sessions holding at least one live item, sorted."""
        self._check_open()
        return self._file.session_ids()

    def purge(self, *, progress: Progress | None = None) -> PurgeReport:
        """Erase now (keys destroyed) what has expired: each session that ended (`ttl` in session
        mode, or `idle_ttl`), with its receipt, then every item past its own `ttl`.

        `progress(done, total)` is called after each session.
        """
        self._check_open()
        return self._file.purge(progress)

    def purge_expired(self, *, progress: Progress | None = None) -> int:
        """`purge`, returning only how many items it erased (those of the sessions that ended too)."""
        return self.purge(progress=progress).items_erased

    def erase_session(self, session_id: str) -> Erasure:
        """Erase a session's items (keys destroyed) and return Citadel's evidence.

        The same erasure as `CitadelSession.clear_session`, plus a readback: each
        erased item is verified ``missing`` by Citadel. Counts only live items;
        expired ones still stored are erased too.

        Raises:
            SessionNotFoundError: the file holds nothing under this id.
        """
        self._check_open()
        erasure = self._file.erase(session_id)
        if erasure is None:
            raise self._not_found(session_id)
        return erasure

    def erase_sessions(
        self, session_ids: list[str], *, confirm: Callable[[dict[str, int]], None] | None = None
    ) -> list[tuple[str, Erasure]]:
        """Erase several sessions (duplicates once), all or nothing: every id is checked before any
        is erased; returns each id, in the order given, with its receipt.

        `confirm` is called with each id's item count once every id is known to hold items,
        before anything is erased; raising from it erases nothing.

        Raises:
            SessionNotFoundError: an id holds nothing; it names every such id; nothing was erased.
        """
        self._check_open()
        ids = list(dict.fromkeys(session_ids))
        # One summary per named id, not `sessions()`: that would count every session in the file.
        counts = {session_id: self._file.summary(session_id) for session_id in ids}
        unknown = [session_id for session_id, found in counts.items() if found is None]
        if unknown:
            raise self._not_found(*unknown, done="nothing was erased.")
        if confirm is not None:
            confirm({session_id: found[0] for session_id, found in counts.items() if found is not None})
        return [(session_id, self.erase_session(session_id)) for session_id in ids]

    def sessions(self) -> list[SessionSummary]:
        """Every session holding a live item: its id, item count and first and last write."""
        self._check_open()
        return [SessionSummary.from_micros(*found) for found in self._file.summaries()]

    def summary(self, session_id: str) -> SessionSummary | None:
        """One session's item count and first and last write; None when it holds no live item."""
        self._check_open()
        found = self._file.summary(session_id)
        return None if found is None else SessionSummary.from_micros(session_id, *found)

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
            checks.check_passphrase(keys[1])
            if keys[1] == keys[0]:
                raise ValueError("the new passphrase is the current one; choose a different one.")
            self._file.rotate_key(*keys)
        finally:
            keys.clear()

    def backup(self, destination: str | os.PathLike[str], *, progress: Progress | None = None) -> list[str]:
        """Write a consistent copy of the file and its companions; return their paths. Refuses a
        destination that exists. Later erasures reach it through `erasure_ledger` and `restore_backup`."""
        self._check_open()
        return self._file.backup(destination, progress)

    def verify(self, *, progress: Progress | None = None) -> IntegrityReport:
        """Check the file: Citadel's page check, the audit log's chain, and every session.

        Per session, the items the file's pages hold are compared with those Citadel
        reads back, and each item read gets Citadel's verdict (authentic, tampered, ...).
        `ok` is False when a page, an item or the audit log is damaged or missing.
        `progress(done, total)` is called after each session.
        """
        self._check_open()
        return self._file.verify(progress)

    def _not_found(self, *session_ids: str, done: str = "") -> SessionNotFoundError:
        lister = f"{done} `python -m citadeldb_openai_agents sessions` lists them.".lstrip()
        named = ", ".join(map(repr, session_ids))
        return SessionNotFoundError(f"no session {named} with live items in {self.path}; {lister}")

    def close(self) -> None:
        """Close the store; the file closes when the last store on it does. Idempotent.

        In a process forked from the one that opened the store, it only marks the store
        closed: the file belongs to the parent, which keeps using it.
        """
        if self._file.forked:
            # Before `_close_lock`, which another thread of the parent may have held at the fork.
            self._closed = True
            return
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._file.release()

    def __enter__(self) -> CitadelSessionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CitadelSessionStore {self.path!r} ttl={self.ttl} {'closed' if self._closed else 'open'}>"

    def _check_process(self) -> None:
        """`ForkedStoreError` in a forked child (or it becomes a client of the parent serving the file)."""
        self._file.check_process()

    def _check_open(self) -> None:
        """Every public call's first step: the one fork check, then whether the store is closed."""
        self._check_process()
        self._check_not_closed()

    def _check_not_closed(self) -> None:
        if self._closed:
            raise SessionClosedError(
                f"this CitadelSessionStore ({self.path}) is closed; open a new one to continue."
            )

    def _history(self, session_id: str, retention: Retention | None) -> History:
        """What a `CitadelSession` of `session_id` runs its methods on (history.py)."""
        return History(self._file, session_id, retention)
