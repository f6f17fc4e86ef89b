"""One open Citadel file per process, owned by a thread of its own.

citadeldb pins a `Database` to the thread that opened it, and one process owns a
file. So each file is opened once, on a dedicated owner thread that also runs
every file-level call (close, verify_passphrase, backup, integrity check);
the `Memory` handle it hands out works from any thread and releases the GIL,
so session reads and writes run in worker threads in parallel.

Stores on the same resolved path (relative, ``..`` or symlink) share one
`OpenDatabase`; the last store to close it closes the file.

A forked child inherits the parent's open file but not its owner thread, and
citadeldb detects no fork: writes through the inherited handle return normally
and damage the file. So every entry point first checks that it runs in the
process that opened the file (`ForkedStoreError` otherwise), and the child
never lets Citadel close or drop what it inherited (see `_after_fork_in_child`).
"""

from __future__ import annotations

import ctypes
import gc
import os
import queue
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import citadeldb

from . import inventory
from .embedders import CITADEL_EMBEDDER_FAILURE, embedder_failed
from .errors import (
    CitadelSessionError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EmptyPassphraseError,
    ForkedStoreError,
    SessionClosedError,
    StorageError,
    WrongPassphraseError,
)
from .lock_holder import find_lock_holder

T = TypeVar("T")

_registry: dict[str, OpenDatabase] = {}
# Databases whose last store let go and whose close is still under way: a child forked
# meanwhile inherits them as much as those in `_registry` (see `_after_fork_in_child`).
_closing: set[OpenDatabase] = set()
_registry_lock = threading.Lock()
# This process's id, refreshed in a forked child by `_after_fork_in_child`. Every call
# checks it, several times; `os.getpid()` is a system call each time (measured ~450 ns
# on CPython 3.11 here, against ~30 ns to read this global).
_pid = os.getpid()

_FORK_ADVICE = (
    "Open the store in each process after the fork, not in the parent before it: with "
    "gunicorn, run without --preload, or open it in a post_fork hook or on the first "
    "request; with uvicorn, open it in the app's lifespan; with multiprocessing, use the "
    "\"spawn\" start method. One process owns a Citadel file at a time."
)


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


# Runs on the owner thread between `connect` and `Database.memory()`, which deletes the rows of
# atoms it cannot read: the file's one chance to be checked before anything is changed.
BeforeMemory = Callable[[citadeldb.Database, str], Any]


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
        with _registry_lock:
            database = _registry.get(resolved)
            if database is not None and database.forked:
                # citadeldb would join the engine this process inherited, lock and all.
                raise database.forked_error(opening=True)
            if database is None:
                database = OpenDatabase(resolved, key, options, before_memory)
                _registry[resolved] = database
            else:
                database.check_same_passphrase(key)
            database.references += 1
            return database
    finally:
        del key


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
            if resolved in _registry:
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
        _refuse_lost_key_files(db, resolved)
        return inspect(db, resolved)
    except citadeldb.CitadelError as exc:
        raise translate_storage_error(exc, resolved) from None
    finally:
        db.close()
        gc.collect()  # the maintenance handles inspect made hold the file until collected


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
        self.owner_pid = _pid
        self.references = 0
        self.audit: Any = None
        # The session layout shared by every store on this file (set by the first store).
        self.layout: Any = None
        self.setup_lock = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable[[Any], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
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
            target=self._own, args=(secret, options, before_memory, opened),
            name=f"citadel-owner:{os.path.basename(path)}", daemon=True,
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
        try:
            db = citadeldb.connect(self.path, key=key, region_keys=True, options=options)
        except BaseException as exc:  # handed to the opener, re-raised there
            opened.set_exception(translate_open_error(exc, self.path))
            return
        finally:
            del key
        try:
            _refuse_lost_key_files(db, self.path)
            if before_memory is not None:
                self.audit = before_memory(db, self.path)
            # Opening the memory engine reads pages: a damaged file can fail here, after
            # connect succeeded. The opener must get the error, and the file its lock back.
            memory = _MemoryHandle(db.memory(), self.path)
        except BaseException as exc:
            db.close()
            opened.set_exception(translate_open_error(exc, self.path))
            return
        opened.set_result((db, memory))
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
        return self.owner_pid != _pid

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
        if opening:
            cause = (
                f"cannot open {self.path} in process {_pid}: process {self.owner_pid} held it "
                "open when this process was forked from it, and that parent still holds the "
                "file; opening it here would use the forked copy of the parent's open file"
            )
        else:
            cause = (
                f"{self.path} was opened by process {self.owner_pid}, and this is process "
                f"{_pid}, a fork of it"
            )
        return ForkedStoreError(
            f"{cause}. A forked copy of an open Citadel file cannot be used: its writes "
            f"would damage the file. {_FORK_ADVICE}",
            self.path,
            self.owner_pid,
        )

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

    def region_rows(self, names: list[str]) -> dict[str, dict[int, int | None]]:
        """The rows the file's pages hold for these regions (atom id -> expiry in µs, or None)."""
        return self.on_owner_thread(lambda db: inventory.region_rows(db, names))

    @contextmanager
    def operation(self) -> Iterator[citadeldb.memory.Memory]:
        """Hold the file open for one memory operation; `close` waits for it to finish."""
        self.check_process()
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
                f"{self.path} is already open in this process with a different passphrase. "
                "Use the same passphrase for every store and session on one file "
                "(or a separate file per passphrase)."
            )

    def release(self) -> None:
        """Drop one reference; the last one closes the file and frees its lock."""
        self.check_process()
        with _registry_lock:
            self.references -= 1
            if self.references > 0:
                return
            _registry.pop(self.path, None)
            _closing.add(self)
        try:
            with self._idle:
                self._closed = True
                while self._in_flight:
                    self._idle.wait()
            self._close_file()
        finally:
            with _registry_lock:
                _closing.discard(self)

    def _close_file(self) -> None:
        result: Future[None] = Future()
        self._calls.put((lambda db: db.close(), result))
        self._calls.put(None)
        try:
            result.result()
        finally:
            self._thread.join()
            # Citadel keeps the file lock until every Memory object is collected too.
            self.memory.release()
            self.memory = None  # type: ignore[assignment]
            self._db = None  # type: ignore[assignment]
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


