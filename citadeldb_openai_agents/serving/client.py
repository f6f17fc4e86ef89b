"""A client's side: calls sent to the process that owns the file, over its Unix socket.

Connections are pooled: the store's sessions call from many worker threads at once,
and a connection carries one call at a time. Each new connection checks that the peer
is the process holding the file's lock, runs the mutual proof (handshake.py) and says
hello with the settings that must agree with the owner's, all within
`CONNECT_SECONDS`. A call whose owner sends nothing, not even its heartbeat, for
`SILENCE_SECONDS` raises instead of waiting for ever (a stopped or stuck owner).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any, TypeVar

from .. import telemetry
from ..errors import CitadelSessionError, StorageError, WrongPassphraseError
from ..results import Progress
from ..storage.lockholder import find_lock_holder
from ..storage.process_state import gone
from .address import SocketKey
from .channel import Channel
from .handshake import VERSION, ProofRefused, TurnedAway, VersionRefused, client_side, peer_process
from .operations import Operation, ProtocolError, wire_argument
from .protocol import OWNER_HELLO, ClientHello, OwnerHello, error_from_wire, hello_to_wire
from .refusals import owner_busy
from .transport import Note, OwnerBusy, OwnerGone

T = TypeVar("T")

POOL = 16  # idle connections kept per file; more calls at once open more, closed when done
CONNECT_SECONDS = 5.0  # to connect, prove both ways and exchange hellos
SILENCE_SECONDS = 10.0  # the owner's heartbeat comes every second while it works on a call
BUSY_SECONDS = 10.0  # how long a new connection keeps asking an owner that turns it away (busy)
# Handshakes one client runs at once: under the owner's cap per process (server.py), so a
# process whose threads all open connections at once is never turned away for its own sake.
HANDSHAKES_AT_ONCE = 2


class RemoteOwner:
    """The owner of a file, reached through its socket (the remote transport)."""

    def __init__(self, address: str, key: SocketKey, hello: ClientHello, path: str) -> None:
        self._address = address
        self._key = key
        self._hello = hello
        self._path = path
        self._idle: list[Channel] = []
        self._lock = threading.Lock()
        self._handshakes = threading.BoundedSemaphore(HANDSHAKES_AT_ONCE)
        self._closed = False
        channel, self.owner = self._connect()
        self._idle.append(channel)

    @property
    def owner_pid(self) -> int:
        return self.owner.pid

    def call(
        self, operation: Operation[T], args: tuple[Any, ...], progress: Progress | None, note: Note | None
    ) -> T:
        """Run `operation(*args)` in the owner; raise what it raised there, or `OwnerGone`.

        What the owner notes before it erases (a pop's item, a clear's newest atom) goes to `note`
        as it arrives. The call carries the trace context: the owner's span continues the caller's.
        """
        channel = self._take()
        try:
            channel.bound_silence(SILENCE_SECONDS)
            wired = [wire_argument(a) for a in args], progress is not None, telemetry.carrier()
            channel.send(["call", operation.name, *wired])
            while True:
                reply = channel.receive()
                if not isinstance(reply, list) or not reply:
                    raise ProtocolError("a reply that is not a message")
                if reply[0] == "progress" and len(reply) == 3:
                    if progress is not None:
                        progress(reply[1], reply[2])
                elif reply[0] == "noted" and len(reply) == 2:
                    if note is not None:
                        note(operation.noted(reply[1]))
                elif reply[0] != "alive":
                    break
        except TimeoutError:
            channel.close()
            raise StorageError(
                f"process {self.owner.pid}, which holds {self._path} and serves it to this one, has "
                f"not answered {operation.name} for {SILENCE_SECONDS:g} s: it is stopped (SIGSTOP), "
                "stuck or starved of CPU. Whether a write was done is unknown: resume or restart that "
                "process, then check with `python -m citadeldb_openai_agents sessions`."
            ) from None
        except (EOFError, OSError) as exc:
            channel.close()
            raise OwnerGone(str(exc)) from None
        except ProtocolError as exc:
            channel.close()
            raise StorageError(
                f"the owner of {self._path} sent what the protocol does not allow: {exc}"
            ) from None
        if reply[0] == "ok" and len(reply) == 2:
            value: T = operation.result(reply[1])
            self._give_back(channel)
            return value
        if reply[0] == "error" and len(reply) == 4:
            self._give_back(channel)
            raise error_from_wire(*reply[1:])
        channel.close()
        raise StorageError(f"the owner of {self._path} sent an answer the protocol does not allow")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for channel in idle:
            with contextlib.suppress(OSError):
                channel.close()

    def _take(self) -> Channel:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        patience = time.monotonic() + BUSY_SECONDS
        while True:  # nothing was sent to an owner that turned this process away: asked again
            try:
                return self._connect()[0]
            except OwnerBusy:
                if time.monotonic() > patience:
                    raise StorageError(
                        f"process {self.owner.pid}, which holds {self._path}, could not take another "
                        f"connection from this one. {owner_busy(BUSY_SECONDS)}"
                    ) from None
                time.sleep(0.05)

    def _give_back(self, channel: Channel) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < POOL:
                self._idle.append(channel)
                return
        channel.close()

    def _connect(self) -> tuple[Channel, OwnerHello]:
        with self._handshakes:
            return self._handshake()

    def _handshake(self) -> tuple[Channel, OwnerHello]:
        # Once per process and file (~0.65 s), under the salt beside the socket: not counted
        # against the owner's answer (again in it only if the owner's salt differs).
        self._key.derive()
        deadline = time.monotonic() + CONNECT_SECONDS
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_SECONDS)
        try:
            sock.connect(self._address)
        except OSError as exc:
            sock.close()
            raise OwnerGone(str(exc)) from None
        channel = Channel(sock)
        try:
            pid = self._check_peer(sock)
            client_side(channel, self._key, pid, deadline)
            channel.send(["hello", hello_to_wire(self._hello)])
            reply = channel.receive(deadline)
        except TurnedAway:
            channel.close()
            raise OwnerBusy("the owner turned this process away: busy") from None
        except ProofRefused:
            channel.close()
            refused = self._proof_refused(pid)
            refused.at_handshake = True  # type: ignore[attr-defined]  # the owner's key, not an operation's
            raise refused from None
        except BaseException as exc:
            channel.close()
            raise self._refusal(exc) from None
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == "refused":
            channel.close()
            raise CitadelSessionError(
                f"the process that holds {self._path} refused this one: {reply[1]}. Run the same "
                "version of citadeldb-openai-agents in every process on one file."
            )
        try:
            if not (isinstance(reply, list) and len(reply) == 2 and reply[0] == "welcome"):
                raise ProtocolError("no welcome")
            owner: OwnerHello = OWNER_HELLO(reply[1])
        except ProtocolError as exc:
            channel.close()
            raise self._refusal(exc) from None
        return channel, owner

    def _check_peer(self, sock: socket.socket) -> int:
        """The peer's pid, once the kernel says it is this user's process holding the file's lock."""
        peer = peer_process(sock)
        if peer is None:
            return 0  # no SO_PEERCRED here: the proofs alone stand (they bind no pid)
        pid, uid = peer
        if uid != os.getuid():
            raise _Impostor(f"the socket is served by process {pid} of user {uid}, not of this user")
        holder = find_lock_holder(self._path)
        if holder is None:
            raise OwnerGone("no process holds the file's lock")
        if holder.pid != pid and gone(pid):
            raise OwnerGone(f"process {pid} is exiting")  # its socket outlives it by a moment
        if holder.pid != pid:
            raise _Impostor(
                f"the socket is served by process {pid}, but process {holder.pid} holds the file's lock"
            )
        return pid

    def _proof_refused(self, pid: int) -> WrongPassphraseError:
        # Either side may be wrong: flock needs no passphrase, so the lock holder may be no store.
        holder = f"process {pid}" if pid else "the process"
        # The public call that took the passphrase adds where it came from (errors.py).
        return WrongPassphraseError(
            f"wrong passphrase for {self._path}: {holder}, which holds the file and serves it, does "
            f"not accept it (this is process {os.getpid()}): it could not prove it knows this "
            "passphrase, so nothing derived from it was sent.",
            f": every process on one file needs the same passphrase. If it is right, {holder} is "
            "not a store of this file: find it (`ps -p PID`) and stop it.",
        )

    def _refusal(self, exc: BaseException) -> BaseException:
        """What a failed connection means for the caller (never a secret: only what was refused)."""
        if isinstance(exc, _Impostor):
            return CitadelSessionError(
                f"refused to use {self._address} for {self._path}: {exc}. Another process is posing "
                "as the file's owner, so nothing was sent to it. Find it (`ss -xp`), stop it, then retry."
            )
        if isinstance(exc, VersionRefused):
            return CitadelSessionError(
                f"the process that holds {self._path} speaks {exc}, this one protocol {VERSION}. Run the same "
                "version of citadeldb-openai-agents in every process on one file."
            )
        if isinstance(exc, TimeoutError):
            return StorageError(
                f"the process that holds {self._path} accepted a connection but did not complete the "
                f"handshake within {CONNECT_SECONDS:g} s: it is stopped (SIGSTOP) or stuck, or another "
                "process is listening at its socket. Resume or restart the process holding the file."
            )
        if isinstance(exc, ProtocolError):
            return StorageError(f"the peer at {self._address} does not speak this protocol: {exc}")
        if isinstance(exc, (OSError, EOFError, OwnerGone)):
            return OwnerGone(str(exc))
        return exc


class _Impostor(Exception):
    """The socket's peer is not the process holding the file."""
