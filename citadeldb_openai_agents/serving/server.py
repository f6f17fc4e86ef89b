"""The owner's side: a file served to other processes on a Unix socket.

One thread accepts (and sends the heartbeats of calls in progress); each connection
gets a thread that runs the handshake (handshake.py) under one deadline,
`HANDSHAKE_SECONDS` for the whole of it, then executes that client's calls on the
`LocalFile`, one at a time. At most `MAX_HANDSHAKES` peers may be in their handshake
at once, and at most `MAX_HANDSHAKES_PER_PROCESS` of one process (the kernel's word for
its pid, SO_PEERCRED), so that one process reconnecting as fast as it is dropped cannot
keep the others out: a peer past either is told the owner is busy and closed at once,
without a thread. Calls of different clients run in parallel, as the store's own threads do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import telemetry
from ..options import StoreOptions
from ..results import OwnerStatus
from ..storage.files import umask
from ..storage.local_file import LocalFile
from ..storage.process_state import SERVERS, at_fork, current_pid
from .address import SocketKey, remove_stale_sockets
from .channel import Channel
from .handshake import ProofRefused, VersionRefused, owner_side, peer_process, turn_away
from .operations import OPERATIONS, ROTATE_KEY, ProtocolError
from .orphans import watch_parent
from .protocol import (
    CLIENT_HELLO,
    HEARTBEAT_SECONDS,
    ClientHello,
    OwnerHello,
    error_to_wire,
    hello_to_wire,
    wire_identity,
)
from .transport import run_here

log = logging.getLogger("citadeldb_openai_agents")
# Each client connecting and leaving, at DEBUG: a web server's workers open several
# connections each. The serve command (a sidecar whose job this is) shows them.
connections = logging.getLogger("citadeldb_openai_agents.connections")

HANDSHAKE_SECONDS = 5.0  # a peer must prove itself and say hello within this, or it is dropped
MAX_HANDSHAKES = 32  # peers not yet authenticated at once; more are closed on arrival
MAX_HANDSHAKES_PER_PROCESS = 4  # of one process (a client opens at most 2 at once: client.py)
_servers: weakref.WeakSet[Server] = weakref.WeakSet()  # this process's, for `_after_fork_in_child`


class Server:
    """Serves one `LocalFile` on `address` to whoever proves it knows the passphrase."""

    def __init__(self, file: LocalFile, address: str, key: SocketKey, *, terms: StoreOptions) -> None:
        self._file = file
        self.address = address
        self._key = key
        self._terms = terms
        self._owner_pid = current_pid()
        self._closed = threading.Event()
        self._peers: set[socket.socket] = set()  # every accepted peer, for close and fork
        self._handshaking = 0
        self._handshaking_by: dict[int, int] = {}  # peers in their handshake, by process id
        self._authenticated = 0
        self._clients: dict[int, int] = {}  # authenticated connections, by the client's process id
        self._since = time.time()
        self._busy: dict[Channel, float] = {}  # channels with a call running, since when
        self._lock = threading.Lock()
        self._refusals = _Throttle("refused a peer of %s", file.path)
        # Its own limit: a flood turned away must not crowd out the other refusals' lines, nor they it.
        self._turned_away = _Throttle("turned away a peer of %s", file.path)
        self._failed_accepts = _Throttle("could not accept a client on %s", address)
        self._listener = _listen(address)
        # Written to by `close`, so the accept thread's wait ends at once (a closed listener
        # does not wake a select on Linux: every close would wait out the timeout).
        self._wake_read, self._wake_write = os.pipe()
        _servers.add(self)
        self._thread = threading.Thread(target=self._accept, name="citadel-serve", daemon=True)
        self._thread.start()
        file.serving = self.status  # what `status` shows of this owner (storage/file_status.py)
        log.info("serving %s to other processes on %s", file.path, address)
        for stale in remove_stale_sockets(keep=address):
            log.info("removed %s, left by an owner that was killed", stale)

    def status(self) -> OwnerStatus:
        """This owner as `status` shows it: its pid, since when it serves, its client processes."""
        with self._lock:
            clients = len(self._clients)
        return OwnerStatus(self._owner_pid, self._since, clients, self.address)

    def close(self) -> None:
        """Stop serving and remove the socket; clients then take the file over or reconnect.

        In a process forked from the owner it does nothing: the socket is the parent's.
        """
        if current_pid() != self._owner_pid or self._closed.is_set():
            return
        self._closed.set()
        if self._file.serving == self.status:
            self._file.serving = None
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for peer in self._peers:
                with contextlib.suppress(OSError):
                    peer.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")
        self._thread.join(timeout=5)
        for descriptor in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(descriptor)

    def rotated(self, passphrase: bytes) -> None:
        """The file's passphrase changed in this process: new handshakes prove the new one."""
        self._key.rotated(passphrase)

    def _accept(self) -> None:
        pause = 0.0  # back-off while accepting fails (out of descriptors)
        with selectors.DefaultSelector() as waiting:
            try:
                waiting.register(self._listener, selectors.EVENT_READ)
                waiting.register(self._wake_read, selectors.EVENT_READ)
            except (OSError, ValueError):
                return  # closed before this thread started
            while not self._closed.is_set():
                ready = waiting.select(timeout=HEARTBEAT_SECONDS)
                if self._closed.is_set() or any(key.fileobj == self._wake_read for key, _ in ready):
                    return
                self._beat()
                if ready:
                    pause = self._take_peer(pause)
                    if pause:
                        time.sleep(pause)  # a listener still ready must not spin this thread

    def _take_peer(self, pause: float) -> float:
        """Accept a waiting peer and serve it on a thread of its own; the back-off to apply next."""
        try:
            # Accepted and registered under the lock a fork waits for: a child forked at any
            # moment closes every connection of this server (`_after_fork_in_child`).
            with self._lock:
                peer, _ = self._listener.accept()
                process = _peer(peer)
                full = self._full(process[0])
                if full:
                    turn_away(peer)
                    peer.close()
                    self._turned_away.note(full)
                    telemetry.metrics.handshake_refused(self._file.path, "busy")
                    return 0.0
                self._peers.add(peer)
                self._handshaking += 1
                self._handshaking_by[process[0]] = self._handshaking_by.get(process[0], 0) + 1
        except BlockingIOError:
            return 0.0  # the peer gave up before it was accepted
        except OSError as exc:
            if self._closed.is_set():
                return 0.0
            # Out of descriptors, or the peer aborted: this peer is lost, not the server.
            self._failed_accepts.note(f"{exc.strerror or exc}; still serving")
            return min(1.0, max(0.05, pause * 2))
        threading.Thread(target=self._serve, args=(peer, process), name="citadel-client", daemon=True).start()
        return 0.0

    def _full(self, pid: int) -> str | None:
        """Why a new peer of process `pid` is turned away (too many in their handshake), or None."""
        if self._handshaking >= MAX_HANDSHAKES:
            return f"{MAX_HANDSHAKES} peers are already in their handshake"
        if self._handshaking_by.get(pid, 0) >= MAX_HANDSHAKES_PER_PROCESS:
            return f"PID {pid} has {MAX_HANDSHAKES_PER_PROCESS} peers in their handshake already"
        return None

    def _serve(self, peer: socket.socket, process: tuple[int, int]) -> None:
        channel = Channel(peer)
        authenticated = False
        who = "a local process"
        try:
            hello, who = self._handshake(channel, process)
            with self._lock:
                self._handshaking -= 1
                left = self._handshaking_by.pop(process[0]) - 1
                if left:
                    self._handshaking_by[process[0]] = left
                authenticated = hello is not None
                self._authenticated += authenticated
                if authenticated:
                    self._clients[process[0]] = self._clients.get(process[0], 0) + 1
            if hello is not None:
                connections.debug("client connected to %s: %s (%s)", self._file.path, who, hello.program)
                if self._calls(channel, who):
                    connections.debug("client left %s: %s", self._file.path, who)
        except (EOFError, OSError) as exc:
            if not self._closed.is_set():
                log.warning("dropped the client %s of %s: %s", who, self._file.path, type(exc).__name__)
        finally:
            with self._lock:
                self._peers.discard(peer)
                self._busy.pop(channel, None)
                if authenticated:
                    self._authenticated -= 1
                    left = self._clients.pop(process[0]) - 1
                    if left:
                        self._clients[process[0]] = left
            peer.close()

    def _handshake(self, channel: Channel, process: tuple[int, int]) -> tuple[ClientHello | None, str]:
        """Authenticate the peer both ways, then exchange hellos; (None, who) for a peer refused."""
        self._key.derive()  # at the first peer only (~0.65 s): not counted against the peer's time
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        pid, uid = process
        who = f"PID {pid}" if uid == os.getuid() else f"PID {pid} (uid {uid})"
        try:
            if uid != os.getuid():
                raise ProofRefused("another user's process")
            owner_side(channel, self._key, pid, deadline)
            message = channel.receive(deadline)
            if not (isinstance(message, list) and len(message) == 2 and message[0] == "hello"):
                raise ProtocolError("it sent no hello")
            hello: ClientHello = CLIENT_HELLO(message[1])
            owner = OwnerHello(
                current_pid(), self._file.path, self._terms, wire_identity(self._file.identity)
            )
            channel.send(["welcome", hello_to_wire(owner)])
            return hello, who
        except TimeoutError:
            self._refused("timeout", f"{who}: it did not finish its handshake within {HANDSHAKE_SECONDS:g} s")
        except ProofRefused:
            self._refused("proof", f"{who}: it could not prove it knows the passphrase")
        except VersionRefused as exc:
            self._refused("version", f"{who}: it speaks {exc}")
        except EOFError:
            self._refused(
                "left", f"{who}: it left during the handshake (a wrong passphrase, or not a client)"
            )
        except (ProtocolError, OSError, ValueError) as exc:
            self._refused("protocol", f"{who}: {type(exc).__name__}, not a client of this package")
        return None, who

    def _refused(self, cause: str, detail: str) -> None:
        """A peer refused at its handshake: logged (ten a minute), counted by cause."""
        self._refusals.note(detail)
        telemetry.metrics.handshake_refused(self._file.path, cause)

    def _calls(self, channel: Channel, who: str) -> bool:
        """Answer the client's calls until it leaves (True) or sends what is not a call (False)."""
        while True:
            try:
                message = channel.receive()
            except EOFError:
                return True  # the client closed the connection: it left
            except ProtocolError as exc:
                log.warning("dropped the client %s of %s: %s", who, self._file.path, exc)
                return False
            operation = OPERATIONS.get(message[1]) if _is_call(message) else None
            try:
                if operation is None:
                    raise ProtocolError("it sent a message that is not a call")
                args = operation.arguments(message[2])
                parent = telemetry.continued(telemetry.checked_carrier(message[4]))
            except ValueError as exc:  # a trace context that is not an object
                log.warning("dropped the client %s of %s: %s", who, self._file.path, exc)
                return False
            except ProtocolError as exc:
                log.warning("dropped the client %s of %s: %s", who, self._file.path, exc)
                return False
            # Progress only for a caller that asked for it.
            progress = _forward(channel, "progress") if operation.reports and message[3] else None
            note = _forward(channel, "noted") if operation.notes else None
            with self._lock:
                self._busy[channel] = time.monotonic()
            try:
                result = run_here(self._file, operation, args, progress, note, parent)
                if operation is ROTATE_KEY:  # new handshakes prove the new passphrase; these connections stay
                    self._key.rotated(args[1].encode("utf-8", "surrogatepass"))
            except Exception as exc:
                reply = error_to_wire(exc)
            else:
                reply = ["ok", operation.to_wire(result)]
            finally:
                if operation is ROTATE_KEY:
                    message, args = None, ()  # the passphrases: no frame keeps them
                with self._lock:
                    self._busy.pop(channel, None)
            channel.send(reply)

    def _beat(self) -> None:
        """Tell the clients whose calls run long that this owner is alive."""
        now = time.monotonic()
        with self._lock:
            busy = [channel for channel, since in self._busy.items() if now - since >= HEARTBEAT_SECONDS]
        for channel in busy:
            with contextlib.suppress(OSError, ProtocolError):
                channel.send(["alive"], wait=False)  # never behind a reply being sent


