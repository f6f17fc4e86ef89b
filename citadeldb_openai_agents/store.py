"""CitadelSessionStore: one encrypted Citadel file holding many sessions, the package's facade.

It checks what callers give it (options.py), turns items into JSON text and back (storage/codec.py),
and hands every operation to its file (serving/shared_file.py). Sessions call its private methods.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import options as checks
from .embedders.protocol import EmbedderIdentity
from .embedders.providers import resolve_embedder
from .errors import (
    KEY_ARGUMENT,
    OwnerMismatchError,
    OwnerNotFoundError,
    SessionClosedError,
    SessionNotFoundError,
    WrongPassphraseError,
)
from .history import History
from .options import Argon2Profile, SessionOptions, StoreOptions, SyncMode, TtlMode
from .original_api import OriginalStoreApi, refuse_region
from .people import check_labels, check_owner, check_owner_pattern, owner_by_pattern
from .results import (
    Erasure,
    IntegrityReport,
    MoveSummary,
    OwnerErasure,
    OwnerHit,
    Progress,
    PurgeReport,
    SessionExport,
    SessionSummary,
)
from .serving import operations as ops
from .serving.shared_file import SharedFile
from .shards import Ring, RingFile
from .storage.codec import decode_item, decode_items, encode_batch, search_text
from .storage.records import MAIN
from .storage.segments import key_of
from .telemetry import returned, traced
from .transfer.chunks import IMPORT_MODES, ImportMode, import_chunks
from .transfer.moves import move_sessions

if TYPE_CHECKING:
    # Imported for annotations only: the operator CLI never needs the Agents SDK loaded.
    from agents.memory import SessionSettings

    from .results import ImportSummary


class FileStore(OriginalStoreApi):
    """An encrypted Citadel file shared by every session in it: all of `CitadelSessionStore` but
    the making of sessions (session.py adds it, as CitadelSession opens one of these).
    Its arguments are documented on `CitadelSessionStore`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        embedder: Any | None = None,
        ttl: float | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        argon2_profile: Argon2Profile | None = None,
        sync_mode: SyncMode | None = None,
        cache_size: int | None = None,
        create: bool = True,
        serve: bool = True,
        socket_dir: str | os.PathLike[str] | None = None,
        adopt: Collection[str] = (),
        shards: Sequence[str] | None = None,
        shard: str | None = None,
        erasure_ledger: str | os.PathLike[str] | None = None,
        ledger_mirror: str | os.PathLike[str] | None = None,
        ring_file: str | os.PathLike[str] | None = None,
        max_items: int | None = None,
        ttl_mode: TtlMode | None = None,
        idle_ttl: float | None = None,
        owner_pattern: str | re.Pattern[str] | None = None,
        region: str | None = None,
    ) -> None:
        wrong = None
        try:
            refuse_region(region)  # 2.x's argument: raises, naming the way over (original_api.py)
            checks.check_passphrase(key)
            self.max_items = checks.check_max_items(max_items)
            self.owner_pattern = check_owner_pattern(owner_pattern)
            adopted = checks.check_adopt(adopt)
            ring = Ring.of(shards, shard) if ring_file is None else RingFile.of(ring_file, shards, shard)
            self.session_settings = checks.coerce_session_settings(session_settings)
            # The one options value, built once and passed whole (options.StoreOptions).
            options = StoreOptions.of(
                ttl=ttl, ttl_mode=ttl_mode, idle_ttl=idle_ttl, sync_mode=sync_mode, cache_size=cache_size,
                erasure_ledger=erasure_ledger, ledger_mirror=ledger_mirror, argon2_profile=argon2_profile,
                socket_dir=socket_dir)  # fmt: skip
            self._closed, self._close_lock = False, threading.Lock()
            self._file = SharedFile(
                path, key, embedder=resolve_embedder(embedder), options=options, create=create,
                serve=serve, adopt=adopted, ring=ring)  # fmt: skip
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

    def _telemetry(self) -> tuple[str, str, str | None]:
        """What this store's spans say of it: its file, this process's role, its shard (telemetry/)."""
        return self._file.path, "owner" if self._file.served_by is None else "client", self._file.shard

    @property
    def ttl(self) -> float | None:
        """Seconds an item lives after it is written, or None (the owner's, when adopted)."""
        return self._file.options.ttl

    @property
    def ttl_mode(self) -> str:
        """How the TTL counts: "item" or "session" (the owner's, when adopted)."""
        return self._file.options.ttl_mode

    @property
    def idle_ttl(self) -> float | None:
        """Seconds a session may go without a write before it is erased, or None (the owner's, when adopted)."""
        return self._file.options.idle_ttl

    @property
    def options(self) -> StoreOptions:
        """Every setting this store holds for its file, as one immutable value (the owner's, where
        adopted)."""
        return self._file.options

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

    @property
    def erasure_ledger_head(self) -> tuple[int, str] | None:
        """The erasure ledger's newest entry (number, MAC) as the file records it; None: none yet."""
        self._check_open()
        return self._file.call(ops.LEDGER_HEAD)

    @traced("session_ids", counted=returned)
    def session_ids(self) -> list[str]:
        """The ids of the sessions holding at least one live item, sorted."""
        self._check_open()
        return self._file.call(ops.SESSION_IDS)

    @traced("purge")
    def purge(self, *, progress: Progress | None = None) -> PurgeReport:
        """Erase now (keys destroyed) what has expired: each session that ended (`ttl` in session
        mode, or `idle_ttl`), with its receipt, then every item past its own `ttl`.

        `progress(done, total)` is called after each session.
        """
        self._check_open()
        return self._file.call(ops.PURGE, progress=progress)

    def purge_expired(self, *, progress: Progress | None = None) -> int:
        """`purge`, returning only how many items it erased (those of the sessions that ended too)."""
        return self.purge(progress=progress).items_erased

    @traced("erase_session")
    def erase_session(self, session_id: str) -> Erasure:
        """Erase a session's items (keys destroyed) and return Citadel's evidence: the erasure of
        `CitadelSession.clear_session`, plus a readback in which Citadel calls each erased item
        ``missing``. Counts only live items; expired ones still stored are erased too.

        Raises:
            SessionNotFoundError: the file holds nothing under this id.
        """
        self._check_open()
        erasure = self._file.call(ops.ERASE, session_id, None)
        if erasure is None:
            raise self._not_found(session_id)
        return erasure

    @traced("erase_sessions")
    def erase_sessions(
        self, session_ids: list[str], *, confirm: Callable[[dict[str, int]], None] | None = None
    ) -> list[tuple[str, Erasure]]:
        """Erase several sessions (duplicates once), all or nothing: every id is checked before any
        is erased; returns each id, in the order given, with its receipt. `confirm` is called with
        each id's item count once every id is known to hold items, before anything is erased;
        raising from it erases nothing.

        Raises:
            SessionNotFoundError: an id holds nothing; it names every such id; nothing was erased.
        """
        self._check_open()
        ids = list(dict.fromkeys(session_ids))
        # One summary per named id, not `sessions()`: that would count every session in the file.
        counts = {session_id: self._file.call(ops.SUMMARY, session_id) for session_id in ids}
        unknown = [session_id for session_id, found in counts.items() if found is None]
        if unknown:
            raise self._not_found(*unknown, done="nothing was erased.")
        if confirm is not None:
            confirm({session_id: found[0] for session_id, found in counts.items() if found is not None})
        return [(session_id, self.erase_session(session_id)) for session_id in ids]

    @traced("sessions", counted=returned)
    def sessions(self, *, owner: str | None = None, owned: bool | None = None) -> list[SessionSummary]:
        """Every session holding a live item: its id, item count, first and last write, owner.
        `owner` lists only that person's sessions; `owned=False` those that have no owner
        (`owned=True`: those that have one). Chosen from the file's records before any session
        is read: one owner's few sessions in a file of thousands are listed quickly."""
        self._check_open()
        if owner is not None:
            owner = check_owner(owner, "sessions' owner=")
        return [SessionSummary.from_micros(*found) for found in self._file.call(ops.SUMMARIES, owner, owned)]

    @traced("set_owner")
    def set_owner(self, session_ids: str | list[str], owner: str) -> list[str]:
        """Record `owner` as the owner of each session (a session changes owner only this way, or
        with `owner set`); returns the ids whose owner changed. Every id is checked first:
        `SessionNotFoundError` naming those the file does not hold, and nothing changed."""
        self._check_open()
        owner = check_owner(owner, "set_owner's owner")
        ids = list(dict.fromkeys([session_ids] if isinstance(session_ids, str) else session_ids))
        unknown = [session_id for session_id in ids if self._file.call(ops.SUMMARY, session_id) is None]
        if unknown:
            raise self._not_found(*unknown, done="no owner was changed.")
        return [sid for sid in ids if self._file.call(ops.SET_OWNER, sid, owner) == "changed"]

    @traced("search_owner", counted=returned)
    def search(self, query: str, *, owner: str, limit: int = 10) -> list[OwnerHit]:
        """The `limit` items best matching `query` over every session of one person, best first,
        each naming its session and its position there: what this person said in any of their
        conversations, and nothing of anyone else's. Ranked as `CitadelSession.search` ranks one
        session's items. Blocking: from async code, run it in a thread."""
        self._check_open()
        owner = check_owner(owner, "search's owner=")
        if limit <= 0:
            raise ValueError(f"limit must be at least 1, not {limit}")
        found = self._file.call(ops.SEARCH_OWNER, owner, query, limit)
        return [
            OwnerHit(sid, position, item := decode_item(payload), search_text(item))
            for sid, payload, position in found
        ]

    @traced("apply_owner_pattern")
    def apply_owner_pattern(self, *, dry_run: bool = False) -> dict[str, str]:
        """Record, for each session that has no owner, the one `owner_pattern` finds in its id;
        return each session id changed (or, `dry_run`, that would change) with its owner. A
        session that got an owner meanwhile keeps it. `ValueError` when no pattern is set."""
        self._check_open()
        if self.owner_pattern is None:
            raise ValueError(
                "no owner_pattern is set: give the store one (owner_pattern=, or CITADEL_OWNER_PATTERN), "
                "e.g. ^(?P<owner>[^:]+): for ids such as user-123:phone"
            )
        found = {
            s.session_id: owner_by_pattern(self.owner_pattern, s.session_id)
            for s in self.sessions(owned=False)
        }
        planned = {session_id: owner for session_id, owner in found.items() if owner is not None}
        if dry_run:
            return planned
        changed = {}
        for session_id, owner in planned.items():
            try:
                self._file.call(ops.CLAIM_OWNER, session_id, owner, None)
            except OwnerMismatchError:
                continue  # another owner was recorded since the listing: an owner changes only explicitly
            changed[session_id] = owner
        return changed

    @traced("erase_owner")
    def erase_owner(self, owner: str, *, progress: Progress | None = None) -> OwnerErasure:
        """Erase every session of one person (a GDPR art. 17 / CCPA deletion request), keys
        destroyed, each with Citadel's readback; one receipt for the person.

        The erasure is noted in the file before the first session goes: a crash leaves each
        session whole or erased, and calling it again erases what is left, then reports the
        erasure complete (`already_complete`) instead of not found. `progress(done, total)` is
        called once the erasure is noted, then after each session.

        Raises:
            OwnerNotFoundError: the file holds no session of `owner` and never erased one.
        """
        self._check_open()
        owner = check_owner(owner, "erase_owner's owner")
        session_ids, began_before = self._file.call(ops.BEGIN_OWNER_ERASURE, owner)
        if not session_ids and not began_before:
            raise OwnerNotFoundError(
                f"{self.path} holds no session of this owner, and never erased one; nothing was "
                "erased. Check the owner's spelling (owners are case-sensitive), or list them: "
                "`python -m citadeldb_openai_agents sessions --json`."
            )
        receipts = []
        for done, session_id in enumerate(session_ids):
            if progress is not None:
                progress(done, len(session_ids))
            erasure = self._file.call(ops.ERASE, session_id, None)
            if erasure is not None:  # None: nothing live was left (its items had expired)
                receipts.append((session_id, erasure))
        if progress is not None:
            progress(len(session_ids), len(session_ids))
        return OwnerErasure(owner, receipts, already_complete=not session_ids)

    @traced("summary")
    def summary(self, session_id: str) -> SessionSummary | None:
        """One session's item count, first and last write and owner; None when it holds no live item."""
        self._check_open()
        found = self._file.call(ops.SUMMARY, session_id)
        if found is None:
            return None
        return SessionSummary.from_micros(session_id, *found, *self._file.call(ops.ABOUT, session_id))

    # Not traced here: a wrapper's frame would hold both passphrases (its operation's span is made
    # where the file is, telemetry/spans.py, from a frame that keeps none).
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

    def follow_rotation(
        self, reread: Callable[[], str | None] | None, source: str = "the key= argument"
    ) -> None:
        """How this store follows a `rotate_key` another process makes while it runs: `reread`
        returns the passphrase read again from its source (a key file, a secret manager), and is
        called once the owner refuses the old one, until it gives another (60 s). Without it,
        the store raises `WrongPassphraseError` naming the rotation. `from_config` sets it."""
        self._file.follow_rotation(reread, source)

    @traced("backup")
    def backup(self, destination: str | os.PathLike[str], *, progress: Progress | None = None) -> list[str]:
        """Write a consistent copy of the file and its companions; return their paths. Refuses a
        destination that exists. Later erasures reach it through `erasure_ledger` and `restore_backup`."""
        self._check_open()
        return self._file.backup(destination, progress)

    @traced("verify")
    def verify(self, *, progress: Progress | None = None) -> IntegrityReport:
        """Check the file: Citadel's page check, the audit log's chain, and every session.

        Per session, the items the file's pages hold are compared with those Citadel
        reads back, and each item read gets Citadel's verdict (authentic, tampered, ...).
        `ok` is False when a page, an item or the audit log is damaged or missing.
        `progress(done, total)` is called after each session.
        """
        self._check_open()
        return self._file.call(ops.VERIFY, progress=progress)

    # -- whole sessions in and out: export, import, move (transfer/) --

    @traced("export", counted=returned)
    def export(self, session_id: str, *, progress: Progress | None = None) -> list[Any]:
        """A session's items, oldest first, exactly as stored (for a data-access request);
        `progress(done, total)` after each of its segments (256 items). Raises
        `SessionNotFoundError` when the session holds no live item."""
        self._check_open()
        items = decode_items(self._file.call(ops.ALL_ITEMS, session_id, progress=progress))
        if not items:
            raise self._not_found(session_id)
        return items

    @traced("import_items", counted=lambda args, summary: summary.written)
    def import_items(
        self,
        session_id: str,
        items: Iterable[Any],
        *,
        mode: ImportMode = "new",
        progress: Progress | None = None,
        branch: str = MAIN,
        owner: str | None = None,
        labels: dict[str, Any] | None = None,
        expires_at: Sequence[int | None] | None = None,
    ) -> ImportSummary:
        """Import items into a session, verbatim and in order; a rerun resumes, never duplicates.

        Written in atomic chunks of 256 items whose ids derive from this import (transfer/chunks.py).
        `mode`: "new" refuses a session that holds other items than this import's, "append" adds
        after them, "replace" erases them first (every branch). `progress(items done, items)` after
        each chunk. Another `branch` than "main" gets the items after what it holds ("replace"
        replaces nothing there: the session's own replacement erased it); its name is recorded
        as used, as a branch created here. `owner` and `labels` are recorded as
        `session(session_id, owner=, labels=)` records them, checked before anything is written.
        `expires_at`: each item's own expiry (µs since the epoch, or None), kept by an import from a
        file that had one; the store's own TTL still applies, and the earlier wins.

        Raises:
            SessionNotEmptyError: mode "new" and the session holds other items; nothing was written.
            InvalidItemError: an item is not JSON (its position is named); nothing was written.
            OwnerMismatchError: the session belongs to another owner; nothing was written.
        """
        self._check_open()
        if mode not in IMPORT_MODES:
            raise ValueError(f"mode must be one of {', '.join(IMPORT_MODES)}, not {mode!r}")
        owner = None if owner is None else check_owner(owner, "import_items' owner=")
        labels = None if labels is None else check_labels(labels, "import_items' labels=")
        batch = encode_batch(list(items), owner=owner, labels=labels)
        if expires_at is not None and len(expires_at) != len(batch):
            raise ValueError(f"expires_at holds {len(expires_at)} expiries for {len(batch)} items")
        if branch != MAIN:
            self._file.call(ops.RESERVE, session_id, [branch])
        expiry = self._history(session_id, None).expires_at
        own = None if expires_at is None else list(expires_at)
        return import_chunks(self._file, session_id, batch, mode, expiry, progress, branch, own)

    @traced("import_usage")
    def import_usage(
        self,
        session_id: str,
        usage: Iterable[tuple[str, int, dict[str, Any]]],
        *,
        branch_names: Iterable[str] = (),
    ) -> int:
        """Store each (branch, user turn, usage) as `store_run_usage` would have stored it then, and
        record `branch_names` as used; returns the turns whose usage was stored (a turn the
        branch does not hold is skipped). Running it again stores the same."""
        self._check_open()
        names = list(branch_names)
        if names:
            self._file.call(ops.RESERVE, session_id, names)
        return sum(
            self._file.call(ops.STORE_USAGE, key_of(session_id, branch), used, turn)
            for branch, turn, used in usage
        )

    @traced("export_session")
    def export_session(self, session_id: str) -> SessionExport:
        """A session whole (a data-access request): every branch's items with when each was written,
        every turn's usage stored, and every branch name the session used.

        Raises:
            SessionNotFoundError: no branch of the session holds a live item.
        """
        self._check_open()
        names = [name for name, *_ in self._file.call(ops.BRANCHES, session_id)]
        if not names:
            raise self._not_found(session_id)
        branches = {}
        for name in sorted(names, key=lambda branch: branch != MAIN):
            rows = self._file.call(ops.ITEM_ROWS, key_of(session_id, name))
            branches[name] = [(decode_item(payload), created) for _, created, payload in rows]
        usage = self._file.call(ops.USAGE, session_id, None)
        return SessionExport(session_id, branches, usage, self._file.call(ops.RESERVED, session_id))

    @traced("move_session")
    def move_session(
        self, session_id: str, other: FileStore, *, progress: Progress | None = None
    ) -> MoveSummary:
        """Move a session to `other` (another file): copy, compare item by item, then erase it here;
        safe to interrupt and run again (transfer/moves.py): the session stays whole here, or in
        both files with the erase still to do, never in neither; the copy resumes, and the erase
        (with its receipt) happens only if this file still holds exactly the items compared. One
        found only in `other` was moved earlier (`erasure` None). `progress(copied, items)`.

        Raises:
            SessionNotFoundError: neither file holds the session.
            MoveConflictError: `other` holds other items under this id, or the session changed; nothing erased.
            ValueError: `other` is a store on this very file.
        """
        return self.move_sessions([session_id], other, progress=progress)[0]

    @traced("move_sessions")
    def move_sessions(
        self, session_ids: list[str], other: FileStore, *, progress: Progress | None = None
    ) -> list[MoveSummary]:
        """`move_session` for each id in turn, once every one is found and free of conflict."""
        self._check_open()
        other._check_open()
        ids = list(dict.fromkeys(session_ids))
        return move_sessions(self._file, other._file, ids, other._history("", None).expires_at, progress)

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

    def __enter__(self) -> FileStore:
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

    def _history(
        self,
        session_id: str,
        retention: SessionOptions | None,
        owner: str | None = None,
        labels: dict[str, Any] | None = None,
    ) -> History:
        """What a `CitadelSession` of `session_id` runs its methods on (history.py)."""
        return History(self._file, session_id, retention, owner, labels)
