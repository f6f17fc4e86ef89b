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
zeroed on close: taking the file over means opening it. Where the operations run is a
transport (transport.py); who holds the file is decided by handover.py, and what the
owner does for others by its mode (modes.py).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .. import telemetry
from ..embedders.protocol import Embedder, EmbedderIdentity
from ..errors import SessionClosedError, StorageError, WrongPassphraseError
from ..options import StoreOptions
from ..results import Progress
from ..shards import Ring, RingFile
from ..storage.codec import Batch
from ..storage.files import resolve_path
from ..storage.local_file import LocalFile
from ..storage.process_state import gone
from ..storage.segments import SessionKey
from . import operations as ops
from . import served_files
from .address import Secret, SocketKey
from .handover import HANDOVER_SECONDS, Opening, attach
from .modes import KeepToSelf, Mode, ServeToOthers
from .operations import Operation
from .refusals import ROTATION_SECONDS, in_flight_unknown, rotated_elsewhere
from .transport import LocalTransport, OwnerGone, Transport

if TYPE_CHECKING:
    pass

T = TypeVar("T")


class SharedFile:
    """Every operation the store offers (`call`), on a file this process owns or reaches through its owner."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        embedder: Embedder,
        options: StoreOptions,
        create: bool,
        serve: bool,
        adopt: frozenset[str] = frozenset(),
        ring: Ring | RingFile | None = None,
    ) -> None:
        passphrase = Secret(key.encode("utf-8", "surrogatepass"))
        del key  # error trackers record a failed frame's locals
        resolved = resolve_path(path)
        self._opening = Opening(path, resolved, passphrase, embedder, options, create, adopt)
        self._socket_key = SocketKey(passphrase, resolved, options.socket_dir)
        self._mode: Mode = ServeToOthers(self._socket_key) if serve else KeepToSelf()
        self._lock = threading.Lock()
        self._ring = ring
        self._released = False
        self._rotation = threading.Lock()
        self._generation = 0  # passphrases this store has taken since it opened
        self._reread: Callable[[], str | None] | None = None
        self._key_source = "the key= argument"
        self._transport: Transport | None = None
        try:
            self._transport = attach(self._opening, self._mode, time.monotonic() + HANDOVER_SECONDS)
        except BaseException:
            self._forget_secrets()
            raise

    # -- who holds the file ---------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._opening.resolved

    @property
    def identity(self) -> EmbedderIdentity:
        local = self._local
        return self._opening.identity if local is None else local.identity

    @property
    def options(self) -> StoreOptions:
        """The options this store writes with: its own, with those it adopted from the owner."""
        return self._opening.options

    @property
    def adopted(self) -> dict[str, Any]:
        """The settings fixed per file this store took from an owner, with their values."""
        return dict(self._opening.adopted)

    @property
    def served_by(self) -> int | None:
        """The process that owns the file when this one is its client; None when this one owns it."""
        transport = self._transport
        return None if transport is None else transport.owner_pid

    @property
    def shard(self) -> str | None:
        """This process's shard of the fleet's ring, if it has one."""
        return None if self._ring is None else self._ring.shard

    @property
    def forked(self) -> bool:
        local = self._local
        return local is not None and local.forked

    def check_shard(self, session_id: str) -> None:
        """Raise `WrongShardError` if the fleet's ring places the session on another shard."""
        if self._ring is not None:
            self._ring.check(session_id)

    def check_process(self) -> None:
        """In a forked child, become a client of the parent that serves the file (or raise)."""
        transport = self._transport
        if not isinstance(transport, LocalTransport) or not transport.local.forked:
            return
        if not self._mode.serves or not served_files.serves(self.path):
            transport.local.check_process()  # ForkedStoreError: the parent does not serve the file
        with self._lock:
            if self._transport is transport:  # the inherited file is left as it is (registry.py)
                self._transport = None
                self._transport = self._attach(time.monotonic() + HANDOVER_SECONDS)

    def release(self) -> None:
        """This store's share of the file is given back (the last one closes it, or stops serving)."""
        with self._lock:
            transport, self._transport = self._transport, None
            self._released = True  # a call racing this one must not take the file over again
        if transport is not None:
            transport.close()
        self._forget_secrets()

    # -- the operations ------------------------------------------------------------------

    def call(self, operation: Operation[T], *args: Any, progress: Progress | None = None) -> T:
        """`operation(*args)` where the file is, here or in its owner: every operation declared in
        operations.py, its result typed by its row (``call(ops.NEWEST, key, 20) -> list[str]``).

        A batched operation's batch gets a new id here (`append_batch` sends the caller's); the
        methods below are the operations with a policy of their own.
        """
        if operation.batched:
            args = (*args, uuid.uuid4().hex)
        return self._call(operation, *args, progress=progress)

    def append_batch(self, key: SessionKey, batch: Batch, batch_id: str) -> None:
        """`ops.APPEND` under the caller's batch id, skipped if a batch with that id is already stored.

        For a batch the caller may have sent before (an import's chunk, rerun): the id is
        looked for where a batch just written is, the session's last two segments.
        """
        self._call(ops.APPEND, key, batch, batch_id, resent=True)

    def pop(self, key: SessionKey) -> str | None:
        """Pop the newest item, in one call to the owner.

        The owner notes the item (its atom and payload) before it erases anything. If
        it dies after that, this process pops that atom only if it is still the newest,
        and returns the payload noted: the item is popped once, whoever finished it.
        """
        while True:
            noted: list[tuple[int, str]] = []
            try:
                return self._call(ops.POP, key, noted=noted)
            except _GoneAfterNote:
                atom, payload = noted[-1]
            if self._call(ops.POP_IF_NEWEST, key, atom) != "moved":
                return payload  # popped now, or by the owner before it died
            # Still stored, no longer the newest: the owner died before popping it; pop again.

    def clear(self, session_id: str) -> None:
        """Clear the session, in one call; finished up to the atom the owner noted if it died mid-call."""
        noted: list[int] = []
        try:
            self._call(ops.CLEAR, session_id, noted=noted)
        except _GoneAfterNote:
            self._call(ops.CLEAR_THROUGH, session_id, noted[-1])

    def backup(self, destination: str | os.PathLike[str], progress: Progress | None = None) -> list[str]:
        # The owner writes it: a path that means the same in every process.
        return self._call(ops.BACKUP, os.path.abspath(os.fspath(destination)), progress=progress)

    def rotate_key(self, current_key: str, new_key: str) -> None:
        """Change the passphrase where the file is, served or not (see `follow_rotation`).

        The owner rotates the file between two writes (`engine.alone`), then proves the new
        passphrase at every new handshake; connections already made keep working. Its clients
        learn it when the owner refuses their old one, and read their source again.
        """
        keys = [current_key, new_key]
        del current_key, new_key
        try:
            self.check_process()
            failed = _without_frames(lambda: self._call(ops.ROTATE_KEY, *keys))
            if failed is not None:
                raise failed from None
            with self._rotation:
                if isinstance(self._transport, LocalTransport):  # its server: new handshakes, new key
                    served_files.rotated(self.path, keys[1].encode("utf-8", "surrogatepass"))
                self._socket_key.rotated(keys[1].encode("utf-8", "surrogatepass"))  # for a takeover
                self._generation += 1
        finally:
            keys.clear()

    def follow_rotation(self, reread: Callable[[], str | None] | None, source: str) -> None:
        """How this store follows a rotation made by another process: `reread` reads its passphrase
        again from where it came from (a key file, a key command), or None where it cannot be
        (the environment, an argument); `source` names it in the errors."""
        self._reread, self._key_source = reread, source

    # -- plumbing -------------------------------------------------------------------------

    @property
    def _local(self) -> LocalFile | None:
        """The file, when this process holds it (tests look inside it)."""
        transport = self._transport
        return transport.local if isinstance(transport, LocalTransport) else None

    def _call(
        self,
        operation: Operation[T],
        *args: Any,
        progress: Progress | None = None,
        resent: bool = False,
        noted: list[Any] | None = None,
    ) -> T:
        """`call`, told `resent` (`append_batch`) and given `noted` for what a pop or clear will erase.

        When the owner goes mid-call, the call is sent again to the next owner where its
        declaration allows (`Operation.resend`), and raises `_GoneAfterNote` (once attached
        to the next owner) if the owner had noted what it was about to erase.
        """
        if operation.session:
            self.check_shard(args[0] if isinstance(args[0], str) else args[0][0])  # before anything is done
        deadline: float | None = None
        dropped_by: int | None = None
        note = None if noted is None else noted.append
        while True:
            # A write names its batch: `resent` when an owner that died may have stored it.
            call_args = (*args, resent) if operation.batched else args
            if deadline is not None:  # a retry; the public call checked for a fork before the first
                self.check_process()
            transport = self._transport
            generation = self._generation
            try:
                if transport is None:
                    raise OwnerGone("not connected")
                return transport.call(operation, call_args, progress, note)
            except WrongPassphraseError as refused:
                self._after_refusal(refused, generation)  # at a new connection: nothing was sent
                deadline = deadline or time.monotonic() + HANDOVER_SECONDS
            except OwnerGone:
                if not operation.resend:
                    raise StorageError(
                        f"the process that held {self.path} (PID {self.served_by}) stopped during "
                        f"{operation.name}, so whether it was done is unknown. `python -m citadeldb_openai_agents "
                        "sessions` (or verify) shows what the file holds; run it again if it was not done."
                    ) from None
                dropped_by = self._dropped_again(operation, transport, dropped_by)
                resent = True
                if deadline is None:
                    # Counted from this call's first failure, not once it gets the lock: calls queued
                    # behind another's handover that found no owner must not each wait anew.
                    deadline = time.monotonic() + HANDOVER_SECONDS
                self._take_over(operation, transport, deadline, dropped_by, writes=noted is not None)
                if noted:
                    raise _GoneAfterNote() from None

    def _take_over(
        self,
        operation: Operation[Any],
        transport: Transport | None,
        deadline: float,
        dropped_by: int | None,
        *,
        writes: bool,
    ) -> None:
        """`_replace` after the owner died during `operation`: a takeover refused for a rotated
        passphrase, with a write in flight (`operation.batched`, or `writes`), says that write may
        be stored, for it is never sent again now and the caller must not take it for lost."""
        try:
            self._replace(transport, deadline)
        except WrongPassphraseError as refused:
            if not (operation.batched or writes):
                raise
            raise in_flight_unknown(refused, operation.name, dropped_by) from None

    def _replace(self, transport: Transport | None, deadline: float) -> None:
        """Attach again in place of `transport`, unless another call of this store did already.
        Taking the file over from an owner that stopped is logged and counted (telemetry/)."""
        with self._lock:
            if self._transport is transport:
                self._transport = None
                previous = None if transport is None else transport.owner_pid
                if transport is not None:
                    transport.close()
                self._transport = self._attach(deadline)
                if previous is not None and isinstance(self._transport, LocalTransport):
                    telemetry.events.handover(self.path, previous)
                    telemetry.metrics.handover(self.path)

    def _dropped_again(
        self, operation: Operation[Any], transport: Transport | None, before: int | None
    ) -> int | None:
        """The owner that dropped the call; raises when the same owner, still running, drops it again.

        An owner that stops hands over, and a new connection finds the next one; one that lets
        this process connect again and drops the same call refuses it (a version it does not
        speak, a bug): sent again, the call would loop for ever.
        """
        pid = None if transport is None else transport.owner_pid
        if pid and pid == before and not gone(pid):
            raise StorageError(
                f"process {pid}, which serves {self.path}, closed the connection during "
                f"{operation.name} twice and still runs: it refuses the call (its log says why: an "
                "operation it does not know, or a message over its limits). Every process that opens "
                "the file must run the same version of citadeldb-openai-agents: restart those that do not."
            )
        return pid

    def _attach(self, deadline: float) -> Transport:
        """Attach again (this store was attached before): a passphrase refused now was rotated."""
        while True:
            if self._released:
                raise SessionClosedError(f"the store for {self.path} is closed")
            generation = self._generation
            try:
                return attach(self._opening, self._mode, deadline)
            except WrongPassphraseError:
                self._take_rotated(generation)

    def _after_refusal(self, refused: WrongPassphraseError, generation: int) -> None:
        """The owner refused this store's passphrase at a handshake: follow the rotation. Any other
        refusal is the operation's own (a backup's passphrase), raised as it is."""
        if not getattr(refused, "at_handshake", False):
            raise refused
        self._take_rotated(generation)

    def _take_rotated(self, generation: int) -> None:
        """The owner, or the file, refuses the passphrase that opened it: it was rotated. Read it
        again from its source until that gives another one (ROTATION_SECONDS), or raise saying so."""
        with self._rotation:
            if self._generation != generation:
                return  # another thread of this process took the new one meanwhile
            if self._reread is None:
                raise rotated_elsewhere(self.path, self._key_source) from None
            waited_until = time.monotonic() + ROTATION_SECONDS
            pause = 0.05
            while time.monotonic() < waited_until:
                found = self._read_again()
                if found is not None:
                    self._socket_key.rotated(found)
                    self._generation += 1
                    return
                time.sleep(pause)
                pause = min(1.0, pause * 2)
            raise rotated_elsewhere(self.path, self._key_source, ROTATION_SECONDS) from None

    def _read_again(self) -> bytes | None:
        """The passphrase its source gives now, if it is not the one that was refused."""
        assert self._reread is not None
        try:
            given = self._reread()
        except ValueError:  # the source cannot be read right now (a command failing): try again
            return None
        found = None if given is None else given.encode("utf-8", "surrogatepass")
        del given
        return None if found is None or found == self._opening.passphrase.value else found

    def _forget_secrets(self) -> None:
        self._opening.passphrase.wipe()
        self._socket_key.forget()


def _without_frames(run: Callable[[], object]) -> BaseException | None:
    """What `run` raised, stripped of its frames, which hold the passphrases it was given (error
    trackers record every frame's locals); None when it returned."""
    try:
        run()
    except Exception as exc:
        exc.__traceback__, exc.__context__ = None, None
        return exc
    return None


class _GoneAfterNote(Exception):
    """The owner died after noting what it was about to erase: the caller finishes the call."""