def _before_fork() -> None:
    # No thread may be opening or closing a file while the process is copied: the child
    # must find every file the parent holds (or is closing) in `_registry` or `_closing`.
    _registry_lock.acquire()


def _after_fork_in_parent() -> None:
    _registry_lock.release()


def _after_fork_in_child() -> None:
    global _pid, _registry_lock
    _pid = os.getpid()
    _registry_lock = threading.Lock()  # the parent's is held by the forking thread
    # Files being closed are inherited too; `acquire` must refuse them like open ones.
    for database in _closing:
        _registry.setdefault(database.path, database)
    _closing.clear()
    for database in _registry.values():
        database.keep_citadel_objects_forever()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


class _MemoryHandle:
    """The file's `Memory`, handed to every operation in its place.

    Citadel keeps a file locked until every `Memory` object of it is collected, and
    an error's traceback keeps the frames of the failed operation (with their
    ``memory`` argument) alive as long as the error lives, often in a reference
    cycle only a gc pass frees. Operations hold this handle instead, so closing
    the file drops the one real reference whatever errors are still around: the
    lock is released at once, and a reopen in this process reads the file afresh.
    """

    __slots__ = ("_memory", "_path")

    def __init__(self, memory: citadeldb.memory.Memory, path: str) -> None:
        self._memory: citadeldb.memory.Memory | None = memory
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if self._memory is None:
            raise SessionClosedError(f"{self._path} is closed")
        return getattr(self._memory, name)

    def release(self) -> None:
        self._memory = None


COMPANION_SUFFIXES = (".citadel-keys", ".citadel-regions", ".citadel-atomkeys")
AUDIT_SUFFIX = ".citadel-audit"  # Citadel's audit log: not needed to open the file


def database_files(path: str) -> list[str]:
    """The file and every companion Citadel may keep beside it (they go together)."""
    return [path, *(path + suffix for suffix in (*COMPANION_SUFFIXES, AUDIT_SUFFIX))]


