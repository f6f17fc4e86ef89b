"""A file shared by every process that opens it: this one owns it and serves it, or is a client.

The first process to open a file holds Citadel's lock and owns it; with ``serve`` on
(the default) it serves the file on a Unix socket (server.py). A process that finds
the file held becomes a client of that owner (client.py), with no change to its code.
When the owner goes, whether it exits, is stopped or is killed, a client's next call
takes the file over (and serves it) or connects to whichever process did. A call in
flight then is sent again only when that is safe: a batch carries an id the owner
stores with it, a pop or a clear names the atom it stops at; an erasure or a backup,
whose outcome is unknown, raises instead.

A store inherited by a forked child (gunicorn ``--preload``) becomes a client of the
parent that serves it; with serving off, it raises `ForkedStoreError`.

The passphrase is kept here for the life of the store, in a private buffer that is
zeroed on close: taking the file over means opening it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..embedders.protocol import Embedder, EmbedderIdentity
from ..errors import (
    DatabaseLockedError,
    ForkedStoreError,
    SessionClosedError,
    StorageError,
)
from ..results import Erasure, IntegrityReport, Progress
from ..storage.files import resolve_path
from ..storage.local import LocalFile
from ..storage.lockholder import shorten_command
from ..storage.process import current_pid, gone
from . import refusals
from .address import Secret, derive_authkey, socket_path
from .client import OwnerGone, RemoteOwner
from .hosting import (
    clients_of,
    is_exclusive,
    is_opening,
    mark_exclusive,
    opening,
    restart_serving,
    serves,
    start_serving,
    stop_serving,
)
from .protocol import OPERATIONS, ClientHello, Terms, disagreements, wire_identity

if TYPE_CHECKING:
    import citadeldb

# How long a client waits for an owner: one starting up (it holds the lock before it
# serves), or a new one after the old one died. Past it, the file is held by a process
# that does not serve it.
HANDOVER_SECONDS = 10.0
# How long a client waits for a holder still opening the file (1.6-1.8 s at 70,000 items).
OPENING_SECONDS = 300.0


class SharedFile:
    """Every operation the store offers, on a file this process owns or reaches through its owner."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        embedder: Embedder,
        options: citadeldb.DatabaseOptions,
        create: bool,
        terms: Terms,
        serve: bool,
    ) -> None:
        self._secret = Secret(key.encode("utf-8", "surrogatepass"))
        try:
            self._resolved = resolve_path(path)
            # Opened by the name given the first time (its errors say what that was), by the
            # resolved path for a takeover later (the working directory may have changed).
            self._opening: str | os.PathLike[str] = path
            self._authkey = Secret(derive_authkey(key, self._resolved) if serve else b"")
        finally:
            del key  # error trackers record a failed frame's locals
        self._embedder = embedder
        self._options = options
        self._create = create
        self._terms = terms
        self._serve = serve
        self._lock = threading.Lock()
        self._released = False
        self._local: LocalFile | None = None
        self._remote: RemoteOwner | None = None
        self._owner_pid: int | None = None
        self._attach(time.monotonic() + HANDOVER_SECONDS)

    # -- who holds the file ---------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._resolved

    @property
    def identity(self) -> EmbedderIdentity:
        return EmbedderIdentity.of(self._embedder) if self._local is None else self._local.identity

    @property
    def served_by(self) -> int | None:
        """The process that owns the file when this one is its client; None when this one owns it."""
        return None if self._local is not None else self._owner_pid

    @property
    def forked(self) -> bool:
        return self._local is not None and self._local.forked

    def check_process(self) -> None:
        """In a forked child, become a client of the parent that serves the file (or raise)."""
        local = self._local
        if local is None or not local.forked:
            return
        if not serves(self._resolved) or not self._serve:
            local.check_process()  # ForkedStoreError: the parent does not serve the file
        with self._lock:
            if self._local is local:  # the inherited file is left as it is (registry.py)
                self._local = None
                self._attach(time.monotonic() + HANDOVER_SECONDS)

    def release(self) -> None:
        """This store's share of the file is given back (the last one closes it, or stops serving)."""
        with self._lock:
            local, remote = self._local, self._remote
            self._local = self._remote = None
            self._released = True  # a call racing this one must not take the file over again
        if remote is not None:
            remote.close()
        if local is not None and not local.forked:
            if self._serve:
                stop_serving(self._resolved)
            else:
                mark_exclusive(self._resolved, False)
            local.release()
        self._secret.wipe()
        self._authkey.wipe()

    # -- one session ----------------------------------------------------------------------

    def append(
        self,
        session_id: str,
        payloads: list[str],
        texts: list[str],
        from_user: list[bool],
        expires_at: int | None,
    ) -> None:
        batch = uuid.uuid4().hex
        self._call("append", session_id, payloads, texts, from_user, expires_at, batch)

    def append_batch(
        self,
        session_id: str,
        payloads: list[str],
        texts: list[str],
        from_user: list[bool],
        expires_at: int | None,
        batch: str,
    ) -> None:
        """`append` under the caller's batch id, skipped if a batch with that id is already stored.

        For a batch the caller may have sent before (an import's chunk, rerun): the id is
        looked for where a batch just written is, the session's last two segments.
        """
        self._call("append", session_id, payloads, texts, from_user, expires_at, batch, resent=True)

    def newest_rows(self, session_id: str, limit: int) -> tuple[list[tuple[int, str]], bool]:
        return self._call("newest_rows", session_id, limit)  # type: ignore[no-any-return]

    def oldest_rows(self, session_id: str, after: int, before: int, limit: int) -> list[tuple[int, str]]:
        return self._call("oldest_rows", session_id, after, before, limit)  # type: ignore[no-any-return]

    def replace_suffix(self, session_id: str, *args: Any) -> bool:
        """`storage.compaction.replace_suffix` under a new batch id: safe to send again."""
        return self._call("replace_suffix", session_id, *args, uuid.uuid4().hex)  # type: ignore[no-any-return]

    def newest(self, session_id: str, limit: int) -> list[str]:
        return self._call("newest", session_id, limit)  # type: ignore[no-any-return]

    def all_items(self, session_id: str, progress: Progress | None = None) -> list[str]:
        return self._call("all_items", session_id, progress=progress)  # type: ignore[no-any-return]

    def search_placed(self, session_id: str, query: str, limit: int) -> tuple[list[tuple[str, int]], int]:
        return self._call("search_placed", session_id, query, limit)  # type: ignore[no-any-return]

    def summary(self, session_id: str) -> tuple[int, int, int] | None:
        return self._call("summary", session_id)  # type: ignore[no-any-return]

    def pop(self, session_id: str) -> str | None:
        """Pop the newest item, in one call to the owner.

        The owner notes the item (its atom and payload) before it erases anything. If
        it dies after that, this process pops that atom only if it is still the newest,
        and returns the payload noted: the item is popped once, whoever finished it.
        """
        while True:
            noted: list[tuple[int, str]] = []
            try:
                return self._call("pop", session_id, noted=noted)  # type: ignore[no-any-return]
            except _GoneAfterNote:
                atom, payload = noted[-1]
            if self._call("pop_if_newest", session_id, atom) != "moved":
                return payload  # popped now, or by the owner before it died
            # Still stored, no longer the newest: the owner died before popping it; pop again.

    def clear(self, session_id: str) -> None:
        """Clear the session, in one call; finished up to the atom the owner noted if it died mid-call."""
        noted: list[int] = []
        try:
            self._call("clear", session_id, noted=noted)
        except _GoneAfterNote:
            self._call("clear_through", session_id, noted[-1])

    def erase(self, session_id: str, expected: str | None = None) -> Erasure | None:
        """Erase with a receipt; with `expected`, only if the session holds the items it digests (writes.py)."""
        args = (session_id,) if expected is None else (session_id, expected)
        return self._call("erase", *args)  # type: ignore[no-any-return]

    # -- every session --------------------------------------------------------------------

    def session_ids(self) -> list[str]:
        return self._call("session_ids")  # type: ignore[no-any-return]

    def summaries(self, progress: Progress | None = None) -> list[tuple[str, int, int, int]]:
        return self._call("summaries", progress=progress)  # type: ignore[no-any-return]

    def purge_expired(self, progress: Progress | None = None) -> int:
        return self._call("purge_expired", progress=progress)  # type: ignore[no-any-return]

    def verify(self, progress: Progress | None = None) -> IntegrityReport:
        return self._call("verify", progress=progress)  # type: ignore[no-any-return]

    def backup(self, destination: str | os.PathLike[str], progress: Progress | None = None) -> list[str]:
        # The owner writes it: a path that means the same in every process.
        return self._call("backup", os.path.abspath(os.fspath(destination)), progress=progress)  # type: ignore[no-any-return]

    def rotate_key(self, current_key: str, new_key: str) -> None:
        keys = [current_key, new_key]
        del current_key, new_key
        try:
            local = self._owned()
            if local is None:
                raise StorageError(
                    f"cannot change the passphrase of {self._resolved} while process {self._owner_pid} holds "
                    "it and serves it to this one: every process on the file would be left with the old one. "
                    "Stop the service first, then run rotate-key."
                )
            clients = clients_of(self._resolved)
            if clients:
                raise StorageError(
                    f"cannot change the passphrase of {self._resolved} while {clients} other process"
                    f"{'es use' if clients > 1 else ' uses'} it through this one: they would be left with the "
                    "old one. Stop them first, then run rotate-key."
                )
            local.rotate_key(*keys)
            self._secret.replace(keys[1].encode("utf-8", "surrogatepass"))
            self._authkey.replace(derive_authkey(keys[1], self._resolved) if self._serve else b"")
            restart_serving(self._resolved, local, bytes(self._authkey.value), self._terms)
        finally:
            keys.clear()

    # -- plumbing -------------------------------------------------------------------------

    def _owned(self) -> LocalFile | None:
        self.check_process()
        return self._local

    def _call(
        self,
        operation: str,
        *args: Any,
        progress: Progress | None = None,
        resent: bool = False,
        noted: list[Any] | None = None,
    ) -> Any:
        """`operation(*args)`, here if this process owns the file, else through its owner.

        When the owner goes mid-call, the call is sent again to the next owner where that
        is safe (see protocol.OPERATIONS), and raises `_GoneAfterNote` (once attached to
        the next owner) if the owner had noted what it was about to erase.
        """
        deadline: float | None = None
        while True:
            # A write names its batch: `resent` when an owner that died may have stored it.
            call_args = (*args, resent) if operation in ("append", "replace_suffix") else args
            local = self._owned()
            if local is not None:
                if operation == "append" and not resent:
                    return local.append(*args[:-1])  # this process's own write needs no marker
                options: dict[str, Any] = {}
                if progress is not None:
                    options["progress"] = progress
                if noted is not None:
                    options["note"] = noted.append
                return getattr(local, operation)(*call_args, **options)
            remote = self._remote
            try:
                if remote is None:
                    raise OwnerGone("not connected")
                return remote.call(operation, call_args, progress, noted)
            except OwnerGone:
                if not OPERATIONS[operation]:
                    raise StorageError(
                        f"the process that held {self._resolved} (PID {self._owner_pid}) stopped during "
                        f"{operation}, so whether it was done is unknown. `python -m citadeldb_openai_agents "
                        "sessions` (or verify) shows what the file holds; run it again if it was not done."
                    ) from None
                resent = True
                if deadline is None:
                    # Counted from this call's first failure, not once it gets the lock: calls queued
                    # behind another's handover that found no owner must not each wait anew.
                    deadline = time.monotonic() + HANDOVER_SECONDS
                with self._lock:
                    if self._remote is remote:
                        self._remote = None
                        if remote is not None:
                            remote.close()
                        self._attach(deadline)
                if noted:
                    raise _GoneAfterNote() from None

    def _attach(self, deadline: float) -> None:
        """Own the file (and serve it), or become a client of the process that does."""
        if self._released:
            raise SessionClosedError(f"the store for {self._resolved} is closed")
        locked: DatabaseLockedError | None = None
        parent: int | None = None  # the process this one was forked from, when it held the file
        patience = time.monotonic() + OPENING_SECONDS
        # Marked opening once, not on each 20 ms retry: only the lock holder's mark is looked at.
        with opening(self._resolved) if self._serve else contextlib.nullcontext():
            while True:
                try:
                    local = LocalFile(
                        self._opening,
                        self._secret.value.decode("utf-8", "surrogatepass"),
                        embedder=self._embedder,
                        options=self._options,
                        create=self._create,
                    )
                except DatabaseLockedError as exc:
                    if not self._serve:
                        raise refusals.not_serving_here(exc) from None
                    locked = exc
                except ForkedStoreError as exc:
                    # A child forked while its parent held the file: the parent serves it, or nobody.
                    if not self._serve or not serves(self._resolved):
                        raise
                    parent = exc.owner_pid
                    locked = DatabaseLockedError(f"{self._resolved} is held by the parent of this process.")
                else:
                    try:
                        if self._serve:
                            start_serving(self._resolved, local, bytes(self._authkey.value), self._terms)
                        else:
                            mark_exclusive(self._resolved, True)
                    except BaseException:
                        local.release()  # else this process would hold the file and serve no one
                        raise
                    self._local, self._owner_pid = local, None
                    self._opening = self._resolved
                    return
                if is_exclusive(self._resolved):
                    raise refusals.kept_to_itself(locked)
                try:
                    self._remote = RemoteOwner(
                        socket_path(self._resolved), bytes(self._authkey.value), self._hello(), self._resolved
                    )
                except OwnerGone:
                    if parent is not None and (gone(parent) or time.monotonic() > deadline):
                        # Its children keep the lock it held through their inherited copies: no one
                        # can take the file over, so there is no handover to wait for once it is gone.
                        raise refusals.parent_gone(
                            self._resolved, parent, gone(parent), HANDOVER_SECONDS
                        ) from None
                    holder = locked.holder if locked is not None else None
                    opener = holder is not None and is_opening(self._resolved, holder.pid)
                    if opener:
                        # A big file takes seconds to open (its audit reads every row): the holder
                        # is on its way to serving it, so wait for it rather than a fixed time.
                        deadline = max(deadline, min(time.monotonic() + HANDOVER_SECONDS, patience))
                    if time.monotonic() > deadline:
                        waited = OPENING_SECONDS if opener else HANDOVER_SECONDS
                        raise refusals.never_served(locked, waited, opening=opener) from None
                    time.sleep(0.02)
                    continue
                self._agree(self._remote)
                self._owner_pid = self._remote.owner.pid
                self._opening = self._resolved
                return

    def _hello(self) -> ClientHello:
        program = shorten_command(list(getattr(sys, "orig_argv", sys.argv)) or ["python"])
        return ClientHello(
            current_pid(), program, self._terms, wire_identity(EmbedderIdentity.of(self._embedder))
        )

    def _agree(self, remote: RemoteOwner) -> None:
        """Refuse an owner whose settings fixed per file differ from this process's."""
        problems = disagreements(remote.owner, self._hello())
        if problems:
            remote.close()
            self._remote = None
            raise refusals.settings_differ(problems, remote.owner.pid, self._resolved)


class _GoneAfterNote(Exception):
    """The owner died after noting what it was about to erase: the caller finishes the call."""