def _peer(peer: socket.socket) -> tuple[int, int]:
    """The peer's (pid, uid) as the kernel reports it; (0, this user) where it does not say."""
    with contextlib.suppress(OSError):
        found = peer_process(peer)
        if found is not None:
            return found
    return 0, os.getuid()


def _is_call(message: Any) -> bool:
    """``["call", name, arguments, wants_progress, trace_context]`` (the context checked apart)."""
    return (
        isinstance(message, list)
        and len(message) == 5
        and message[0] == "call"
        and isinstance(message[1], str)
        and isinstance(message[3], bool)
    )


def _forward(channel: Channel, tag: str) -> Callable[..., None]:
    """A callback that sends its arguments to the client as a ``[tag, ...]`` message.

    A note is sent before the owner erases anything: should the owner die after, the
    client knows what was about to go (a message sent is in the client's queue, even
    once this process is gone).
    """

    def send(*values: Any) -> None:
        channel.send([tag, *values])

    return send


class _Throttle:
    """A warning that may come in floods (slow or hostile peers): ten a minute, then a count."""

    def __init__(self, what: str, where: str, *, burst: int = 10, window: float = 60.0) -> None:
        self._what, self._where = what, where
        self._burst, self._window = burst, window
        self._start, self._count, self._dropped = 0.0, 0, 0
        self._lock = threading.Lock()

    def note(self, detail: str) -> None:
        now = time.monotonic()
        fields = {"citadel_event": "refusal", "citadel_path": self._where}
        with self._lock:
            if now - self._start >= self._window:
                if self._dropped:
                    log.warning(
                        f"{self._what} %s more times (not logged one by one)",
                        self._where,
                        self._dropped,
                        extra={**fields, "citadel_left_out": self._dropped},
                    )
                self._start, self._count, self._dropped = now, 0, 0
            self._count += 1
            if self._count > self._burst:
                self._dropped += 1
                return
        log.warning(f"{self._what} (%s)", self._where, detail, extra=fields)