def translate_open_error(exc: BaseException, path: str) -> BaseException:
    """Turn citadeldb's errors on open into ours, each naming the cause and the fix."""
    message = str(exc).lower()
    if isinstance(exc, CitadelSessionError):
        return exc
    if isinstance(exc, citadeldb.OperationalError) and "its database does not" in message:
        return DatabaseNotFoundError(
            f"{path} does not exist, but its companion files do: the database file was deleted "
            "or moved without them. Restore it from a backup, or move the companion files "
            f"({path}.citadel-*) aside to create a new database here."
        )
    damaged = _damaged_companion(exc, path)
    if damaged is not None:
        return damaged
    if isinstance(exc, citadeldb.IntegrityError) or (
        # A file shorter than Citadel's header: truncated, or not a Citadel file at all.
        isinstance(exc, citadeldb.OperationalError) and "fill whole buffer" in message
    ):
        return _corrupt(path, exc)
    if os.path.isdir(path):
        return DatabaseNotFoundError(
            f"{path} is a directory, not a Citadel file: pass the path of the database file "
            f"inside it (e.g. {os.path.join(path, 'agent.cdl')})."
        )
    missing = _missing_companions(path, COMPANION_SUFFIXES[:1])
    if missing:
        return _companions_missing(path, missing)
    if isinstance(exc, citadeldb.EncryptionError):
        # Citadel cannot tell these apart: the key file decrypts nothing either way.
        return WrongPassphraseError(
            f"wrong passphrase for {path}, or its key file {path}{COMPANION_SUFFIXES[0]} is "
            "damaged: together they do not decrypt this file. Check the passphrase "
            "(CITADEL_KEY / CITADEL_KEY_FILE); if it is right, restore the key file, with the "
            "database and its other companion files, from a backup. The files were left untouched."
        )
    if isinstance(exc, citadeldb.OperationalError) and "locked" in message:
        return _locked(path)
    if isinstance(exc, (FileNotFoundError, citadeldb.CitadelError)) and (
        "no such file" in message or "not found" in message or "missing" in message
    ):
        return DatabaseNotFoundError(
            f"cannot open {path}: {exc}. A Citadel file comes with companion files "
            "(.citadel-keys, -regions, -atomkeys); restore them together from a backup."
        )
    if isinstance(exc, citadeldb.CitadelError):
        return _unrecognised(path, exc)
    return exc


# How citadeldb 2.7.0 words damage to the headers of the key file and the audit log, which it
# otherwise reports as a wrong passphrase, an unsupported format or a bad KDF setting.
_KEY_FILE_DAMAGE = (
    "invalid key file magic",
    "key file integrity check failed",
    "unsupported cipher",
    "argon2 time cost too high",
    "argon2 memory cost",
    "argon2 parallelism",
)
_AUDIT_MAGIC = "0x41554454"  # "AUDT", the audit log's magic number


def _locked(path: str) -> DatabaseLockedError:
    holder = find_lock_holder(path)
    who = "another process" if holder is None else f"another process, {holder}"
    # The usual cause: a server started with several workers, each opening the file.
    return DatabaseLockedError(
        f"{path} is held by {who}: one process owns a Citadel file at a time. If it is "
        "another worker of this app (uvicorn or gunicorn --workers N), run one worker: its "
        "event loop already serves many conversations at once (serving one file to many "
        "processes is planned). Otherwise stop that process (or run this work inside it "
        "through its store), then retry.",
        holder=holder,
    )


def _damaged_companion(exc: BaseException, path: str) -> CorruptDatabaseError | None:
    """Damage to the key file or the audit log, named; None for any other error."""
    message = str(exc).lower()
    keys, audit = path + COMPANION_SUFFIXES[0], path + AUDIT_SUFFIX
    restore = "Restore the database and all its companion files together from one backup."
    culprit = _header_at_fault(path, message)
    if culprit == keys or keys.lower() in message or any(sign in message for sign in _KEY_FILE_DAMAGE):
        return CorruptDatabaseError(
            f"the key file {keys} of {path} is damaged ({exc}); the passphrase is not the cause. "
            f"{restore}"
        )
    if culprit == audit or audit.lower() in message or _AUDIT_MAGIC.lower() in message:
        return CorruptDatabaseError(
            f"the audit log {audit} of {path} is damaged ({exc}). {restore} To keep serving "
            "without the log's history instead, move the audit log aside: Citadel starts a new one."
        )
    if culprit is not None:
        return CorruptDatabaseError(f"{culprit}, a companion file of {path}, is damaged ({exc}). {restore}")
    if "file_id mismatch" in message or "unsupported format version" in message:
        return CorruptDatabaseError(
            f"the key file {keys} or the audit log {audit} of {path} is damaged, or comes from "
            f"another database ({exc}). {restore}"
        )
    return None


