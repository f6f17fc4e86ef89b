"""Where the owner of a file listens, and the key both ends prove they know.

The socket lives in a directory only this user can use, never one another user could
have made first: ``socket_dir`` when set (``CITADEL_SOCKET_DIR``: a systemd unit's
``RuntimeDirectory=``), which must be this user's with mode 0700 (made so if missing);
else ``$XDG_RUNTIME_DIR/citadeldb-openai-agents`` (systemd makes ``$XDG_RUNTIME_DIR``,
mode 0700), else the same under ``/run/user/<uid>`` (for a process started without the
variable, a cron job's), else ``.cache/citadeldb-openai-agents/run`` in the user's home
as the user database has it (not ``$HOME``, which servers and tests change), each checked
for its owner and mode and skipped when it cannot be made or a socket's name would not fit
AF_UNIX's 107 bytes; else, where the home is usable, a directory with a random name in the
temporary directory, noted in that cache so that every process finds it; else (an account
whose home does not exist) ``citadeldb-openai-agents-<uid>`` in the temporary directory,
made 0700 by the first process and trusted only while lstat says it is a directory of this
user's that no one else can enter: another user who made that name first is refused, and
serving then fails naming ``socket_dir``. Every process of a deployment must see the same
``XDG_RUNTIME_DIR`` and ``socket_dir`` (set or unset) to find the same socket. Its name is a keyed digest of the database's resolved path, under a
random secret kept in that directory, so every process of this user that opens the file,
by whatever path, finds the same socket, and no one else can confirm a guessed path from
the names the kernel lists for everyone (/proc/net/unix).

The socket's key is derived from the passphrase with scrypt (`SCRYPT_COST`: n = 2**17,
r = 8, p = 2, 128 MiB, ~0.65 s here), salted with 32 random bytes of the file's own, kept
beside the socket (``<name>.salt``) and sent by the owner in its handshake, so that no
dictionary computed once serves every deployment at a common path. Its cost is above that
of opening the file (argon2id: 18 ms "iot", 123 ms "desktop", 354 ms "server" at the
median on this project's 2-core machine, benchmarks/socket_kdf.py): whatever a peer
records of a handshake, testing a passphrase guess against it costs more than trying the
guess on the file. It is derived once per process and file, when first needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import CitadelSessionError
from ..storage.process_state import gone
from .directory import runtime_directory

_SALT_DOMAIN = b"citadeldb-openai-agents/serve/v3\0"  # then the file's 32 random bytes
_SALT = 32
# scrypt's cost: 128 MiB and ~0.65 s on this project's 2-core machine, once per process and
# file; p = 2 doubles the time of p = 1 (0.35 s, under the "server" profile's file at times)
# at the same memory. benchmarks/socket_kdf.py measures it beside each argon2 profile.
SCRYPT_COST = {"n": 2**17, "r": 8, "p": 2, "dklen": 32, "maxmem": 2**28}


def socket_path(database: str, socket_dir: str | None = None) -> str:
    """The owner's socket for the database at the resolved path `database` (in `socket_dir`, if set)."""
    return str(_named(database, socket_dir, ".sock"))


def _named(database: str, socket_dir: str | None, suffix: str) -> Path:
    """The database's file of kind `suffix` in the runtime directory, under its keyed name."""
    directory = runtime_directory(socket_dir)
    key = _kept_random(directory / "names.key")
    name = hmac.new(key, database.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]
    return directory / f"{name}{suffix}"


def file_salt(database: str, socket_dir: str | None = None) -> bytes:
    """The file's random salt for its socket's key, kept beside its socket (made once, atomically).

    Random per file, not derived from its path: no dictionary computed once tests guesses
    against every deployment at a common path. The owner sends the salt it derived with in
    its handshake, so a client agrees with a live owner even after this file was replaced
    (the runtime directory wiped); a new salt then is only another derivation.
    """
    return _kept_random(_named(database, socket_dir, ".salt"))


def remove_stale_sockets(keep: str, *, older_than: float = 60.0) -> list[str]:
    """Remove the sockets in this user's runtime directory that no process listens on any more.

    An owner killed with SIGKILL leaves its socket behind; the next owner of the same
    file replaces it, but a file never opened again would leave it forever. A socket is
    stale when the kernel lists no socket bound to its name (Linux's /proc/net/unix:
    live owners are not disturbed) and a connection to it is refused; one younger than
    `older_than` seconds is left alone (its owner may be between bind and listen).
    Where /proc/net/unix cannot be read, no socket is removed. The marks of processes
    killed while opening a file are removed too. Returns the paths removed.
    """
    directory = Path(keep).parent
    now = time.time()
    removed = []
    old = [
        entry for entry in directory.glob("*.sock") if str(entry) != keep and _age(entry, now) >= older_than
    ]
    bound = _bound_unix_sockets() if old else None  # read only when there is something to judge
    for entry in old:
        name = str(entry)
        if bound is None or name in bound:
            continue  # bound, or unknown which are: kept
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(name)
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed.append(name)
            with contextlib.suppress(FileNotFoundError):
                entry.with_suffix(".salt").unlink()  # its file's salt: the next owner makes another
        except OSError:
            continue  # gone meanwhile, or not a socket to judge
    for entry in directory.glob("*.opening.*"):  # `served_files.opening`'s, named by pid
        with contextlib.suppress(OSError, ValueError):
            if _age(entry, now) >= older_than and gone(int(entry.name.rsplit(".", 1)[1])):
                entry.unlink()
                removed.append(str(entry))
    return removed


