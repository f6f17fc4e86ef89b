"""Every read is checked against the item rows the pages hold: a shortened history raises.

Citadel skips an atom whose key it cannot read, silently (../shared/CITADEL_NOTES.md),
so a read compares the ids it got with the rows the file's pages list. Querying the
pages costs 0.3-2 ms a segment even by the index, and the SDK reads whole sessions every
turn, so a segment's rows are looked up once and then kept by this process's appends
and pops (`KeptRows`). Every call that may change a region is
counted where Citadel is called (handle.py `MemoryHandle`): a write by any other
path, today's or a later one, makes the next read look at the pages again.

The same kept rows hold the segment's payloads once a read or this process's writes
have seen them all: the SDK's full read of a session at every turn is then answered
from memory (a full read was a third of a turn's time in the owner, where every
process's calls run). Kept within `PAYLOAD_BUDGET` per file, the least recently used
segments giving theirs up first.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..errors import CorruptDatabaseError
from .audit import ATOM_KEYS
from .records import segment_name

if TYPE_CHECKING:
    from .segments import SessionState


# Characters of item payloads kept in memory for reads, per open file (about that many bytes
# of JSON text, plus Python's per-string overhead).
PAYLOAD_BUDGET = 32 * 2**20


class RowReader(Protocol):
    """Reads the rows of a kind (items by default) the file's pages hold for some regions.

    Returns region -> atom id -> expiry (µs) or None.
    """

    def __call__(self, names: list[str], kind: str = ...) -> dict[str, dict[int, int | None]]: ...


def now_micros() -> int:
    """Now, in Citadel's unit for times: µs since the epoch."""
    return time.time_ns() // 1000


@dataclass
class KeptRows:
    """A segment's item rows (atom id -> expiry in µs, or None) as the pages held them.

    Right while the file's write counts for the region are still `writes`.
    """

    atoms: dict[int, int | None]
    writes: tuple[int, int]
    # The payload of every live item among `atoms`, when this process has read or written
    # them all since: a read of the segment is then answered here (see `cached`).
    payloads: dict[int, str] | None = None


