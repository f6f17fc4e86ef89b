"""What this process knows of each segment, kept right by one rule: the region's write count.

A session's `SessionState` holds its segments and an entry per segment; a segment's entry
(`SegmentCache`) holds its item rows as the pages list them (id and
expiry: what every read is checked against, completeness.py, and where the tail's live
ids come from), the payload of every live item once a read or this process's writes
have seen them all (the SDK reads whole sessions every turn), and its search entries
(search_index.py). It is right while the file's count of calls that may have changed
the region is the count it was stamped with (memory_handle.py `MemoryHandle` counts every
such call where Citadel is called). So:

* a write made here runs inside `writing`, changes the entry as it changes the pages
  and leaves it stamped with the count after the write (an error drops it);
* a write by any other path, today's or a later one, leaves the stamp behind, and the
  entry is dropped the next time it is looked at: the next read goes to the file.

The session's latest question (a reply's vector is computed with it) is right while
no segment of the session was written since. Payloads and search entries are held
within one byte budget per open file (`CACHE_BUDGET`), the least recently used
segments giving theirs up first; search entries that wait for a block (a pop's) are
never given up.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from .records import MAIN, CatalogRecord, segment_name
from .search_index import SegmentIndex

# Bytes of payload text and search entries held per open file: about 300,000 items'
# search entries at 384 dimensions and 32 MiB of JSON text.
CACHE_BUDGET = 160 * 2**20

Stamp = tuple[int, int]


def live_ids(atoms: dict[int, int | None], now: int) -> list[int]:
    """The ids among item rows (id -> expiry, ascending) that have not expired by `now`."""
    return [atom for atom, expires in atoms.items() if expires is None or expires > now]


@dataclass(eq=False)
class SegmentCache:
    """One segment as this process knows it, right while the region's write count is `writes`."""

    writes: Stamp
    # Item rows the pages hold (atom id -> expiry in µs, or None), ascending by id, when looked up.
    atoms: dict[int, int | None] | None = None
    # The payload of every live item among `atoms`, when all of them are known.
    payloads: dict[int, str] | None = None
    search: SegmentIndex | None = None
    depth: int = 0  # writes under way (`writing`): stale stamps are expected meanwhile
    text_bytes: int = 0  # characters in `payloads`, kept as they change

    def live(self, now: int) -> list[int] | None:
        """The ids of the unexpired items, ascending; None when the rows are not known."""
        if self.atoms is None:
            return None
        return live_ids(self.atoms, now)

    def add(self, payloads: dict[int, str], expires_at: int | None) -> None:
        """These items were stored (their ids above every id the segment holds)."""
        if self.atoms is None or not payloads:
            return
        if self.atoms and min(payloads) < next(reversed(self.atoms)):
            self.atoms = self.payloads = None  # not in order after all: looked up again
            return
        self.atoms.update(dict.fromkeys(payloads, expires_at))
        if self.payloads is not None:
            self.payloads.update(payloads)
            self.text_bytes += sum(map(len, payloads.values()))

    def hold(self, payloads: dict[int, str]) -> None:
        """Keep these as the segment's live payloads (a read that passed the completeness check)."""
        self.payloads, self.text_bytes = payloads, sum(map(len, payloads.values()))

    def remove(self, ids: Iterable[int]) -> None:
        """These items were erased: their rows and payloads go (an erased item's text is not kept)."""
        for atom in ids:
            if self.atoms is not None:
                self.atoms.pop(atom, None)
            if self.payloads is not None:
                self.text_bytes -= len(self.payloads.pop(atom, ""))

    def expired(self, before: int) -> None:
        """Citadel evicted what had expired by `before` (or later): those rows and entries go."""
        if self.atoms is not None:
            self.remove([a for a, expires in self.atoms.items() if expires is not None and expires <= before])
        if self.search is not None:
            self.search.drop_expired(before)

    @property
    def nbytes(self) -> int:
        text = self.text_bytes if self.payloads is not None else 0
        return text + (self.search.nbytes if self.search is not None else 0)


