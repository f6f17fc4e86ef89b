"""The files that make one Citadel database, and the path two openers of it agree on."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from ..results import PageLayout, Progress
from .process_state import UMASK, at_fork

# Citadel keeps these beside the database file; without any of them the data cannot be
# decrypted, so they are backed up, restored and moved together.
COMPANION_SUFFIXES = (".citadel-keys", ".citadel-regions", ".citadel-atomkeys")
AUDIT_SUFFIX = ".citadel-audit"  # Citadel's audit log: not needed to open the file


# citadeldb 2.7.0's file (measured by altering bytes and reading which page Citadel names):
# a 512-byte header (magic, format, page size, two commit slots), then the pages, counted from 0.
HEADER_BYTES = 512
_MAGIC = 0xC17AD3E1  # the header's first 4 bytes, little-endian; bytes 8-11 give the page size


def page_layout(path: str, high_water_mark: int = 0) -> PageLayout | None:
    """Where `path`'s pages lie, pages 0 to `high_water_mark` - 1 in use (`db.stats()`); None if
    the header does not say (a file too damaged, or not Citadel's)."""
    try:
        with open(path, "rb") as file:
            header, size = file.read(12), os.fstat(file.fileno()).st_size
    except OSError:
        return None
    if len(header) < 12 or int.from_bytes(header[:4], "little") != _MAGIC:
        return None
    return PageLayout(HEADER_BYTES, int.from_bytes(header[8:12], "little"), high_water_mark, size)


# The first bytes of every Citadel database file (citadeldb 2.7.0).
CITADEL_MAGIC = b"\xe1\xd3\x7a\xc1"


def is_citadel_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` begins as a Citadel database file does."""
    with open(path, "rb") as file:
        return file.read(len(CITADEL_MAGIC)) == CITADEL_MAGIC


def resolve_path(path: str | os.PathLike[str]) -> str:
    """The canonical path two openers of one file agree on (relative, ``..``, symlinks resolved)."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def database_files(path: str) -> list[str]:
    """The file and every companion Citadel may keep beside it (they go together)."""
    return [path, *(path + suffix for suffix in (*COMPANION_SUFFIXES, AUDIT_SUFFIX))]


@contextmanager
def opening(path: str) -> Iterator[None]:
    """Held around Citadel's connect: a file being created is never opened half made.

    Citadel creates the file, then its key file, with no lock between processes until
    it is done: a second process that opened it meanwhile failed with "File exists" or
    found the key file missing (measured: 6 starts of 8 with four processes at once,
    as ``uvicorn --workers 4`` starts on a new file). So a process that finds the file
    or its key file missing creates it under an exclusive lock on the directory, and
    every other open waits for that with a shared lock (opens of whole files run in
    parallel). Where the directory cannot be locked, nothing is waited for.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no flock (nor a umask that means the same)
        yield
        return
    complete = all(os.path.exists(name) for name in (path, path + COMPANION_SUFFIXES[0]))
    try:
        descriptor = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with suppress(OSError):  # a file system without flock: as before
            fcntl.flock(descriptor, fcntl.LOCK_SH if complete else fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


_umask_lock = threading.RLock()  # a new file's open nests the creation's own


def _take_umask_lock() -> None:
    _umask_lock.acquire()


def _give_umask_lock() -> None:
    _umask_lock.release()


def _new_umask_lock() -> None:
    global _umask_lock
    _umask_lock = threading.RLock()  # the parent's was taken before the fork: the child gets its own


# A child forked while another thread held it would wait for it forever at its first new file.
at_fork(UMASK, before=_take_umask_lock, after_in_parent=_give_umask_lock, after_in_child=_new_umask_lock)


@contextmanager
def private_files() -> Iterator[None]:
    """Files created meanwhile are 0600 whatever the umask: a database, its companions, a backup.

    Citadel creates them with the process's umask (022 makes them 0644: any local user could
    copy them and guess the passphrase offline). The umask is the process's, so another
    thread creating a file meanwhile gets the stricter mode too, never a looser one.
    """
    with umask(0o077):
        yield


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process's umask set to `mask` meanwhile; one change at a time, so two threads
    restoring each other's value can never leave the process with the wrong one."""
    with _umask_lock:
        previous = os.umask(mask)
        try:
            yield
        finally:
            os.umask(previous)


def make_private(path: str) -> None:
    """chmod 0600 the database's files that exist (after they were created: a directory's ACL
    or a file system that ignores the umask must not leave them open)."""
    for name in database_files(path):
        with suppress(FileNotFoundError):
            os.chmod(name, 0o600, follow_symlinks=False)


def locked_by_this_process(path: str) -> bool:
    """Whether this process still holds Citadel's lock on `path` (a ``flock`` of the file).

    Read from Linux's /proc/locks, which costs microseconds; True wherever that cannot be
    read (another system), so a caller that then collects garbage is safe. A caller asks
    while the file is open too: False then means this system shows the lock otherwise (a
    file system that reports other device numbers), and the answer cannot be trusted.
    """
    try:
        found = os.stat(path)
        with open("/proc/locks", encoding="ascii") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return True
    device = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    pid = str(os.getpid())
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, listed after the lock it waits on
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4] == pid and fields[5] == device:
            return True
    return False


def database_size(path: str) -> int:
    """Bytes of the file and its companions."""
    return sum(os.path.getsize(name) for name in database_files(path) if os.path.isfile(name))


_PAGE_SIZE = 8192  # citadeldb 2.7's page (measured: a copy is 8 KiB x high_water_mark, plus a header)


@contextmanager
def copy_watched(
    source: str, target: str, progress: Progress | None, used_pages: int | None
) -> Iterator[None]:
    """Report a copy's progress by its size, polled from another thread: Citadel's backup is one call."""
    if progress is None:
        yield
        return
    callback = progress
    total = database_size(source)
    if used_pages is not None:
        # The copy holds the used pages only, and the companions as they are.
        total += used_pages * _PAGE_SIZE - os.path.getsize(source)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            callback(min(database_size(target), total), total)

    watcher = threading.Thread(target=watch, name="citadel-backup-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
    callback(total, total)