class CompletenessCheck:
    """Checks reads of one file against its pages' rows, kept per segment in `SessionState.rows`.

    Args:
        rows: Reads the rows the pages hold for some regions (on the file's owner thread).
        writes: The file's count of calls that may have changed each region (None: calls
            that named no region).
        path: The file, for messages.
    """

    def __init__(self, rows: RowReader, writes: Mapping[str | None, int], path: str) -> None:
        self.rows = rows
        self._writes = writes
        self._path = path
        # The kept rows holding payloads, least recently used first, with their sizes; a
        # weak reference, so rows dropped with their segment free their payloads at once.
        self._held: OrderedDict[tuple[str, int], tuple[weakref.ref[KeptRows], int]] = OrderedDict()
        self._held_size = 0
        self._held_lock = threading.Lock()
        self.payload_budget = PAYLOAD_BUDGET

    def check(self, state: SessionState, read: dict[int, list[int]], newest: int | None = None) -> None:
        """Raise unless `read` holds every unexpired item the pages hold in those segments.

        `read` maps a segment to the ids a read returned from it; with `newest`, the read
        asked for that many of the segment's newest items only.
        """
        kept = {number: self.kept(state, number) for number in read}
        unknown = {segment_name(state.hid, number): number for number, atoms in kept.items() if atoms is None}
        if unknown:
            counts = {number: self._count(state, number) for number in unknown.values()}  # before the query
            for name, found in self.rows(list(unknown)).items():
                number = unknown[name]
                kept[number] = found
                state.rows[number] = KeptRows(found, counts[number])
        now = now_micros()  # after the reads: an item that expired since may be gone
        missing = expected = 0
        for number, ids in read.items():
            atoms = kept[number]
            assert atoms is not None  # looked up above
            live = sorted(a for a, expires in atoms.items() if expires is None or expires > now)
            if newest is not None:
                live = live[-newest:]
            expected += len(live)
            missing += len(set(live) - set(ids))
        if missing:
            raise self.damaged(state, missing, expected)

    def kept(self, state: SessionState, number: int) -> dict[int, int | None] | None:
        """A segment's item rows if this process kept them and nothing wrote the region since.

        A write that keeps them takes them before it writes, changes them as it changed
        the pages, and hands them to `keep` after.
        """
        kept = state.rows.get(number)
        if kept is None:
            return None
        if kept.writes != self._count(state, number):
            del state.rows[number]
            kept.payloads = None
            return None
        return kept.atoms

    def keep(
        self,
        state: SessionState,
        number: int,
        atoms: dict[int, int | None],
        added: dict[int, str] | None = None,
    ) -> None:
        """Record a segment's item rows as they are now, after this process's write.

        `atoms` is what `kept` handed out, changed as the write changed the pages; `added`,
        the payloads of the items the write stored. Known payloads stay known, and those of
        atoms no longer there go (an erased item's text is not kept).
        """
        previous = state.rows.get(number)
        payloads = previous.payloads if previous is not None and previous.atoms is atoms else None
        if not atoms:
            payloads = {}  # an empty segment: every payload is known
        if payloads is not None:
            payloads.update(added or {})
            for atom in payloads.keys() - atoms.keys():
                del payloads[atom]
        kept = state.rows[number] = KeptRows(atoms, self._count(state, number), payloads)
        if payloads is not None:
            self._hold(state, number, kept)

    def count(self, state: SessionState, number: int) -> tuple[int, int]:
        """The file's write counts for a segment now: a read taken at these is still right while they hold."""
        return self._count(state, number)

    def remember(
        self, state: SessionState, number: int, hits: list[tuple[int, str]], writes: tuple[int, int]
    ) -> None:
        """Keep a whole segment's live payloads, as a read that passed `check` got them at `writes`."""
        kept = state.rows.get(number)
        if kept is not None and kept.writes == writes == self._count(state, number):
            kept.payloads = dict(hits)
            self._hold(state, number, kept)

    def cached(self, state: SessionState, number: int) -> list[str] | None:
        """A segment's live payloads in order, when kept and nothing wrote the region since."""
        kept = state.rows.get(number)
        if kept is None or kept.payloads is None:
            return None
        if kept.writes != self._count(state, number):
            kept.payloads = None  # written by another path: the text may be erased
            return None
        payloads, now = kept.payloads, now_micros()
        live = sorted(a for a, expires in kept.atoms.items() if expires is None or expires > now)
        if any(atom not in payloads for atom in live):
            return None
        return [payloads[atom] for atom in live]

    def drop_payloads(self) -> None:
        """Give up every payload kept for reads: the next read of each segment goes to the file."""
        with self._held_lock:
            held, self._held, self._held_size = self._held, OrderedDict(), 0
        for ref, _ in held.values():
            kept = ref()
            if kept is not None:
                kept.payloads = None

    def _hold(self, state: SessionState, number: int, kept: KeptRows) -> None:
        """Count `kept`'s payloads against the budget, as the most recently used."""
        assert kept.payloads is not None
        size = sum(map(len, kept.payloads.values()))
        with self._held_lock:
            key = (state.hid, number)
            _, previous = self._held.pop(key, (None, 0))
            self._held[key] = (weakref.ref(kept), size)
            self._held_size += size - previous
            while self._held:
                ref, dropped = next(iter(self._held.values()))
                oldest = ref()
                # Over budget, or rows already gone with their segment (an erased session's).
                if oldest is not None and self._held_size <= self.payload_budget:
                    break
                self._held.popitem(last=False)
                self._held_size -= dropped
                if oldest is not None:
                    oldest.payloads = None

    def _count(self, state: SessionState, number: int) -> tuple[int, int]:
        return self._writes.get(segment_name(state.hid, number), 0), self._writes.get(None, 0)

    def damaged(self, state: SessionState, missing: int, expected: int) -> CorruptDatabaseError:
        """The error for a read that came back short."""
        return CorruptDatabaseError(
            f"{self._path} is damaged: {missing} of {expected} items of session {state.session_id!r} "
            f"cannot be read ({ATOM_KEYS}), and a read never returns a shortened history. Run "
            "`python -m citadeldb_openai_agents verify` for the full report, and restore the file "
            "and its companion files together from a backup."
        )