_FORMAT_VERSION = re.compile(r"unsupported format version: (\d+)")


def _header_at_fault(path: str, message: str) -> str | None:
    """The companion file whose header Citadel's error is about, when its words allow telling.

    citadeldb 2.7.0 reports a bad header field without naming the file. Every file
    starts with a 4-byte magic, a 4-byte little-endian format version and the 8-byte
    file id that the database file holds at offset 24 (measured): the file showing
    the version the error quotes, or another id, is the one.
    """
    version = _FORMAT_VERSION.search(message)
    if version is None and "file_id mismatch" not in message:
        return None
    try:
        with open(path, "rb") as database:
            file_id = database.read(32)[24:32]
    except OSError:
        return None
    for suffix in (*COMPANION_SUFFIXES, AUDIT_SUFFIX):
        try:
            with open(path + suffix, "rb") as companion:
                header = companion.read(16)
        except OSError:
            continue
        if version is not None and int.from_bytes(header[4:8], "little") == int(version.group(1)):
            return path + suffix
        if version is None and header[8:16] != file_id:
            return path + suffix
    return None


def _unrecognised(path: str, exc: BaseException) -> StorageError:
    return StorageError(
        f"Citadel failed on {path} ({type(exc).__name__}: {exc}). Run `python -m "
        "citadeldb_openai_agents verify`; if it reports damage, restore the file and its "
        "companion files from a backup, otherwise report this error with its message."
    )


def _refuse_lost_key_files(db: citadeldb.Database, path: str) -> None:
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
        raise _companions_missing(path, missing)


def translate_storage_error(exc: BaseException, path: str) -> BaseException:
    """Turn citadeldb's errors on a file in use into ours: damage, or a lost companion file.

    Citadel checks a page's MAC when it reads the page, so damage can surface on any
    read or write, long after the file opened; a missing ``-regions`` or ``-atomkeys``
    file surfaces as the first region or atom is touched.
    """
    if isinstance(exc, citadeldb.IntegrityError):
        return _corrupt(path, exc)
    if isinstance(exc, citadeldb.OperationalError) and str(exc).startswith(CITADEL_EMBEDDER_FAILURE):
        # Citadel calls the embedder itself only to re-embed a file, which is idempotent.
        return embedder_failed(
            None, str(exc)[len(CITADEL_EMBEDDER_FAILURE):],
            "the call stopped there (a re-embedding finishes when run again)",
        )
    # Both read as "this region's keys are gone"; a fresh file lacks these files legitimately
    # only until its first region is created, which the layout does on the first open.
    missing = _missing_companions(path, COMPANION_SUFFIXES)
    if missing and isinstance(exc, (citadeldb.EncryptionError, citadeldb.DataError)):
        return _companions_missing(path, missing)
    damaged = _damaged_companion(exc, path)
    if damaged is not None:
        return damaged
    if isinstance(exc, citadeldb.CitadelError):
        return _unrecognised(path, exc)
    return exc


def _corrupt(path: str, exc: BaseException) -> CorruptDatabaseError:
    return CorruptDatabaseError(
        f"{path} is damaged or is not a Citadel database ({exc}). Run "
        "`python -m citadeldb_openai_agents verify` for a report, and restore the file and "
        "its companion files from a backup."
    )


def _missing_companions(path: str, suffixes: tuple[str, ...]) -> list[str]:
    if not os.path.isfile(path):
        return []
    return [path + suffix for suffix in suffixes if not os.path.exists(path + suffix)]


def _companions_missing(path: str, missing: list[str]) -> DatabaseNotFoundError:
    return DatabaseNotFoundError(
        f"cannot use {path}: its companion file{'s' if len(missing) > 1 else ''} "
        f"{', '.join(missing)} {'are' if len(missing) > 1 else 'is'} missing, and the data "
        "cannot be decrypted without it. Restore the file and all its companion files "
        "together from the same backup."
    )
