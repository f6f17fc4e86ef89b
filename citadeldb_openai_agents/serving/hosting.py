"""The files this process serves: one server per file, shared by the stores that own it here.

Also the mark an owner that does not serve leaves for the others, so that a process
finding the file held knows at once that waiting for a socket is useless.
"""

from __future__ import annotations

import contextlib
import os
import threading

from ..storage.local import LocalFile
from ..storage.process import current_pid
from .address import exclusive_marker, socket_path
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


def is_exclusive(path: str) -> bool:
    return os.path.exists(exclusive_marker(path))


def start_serving(path: str, local: LocalFile, authkey: bytes, ttl: float | None) -> None:
    with _lock:
        server, users = _served.get(path, (None, 0))
        if server is None:
            server = Server(local, socket_path(path), authkey, ttl=ttl)
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


def restart_serving(path: str, local: LocalFile, authkey: bytes, ttl: float | None) -> None:
    """Serve again under a new key (after a passphrase change)."""
    with _lock:
        if path not in _served:
            return
        server, users = _served[path]
        server.close()
        _served[path] = (Server(local, socket_path(path), authkey, ttl=ttl), users)


def serves(path: str) -> bool:
    """Whether this process serves the file (or, in a forked child, its parent did)."""
    with _lock:
        return path in _served


def clients_of(path: str) -> int:
    """How many client connections the file's server has now (0 when not served here)."""
    with _lock:
        return _served[path][0].clients if path in _served else 0
