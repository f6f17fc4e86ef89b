"""The files this process serves: one server per file, shared by the stores that own it here.

Also the mark an owner that does not serve leaves for the others, so that a process
finding the file held knows at once that waiting for a socket is useless.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from ..storage.local import LocalFile
from ..storage.process import current_pid, gone
from .address import exclusive_marker, opening_marker, socket_path
from .protocol import Terms
from .server import Server

_served: dict[str, tuple[Server, int]] = {}  # resolved path -> (server, stores using it)

_lock = threading.Lock()


def mark_exclusive(path: str, held: bool) -> None:
    """Tell the processes that find the file held that its owner does not serve it.

    Read only while the file's lock is held, so one left by an owner that was killed
    misleads no one: the next opener gets the lock and replaces it.
    """
    marker = exclusive_marker(path)
    if held:
        with open(marker, "w", encoding="utf-8") as file:
            file.write(str(current_pid()))
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)


@contextlib.contextmanager
def opening(path: str) -> Iterator[None]:
    """Mark this process as opening the file, until it serves it (or fails to).

    Opening a big file takes seconds (the open-time audit reads every row: 1.6-1.8 s at
    70,000 items), during which this process may hold the lock and serve no one yet. A
    process that finds the lock held by a process with this mark waits for it instead of
    taking it for one that never serves.
    """
    marker = opening_marker(path, current_pid())
    with open(marker, "w", encoding="utf-8"):
        pass
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)


def is_opening(path: str, pid: int) -> bool:
    """Whether process `pid` is alive and opening the file (see `opening`)."""
    return os.path.exists(opening_marker(path, pid)) and not gone(pid)


def is_exclusive(path: str) -> bool:
    return os.path.exists(exclusive_marker(path))


def start_serving(path: str, local: LocalFile, authkey: bytes, terms: Terms) -> None:
    with _lock:
        server, users = _served.get(path, (None, 0))
        if server is None:
            server = Server(local, socket_path(path), authkey, terms=terms)
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


def restart_serving(path: str, local: LocalFile, authkey: bytes, terms: Terms) -> None:
    """Serve again under a new key (after a passphrase change)."""
    with _lock:
        if path not in _served:
            return
        server, users = _served[path]
        server.close()
        _served[path] = (Server(local, socket_path(path), authkey, terms=terms), users)


def serves(path: str) -> bool:
    """Whether this process serves the file (or, in a forked child, its parent did)."""
    with _lock:
        return path in _served


def clients_of(path: str) -> int:
    """How many client connections the file's server has now (0 when not served here)."""
    with _lock:
        return _served[path][0].clients if path in _served else 0
