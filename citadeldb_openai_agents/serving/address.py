"""Where the owner of a file listens, and the key both ends prove they know.

The socket lives in a directory only this user can use, never under a predictable
name in a shared directory (another user could squat it and stop this user's erasures):
``$XDG_RUNTIME_DIR/citadeldb-openai-agents`` (systemd makes ``$XDG_RUNTIME_DIR``, mode
0700), else the same under ``/run/user/<uid>`` (for a process started without the
variable, a cron job's), else ``.cache/citadeldb-openai-agents/run`` in the user's home
as the user database has it (not ``$HOME``, which servers and tests change), each checked
for its owner and mode and skipped when a socket's name would not fit AF_UNIX's 107
bytes; else a directory with a random name in the temporary directory, noted in that
cache so that every process finds it. Every process of a deployment must see the same
``XDG_RUNTIME_DIR`` (set or unset) to find the same socket. Its name is a keyed digest of the database's resolved path, under a
random secret kept in that directory, so every process of this user that opens the file,
by whatever path, finds the same socket, and no one else can confirm a guessed path from
the names the kernel lists for everyone (/proc/net/unix).

The socket's key is derived from the passphrase with scrypt at a cost (n = 2**17, 128 MiB,
~0.5 s here) above that of opening the file itself (argon2id: 41 ms "iot", 185 ms
"desktop", 484 ms "server", measured on this project's 2-core machine): whatever a peer
records of a handshake, testing a passphrase guess against it costs more than trying the
guess on the file. It is derived once per process and file, when first needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pwd
import secrets
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import CitadelSessionError
from ..storage.process_state import gone

_APP = "citadeldb-openai-agents"
_SUN_PATH = 107  # bytes of a Unix socket's name on Linux (108, less the terminating NUL)
_SALT_DOMAIN = b"citadeldb-openai-agents/serve/v2\0"
# scrypt's cost: 128 MiB and ~0.5 s on this project's 2-core machine, once per process and file.
_SCRYPT = {"n": 2**17, "r": 8, "p": 1, "dklen": 32, "maxmem": 2**28}


def socket_path(database: str) -> str:
    """The owner's socket for the database at the resolved path `database`."""
    return str(runtime_directory() / f"{_name(database)}.sock")


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
    directory = runtime_directory()
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


def opening_marker(database: str, pid: int) -> str:
    """A file that says process `pid` is opening the database (it may hold the lock, not serve yet)."""
    return str(runtime_directory() / f"{_name(database)}.opening.{pid}")


def _name(database: str) -> str:
    salt = _user_salt(runtime_directory())
    return hmac.new(salt, database.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]


def _user_salt(directory: Path) -> bytes:
    """This user's random secret that salts the sockets' names, made once, atomically."""
    path = directory / "names.key"
    try:
        return _read_salt(path)
    except FileNotFoundError:
        pass
    fresh = directory / f"names.key.{os.getpid()}.{threading.get_ident()}"
    descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(descriptor, secrets.token_bytes(32))
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
    if len(salt) != 32:
        raise CitadelSessionError(
            f"{path} is damaged (it should hold 32 random bytes): remove it; processes serving "
            "a file now keep their socket until they restart."
        )
    return salt


def runtime_directory() -> Path:
    """A directory only this user can use, made if needed; raises if there is none."""
    for candidate in _candidates():
        if _fits(candidate):
            return _made_private(candidate)
    return _noted_directory()


def _candidates() -> list[Path]:
    found = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _private(Path(runtime)):
        found.append(Path(runtime) / _APP)
    systemd = Path(f"/run/user/{os.getuid()}")  # what XDG_RUNTIME_DIR names, for processes without it
    if _private(systemd) and systemd / _APP not in found:
        found.append(systemd / _APP)
    found.append(_cache() / "run")
    return found


def _cache() -> Path:
    """This user's cache directory, from the user database: the same whatever a process's $HOME."""
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        home = os.path.expanduser("~")
    return Path(home) / ".cache" / _APP


