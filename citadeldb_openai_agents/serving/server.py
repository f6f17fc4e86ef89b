"""The owner's side: a file served to other processes on a Unix socket.

One listening thread accepts; each connection gets a thread that first runs the
handshake (`multiprocessing.connection`'s HMAC challenge, both ways, under a
timeout: a peer that sends nothing or garbage only ever costs its own thread a few
seconds) and then executes that client's calls on the `LocalFile`, one at a time.
Calls of different clients run in parallel, as the store's own threads do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from ..errors import CitadelSessionError
from ..storage.local import LocalFile
from ..storage.process import current_pid
from .address import remove_stale_sockets
from .protocol import (
    NOTING,
    OPERATIONS,
    REPORTING,
    VERSION,
    ClientHello,
    OwnerHello,
    Terms,
    portable,
    wire_identity,
)

log = logging.getLogger("citadeldb_openai_agents")

HANDSHAKE_SECONDS = 5.0  # a peer must prove itself within this, or it is dropped
_SO_PEERCRED = getattr(socket, "SO_PEERCRED", None)
_servers: weakref.WeakSet[Server] = weakref.WeakSet()  # this process's, for `_after_fork_in_child`


class Server:
    """Serves one `LocalFile` on `address` to whoever proves it knows the passphrase."""

    def __init__(
        self,
        file: LocalFile,
        address: str,
        authkey: bytes,
        *,
        terms: Terms,
    ) -> None:
        self._file = file
        self.address = address
        self._authkey = authkey
        self._terms = terms
        self._owner_pid = current_pid()
        self._closed = threading.Event()
        self._clients: set[socket.socket] = set()
        self._connections: set[Connection] = set()  # the clients' sockets, as `_calls` reads them
        self._lock = threading.Lock()
        self._listener = _listen(address)
        # Written to by `close`, so the accept thread's wait ends at once (a closed listener
        # does not wake a select on Linux: every close would wait out the timeout).
        self._wake_read, self._wake_write = os.pipe()
        _servers.add(self)
        self._thread = threading.Thread(target=self._accept, name="citadel-serve", daemon=True)
        self._thread.start()
        log.info("serving %s to other processes on %s", file.path, address)
        for stale in remove_stale_sockets(keep=address):
            log.info("removed %s, left by an owner that was killed", stale)

    @property
    def clients(self) -> int:
        """How many client connections are open now."""
        with self._lock:
            return len(self._clients)

    def close(self) -> None:
        """Stop serving and remove the socket; clients then take the file over or reconnect.

        In a process forked from the owner it does nothing: the socket is the parent's.
        """
        if current_pid() != self._owner_pid or self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            os.unlink(self.address)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for client in self._clients:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")
        self._thread.join(timeout=5)
        for descriptor in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(descriptor)

    def _accept(self) -> None:
        with selectors.DefaultSelector() as waiting:
            try:
                waiting.register(self._listener, selectors.EVENT_READ)
                waiting.register(self._wake_read, selectors.EVENT_READ)
            except (OSError, ValueError):
                return  # closed before this thread started
            while not self._closed.is_set():
                # A timeout too, should a close land between two waits.
                ready = waiting.select(timeout=1.0)
                if self._closed.is_set() or any(key.fileobj == self._wake_read for key, _ in ready):
                    return
                if ready and not self._take_peer():
                    return  # closed

    def _take_peer(self) -> bool:
        """Accept a waiting peer and serve it on a thread of its own; False once closed."""
        try:
            # Accepted and registered under the lock a fork waits for: a child forked at any
            # moment closes every connection of this server (`_after_fork_in_child`).
            with self._lock:
                peer, _ = self._listener.accept()
                peer.setblocking(True)  # the connection reads it with plain blocking reads
                connection = Connection(os.dup(peer.fileno()))
                self._clients.add(peer)
                self._connections.add(connection)
        except BlockingIOError:
            return True  # the peer gave up before it was accepted
        except OSError as exc:
            if self._closed.is_set():
                return False
            # Out of descriptors, or the peer aborted: this peer is lost, not the server.
            log.warning("could not accept a client on %s (%s); still serving", self.address, exc)
            time.sleep(0.05)  # a listener still ready must not spin this thread
            return True
        thread = threading.Thread(target=self._serve, args=(peer, connection), name="citadel-client")
        thread.daemon = True
        thread.start()
        return True

    def _serve(self, peer: socket.socket, connection: Connection) -> None:
        who = _peer(peer)
        try:
            # A blocking read that gives up after a while (`settimeout` would make the socket
            # non-blocking, which the connection's plain reads do not expect).
            _receive_timeout(peer, HANDSHAKE_SECONDS)
            hello = self._handshake(connection, who)
            if hello is None:
                return
            _receive_timeout(peer, 0)
            log.info("client connected to %s: %s (%s)", self._file.path, who, hello.program)
            if self._calls(connection, who):
                log.info("client left %s: %s", self._file.path, who)
        except (EOFError, OSError) as exc:
            if not self._closed.is_set():
                log.warning("dropped the client %s of %s: %s", who, self._file.path, type(exc).__name__)
        finally:
            with self._lock:
                self._clients.discard(peer)
                self._connections.discard(connection)
            connection.close()
            peer.close()

    def _handshake(self, connection: Connection, who: str) -> ClientHello | None:
        """Authenticate the peer both ways, then exchange hellos; None for a peer refused."""
        try:
            deliver_challenge(connection, self._authkey)
            answer_challenge(connection, self._authkey)
        except Exception as exc:
            log.warning(
                "refused a peer of %s (%s): %s, a wrong passphrase or not a client of this package",
                self._file.path,
                who,
                type(exc).__name__,
            )
            return None
        message = connection.recv()
        if not (isinstance(message, tuple) and len(message) == 3 and message[0] == "hello"):
            log.warning("refused a peer of %s (%s): it sent no hello", self._file.path, who)
            return None
        _, version, hello = message
        if version != VERSION or not isinstance(hello, ClientHello):
            log.warning(
                "refused a peer of %s (%s): protocol %r, not %d", self._file.path, who, version, VERSION
            )
            connection.send(("refused", f"protocol {version!r}: this owner speaks {VERSION}"))
            return None
        identity = self._file.identity
        connection.send(
            (
                "welcome",
                OwnerHello(
                    current_pid(),
                    self._file.path,
                    self._terms,
                    wire_identity(identity),
                ),
            )
        )
        return hello

    def _calls(self, connection: Connection, who: str) -> bool:
        """Answer the client's calls until it leaves (True) or sends what is not a call (False)."""
        while True:
            try:
                message = connection.recv()
            except EOFError:
                return True  # the client closed the connection: it left
            if not (
                isinstance(message, tuple)
                and len(message) == 3
                and isinstance(message[0], str)
                and isinstance(message[1], tuple)
            ):
                log.warning(
                    "dropped the client %s of %s: it sent a message that is not a call", who, self._file.path
                )
                return False
            operation, args, reporting = message
            function = getattr(self._file, operation) if operation in OPERATIONS else None
            if function is None:
                connection.send(("error", CitadelSessionError(f"the owner offers no {operation!r}")))
                continue
            try:
                # Progress only for a caller that asked for it: every full read reports it.
                if operation in REPORTING and reporting:
                    result = function(*args, progress=_forward(connection, "progress"))
                elif operation in NOTING:
                    result = function(*args, note=_forward(connection, "noted"))
                else:
                    result = function(*args)
            except Exception as exc:
                connection.send(("error", portable(exc)))
            else:
                connection.send(("ok", result))


