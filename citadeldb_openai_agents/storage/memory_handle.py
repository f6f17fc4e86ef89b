"""The handle every operation holds in place of the file's `Memory`, and the writes it counts."""

from __future__ import annotations

import functools
from typing import Any

import citadeldb

from ..errors import SessionClosedError

# The `Memory` methods that change no region; any other call counts as a write, so a
# method a later citadeldb adds is a write until it is listed here.
MEMORY_READS = frozenset(
    {
        "ann_cache_status",
        "count",
        "fetch",
        "fetch_by_ids",
        "fetch_edges",
        "fetch_last",
        "fetch_one",
        "preflight_mmr",
        "profile",
        "recall",
        "recall_mmr",
        "region",
        "regions",
        "summarize",
        "verify",
    }
)


class MemoryHandle:
    """The file's `Memory`, handed to every operation in its place.

    Citadel keeps a file locked until every `Memory` object of it is collected, and
    an error's traceback keeps the frames of the failed operation (with their
    ``memory`` argument) alive as long as the error lives, often in a reference
    cycle only a gc pass frees. Operations hold this handle instead, so closing
    the file drops the one real reference whatever errors are still around: the
    lock is released at once, and a reopen in this process reads the file afresh.
    No frame of this module binds the real `Memory` or one of its methods to a name
    either, for the same reason.

    It also counts, by region name (None: a call that named none), the calls that may
    have changed a region: what a process keeps of a segment is right only while its
    region's count holds (segment_cache.py), whichever code
    path wrote.
    """

    __slots__ = ("_memory", "_path", "writes")

    def __init__(self, memory: citadeldb.memory.Memory, path: str) -> None:
        self._memory: citadeldb.memory.Memory | None = memory
        self._path = path
        self.writes: dict[str | None, int] = {}

    def __getattr__(self, name: str) -> Any:
        if self._memory is None:
            raise SessionClosedError(f"{self._path} is closed")
        if name in MEMORY_READS:
            return getattr(self._memory, name)
        return functools.partial(self._write, name)

    def _write(self, name: str, *args: Any, **kwargs: Any) -> Any:
        region = args[0] if args and isinstance(args[0], str) else None
        changed = True
        try:
            if self._memory is None:
                raise SessionClosedError(f"{self._path} is closed")
            result = getattr(self._memory, name)(*args, **kwargs)
            # An eviction that removed nothing changed nothing: a store with a TTL evicts
            # before every append, and counting those would send every read to the file.
            changed = not (name == "evict" and result == 0)
            return result
        finally:  # counted even when it failed: it may have written part of what it was asked
            if changed:
                self.writes[region] = self.writes.get(region, 0) + 1

    def release(self) -> None:
        self._memory = None
