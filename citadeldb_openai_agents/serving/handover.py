"""Who runs a store's operations: this process, if it can take the file, else the process that holds it.

`attach` opens the file (and serves it, or marks it kept to itself: modes.py) or,
finding it held, connects to its owner. It waits for an owner that is starting (it
holds the lock before it serves), for one still opening a big file, or for the next
owner after the last one died; past those waits it raises an error that names the
holder and the fix (refusals.py).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ..embedders.protocol import Embedder, EmbedderIdentity
from ..errors import DatabaseLockedError, ForkedStoreError
from ..options import StoreOptions
from ..storage.local_file import LocalFile
from ..storage.lockholder import shorten_command
from ..storage.process_state import current_pid, gone
from . import refusals, served_files
from .address import Secret, socket_path
from .client import RemoteOwner
from .modes import Mode, ServeToOthers
from .protocol import ClientHello, OwnerHello, disagreements, wire_identity
from .transport import LocalTransport, OwnerBusy, OwnerGone, Transport

# How long a client waits for an owner: one starting up (it holds the lock before it
# serves), or a new one after the old one died. Past it, the file is held by a process
# that does not serve it.
HANDOVER_SECONDS = 10.0
# How long a client waits for a holder still opening the file (1.6-1.8 s at 70,000 items).
OPENING_SECONDS = 300.0


@dataclass
class Opening:
    """What a store opens, and with what: everything a takeover needs to open the file again."""

    # Opened by the name given the first time (its errors say what that was), by the
    # resolved path for a takeover later (the working directory may have changed).
    path: str | os.PathLike[str]
    resolved: str
    passphrase: Secret
    embedder: Embedder
    options: StoreOptions  # the store's, with what it adopted from an owner
    create: bool
    # The settings fixed per file (options.FIXED_PER_FILE) this store takes from the owner
    # it is a client of, with the values taken.
    adopt: frozenset[str] = frozenset()
    adopted: dict[str, Any] = field(default_factory=dict)

    @property
    def identity(self) -> EmbedderIdentity:
        adopted: EmbedderIdentity | None = self.adopted.get("embedder")
        return EmbedderIdentity.of(self.embedder) if adopted is None else adopted

    def hello(self) -> ClientHello:
        program = shorten_command(list(getattr(sys, "orig_argv", sys.argv)) or ["python"])
        return ClientHello(current_pid(), program, self.options, wire_identity(self.identity))

    def adopt_from(self, owner: OwnerHello) -> None:
        """Take the owner's value of each setting this store adopts.

        Kept after the owner goes: a takeover serves the file as it was served (its TTL and
        retention, its sync mode), not with values this process was never given.
        """
        taken = self.adopt - {"embedder"}
        for name in taken:
            value = getattr(owner.terms, name)
            # Listed when the owner sets it (as the ledger); its TTL and sync mode always.
            if name in ("ttl", "sync_mode") or value != getattr(StoreOptions(), name):
                self.adopted[name] = value
        if "embedder" in self.adopt:
            self.adopted["embedder"] = EmbedderIdentity(*owner.identity)
        self.options = self.options.taking(owner.terms, taken)


def attach(opening: Opening, mode: Mode, deadline: float) -> Transport:
    """Own the file (and serve it, or keep it), or become a client of the process that does."""
    parent: int | None = None  # the process this one was forked from, when it held the file
    patience = time.monotonic() + OPENING_SECONDS
    # Marked opening once, not on each 20 ms retry: only the lock holder's mark is looked at.
    with mode.opening(opening.resolved, opening.options.socket_dir):
        while True:
            try:
                local = LocalFile(
                    opening.path,
                    opening.passphrase.value.decode("utf-8", "surrogatepass"),
                    embedder=opening.embedder,
                    options=opening.options,
                    create=opening.create,
                )
            except DatabaseLockedError as exc:
                locked = exc
                mode.locked(opening.resolved, locked)
            except ForkedStoreError as exc:
                # A child forked while its parent held the file: the parent serves it, or nobody.
                if not mode.serves or not served_files.serves(opening.resolved):
                    raise
                parent = exc.owner_pid
                locked = DatabaseLockedError(f"{opening.resolved} is held by the parent of this process.")
            else:
                try:
                    local.check_erasures_current()  # before anything is read or served (issue 59)
                except BaseException:
                    local.release()
                    raise
                return _owned(opening, mode, local)
            assert isinstance(mode, ServeToOthers)  # `KeepToSelf.locked` raised
            try:
                address = socket_path(opening.resolved, opening.options.socket_dir)
                remote = RemoteOwner(address, mode.key, opening.hello(), opening.resolved)
            except OwnerGone as gone_now:
                busy = isinstance(gone_now, OwnerBusy)  # it answered: alive, never to be called stuck
                deadline = _still_waiting(opening, locked, parent, deadline, patience, busy)
                time.sleep(0.02)
                continue
            _agree(opening, remote)
            opening.path = opening.resolved
            return remote


def _still_waiting(
    opening: Opening,
    locked: DatabaseLockedError,
    parent: int | None,
    deadline: float,
    patience: float,
    busy: bool,
) -> float:
    """The deadline to keep waiting for an owner to serve the file by, or the error for waiting no more
    (`busy`: the last try reached the owner, which turned this process away)."""
    resolved = opening.resolved
    if parent is not None and (gone(parent) or time.monotonic() > deadline):
        # Its children keep the lock it held through their inherited copies: no one can
        # take the file over, so there is no handover to wait for once it is gone.
        raise refusals.parent_gone(resolved, parent, gone(parent), HANDOVER_SECONDS) from None
    holder = locked.holder
    opener = holder is not None and served_files.is_opening(resolved, holder.pid, opening.options.socket_dir)
    if opener:
        # A big file takes seconds to open (its audit reads every row): the holder is on
        # its way to serving it, so wait for it rather than a fixed time.
        deadline = max(deadline, min(time.monotonic() + HANDOVER_SECONDS, patience))
    if time.monotonic() > deadline:
        waited = OPENING_SECONDS if opener else HANDOVER_SECONDS
        raise refusals.never_served(locked, waited, opening=opener, busy=busy) from None
    return deadline


def _owned(opening: Opening, mode: Mode, local: LocalFile) -> LocalTransport:
    try:
        mode.owned(opening.resolved, local, opening.options)
    except BaseException:
        local.release()  # else this process would hold the file and serve no one
        raise
    opening.path = opening.resolved
    return LocalTransport(local, lambda: mode.released(opening.resolved))


def _agree(opening: Opening, remote: RemoteOwner) -> None:
    """Refuse an owner whose settings fixed per file differ from this process's; adopt the rest."""
    problems = disagreements(remote.owner, opening.hello(), opening.adopt)
    if problems:
        remote.close()
        raise refusals.settings_differ(problems, remote.owner.pid, opening.resolved)
    opening.adopt_from(remote.owner)
