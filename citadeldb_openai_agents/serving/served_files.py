"""The files this process serves: one server per file, shared by the stores that own it here.

Also the mark a process leaves while it opens a file, so that one finding the file held
by it waits for it to serve instead of taking it for a process that never will.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from ..options import StoreOptions
from ..storage.local_file import LocalFile
from ..storage.process_state import HOSTING, at_fork, current_pid, gone
from .address import SocketKey, opening_marker, socket_path
from .server import Server

_served: dict[str, tuple[Server, int]] = {}  # resolved path -> (server, stores using it)

_lock = threading.Lock()


def _before_fork() -> None:
    # A server is built under this lock (its stale-socket sweep probes for up to 1 s): a child
    # forked meanwhile must not inherit it held by a thread it does not have.
    _lock.acquire()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


at_fork(
    HOSTING, before=_before_fork, after_in_parent=lambda: _lock.release(), after_in_child=_after_fork_in_child
)


@contextlib.contextmanager
def opening(path: str, socket_dir: str | None = None) -> Iterator[None]:
    """Mark this process as opening the file, until it serves it (or fails to).

    Opening a big file takes seconds (the open-time audit reads every row: 1.6-1.8 s at
    70,000 items), during which this process may hold the lock and serve no one yet. A
    process that finds the lock held by a process with this mark waits for it instead of
    taking it for one that never serves.
    """
    marker = opening_marker(path, current_pid(), socket_dir)
    with open(marker, "w", encoding="utf-8"):
        pass
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)


def is_opening(path: str, pid: int, socket_dir: str | None = None) -> bool:
    """Whether process `pid` is alive and opening the file (see `opening`)."""
    return os.path.exists(opening_marker(path, pid, socket_dir)) and not gone(pid)


def start_serving(path: str, local: LocalFile, key: SocketKey, terms: StoreOptions) -> None:
    with _lock:
        server, users = _served.get(path, (None, 0))
        if server is None:
            server = Server(local, socket_path(path, terms.socket_dir), key, terms=terms)
        _served[path] = (server, users + 1)


def stop_serving(path: str) -> None:
    with _lock:
        if path not in _served:
            return
        server, users = _served[path]
        if users > 1:
            _served[path] = (server, users - 1)
            return
        del _served[path]
    server.close()


def restart_serving(path: str, local: LocalFile, key: SocketKey, terms: StoreOptions) -> None:
    """Serve again under a new key (after a passphrase change)."""
    with _lock:
        if path not in _served:
            return
        server, users = _served[path]
        server.close()
        _served[path] = (Server(local, socket_path(path, terms.socket_dir), key, terms=terms), users)


def rotated(path: str, passphrase: bytes) -> None:
    """This process's server of `path` proves the new passphrase from now on (its clients stay)."""
    with _lock:
        served = _served.get(path)
    if served is not None:
        served[0].rotated(passphrase)


def serves(path: str) -> bool:
    """Whether this process serves the file (or, in a forked child, its parent did)."""
    with _lock:
        return path in _served