def _noted_directory() -> Path:
    """Where the usual directories' paths are too long for a socket: one with a random name in
    the temporary directory (no one can guess it to squat it), its path noted in the cache."""
    note = _made_private(_cache()) / "runtime-directory"
    with contextlib.suppress(OSError):
        noted = Path(note.read_text(encoding="utf-8").strip())
        if noted.is_absolute() and _fits(noted) and _private(noted):
            return noted
    fresh = Path(tempfile.mkdtemp(prefix=f"{_APP}-"))  # 0700, made by this process
    if not _fits(fresh):
        os.rmdir(fresh)
        raise CitadelSessionError(
            f"no directory of this user's is short enough for the socket that serves the file to other "
            f"processes (a Unix socket's name holds at most {_SUN_PATH} bytes): set XDG_RUNTIME_DIR to a "
            "short directory of this user's (mode 700), or set serve = false."
        )
    draft = note.with_name(f"{note.name}.{os.getpid()}.{threading.get_ident()}")
    draft.write_text(str(fresh), encoding="utf-8")
    os.replace(draft, note)  # the last writer wins; every process reads the note again before use
    noted = Path(note.read_text(encoding="utf-8").strip())
    if noted != fresh:
        os.rmdir(fresh)
    return noted


def _made_private(directory: Path) -> Path:
    try:
        directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CitadelSessionError(
            f"cannot create {directory} for the socket that serves the file to other processes "
            f"({exc.strerror}): set XDG_RUNTIME_DIR to a directory of this user's, or serve = false."
        ) from None
    if not _private(directory):
        raise CitadelSessionError(
            f"{directory} is owned by another user or open to others, so the socket that serves the "
            "file to other processes cannot be put there safely. Remove it (or make it yours with "
            "mode 700), set XDG_RUNTIME_DIR to a directory of this user's, or set serve = false."
        )
    return directory


def _fits(directory: Path) -> bool:
    """Whether a socket's name in `directory` fits in AF_UNIX's address."""
    return len(os.fsencode(directory / f"{'0' * 32}.sock")) <= _SUN_PATH


def _private(directory: Path) -> bool:
    try:
        status = directory.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(status.st_mode)
        and status.st_uid == os.getuid()
        and not status.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )


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
    """The key of a file's socket, derived from the passphrase when first needed, in a wiped buffer.

    Its bytes never leave this object: the handshake asks it for a MAC and for the
    connection's keys (handshake.py), so no frame of a raised error holds them.
    """

    __slots__ = ("_database", "_key", "_lock", "_passphrase")

    def __init__(self, passphrase: Secret, database: str) -> None:
        self._passphrase = passphrase  # the store's buffer: replaced in place by a rotation
        self._database = database
        self._key = Secret(b"")
        self._lock = threading.Lock()

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 under the key of `parts`, each length-prefixed (no two lists give one input)."""
        message = b"".join(len(part).to_bytes(4, "big") + part for part in parts)
        return hmac.new(self._bytes(), message, hashlib.sha256).digest()

    def expand(self, salt: bytes, info: bytes) -> bytes:
        """A 32-byte key for one connection: HKDF-SHA256 of the socket's key."""
        return HKDF(algorithm=SHA256(), length=32, salt=salt, info=info).derive(self._bytes())

    def derive(self) -> None:
        """Derive the key now if it is not yet (each later use then costs nothing)."""
        self._bytes()

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
        with self._lock:
            if not self._key.value:
                salt = _SALT_DOMAIN + hashlib.sha256(self._database.encode("utf-8", "surrogatepass")).digest()
                self._key.replace(hashlib.scrypt(self._passphrase.value, salt=salt, **_SCRYPT))
            return self._key.value  # the buffer itself: a copy could not be wiped

    def __repr__(self) -> str:
        return "<socket key>"
