"""The files this process holds open: one `OpenDatabase` per file, shared by its stores.

Stores on the same resolved path (relative, ``..`` or symlink) share one open
file; the last store to let go closes it. Around a fork, the registry is kept
consistent, and in the child every file the parent held (or was closing) stays
registered, so a new open of it is refused: citadeldb would hand the child the
parent's open file, lock and all (`ForkedStoreError`). The child also never lets
Citadel close or drop what it inherited.

No file is opened under the registry's lock: opening can take seconds (the audit reads
every row), and every other open, close and fork in the process would wait for it. An
opening entry per path makes a second store on the same file wait for the first
open (and join it) while stores on other files go on.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from typing import TypeVar

import citadeldb

from .. import telemetry
from ..errors import CitadelSessionError, CorruptDatabaseError
from ..options import check_passphrase
from .engine import BeforeMemory, OpenDatabase, forked_error, refuse_lost_key_files
from .files import locked_by_this_process, resolve_path
from .process_state import REGISTRY, at_fork, current_pid
from .translate import translate_open_error, translate_storage_error

T = TypeVar("T")

_registry: dict[str, OpenDatabase] = {}
# Databases whose last store let go and whose close is still under way: a child forked
# meanwhile inherits them as much as those in `_registry` (see `_after_fork_in_child`).
_closing: set[OpenDatabase] = set()
_registry_lock = threading.Lock()


class _Opening:
    """A file one thread is opening: others wanting it wait for the outcome."""

    def __init__(self) -> None:
        self.opener_pid = current_pid()
        self.done = threading.Event()


_opening: dict[str, _Opening] = {}


def acquire(
    path: str | os.PathLike[str],
    key: str,
    options: citadeldb.DatabaseOptions | None = None,
    before_memory: BeforeMemory | None = None,
) -> OpenDatabase:
    """Open `path` (or join the process's open handle to it) and take a reference.

    `before_memory(db, path)` runs when this call opens the file; its result is kept
    as `OpenDatabase.audit`, and what it raises is raised here, the file closed.
    The passphrase is deleted from every frame it passed through, on every path: an
    error tracker that records a failed frame's locals must not record it.
    """
    try:
        check_passphrase(key)
        resolved = resolve_path(path)
        while True:
            with _registry_lock:
                database = _joined(resolved, key)
                if database is not None:
                    return database
                pending = _opening.get(resolved)
                if pending is None:
                    pending = _opening[resolved] = _Opening()
                    break
            pending.done.wait()  # then join what it opened, or try again if it failed
        try:
            database = OpenDatabase(resolved, key, options, before_memory)
        except BaseException as exc:
            with _registry_lock:
                _opening.pop(resolved, None)
            pending.done.set()
            if isinstance(exc, CorruptDatabaseError):  # an operator acts on this: logged and counted
                telemetry.events.damaged(resolved, getattr(exc, "logged", str(exc)))
                telemetry.metrics.open_refused(resolved)
            raise
        with _registry_lock:
            _registry[resolved] = database
            database.references += 1
            _opening.pop(resolved, None)
        pending.done.set()
        return database
    finally:
        del key


def _joined(resolved: str, key: str) -> OpenDatabase | None:
    """The open file at `resolved` with one more reference, if this process holds it (under the lock)."""
    try:
        database = _registry.get(resolved)
        pending = _opening.get(resolved)
        if database is not None and database.forked:
            # citadeldb would join the engine this process inherited, lock and all.
            raise database.forked_error(opening=True)
        if pending is not None and pending.opener_pid != current_pid():
            raise forked_error(resolved, pending.opener_pid, opening=True)  # forked mid-open
        if database is None:
            return None
        database.check_same_passphrase(key)
        database.references += 1
        return database
    finally:
        del key  # see `acquire`: error trackers record a failed frame's locals


def inspect_file(
    path: str | os.PathLike[str], key: str, inspect: Callable[[citadeldb.Database, str], T]
) -> T:
    """Open a file without its memory engine, run `inspect(db, path)`, close it: nothing is changed.

    For a file that refuses to open for use (a damaged one): Citadel's memory engine
    would delete what it cannot read. Raises `CitadelSessionError` if this process
    holds the file open already (inspect that open store instead).
    """
    try:
        check_passphrase(key)
        resolved = resolve_path(path)
        with _registry_lock:
            if resolved in _registry or resolved in _opening:
                raise CitadelSessionError(
                    f"{resolved} is open in this process; call verify() on its store instead."
                )
        try:
            db = citadeldb.connect(resolved, key=key, region_keys=True)
        except BaseException as exc:
            raise translate_open_error(exc, resolved) from None
    finally:
        del key  # see `acquire`
    try:
        refuse_lost_key_files(db, resolved)
        return inspect(db, resolved)
    except citadeldb.CitadelError as exc:
        raise translate_storage_error(exc, resolved) from None
    finally:
        probe_works = locked_by_this_process(resolved)  # the lock shows while the file is open
        db.close()
        if not probe_works or locked_by_this_process(resolved):
            gc.collect()  # the maintenance handles inspect made hold the file until collected


def release(database: OpenDatabase) -> None:
    """Drop one store's reference to `database`; the last one closes the file and frees its lock."""
    database.check_process()
    with _registry_lock:
        database.references -= 1
        if database.references > 0:
            return
        _registry.pop(database.path, None)
        _closing.add(database)
    try:
        database.close()
    finally:
        with _registry_lock:
            _closing.discard(database)


def _before_fork() -> None:
    # No thread may be opening or closing a file while the process is copied: the child
    # must find every file the parent holds (or is closing) in `_registry` or `_closing`.
    _registry_lock.acquire()


def _after_fork_in_parent() -> None:
    _registry_lock.release()


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()  # the parent's is held by the forking thread
    # Files being closed are inherited too; `acquire` must refuse them like open ones (and
    # those being opened: their entries in `_opening` name the parent).
    for database in _closing:
        _registry.setdefault(database.path, database)
    _closing.clear()
    for database in _registry.values():
        database.keep_citadel_objects_forever()


at_fork(
    REGISTRY, before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
