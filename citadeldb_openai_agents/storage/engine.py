"""The open file and its owner thread: the one place that calls citadeldb's `Database`.

citadeldb pins a `Database` to the thread that opened it, and one process owns a
file. So each file is opened once, on a dedicated owner thread that also runs
every file-level call (close, verify_passphrase, backup, integrity check);
the `Memory` handle it hands out works from any thread and releases the GIL,
so session reads and writes run in worker threads in parallel.

Between `connect` and `Database.memory()`, which deletes the rows of atoms it cannot
read, the file is audited (audit.py): its one chance to be checked before anything is
changed. Every entry point first checks that it runs in the process that opened the
file (`ForkedStoreError` otherwise): a forked child inherits the open file but not its
owner thread, and citadeldb detects no fork (registry.py keeps the child from ever
dropping what it inherited).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import citadeldb

from ..errors import (
    DatabaseNotFoundError,
    ForkedStoreError,
    SessionClosedError,
    WrongPassphraseError,
)
from ..options import StoreOptions
from . import inventory
from .codec import ITEM_KIND
from .files import COMPANION_SUFFIXES, locked_by_this_process, opening, private_files
from .memory_handle import MemoryHandle
from .process_state import current_pid
from .translate import companions_missing, translate_open_error, translate_storage_error

_log = logging.getLogger("citadeldb_openai_agents")

T = TypeVar("T")

# Runs on the owner thread between `connect` and `Database.memory()`.
BeforeMemory = Callable[[citadeldb.Database, str], Any]

FORK_ADVICE = (
    "Leave serve on (the default) in the parent, and the child's store becomes a client of it; or "
    "open the store in each process after the fork, not in the parent before it: with "
    "gunicorn, run without --preload, or open it in a post_fork hook or on the first "
    "request; with uvicorn, open it in the app's lifespan; with multiprocessing, use the "
    '"spawn" start method. One process owns a Citadel file at a time.'
)


def database_options(options: StoreOptions) -> citadeldb.DatabaseOptions:
    """Citadel's options for opening (the profile applies to a new file only, the sync mode to this open)."""
    return citadeldb.DatabaseOptions(
        argon2_profile=options.argon2_profile, sync_mode=options.sync_mode, cache_size=options.cache_size
    )