@dataclass
class SessionState:
    """What this process knows about one session's segments (guarded by `lock`)."""

    session_id: str
    hid: str
    branch: str = MAIN  # a branch of the session other than MAIN is a state of its own
    segments: list[int] = field(default_factory=list)
    catalog_id: int | None = None
    record: CatalogRecord | None = None
    # What this process knows of each segment, by number.
    cache: dict[int, SegmentCache] = field(default_factory=dict)
    # The text of the session's latest user message and when it was right: a reply's
    # vector is computed with the question it answers (writes.append).
    question: tuple[str, tuple[object, ...]] | None = None
    # When the session was last written (µs), once looked up (retention.last_write); every
    # write here sets it, a clear forgets it.
    last_write: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class SegmentCaches:
    """Every segment entry of one open file, by session (`SessionState.cache`), within one budget.

    Args:
        writes: The file's count of calls that may have changed each region (None:
            calls that named no region).
    """

    def __init__(self, writes: Mapping[str | None, int]) -> None:
        self._writes = writes
        self.budget = CACHE_BUDGET
        # Entries holding payloads or search entries, least recently used first, with their
        # sizes; weak references, so an entry dropped with its segment frees them at once.
        self._held: OrderedDict[tuple[str, int], tuple[weakref.ref[SegmentCache], int, threading.Lock]] = (
            OrderedDict()
        )
        self.held_bytes = 0
        self._lock = threading.Lock()

    def stamp(self, state: SessionState, number: int) -> Stamp:
        """The file's write counts for a segment now: what is read now stays right while they hold."""
        return self._writes.get(segment_name(state.hid, number), 0), self._writes.get(None, 0)

    def get(self, state: SessionState, number: int) -> SegmentCache | None:
        """The segment's entry if it is still right (else it is dropped), or None."""
        entry = state.cache.get(number)
        if entry is None or entry.depth or entry.writes == self.stamp(state, number):
            return entry
        del state.cache[number]  # written by another path: what it holds may be erased
        return None

    def entry(self, state: SessionState, number: int) -> SegmentCache:
        """The segment's entry, a new empty one (nothing known) if there is none that is right."""
        entry = self.get(state, number)
        if entry is None:
            entry = state.cache[number] = SegmentCache(self.stamp(state, number))
        return entry

    @contextmanager
    def writing(self, state: SessionState, number: int) -> Iterator[SegmentCache]:
        """Around a write to the segment: change the entry as the write changes the pages.

        After the write the entry is stamped with the count it left; if the write
        fails, the entry is dropped (what the file holds is not known).
        """
        entry = self.entry(state, number)
        entry.depth += 1
        try:
            yield entry
        except BaseException:
            if state.cache.get(number) is entry:
                del state.cache[number]
            raise
        finally:
            entry.depth -= 1
        entry.writes = self.stamp(state, number)
        self.touch(state, number, entry)

    def rows_read(self, state: SessionState, number: int, atoms: dict[int, int | None], at: Stamp) -> None:
        """The pages' item rows for the segment, as looked up at stamp `at`."""
        if at == self.stamp(state, number):
            entry = self.entry(state, number)
            if entry.atoms is None:
                entry.atoms = atoms

    def payloads_read(self, state: SessionState, number: int, hits: list[tuple[int, str]], at: Stamp) -> None:
        """A read that passed the completeness check got the segment's live payloads at stamp `at`."""
        entry = self.get(state, number)
        if entry is not None and entry.atoms is not None and at == entry.writes == self.stamp(state, number):
            entry.hold(dict(hits))
            self.touch(state, number, entry)

    def payloads(self, state: SessionState, number: int, now: int) -> list[str] | None:
        """The segment's live payloads in order, when every one of them is held."""
        entry = self.get(state, number)
        payloads = None if entry is None else entry.payloads
        live = None if entry is None else entry.live(now)
        if payloads is None or live is None or any(atom not in payloads for atom in live):
            return None
        self.used(state, number)
        return [payloads[atom] for atom in live]

    def question(self, state: SessionState) -> str | None:
        """The session's latest user message, if known and no segment of it was written since."""
        if state.question is None or state.question[1] != self._session_stamp(state):
            return None
        return state.question[0]

    def set_question(self, state: SessionState, text: str) -> None:
        state.question = (text, self._session_stamp(state))

    def _session_stamp(self, state: SessionState) -> tuple[object, ...]:
        return tuple(self.stamp(state, number) for number in state.segments) + tuple(state.segments)

    def used(self, state: SessionState, number: int) -> None:
        """The segment's entry was read: the most recently used (its size unchanged)."""
        with self._lock:
            key = (state.hid, number)
            if key in self._held:
                self._held.move_to_end(key)

    def touch(self, state: SessionState, number: int, entry: SegmentCache | None = None) -> None:
        """Count the entry's payloads and search entries against the budget, as the most recently used."""
        entry = entry if entry is not None else state.cache.get(number)
        if entry is None:
            return
        size = entry.nbytes
        with self._lock:
            key = (state.hid, number)
            _, previous, _ = self._held.pop(key, (None, 0, None))
            self._held[key] = (weakref.ref(entry), size, state.lock)
            self.held_bytes += size - previous
            for old in list(self._held):
                # Entries already gone with their segment (an erased session's) go first.
                gone = self._held[old][0]() is None
                if not gone and (self.held_bytes <= self.budget or old == key):
                    break
                self._let_go(old)

    def drop_held(self) -> None:
        """Give up every payload and search entry that can go: the next read of each goes to the file."""
        with self._lock:
            for key in list(self._held):
                self._let_go(key)

    def _let_go(self, key: tuple[str, int]) -> None:
        """Drop a held entry's payloads and search entries, unless its session is busy; search
        entries that wait for a block stay (they would be lost from sight)."""
        ref, size, lock = self._held[key]
        entry = ref()
        if entry is not None:
            if not lock.acquire(blocking=False):
                return
            try:
                entry.payloads = None
                if entry.search is not None and not entry.search.pending:
                    entry.search = None
                still = entry.nbytes
            finally:
                lock.release()
            if still:
                self._held[key] = (ref, still, lock)
                self.held_bytes += still - size
                return
        del self._held[key]
        self.held_bytes -= size
