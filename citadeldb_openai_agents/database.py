"""One open Citadel file per process, owned by a thread of its own.

citadeldb pins a `Database` to the thread that opened it, and one process owns a
file. So each file is opened once, on a dedicated owner thread that also runs
every file-level call (close, verify_passphrase, backup, integrity check);
the `Memory` handle it hands out works from any thread and releases the GIL,
so session reads and writes run in worker threads in parallel.

Stores on the same resolved path (relative, ``..`` or symlink) share one
`OpenDatabase`; the last store to close it closes the file.
"""

from __future__ import annotations

import gc
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import citadeldb

from .errors import (
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EmptyPassphraseError,
    SessionClosedError,
    WrongPassphraseError,
)

T = TypeVar("T")

_registry: dict[str, OpenDatabase] = {}
_registry_lock = threading.Lock()


def resolve_path(path: str | os.PathLike[str]) -> str:
    """The canonical path two openers of one file agree on."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def check_passphrase(key: str | None) -> str:
    """Refuse a missing or empty passphrase before anything touches the disk."""
    if key is None or (isinstance(key, str) and not key):
        raise EmptyPassphraseError(
            "the passphrase is empty: Citadel would encrypt the file with an empty key. "
            "Pass key=... (in deployments, set CITADEL_KEY or CITADEL_KEY_FILE)."
        )
    if not isinstance(key, str):
        raise TypeError(f"the passphrase must be a str, not {type(key).__name__}")
    return key


def acquire(
    path: str | os.PathLike[str],
    key: str,
    options: citadeldb.DatabaseOptions | None = None,
) -> OpenDatabase:
    """Open `path` (or join the process's open handle to it) and take a reference."""
    check_passphrase(key)
    resolved = resolve_path(path)
    with _registry_lock:
        database = _registry.get(resolved)
        if database is None:
            database = OpenDatabase(resolved, key, options)
            _registry[resolved] = database
        else:
            database.check_same_passphrase(key)
        database.references += 1
        return database


class OpenDatabase:
    """A Citadel file held open by this process: its owner thread and `Memory` handle."""

    def __init__(
        self, path: str, key: str, options: citadeldb.DatabaseOptions | None = None
    ) -> None:
        self.path = path
        self.references = 0
        # The session layout shared by every store on this file (set by the first store).
        self.layout: Any = None
        self.setup_lock = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable[[Any], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        self._in_flight = 0
        self._idle = threading.Condition()
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            raise DatabaseNotFoundError(
                f"cannot create {path}: the directory {directory} does not exist. "
                "Create it first (mkdir -p) or choose another path."
            )
        opened: Future[tuple[citadeldb.Database, Any]] = Future()
        self._thread = threading.Thread(
            target=self._own, args=(key, options, opened), name=f"citadel-owner:{os.path.basename(path)}",
            daemon=True,
        )
        self._thread.start()
        self._db, self.memory = opened.result()

    def _own(
        self, key: str, options: citadeldb.DatabaseOptions | None, opened: Future[Any]
    ) -> None:
        try:
            db = citadeldb.connect(self.path, key=key, region_keys=True, options=options)
        except BaseException as exc:  # handed to the opener, re-raised there
            opened.set_exception(translate_open_error(exc, self.path))
            return
        del key
        opened.set_result((db, db.memory()))
        while True:
            call = self._calls.get()
            if call is None:
                return
            function, result = call
            try:
                result.set_result(function(db))
            except BaseException as exc:
                result.set_exception(exc)

    def on_owner_thread(self, function: Callable[[citadeldb.Database], T]) -> T:
        """Run a file-level call on the thread that owns the `Database`."""
        if self._closed:
            raise SessionClosedError(f"{self.path} is closed")
        result: Future[T] = Future()
        self._calls.put((function, result))
        return result.result()

    @contextmanager
    def operation(self) -> Iterator[citadeldb.memory.Memory]:
        """Hold the file open for one memory operation; `close` waits for it to finish."""
        with self._idle:
            if self._closed:
                raise SessionClosedError(f"the store for {self.path} is closed")
            self._in_flight += 1
        try:
            yield self.memory
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def check_same_passphrase(self, key: str) -> None:
        if not self.on_owner_thread(lambda db: db.verify_passphrase(key)):
            raise WrongPassphraseError(
                f"{self.path} is already open in this process with a different passphrase. "
                "Use the same passphrase for every store and session on one file "
                "(or a separate file per passphrase)."
            )

    def release(self) -> None:
        """Drop one reference; the last one closes the file and frees its lock."""
        with _registry_lock:
            self.references -= 1
            if self.references > 0:
                return
            _registry.pop(self.path, None)
        with self._idle:
            self._closed = True
            while self._in_flight:
                self._idle.wait()
        self._close_file()

    def _close_file(self) -> None:
        result: Future[None] = Future()
        self._calls.put((lambda db: db.close(), result))
        self._calls.put(None)
        try:
            result.result()
        finally:
            self._thread.join()
            # Citadel keeps the file lock until every Memory handle is collected too.
            self.memory = None  # type: ignore[assignment]
            self._db = None  # type: ignore[assignment]
            gc.collect()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<OpenDatabase {self.path!r} {state}>"


def translate_open_error(exc: BaseException, path: str) -> BaseException:
    """Turn citadeldb's errors on open into ours, each naming the cause and the fix."""
    message = str(exc).lower()
    if isinstance(exc, citadeldb.EncryptionError):
        return WrongPassphraseError(
            f"wrong passphrase for {path}: it does not decrypt this file. Check CITADEL_KEY / "
            "CITADEL_KEY_FILE (the file was left untouched)."
        )
    if isinstance(exc, citadeldb.OperationalError) and "locked" in message:
        return DatabaseLockedError(
            f"{path} is held by another process: one process owns a Citadel file at a time. "
            "Stop the other process (or run this work inside it through its store), then retry."
        )
    if isinstance(exc, citadeldb.IntegrityError):
        return CorruptDatabaseError(
            f"{path} is damaged ({exc}). Run `python -m citadeldb_openai_agents verify` for a "
            "report, and restore the file and its companion files from a backup."
        )
    if isinstance(exc, (FileNotFoundError, citadeldb.CitadelError)) and (
        "no such file" in message or "not found" in message or "missing" in message
    ):
        return DatabaseNotFoundError(
            f"cannot open {path}: {exc}. A Citadel file comes with companion files "
            "(.citadel-keys, -regions, -atomkeys); restore them together from a backup."
        )
    return exc