def _forward(connection: Connection, tag: str) -> Callable[..., None]:
    """A callback that sends its arguments to the client as a ``(tag, ...)`` message.

    A note is sent before the owner erases anything: should the owner die after, the
    client knows what was about to go (a message sent is in the client's queue, even
    once this process is gone).
    """

    def send(*values: Any) -> None:
        connection.send((tag, *values))

    return send


def _after_fork_in_child() -> None:
    # A forked child that kept its copies of the owner's sockets would keep them open after
    # the owner died: the listening one accepting connections whose handshake no one answers,
    # a client's call waiting forever for a reply instead of seeing the owner gone (gunicorn
    # --preload's workers outlive a killed master, and a worker it forks to replace one
    # inherits every connection the master serves). Closing the child's copies, without a
    # shutdown, changes nothing for the parent, which goes on serving; its threads are not here.
    for server in list(_servers):
        server._listener.close()
        for peer in list(server._clients):
            peer.close()
        for connection in list(server._connections):
            connection.close()
        for descriptor in (server._wake_read, server._wake_write):
            with contextlib.suppress(OSError):
                os.close(descriptor)
    _release_forking()


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


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(
        before=_before_fork, after_in_parent=_release_forking, after_in_child=_after_fork_in_child
    )


def _listen(address: str) -> socket.socket:
    """A listening socket at `address`, mode 0600, replacing one a dead owner left."""
    # Only the process holding the file's lock serves it, so a socket found here is stale.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)  # created 0600: no window in which others could connect
    try:
        listener.bind(address)
    finally:
        os.umask(previous)
    os.chmod(address, 0o600)
    listener.listen(64)
    listener.setblocking(False)  # accepted only once select says a peer waits (`Server._accept`)
    return listener


def _receive_timeout(peer: socket.socket, seconds: float) -> None:
    """Reads on `peer` fail after `seconds` without data (0: wait forever)."""
    whole = int(seconds)
    peer.setsockopt(
        socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6))
    )


def _peer(peer: socket.socket) -> str:
    """The peer's process id and user, where Linux tells them (SO_PEERCRED)."""
    if _SO_PEERCRED is None:
        return "a local process"
    try:
        pid, uid, _ = struct.unpack(
            "3i", peer.getsockopt(socket.SOL_SOCKET, _SO_PEERCRED, struct.calcsize("3i"))
        )
    except OSError:
        return "a local process"
    return f"PID {pid}" if uid == os.getuid() else f"PID {pid} (uid {uid})"
