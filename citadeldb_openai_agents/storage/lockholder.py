"""Which process holds a Citadel file: its PID and, shortened, its command line.

Citadel locks a file with ``flock``; Linux lists every such lock in ``/proc/locks``
as ``FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> ...``, the device numbers in
hex. Elsewhere (another OS, a /proc this process may not read, a lock taken in
another PID namespace) the holder cannot be known, and `find_lock_holder` says so
with None.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..results import LockHolder

PROC = Path("/proc")
_MAX_COMMAND = 60


def find_lock_holder(path: str | os.PathLike[str]) -> LockHolder | None:
    """The process holding a ``flock`` on `path`, or None when that cannot be known."""
    try:
        status = os.stat(path)
        locks = (PROC / "locks").read_text()
    except OSError:
        return None
    wanted = (os.major(status.st_dev), os.minor(status.st_dev), status.st_ino)
    for line in locks.splitlines():
        fields = line.split()
        # A waiter's line reads "1: -> FLOCK ...": it does not hold the lock, so it never matches.
        if len(fields) < 6 or fields[1] != "FLOCK" or _file_id(fields[5]) != wanted:
            continue
        pid = int(fields[4]) if fields[4].isdigit() else 0
        # 0 or -1: the owner lives in another PID namespace, so its number means nothing here.
        if pid <= 0:
            return None
        if not os.path.exists(PROC / str(pid)):
            # The process that took the lock has exited, and the lock lives on in the processes
            # that inherited its open file (a SIGKILLed gunicorn master's workers): name one.
            pid = _a_process_with_open(path) or pid
        return LockHolder(pid, _command(pid))
    return None


def _a_process_with_open(path: str | os.PathLike[str]) -> int | None:
    """A live process (of those this one may inspect) with `path` open, or None."""
    wanted = os.path.realpath(path)
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for descriptor in (entry / "fd").iterdir():
                if os.readlink(descriptor) == wanted:
                    return int(entry.name)
        except OSError:
            continue  # another user's, or gone meanwhile
    return None


def _file_id(field: str) -> tuple[int, int, int] | None:
    try:
        major, minor, inode = field.split(":")
        return int(major, 16), int(minor, 16), int(inode)
    except ValueError:
        return None


def _command(pid: int) -> str | None:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    return shorten_command(argv) if argv else None


def shorten_command(argv: list[str]) -> str:
    """The program and what it runs, never its other arguments.

    Another process's arguments can hold secrets (a passphrase, an API token), so
    only the program's name is kept, and for Python the module (``-m uvicorn``) or
    the script's name; "…" marks what was left out.
    """
    program = os.path.basename(argv[0])
    shown, rest = [program], argv[1:]
    if program.startswith("python"):
        for position, argument in enumerate(rest):
            if argument == "-m" and position + 1 < len(rest):
                shown += ["-m", rest[position + 1]]
                rest = rest[position + 2 :]
                break
            if argument == "-c":
                shown.append("-c")  # the code itself may hold anything
                rest = rest[position + 1 :]
                break
            if not argument.startswith("-"):
                shown.append(os.path.basename(argument))
                rest = rest[position + 1 :]
                break
    text = " ".join(shown)
    cut = text[:_MAX_COMMAND]
    return f"{cut} …" if rest or cut != text else text
