"""Where the owner of a file listens, and the key a client proves it knows.

The socket lives in a directory only this user can use: ``$XDG_RUNTIME_DIR`` (systemd
makes it, mode 0700), unless it is too long a path for a socket's name, or else
``/tmp/citadeldb-openai-agents-<uid>``, which is created with mode 0700 and refused if
anyone else owns it or can enter it. Its name
is a digest of the database's resolved path, so every process that opens the file,
by whatever path, finds the same socket, and a long path cannot exceed AF_UNIX's
limit of about 107 bytes.

The authentication key is derived from the passphrase with scrypt, salted with the
file's path: the passphrase itself never crosses the socket, and the derivation's
cost (~0.1 s) slows a guesser who can reach the socket to one guess per derivation.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import tempfile
import time
from pathlib import Path

from ..errors import CitadelSessionError
from ..storage.process import gone

_APP = "citadeldb-openai-agents"
_SUN_PATH = 107  # bytes of a Unix socket's name on Linux (108, less the terminating NUL)
_SALT_DOMAIN = b"citadeldb-openai-agents/serve/v1\0"
# scrypt's cost: 16 MiB and ~0.1 s on this project's 2-core machine, once per process and file.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


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
    Where /proc/net/unix cannot be read, no socket is removed. The marks of owners that
    kept their file to themselves and were killed (their process is gone) are removed
    too. Returns the paths removed.
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
    for entry in directory.glob("*.exclusive"):  # `hosting.mark_exclusive`'s, by pid
        with contextlib.suppress(OSError, ValueError):
            if _age(entry, now) >= older_than and gone(int(entry.read_text())):
                entry.unlink()
                removed.append(str(entry))
    for entry in directory.glob("*.opening.*"):  # `hosting.opening`'s, named by pid
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


def exclusive_marker(database: str) -> str:
    """A file that says the database's owner keeps it to itself (serve = false)."""
    return str(runtime_directory() / f"{_name(database)}.exclusive")


def _name(database: str) -> str:
    return hashlib.sha256(database.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def runtime_directory() -> Path:
    """A directory only this user can write to, made if needed; raises if it is not safe."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private(Path(runtime)) and _fits(Path(runtime) / _APP):
        directory = Path(runtime) / _APP
    else:
        directory = Path(tempfile.gettempdir()) / f"{_APP}-{os.getuid()}"
        if not _fits(directory):
            raise CitadelSessionError(
                f"{directory} is too long a directory for the socket that serves the file to other "
                f"processes (a Unix socket's name holds at most {_SUN_PATH} bytes): set TMPDIR or "
                "XDG_RUNTIME_DIR to a shorter directory of this user's, or set serve = false."
            )
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CitadelSessionError(
            f"cannot create {directory} for the socket that serves the file to other processes "
            f"({exc.strerror}); set XDG_RUNTIME_DIR to a directory of this user's, or serve = false"
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


def derive_authkey(passphrase: str, database: str) -> bytes:
    """The key a process proves it knows to use the owner's socket (HMAC challenge)."""
    salt = _SALT_DOMAIN + hashlib.sha256(database.encode("utf-8", "surrogatepass")).digest()
    return hashlib.scrypt(passphrase.encode("utf-8", "surrogatepass"), salt=salt, **_SCRYPT)


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