class OpenDatabase:
    """A Citadel file held open by this process: its owner thread and `Memory` handle."""

    def __init__(
        self,
        path: str,
        key: str,
        options: citadeldb.DatabaseOptions | None = None,
        before_memory: BeforeMemory | None = None,
    ) -> None:
        # The owner thread takes the passphrase out of `secret` and forgets it once the
        # file is open; neither this frame nor the thread object keeps it (see `acquire`).
        secret = [key]
        del key
        try:
            self._start(path, secret, options, before_memory)
        finally:
            secret.clear()

    def _start(
        self,
        path: str,
        secret: list[str],
        options: citadeldb.DatabaseOptions | None,
        before_memory: BeforeMemory | None,
    ) -> None:
        self.path = path
        self.owner_pid = current_pid()
        self.references = 0
        self.audit: Any = None
        # The session layout shared by every store on this file (set by the first store).
        self.layout: Any = None
        # Work that must reach the file before it closes (search data waiting for a block).
        self.before_close: Callable[[Any], None] | None = None
        # Work of its own the file does in the background (the retention sweep), stopped first.
        self.stop_background: Callable[[], None] | None = None
        self.setup_lock = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable[[Any], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._closed = False
        self._in_flight = 0
        self._paused = False  # set by `exclusive`
        self._idle = threading.Condition()
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            raise DatabaseNotFoundError(
                f"cannot create {path}: the directory {directory} does not exist. "
                "Create it first (mkdir -p) or choose another path."
            )
        opened: Future[tuple[citadeldb.Database, Any]] = Future()
        self._thread = threading.Thread(
            target=self._own,
            args=(secret, options, before_memory, opened),
            name=f"citadel-owner:{os.path.basename(path)}",
            daemon=True,
        )
        self._thread.start()
        self._db, self.memory = opened.result()

    def _own(
        self,
        secret: list[str],
        options: citadeldb.DatabaseOptions | None,
        before_memory: BeforeMemory | None,
        opened: Future[Any],
    ) -> None:
        key = secret.pop()
        new = not os.path.exists(self.path)
        # A new file's companions are made by connect and by the memory engine: all 0600.
        with private_files() if new else nullcontext():
            try:
                with opening(self.path):
                    db = citadeldb.connect(self.path, key=key, region_keys=True, options=options)
            except BaseException as exc:  # handed to the opener, re-raised there
                opened.set_exception(translate_open_error(exc, self.path))
                return
            finally:
                del key
            try:
                refuse_lost_key_files(db, self.path)
                if before_memory is not None:
                    self.audit = before_memory(db, self.path)
                # Opening the memory engine reads pages: a damaged file can fail here, after
                # connect succeeded. The opener must get the error, and the file its lock back.
                memory = MemoryHandle(db.memory(), self.path)
            except BaseException as exc:
                db.close()
                opened.set_exception(translate_open_error(exc, self.path))
                return
        opened.set_result((db, memory))  # LocalFile chmods the new file's five once its layout is made
        while True:
            call = self._calls.get()
            if call is None:
                return
            function, result = call
            try:
                result.set_result(function(db))
            except BaseException as exc:
                result.set_exception(exc)

    @property
    def forked(self) -> bool:
        """True in a process forked from the one that opened the file."""
        return self.owner_pid != current_pid()

    def check_process(self) -> None:
        """Raise `ForkedStoreError` unless this is the process that opened the file.

        Entry points call it before anything else: in a forked child the owner thread
        is gone (a call handed to it would wait forever), another thread may have held
        any of our locks at the fork, and Citadel's inherited handle damages the file.
        """
        if self.forked:
            raise self.forked_error()

    def forked_error(self, *, opening: bool = False) -> ForkedStoreError:
        """The error for a use of this file in a forked process (or a new open there)."""
        return forked_error(self.path, self.owner_pid, opening=opening)

    def on_owner_thread(self, function: Callable[[citadeldb.Database], T]) -> T:
        """Run a file-level call on the thread that owns the `Database`."""
        self.check_process()
        if self._closed:
            raise SessionClosedError(f"{self.path} is closed")
        result: Future[T] = Future()
        self._calls.put((function, result))
        try:
            return result.result()
        except citadeldb.CitadelError as exc:
            raise translate_storage_error(exc, self.path) from exc

    def alone(self, function: Callable[[citadeldb.Database], T]) -> T:
        """`on_owner_thread`, with no memory operation under way meanwhile.

        For Citadel's calls that take the file's write transaction themselves: its page check
        (`integrity_check`) and a passphrase change. Beside a memory write on another thread
        either fails ("a write transaction is already active") and makes that write fail too:
        `verify` during 8 threads' appends failed 6 times in 6, and some appends with it.
        """
        with self.exclusive():
            return self.on_owner_thread(function)

    def region_rows(self, names: list[str], kind: str = ITEM_KIND) -> dict[str, dict[int, int | None]]:
        """The rows of `kind` the file's pages hold for these regions (atom id -> expiry in µs, or None)."""
        return self.on_owner_thread(lambda db: inventory.region_rows(db, names, kind))

    @property
    def region_writes(self) -> dict[str | None, int]:
        """How many calls may have changed each region since the file opened (`MemoryHandle.writes`)."""
        handle: MemoryHandle | None = self.memory
        assert handle is not None, "the file is open"
        return handle.writes

    @contextmanager
    def operation(self) -> Iterator[citadeldb.memory.Memory]:
        """Hold the file open for one memory operation; `close` waits for it to finish.

        No fork check here: the public call that leads here made it (store.py, session.py), and
        the owner's own threads, which also come here, do not exist in a forked child.
        """
        with self._idle:
            while self._paused and not self._closed:
                self._idle.wait()
            if self._closed:
                raise SessionClosedError(f"the store for {self.path} is closed")
            self._in_flight += 1
        try:
            yield self.memory
        except citadeldb.CitadelError as exc:
            translated = translate_storage_error(exc, self.path)
            if translated is exc:
                raise
            try:
                raise translated from exc
            finally:
                # Else this frame and the error hold each other (and, through the
                # traceback, `memory`): the file would stay locked until a gc pass.
                del translated
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Run no memory operation while this is held; wait for those under way first.

        For file-level work that must see the file still (a backup and its audit log).
        """
        self.check_process()
        with self._idle:
            while self._paused:
                self._idle.wait()
            self._paused = True
            while self._in_flight:
                self._idle.wait()
        try:
            yield
        finally:
            with self._idle:
                self._paused = False
                self._idle.notify_all()

    def check_same_passphrase(self, key: str) -> None:
        keys = [key]
        del key  # see `acquire`
        try:
            same = self.on_owner_thread(lambda db: db.verify_passphrase(keys[0]))
        finally:
            keys.clear()
        if not same:
            raise WrongPassphraseError(
                f"{self.path} is already open in this process with a different passphrase.",
                ": use the same passphrase for every store and session on one file "
                "(or a separate file per passphrase).",
            )

    def close(self) -> None:
        """Close the file once the operations under way have finished; free its lock."""
        stop, self.stop_background = self.stop_background, None
        if stop is not None:
            stop()  # before anything waits on the operations under way, a sweep's among them
        finish, self.before_close = self.before_close, None
        if finish is not None and not self._closed:
            try:
                with self.operation() as memory:
                    finish(memory)
            except Exception:
                # Nothing is lost: what was not stored is rebuilt from the items when needed.
                _log.warning(
                    "could not finish pending work on %s before closing it", self.path, exc_info=True
                )
        with self._idle:
            self._closed = True
            while self._in_flight:
                self._idle.wait()
        self._close_file()

    def _close_file(self) -> None:
        # The lock must show while the file is open, or the probe cannot be trusted here.
        probe_works = locked_by_this_process(self.path)
        result: Future[None] = Future()
        self._calls.put((lambda db: db.close(), result))
        self._calls.put(None)
        try:
            result.result()
        finally:
            self._thread.join()
            # Citadel keeps the file lock until every Memory object is collected too.
            self.memory.release()
            self.memory = None
            self._db = None  # type: ignore[assignment]
            # A `Memory` only a reference cycle holds keeps the lock until it is collected; a
            # full collection costs 0.1-0.3 s in a big process, so it runs only when needed.
            if not probe_works or locked_by_this_process(self.path):
                gc.collect()

    @property
    def closed(self) -> bool:
        return self._closed

    def keep_citadel_objects_forever(self) -> None:
        """Make sure this process never drops its `Database` and `Memory` of the file.

        For a forked child: dropping the last reference to either runs Citadel's close,
        which appends to the file's audit log (measured: in the parent's file, that broke
        the log's HMAC chain), and interpreter shutdown drops whatever module globals
        hold. A reference count of our own, never given back, keeps them until the
        process ends; the memory they hold is the parent's pages, shared copy-on-write.
        """
        memory = self.memory._memory if self.memory is not None else None
        for handle in (self._db, memory):
            if handle is not None:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<OpenDatabase {self.path!r} {state}>"


def forked_error(path: str, owner_pid: int, *, opening: bool = False) -> ForkedStoreError:
    """The error for a use of `path` in a process forked from `owner_pid` (or a new open there)."""
    if opening:
        cause = (
            f"cannot open {path} in process {current_pid()}: process {owner_pid} held it (or was "
            "opening it) when this process was forked from it, and that parent still holds the "
            "file; opening it here would use the forked copy of the parent's open file"
        )
    else:
        cause = f"{path} was opened by process {owner_pid}, and this is process {current_pid()}, a fork of it"
    return ForkedStoreError(
        f"{cause}. A forked copy of an open Citadel file cannot be used: its writes "
        f"would damage the file. {FORK_ADVICE}",
        path,
        owner_pid,
    )


def refuse_lost_key_files(db: citadeldb.Database, path: str) -> None:
    """Refuse a file whose regions exist but whose ``-regions`` or ``-atomkeys`` key file is gone.

    Measured on citadeldb 2.7.0: `Database.memory()` then treats every region (or
    atom) as erased and rewrites the file, so restoring the lost file afterwards no
    longer brings the data back. A fresh file has no regions yet (and no key files),
    which is why the tables are asked first.
    """
    missing = [path + suffix for suffix in COMPANION_SUFFIXES[1:] if not os.path.exists(path + suffix)]
    if not missing:
        return
    tables = set(db.tables())
    if inventory.REGION_TABLE not in tables:  # the memory engine never ran on this file
        return
    regions = db.query(f"SELECT count(*) FROM {inventory.REGION_TABLE}").rows[0][0]
    if regions:
        raise companions_missing(path, missing)