def _after_fork_in_child() -> None:
    # A forked child that kept its copies of the owner's sockets would keep them open after
    # the owner died: the listening one accepting connections whose handshake no one answers,
    # a client's call waiting forever for a reply instead of seeing the owner gone (gunicorn
    # --preload's workers outlive a killed master, and a worker it forks to replace one
    # inherits every connection the master serves). Closing the child's copies, without a
    # shutdown, changes nothing for the parent, which goes on serving; its threads are not here.
    inherited = [server for server in list(_servers) if server._owner_pid != current_pid()]
    for server in inherited:
        server._listener.close()
        for peer in list(server._peers):
            peer.close()
        for descriptor in (server._wake_read, server._wake_write):
            with contextlib.suppress(OSError):
                os.close(descriptor)
    _release_forking()
    if inherited:
        watch_parent(inherited[0]._owner_pid, [server._file.path for server in inherited])


# The servers whose lock the forking thread holds, from `_before_fork` to after the fork.
_forking: list[Server] = []


def _before_fork() -> None:
    _forking[:] = list(_servers)
    for server in _forking:
        server._lock.acquire()


def _release_forking() -> None:
    for server in _forking:
        server._lock.release()
    _forking.clear()


at_fork(SERVERS, before=_before_fork, after_in_parent=_release_forking, after_in_child=_after_fork_in_child)


def _listen(address: str) -> socket.socket:
    """A listening socket at `address`, mode 0600, replacing one a dead owner left."""
    # Only the process holding the file's lock serves it, so a socket found here is stale.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with umask(0o177):  # created 0600: no window in which others could connect
        listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen(64)
    listener.setblocking(False)  # accepted only once select says a peer waits (`Server._accept`)
    return listener
