"""Every read is checked against the item rows the pages hold: a shortened history raises.

Citadel skips an atom whose key it cannot read, silently (../shared/CITADEL_NOTES.md),
so a read compares the ids it got with the rows the file's pages list. Querying the
pages costs 0.3-2 ms a segment even by the index, and the SDK reads whole sessions every
turn, so a segment's rows are looked up once and then kept in its cache entry, changed by
this process's own writes and dropped after a write by any other path
(segment_cache.py).
"""

from __future__ import annotations

import time
from typing import Protocol

from ..errors import RUN_VERIFY, CorruptDatabaseError
from .audit import ATOM_KEYS
from .records import segment_name
from .segment_cache import SegmentCaches, SessionState, live_ids


class RowReader(Protocol):
    """Reads the rows of a kind (items by default) the file's pages hold for some regions.

    Returns region -> atom id -> expiry (µs) or None.
    """

    def __call__(self, names: list[str], kind: str = ...) -> dict[str, dict[int, int | None]]: ...


def now_micros() -> int:
    """Now, in Citadel's unit for times: µs since the epoch."""
    return time.time_ns() // 1000


class CompletenessCheck:
    """Checks reads of one file against its pages' rows, kept in each segment's cache entry.

    Args:
        rows: Reads the rows the pages hold for some regions (on the file's owner thread).
        caches: The file's segment cache entries.
        path: The file, for messages.
    """

    def __init__(self, rows: RowReader, caches: SegmentCaches, path: str) -> None:
        self.rows = rows
        self._caches = caches
        self._path = path

    def check(self, state: SessionState, read: dict[int, list[int]], newest: int | None = None) -> None:
        """Raise unless `read` holds every unexpired item the pages hold in those segments.

        `read` maps a segment to the ids a read returned from it; with `newest`, the read
        asked for that many of the segment's newest items only.
        """
        kept = self.atoms(state, list(read))
        now = now_micros()  # after the reads: an item that expired since may be gone
        missing = expected = 0
        for number, ids in read.items():
            live = live_ids(kept[number], now)
            if newest is not None:
                live = live[-newest:]
            expected += len(live)
            missing += len(set(live) - set(ids))
        if missing:
            raise self.damaged(state, missing, expected)

    def atoms(self, state: SessionState, numbers: list[int]) -> dict[int, dict[int, int | None]]:
        """The item rows of these segments, ascending by id: kept, or looked up in the pages (in
        one query) and kept."""
        found: dict[int, dict[int, int | None]] = {}
        unknown: dict[str, int] = {}
        for number in numbers:
            entry = self._caches.get(state, number)
            if entry is not None and entry.atoms is not None:
                found[number] = entry.atoms
            else:
                unknown[segment_name(state.hid, number)] = number
        if unknown:
            stamps = {number: self._caches.stamp(state, number) for number in unknown.values()}  # before
            looked_up = self.rows(list(unknown))
            for name, number in unknown.items():
                rows = found[number] = dict(sorted(looked_up.get(name, {}).items()))
                self._caches.rows_read(state, number, rows, stamps[number])
        return found

    def damaged(self, state: SessionState, missing: int, expected: int) -> CorruptDatabaseError:
        """The error for a read that came back short."""
        return CorruptDatabaseError(
            f"{self._path} is damaged: {missing} of {expected} items of session {state.session_id!r} "
            f"cannot be read ({ATOM_KEYS}), and a read never returns a shortened history.",
            RUN_VERIFY,
        )
