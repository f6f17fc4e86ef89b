"""The directory that holds the owners' sockets: one only this user can use, which every process finds.

The order and the reasons are address.py's docstring's. Each candidate is trusted only
once ``lstat`` says it is a directory (not a symlink) owned by this user that no one else
can enter; one that cannot be made or is not private is passed over, so that an account
whose home does not exist still serves its files. ``socket_dir`` (``CITADEL_SOCKET_DIR``)
is never passed over: a socket_dir that is not private is refused, naming it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import tempfile
import threading
from pathlib import Path

from ..errors import CitadelSessionError

APP = "citadeldb-openai-agents"
SUN_PATH = 107  # bytes of a Unix socket's name on Linux (108, less the terminating NUL)
_SETTING = "socket_dir (CITADEL_SOCKET_DIR)"


def runtime_directory(socket_dir: str | None = None) -> Path:
    """`socket_dir`, checked, or the first private directory of this user's found; raises if none."""
    if socket_dir is not None:
        return _chosen(Path(socket_dir))
    passed: list[str] = []
    for candidate in _candidates():
        if _fits(candidate) and _usable(candidate, passed):
            return candidate
    noted = _noted_directory(passed)
    if noted is not None:
        return noted
    shared = Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"  # for an account without a home
    if _fits(shared) and _usable(shared, passed, parents=False):
        return shared
    raise CitadelSessionError(
        f"no private directory for the socket that serves the file to other processes ({'; '.join(passed)}): "
        f"set {_SETTING} to a directory of this user's with mode 700, or set serve = false."
    )


def _chosen(directory: Path) -> Path:
    """The directory socket_dir names, made 0700 if missing; refused unless it is this user's alone."""
    with contextlib.suppress(OSError):  # one that cannot be made is told below
        directory.mkdir(mode=0o700)
    why = _not_private(directory)
    if why is None and not _fits(directory):
        why = f"is too long for a socket's name (a Unix socket's name holds at most {SUN_PATH} bytes)"
    if why is not None:
        raise CitadelSessionError(
            f"{_SETTING} is {directory}, which {why}: the socket that serves the file to other "
            "processes needs a directory of this user's that no one else can enter (chmod 700 it; "
            f"systemd: RuntimeDirectoryMode=0700). Fix it, set {_SETTING} to another, or set serve = false."
        )
    return directory


def _candidates() -> list[Path]:
    found = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and _private(Path(runtime)):
        found.append(Path(runtime) / APP)
    systemd = Path(f"/run/user/{os.getuid()}")  # what XDG_RUNTIME_DIR names, for processes without it
    if _private(systemd) and systemd / APP not in found:
        found.append(systemd / APP)
    found.append(_cache() / "run")
    return found


def _cache() -> Path:
    """This user's cache directory, from the user database: the same whatever a process's $HOME."""
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        home = os.path.expanduser("~")
    return Path(home) / ".cache" / APP


def _noted_directory(passed: list[str]) -> Path | None:
    """Where the usual directories' paths are too long for a socket: one with a random name in
    the temporary directory (no one can guess it to squat it), its path noted in the cache.
    None where the cache cannot be had (an account whose home does not exist)."""
    if not _usable(_cache(), [] if passed else passed):  # said once: its run/ could not be made either
        return None
    note = _cache() / "runtime-directory"
    with contextlib.suppress(OSError):
        noted = Path(note.read_text(encoding="utf-8").strip())
        if noted.is_absolute() and _fits(noted) and _private(noted):
            return noted
    fresh = Path(tempfile.mkdtemp(prefix=f"{APP}-"))  # 0700, made by this process
    if not _fits(fresh):
        os.rmdir(fresh)
        passed.append(f"{fresh.parent} is too long for a socket's name (at most {SUN_PATH} bytes)")
        return None
    draft = note.with_name(f"{note.name}.{os.getpid()}.{threading.get_ident()}")
    draft.write_text(str(fresh), encoding="utf-8")
    os.replace(draft, note)  # the last writer wins; every process reads the note again before use
    noted = Path(note.read_text(encoding="utf-8").strip())
    if noted != fresh:
        os.rmdir(fresh)
    return noted


def _usable(directory: Path, passed: list[str], *, parents: bool = True) -> bool:
    """Whether `directory` is, or could be made, private to this user; why not goes in `passed`."""
    try:
        if parents:
            directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        passed.append(f"cannot create {directory}: {exc.strerror}")
        return False
    why = _not_private(directory)
    if why is not None:
        passed.append(f"{directory} {why}")
    return why is None


def _fits(directory: Path) -> bool:
    """Whether a socket's name in `directory` fits in AF_UNIX's address."""
    return len(os.fsencode(directory / f"{'0' * 32}.sock")) <= SUN_PATH


def _private(directory: Path) -> bool:
    return _not_private(directory) is None


def _not_private(directory: Path) -> str | None:
    """Why `directory` is not a directory of this user's that no one else can enter, or None."""
    try:
        status = directory.lstat()  # a symlink is judged as itself, never followed
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(status.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(status.st_mode):
        return "is not a directory"
    if status.st_uid != os.getuid():
        return f"is owned by uid {status.st_uid}, not this user ({os.getuid()})"
    if status.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"is open to others (mode {stat.S_IMODE(status.st_mode):o}, not 700)"
    return None
