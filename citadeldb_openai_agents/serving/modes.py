"""What the owner of a file does for the other processes that open it: serve them, or not.

`ServeToOthers` (``serve`` on, the default) serves the file on a Unix socket and makes
a process that finds the file held its owner's client. `KeepToSelf` (``serve = false``)
leaves a mark beside the file so that others are refused at once instead of waiting for
a socket, and never touches the runtime directory.
"""

from __future__ import annotations

import contextlib
import os
from typing import Protocol

from ..errors import DatabaseLockedError, StorageError
from ..options import StoreOptions
from ..storage.local_file import LocalFile
from ..storage.process_state import current_pid
from . import refusals, served_files
from .address import SocketKey


class Mode(Protocol):
    """How this process treats the others on a file it owns."""

    serves: bool

    def opening(self, path: str, socket_dir: str | None) -> contextlib.AbstractContextManager[None]:
        """Held while this process opens the file (it may hold the lock and serve no one yet)."""

    def owned(self, path: str, local: LocalFile, terms: StoreOptions) -> None:
        """This process now owns the file, under `terms` (told to its clients)."""

    def released(self, path: str) -> None:
        """This store let go of the file it owned."""

    def locked(self, path: str, locked: DatabaseLockedError) -> None:
        """Another process holds the file: raise if this one cannot be its client."""


class ServeToOthers:
    """Serve the file to the other processes, and be a client where another owns it."""

    serves = True

    def __init__(self, key: SocketKey) -> None:
        self.key = key

    def opening(self, path: str, socket_dir: str | None) -> contextlib.AbstractContextManager[None]:
        return served_files.opening(path, socket_dir)

    def owned(self, path: str, local: LocalFile, terms: StoreOptions) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(exclusive_mark(path))  # a killed serve = false owner's
        served_files.start_serving(path, local, self.key, terms)

    def released(self, path: str) -> None:
        served_files.stop_serving(path)

    def locked(self, path: str, locked: DatabaseLockedError) -> None:
        if locked.holder is not None and exclusive(path, locked.holder.pid):
            raise refusals.kept_to_itself(locked)


class KeepToSelf:
    """serve = false: the file is this process's alone; others are refused, and so is this one elsewhere."""

    serves = False

    def opening(self, path: str, socket_dir: str | None) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def owned(self, path: str, local: LocalFile, terms: StoreOptions) -> None:
        # 0600 like the database's files, and never written through a link someone left there.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            descriptor = os.open(exclusive_mark(path), flags, 0o600)
        except OSError as exc:
            raise StorageError(
                f"cannot write {exclusive_mark(path)}, the mark that keeps {path} to this process "
                f"(serve = false): {exc.strerror}. Remove what is there (a link is never written through)."
            ) from None
        with os.fdopen(descriptor, "w", encoding="utf-8") as mark:
            os.fchmod(descriptor, 0o600)  # one an older version left 0644
            mark.write(str(current_pid()))

    def released(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(exclusive_mark(path))

    def locked(self, path: str, locked: DatabaseLockedError) -> None:
        raise refusals.not_serving_here(locked)


def exclusive_mark(path: str) -> str:
    """The mark an owner with serve = false leaves beside the file, read only while its lock is held.

    Beside the database rather than in the runtime directory: serve = false must work
    where that directory cannot be made, and no other user can write there. One left by
    an owner that was killed misleads no one: it names that owner's pid, which no longer
    holds the lock, and the next owner removes it.
    """
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.exclusive")


def exclusive(path: str, holder: int) -> bool:
    """Whether process `holder`, which holds the file's lock, left the serve = false mark."""
    try:
        with open(exclusive_mark(path), encoding="utf-8") as mark:
            return mark.read().strip() == str(holder)
    except OSError:
        return False
