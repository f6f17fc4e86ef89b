"""The handshake on the owner's socket: who the peer is, then a mutual proof bound to the connection.

1. The client checks, with the kernel's word for it (``SO_PEERCRED``), that the peer is
   a process of this user and the one holding the file's lock (/proc/locks). A relay or
   a squatter at the socket's name is refused here, before anything is sent.
2. Client -> owner: ``CDLS``, the protocol version, a fresh 32-byte nonce.
3. Owner -> client: ``CDLS``, its version, the salt its socket key is derived under (the
   file's 32 random bytes, address.file_salt: not a secret), its own nonce, and its
   proof: an HMAC under the socket's key (address.SocketKey) of both nonces and both
   process ids as the owner's kernel reports them. The client derives under that salt
   (again, only if it differs from the one it found beside the socket). The owner proves
   itself first, so a fake owner gets nothing derived from the passphrase.
4. Client -> owner: the client's proof, the same with its role. Both ids are in both
   proofs, so a proof relayed to another connection does not verify.
5. Each side derives the connection's two keys (HKDF of the socket's key over both
   nonces, one per direction) and seals every later frame with them (channel.py).

A fake client does get the owner's proof: testing a passphrase guess against it costs
one derivation of the socket's key, which is dearer than trying the guess on the file.

An owner with too many peers in their handshake (server.py's caps) answers a new one
``CDLS``, its version and ``busy`` instead, and closes it: the client then knows the owner
is alive and answering, only turned it away (`TurnedAway`), and never calls it stuck.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import struct

from .address import SocketKey
from .channel import Channel
from .operations import ProtocolError

VERSION = 16  # 16: a call carries the caller's trace context, an erasure its receipt id, purge what retention swept, the status operation; 15: the owner sends its socket key's salt (random per file) in its answer, or says it is busy; 14: the erasure ledger's mirror in the terms; 13: an erasure names its ledger entries; 12: owners and labels (a batch's, claim_owner, set_owner, about, begin_owner_erasure, search_owner; summaries by owner); 11: the terms are the store's whole options (StoreOptions); 10: the branch, turn and usage operations and `reserved`; 9: how long sessions live in the terms, a batch's session options, purge's report; 8: a batch's max_items; 7: the erasure ledger in the terms; 6: a batch as one record; 5: this handshake and JSON frames (1-4: multiprocessing.connection)
_MAGIC = b"CDLS"
_NONCE = 32
_SALT = 32
_BUSY = b"busy"
_SO_PEERCRED = getattr(socket, "SO_PEERCRED", None)


class ProofRefused(Exception):
    """The peer could not prove it knows the socket's key: a wrong passphrase, or an impostor."""


class TurnedAway(Exception):
    """The owner answered, but has too many peers in their handshake now: it turned this one away."""


class VersionRefused(Exception):
    """The peer speaks another version of the protocol (`version` is its)."""

    def __init__(self, version: int) -> None:
        super().__init__(f"protocol {version}")
        self.version = version


def peer_process(sock: socket.socket) -> tuple[int, int] | None:
    """The peer's (pid, uid) as the kernel reports it, or None where it does not (not Linux)."""
    if _SO_PEERCRED is None:
        return None
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, _SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def client_side(channel: Channel, key: SocketKey, owner_pid: int, deadline: float) -> None:
    """The client's half, after it checked the peer (`owner_pid` is the kernel's word for it)."""
    mine = secrets.token_bytes(_NONCE)
    try:
        channel.send_plain(_MAGIC + VERSION.to_bytes(2, "big") + mine)
    except OSError:
        # Closed already: an owner that turned this peer away said so first (`turn_away`).
        with contextlib.suppress(OSError, EOFError, ProtocolError):
            if channel.receive_plain(deadline)[4:] == VERSION.to_bytes(2, "big") + _BUSY:
                raise TurnedAway("the owner has too many peers in their handshake") from None
        raise
    answer = channel.receive_plain(deadline)
    version = _version(answer)
    if version != VERSION:
        raise VersionRefused(version)
    if answer[6:] == _BUSY:
        raise TurnedAway("the owner has too many peers in their handshake")
    if len(answer) != 6 + _SALT + 2 * _NONCE:
        raise ProtocolError("the owner's handshake is malformed")
    salt, theirs, proof = (
        answer[6 : 6 + _SALT],
        answer[6 + _SALT : 6 + _SALT + _NONCE],
        answer[6 + _SALT + _NONCE :],
    )
    key.derive(salt)  # the owner's: derived already, unless the salt beside the socket was replaced
    ids = _ids(owner_pid, os.getpid())
    if not hmac.compare_digest(proof, key.mac(b"owner", mine, theirs, ids)):
        raise ProofRefused("the owner's proof does not verify")
    channel.send_plain(key.mac(b"client", mine, theirs, ids))
    _key(channel, key, mine, theirs, ids, outgoing=b"client->owner", incoming=b"owner->client")


def owner_side(channel: Channel, key: SocketKey, client_pid: int, deadline: float) -> None:
    """The owner's half (`client_pid` is the kernel's word for the peer); raises if refused."""
    hello = channel.receive_plain(deadline)
    version = _version(hello)
    if version != VERSION:
        channel.send_plain(_MAGIC + VERSION.to_bytes(2, "big"))  # the client says what it is
        raise VersionRefused(version)
    if len(hello) != 6 + _NONCE:
        raise ProtocolError("a malformed hello")
    theirs, mine = hello[6:], secrets.token_bytes(_NONCE)
    ids = _ids(os.getpid(), client_pid)
    salt = key.derive()  # the file's salt: derived at the owner's first peer, not again
    proof = key.mac(b"owner", theirs, mine, ids)
    channel.send_plain(_MAGIC + VERSION.to_bytes(2, "big") + salt + mine + proof)
    proof = channel.receive_plain(deadline)
    if not hmac.compare_digest(proof, key.mac(b"client", theirs, mine, ids)):
        raise ProofRefused("the client's proof does not verify")
    _key(channel, key, theirs, mine, ids, outgoing=b"owner->client", incoming=b"client->owner")


def turn_away(sock: socket.socket) -> None:
    """Tell a peer the owner is busy (before any hello: it costs the owner one non-blocking send)."""
    busy = _MAGIC + VERSION.to_bytes(2, "big") + _BUSY
    with contextlib.suppress(OSError):  # its buffer is full or it left: it finds the connection closed
        sock.send(len(busy).to_bytes(4, "big") + busy, socket.MSG_DONTWAIT)


def _ids(owner_pid: int, client_pid: int) -> bytes:
    if _SO_PEERCRED is None:
        return b""  # no kernel word on the peer (not Linux): neither side knows the other's pid
    return owner_pid.to_bytes(8, "big", signed=True) + client_pid.to_bytes(8, "big", signed=True)


def _version(frame: bytes) -> int:
    if len(frame) < 6 or frame[:4] != _MAGIC:
        raise ProtocolError("not this package's handshake")
    return int.from_bytes(frame[4:6], "big")


def _key(
    channel: Channel,
    key: SocketKey,
    client_nonce: bytes,
    owner_nonce: bytes,
    ids: bytes,
    *,
    outgoing: bytes,
    incoming: bytes,
) -> None:
    salt = client_nonce + owner_nonce
    channel.seal(key.expand(salt, outgoing + ids), key.expand(salt, incoming + ids))
