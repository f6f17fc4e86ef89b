"""Frames on the owner's socket: length-prefixed and capped; once keyed, sealed and in order.

A frame is a 4-byte big-endian length and that many bytes. Before the handshake ends
a frame is at most `HANDSHAKE_FRAME` bytes, so an unauthenticated peer can make the
other side hold no more than that. After it, every frame is one JSON message sealed
with ChaCha20-Poly1305 (`cryptography`) under the connection's key for its direction,
its nonce the count of frames sent before it: a frame replayed, reordered, cut,
forged or relayed from another connection fails to open, and the connection is
dropped. JSON decoding builds only plain data; it never runs code.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from .operations import ProtocolError

HANDSHAKE_FRAME = 256
MAX_FRAME = 1 << 30  # a sealed frame: a whole session's items can be large, but not this large
_LENGTH = 4


class Closed(EOFError):
    """The peer closed the connection (or it broke)."""


class Channel:
    """One connection: plain frames for the handshake, sealed JSON messages after it.

    Sending is thread-safe (the owner's heartbeat shares a connection with its call);
    receiving is done by one thread at a time.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._outgoing: ChaCha20Poly1305 | None = None
        self._incoming: ChaCha20Poly1305 | None = None
        self._sent = 0
        self._received = 0

    def seal(self, outgoing: bytes, incoming: bytes) -> None:
        """From now on every frame is sealed (each key 32 bytes, one per direction)."""
        self._outgoing, self._incoming = ChaCha20Poly1305(outgoing), ChaCha20Poly1305(incoming)

    def send_plain(self, data: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(len(data).to_bytes(_LENGTH, "big") + data)

    def receive_plain(self, deadline: float) -> bytes:
        """The next frame, due by `deadline` (time.monotonic()); `socket.timeout` past it."""
        return self._frame(HANDSHAKE_FRAME, deadline)

    def send(self, message: Any, *, wait: bool = True) -> None:
        """Seal and send a message (JSON data); lone surrogates cross as JSON escapes.

        With `wait` false, nothing is sent if another thread is sending on this channel.
        """
        if self._outgoing is None:
            raise ProtocolError("the connection is not keyed yet")
        data = json.dumps(message, separators=(",", ":")).encode("ascii")
        if not self._send_lock.acquire(blocking=wait):
            return
        try:
            sealed = self._outgoing.encrypt(_nonce(self._sent), data, None)
            self._sent += 1
            self.sock.settimeout(None)  # blocking: SO_SNDTIMEO bounds a client's (`bound_silence`)
            try:
                self.sock.sendall(len(sealed).to_bytes(_LENGTH, "big") + sealed)
            except BlockingIOError:
                raise TimeoutError("the peer took nothing in time") from None
        finally:
            self._send_lock.release()

    def receive(self, deadline: float | None = None) -> Any:
        """The next message; `socket.timeout` if none comes by `deadline`, `ProtocolError` if forged."""
        if self._incoming is None:
            raise ProtocolError("the connection is not keyed yet")
        sealed = self._frame(MAX_FRAME, deadline)
        try:
            data = self._incoming.decrypt(_nonce(self._received), sealed, None)
        except InvalidTag:
            raise ProtocolError("a frame that does not open under this connection's key") from None
        self._received += 1
        try:
            return json.loads(data)
        except ValueError:
            raise ProtocolError("a sealed frame that is not JSON") from None

    def close(self) -> None:
        self.sock.close()

    def _frame(self, cap: int, deadline: float | None) -> bytes:
        length = int.from_bytes(self._exactly(_LENGTH, deadline), "big")
        if length > cap:
            raise ProtocolError(f"a frame of {length} bytes (at most {cap} here)")
        return self._exactly(length, deadline)

    def _exactly(self, size: int, deadline: float | None) -> bytes:
        if deadline is None:
            # A blocking read, whole in one call where the kernel can (a call's frames: no poll
            # before each read, as a timeout would make Python do). A client's bound on the
            # owner's silence is the socket's SO_RCVTIMEO (`bound_silence`): it ends the read
            # with EAGAIN, which is a timeout here.
            self.sock.settimeout(None)
            try:
                data = self.sock.recv(size, socket.MSG_WAITALL)
            except BlockingIOError:
                raise TimeoutError("no frame in time") from None
            if len(data) == size:
                return data
            if not data:
                raise Closed("the peer closed the connection")
            return data + self._rest(size - len(data))
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame in time")
            self.sock.settimeout(left)  # the whole frame is due by the deadline, not each read
            count = self.sock.recv_into(view[got:])
            if count == 0:
                raise Closed("the peer closed the connection")
            got += count
        return bytes(buffer)

    def _rest(self, size: int) -> bytes:
        """What a signal or a short read left of a frame (blocking reads)."""
        parts = []
        while size:
            try:
                part = self.sock.recv(size, socket.MSG_WAITALL)
            except BlockingIOError:
                raise TimeoutError("no frame in time") from None
            if not part:
                raise Closed("the peer closed the connection")
            parts.append(part)
            size -= len(part)
        return b"".join(parts)

    def bound_silence(self, seconds: float) -> None:
        """Blocking reads and writes on this channel fail after `seconds` without progress."""
        packed = struct.pack("ll", int(seconds), int((seconds - int(seconds)) * 1e6))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, packed)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, packed)


def _nonce(count: int) -> bytes:
    return count.to_bytes(12, "big")
