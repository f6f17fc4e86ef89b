"""How a store reaches its file: one `call` whether the file is open here or in its owner.

`LocalTransport` runs an operation on the file this process holds; the remote
transport (`client.RemoteOwner`) sends it to the process that does. Both take an
`Operation` declaration (operations.py) and its arguments, and return its result;
only the remote one can lose its owner mid-call (`OwnerGone`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from .. import telemetry
from ..results import Progress
from ..storage.local_file import LocalFile
from .operations import Operation

T = TypeVar("T")
Note = Callable[[Any], None]


class OwnerGone(Exception):
    """No process serves the file at the address (any more): the caller takes it over, or waits."""


class OwnerBusy(OwnerGone):
    """The owner answered but turned this process away (too many peers in their handshake with it):
    it is alive, not stuck, and nothing was sent to it. The caller waits and tries again."""


class Transport(Protocol):
    """Where a store's operations run."""

    @property
    def owner_pid(self) -> int | None:
        """The process that holds the file, when it is not this one."""

    def call(
        self, operation: Operation[T], args: tuple[Any, ...], progress: Progress | None, note: Note | None
    ) -> T:
        """Run `operation(*args)`; `note` hears what a noting operation is about to erase."""

    def close(self) -> None:
        """Let go of the file (or the connections to its owner)."""


def run_here(
    local: LocalFile,
    operation: Operation[T],
    args: tuple[Any, ...],
    progress: Progress | None,
    note: Note | None,
    parent: Any = None,
) -> T:
    """`operation(*args)` on the file this process holds, in the calling thread (the owner's
    server runs its clients' calls here too, `parent` the trace context a call carried).

    The one place every operation runs where the file is: its span and its counts (items
    written and read, a search's time) are made here, once, whoever asked (telemetry/)."""
    if not telemetry.on():
        return _run(local, operation, args, progress, note)
    session = local.hashed(args[0]) if operation.session else None
    with telemetry.operation(operation.name, local.path, parent, session) as attribute:
        started = time.perf_counter()
        result = _run(local, operation, args, progress, note)
        if operation.search:
            telemetry.metrics.search_took(time.perf_counter() - started, local.path)
        if operation.counts is not None:
            count, size = operation.measure(args, result)
            telemetry.metrics.items(operation.counts, count, local.path)
            attribute(f"citadel.items.{operation.counts}", count)
            attribute(f"citadel.bytes.{operation.counts}", size)
        return result


def _run(
    local: LocalFile,
    operation: Operation[T],
    args: tuple[Any, ...],
    progress: Progress | None,
    note: Note | None,
) -> T:
    extra = (progress,) if operation.reports else (note,) if operation.notes else ()
    if operation.session:
        return local.on_session(args[0], operation.run, *args[1:], *extra)
    return operation.run(local, *args, *extra)


class LocalTransport:
    """The file, open in this process: an operation is a method call in the calling thread."""

    def __init__(self, local: LocalFile, on_close: Callable[[], None]) -> None:
        self.local = local
        self.owner_pid: int | None = None
        self._on_close = on_close  # the mode's: stop serving, or remove the serve = false mark

    def call(
        self, operation: Operation[T], args: tuple[Any, ...], progress: Progress | None, note: Note | None
    ) -> T:
        if operation.batched and not operation.marks_local and not args[-1]:
            args = (*args[:-2], None, False)  # this process's own write needs no marker
        return run_here(self.local, operation, args, progress, note)

    def close(self) -> None:
        """Give this store's share of the file back (a forked child leaves its parent's alone)."""
        if self.local.forked:
            return
        self._on_close()
        self.local.release()