def _age(entry: Path, now: float) -> float:
    """Seconds since `entry` was last changed (0 if it is gone)."""
    try:
        return now - entry.lstat().st_mtime
    except OSError:
        return 0.0


def _bound_unix_sockets() -> set[str] | None:
    """The names of the Unix sockets bound now (in this network namespace), or None if unknown."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="surrogateescape") as table:
            next(table)  # the header
            return {
                fields[7]
                for fields in (line.rstrip("\n").split(maxsplit=7) for line in table)
                if len(fields) == 8
            }
    except (OSError, StopIteration):
        return None


def opening_marker(database: str, pid: int, socket_dir: str | None = None) -> str:
    """A file that says process `pid` is opening the database (it may hold the lock, not serve yet)."""
    return str(_named(database, socket_dir, f".opening.{pid}"))


def _kept_random(path: Path) -> bytes:
    """32 random bytes kept at `path` (this user's names' secret, a file's salt), made once, atomically."""
    try:
        return _read_salt(path)
    except FileNotFoundError:
        pass
    fresh = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(descriptor, secrets.token_bytes(_SALT))
    finally:
        os.close(descriptor)
    try:
        os.link(fresh, path)  # fails if another process made it first: theirs is used
    except FileExistsError:
        pass
    finally:
        os.unlink(fresh)
    return _read_salt(path)


def _read_salt(path: Path) -> bytes:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        salt = os.read(descriptor, 64)
    finally:
        os.close(descriptor)
    if len(salt) != _SALT:
        raise CitadelSessionError(
            f"{path} is damaged (it should hold 32 random bytes): remove it; processes serving "
            "a file now keep their socket until they restart."
        )
    return salt


class Secret:
    """Bytes kept for the life of a store (the passphrase, the socket's key): never shown, zeroed on close."""

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = bytearray(value)

    def wipe(self) -> None:
        self.value[:] = bytes(len(self.value))

    def replace(self, value: bytes) -> None:
        """Hold `value` instead; the old bytes are zeroed first (an old passphrase is still a secret)."""
        self.wipe()
        self.value = bytearray(value)

    def __repr__(self) -> str:
        return "<secret>"


class SocketKey:
    """The key of a file's socket, derived from the passphrase and a salt when first needed, in a wiped buffer.

    Its bytes never leave this object: the handshake asks it for a MAC and for the
    connection's keys (handshake.py), so no frame of a raised error holds them. The salt
    is the file's (`file_salt`): the owner derives under its own and sends it; a client
    derives beforehand under the one it finds beside the socket, and again, during the
    handshake, only if the owner's differs.
    """

    __slots__ = ("_database", "_key", "_lock", "_passphrase", "_salt", "_socket_dir")

    def __init__(self, passphrase: Secret, database: str, socket_dir: str | None = None) -> None:
        self._passphrase = passphrase  # the store's buffer: replaced in place by a rotation
        self._database = database
        self._socket_dir = socket_dir
        self._key = Secret(b"")
        self._salt = b""  # the salt the key was derived under
        self._lock = threading.Lock()

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 under the key of `parts`, each length-prefixed (no two lists give one input)."""
        message = b"".join(len(part).to_bytes(4, "big") + part for part in parts)
        return hmac.new(self._bytes(), message, hashlib.sha256).digest()

    def expand(self, salt: bytes, info: bytes) -> bytes:
        """A 32-byte key for one connection: HKDF-SHA256 of the socket's key."""
        return HKDF(algorithm=SHA256(), length=32, salt=salt, info=info).derive(self._bytes())

    def derive(self, salt: bytes | None = None) -> bytes:
        """Derive the key under `salt` (32 bytes; None: the file's own, `file_salt`) unless it is
        already; returns the salt it is derived under. Each later use then costs nothing."""
        if salt is not None and len(salt) != _SALT:
            raise ValueError(f"a socket key's salt is {_SALT} bytes")
        with self._lock:
            if salt is None:
                salt = self._salt or file_salt(self._database, self._socket_dir)
            if not self._key.value or salt != self._salt:
                self._key.replace(
                    hashlib.scrypt(self._passphrase.value, salt=_SALT_DOMAIN + salt, **SCRYPT_COST)
                )
                self._salt = salt
            return salt

    def rotated(self, passphrase: bytes) -> None:
        """Derive from `passphrase` from now on (a key rotation): the buffer the store shares is
        replaced in place, and the key zeroed, derived anew at the next handshake. Connections
        already authenticated keep their own keys: a rotation drops none of them."""
        with self._lock:
            self._passphrase.replace(passphrase)
            self._key.wipe()
            self._key = Secret(b"")

    def forget(self) -> None:
        """Zero the key (the store closed, or its passphrase changed: derived anew when next needed)."""
        with self._lock:
            self._key.wipe()
            self._key = Secret(b"")

    def _bytes(self) -> bytearray:
        self.derive(self._salt or None)
        with self._lock:
            return self._key.value  # the buffer itself: a copy could not be wiped

    def __repr__(self) -> str:
        return "<socket key>"
