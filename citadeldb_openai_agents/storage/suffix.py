"""A session's newest items replaced by others, atomically: what the SDK's compaction asks for.

The Agents SDK's `OpenAIResponsesCompactionSession` replaces a run's items (the
session's *suffix*) with their compacted form. A replacement compares, then writes the
new items, then erases the old ones, keeping the catalog record ahead of the data as
every write does (records.py):

1. the record names the batch (``replacing``) and the items to erase (``erasing``);
2. the new items and a write marker holding the batch id go in one `remember_batch`:
   that commit is the replacement's commit point;
3. the old items are forgotten with their search data (keys destroyed, as a pop does),
   a segment they empty dropped;
4. the record forgets the batch.

A crash before 2 leaves the old suffix (the marker is not stored: `recover` undoes the
announcement); after 2, the new one (`recover` finishes the erasure when the file next
opens). The audit (audit.py) takes the atoms a crash left half-forgotten for what the
record announced. Each function runs in a worker thread, under the session's lock.
"""

from __future__ import annotations

from citadeldb.memory import AtomHit, Memory

from ..telemetry import metrics
from . import search_upkeep, usage
from .codec import ITEM_KIND, Batch
from .ledger import LedgerEntry
from .reads import newest_in
from .segment_cache import SessionState
from .segments import SessionLayout
from .writes import append, clear, committed

# (atom id, payload) of a stored item: what a snapshot holds and a replacement compares.
Row = tuple[int, str]


def newest_rows(
    layout: SessionLayout, memory: Memory, state: SessionState, limit: int
) -> tuple[list[Row], bool]:
    """The newest `limit` live items with their atom ids, oldest first, and whether that is all of them."""
    hits: list[AtomHit] = []
    first: int | None = None  # the segment holding the oldest hit
    for number in reversed(state.segments):
        need = limit - len(hits)
        if need <= 0:
            break
        found = newest_in(layout, memory, state, number, need)
        if found:
            hits[:0] = found
            first = number
    rows = [(hit.id, str(hit.payload)) for hit in hits]
    if len(rows) < limit or first is None:
        return rows, True
    return rows, not _older_exists(layout, memory, state, first, rows[0][0])


def _older_exists(layout: SessionLayout, memory: Memory, state: SessionState, number: int, atom: int) -> bool:
    oldest = memory.fetch(layout.region(memory, state, number), ITEM_KIND, limit=1)
    if oldest and oldest[0].id < atom:
        return True
    return any(layout.has_live(memory, state, n) for n in state.segments if n < number)


def oldest_rows(
    layout: SessionLayout, memory: Memory, state: SessionState, after: int, before: int, limit: int
) -> list[Row]:
    """Up to `limit` of the oldest live items whose ids lie strictly between `after` and `before`."""
    rows: list[Row] = []
    for number in state.segments:
        region = layout.region(memory, state, number)
        for hit in memory.fetch(region, ITEM_KIND, limit=limit - len(rows), after_id=after or None):
            if hit.id >= before:
                return rows
            rows.append((hit.id, str(hit.payload)))
        if len(rows) >= limit:
            break
    return rows


def replace_suffix(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    expected: list[Row],
    batch: Batch,
    prune: list[int],
    batch_id: str,
    resent: bool = False,
) -> bool:
    """Replace the newest items, which must still be `expected`, by the new ones; False (nothing changed) if not.

    `prune`: older items to erase in the same replacement (those the caller found
    expired; the SDK's `prune_prefix`). `batch_id` names the replacement: sent again
    (`resent`) after an owner died without answering, a replacement already made
    answers True and is not made twice.
    """
    if resent and committed(layout, memory, state, batch_id):
        return True
    if not expected or newest_rows(layout, memory, state, len(expected))[0] != expected:
        return False
    start = expected[0][0]
    record = layout.record(state)
    record.erasing = [atom for atom, _ in expected] + [atom for atom in prune if atom < start]
    record.replacing = batch_id
    layout.write_record(memory, state)  # announced: a crash from here on is explained
    append(layout, memory, state, batch, batch_id)  # the commit point
    _finish(layout, memory, state)
    return True


def recover(layout: SessionLayout, memory: Memory) -> None:
    """Finish, or undo, every replacement a crash interrupted (when the file opens).

    The marker is in the tail segment, which a replacement never drops: found, the new
    items are stored and the old ones are erased; not found, nothing was replaced.
    """
    for state in layout.states():
        record = state.record
        if record is None or record.replacing is None:
            continue
        with state.lock:
            if state.segments and committed(layout, memory, state, record.replacing):
                _finish(layout, memory, state)
            else:
                record.erasing, record.replacing = [], None
                layout.write_record(memory, state)


def _finish(layout: SessionLayout, memory: Memory, state: SessionState) -> None:
    """Erase the items the record names, then clear its announcement."""
    record = layout.record(state)
    erase_items(layout, memory, state, record.erasing)
    record.erasing, record.replacing = [], None
    layout.write_record(memory, state)


def erase_items(layout: SessionLayout, memory: Memory, state: SessionState, atoms: list[int]) -> None:
    """Erase these items (keys destroyed) wherever they are; drop a segment they empty, unless it is the tail.

    Ids grow with every write and segments are filled in order, so the search goes from
    the tail back and stops at the segment that holds the oldest of them.
    """
    remaining = set(atoms)
    for number in reversed(list(state.segments)):
        if not remaining:
            break
        hits = layout.live_hits(memory, state, number)
        erasing = [hit for hit in hits if hit.id in remaining]
        here = [hit.id for hit in erasing]
        remaining.difference_update(here)
        noted = layout.erasures.items(state, erasing)
        metrics.erased(len(here), layout.path, "compaction")
        tail = number == state.segments[-1]
        if here and len(here) == len(hits) and not tail:
            layout.drop_segment(memory, state, number)  # its keys go with it (tests/test_erasure.py)
        elif here:
            with layout.caches.writing(state, number) as cached:
                # Their search data and the usage of the turns they began go in the same forget;
                # the usage is announced as the items were (a crash mid-erasure is not damage).
                blocks = search_upkeep.take_out(layout, memory, state, number, here)
                used = usage.anchored(layout, memory, state, number, here)
                if used or noted:  # and the ledger's new head, before the erasure
                    record = layout.record(state)
                    record.erasing = [*record.erasing, *used]
                    layout.write_record(memory, state)
                memory.forget(layout.region(memory, state, number), here + blocks + used)
                cached.remove(here)
                search_upkeep.store_pending(layout, memory, state, number)
        if hits and hits[0].id <= min(remaining, default=0):
            break


def ledger_erased(
    layout: SessionLayout, memory: Memory, state: SessionState, entries: list[LedgerEntry]
) -> list[AtomHit]:
    """The session's live items that these entries of the erasure ledger say were erased."""
    return [
        hit
        for number in state.segments
        for hit in layout.live_hits(memory, state, number)
        if any(entry.erases(hit.id, hit.created_at) for entry in entries)
    ]


def erase_ledgered(
    layout: SessionLayout, memory: Memory, state: SessionState, entries: list[LedgerEntry]
) -> None:
    """Erase again what the ledger's entries name (a restored backup still holds it)."""
    erased = ledger_erased(layout, memory, state, entries)
    live = sum(len(layout.live_hits(memory, state, number)) for number in state.segments)
    if erased and len(erased) == live:
        clear(layout, memory, state)  # the whole session: its segments and record go
    elif erased:
        erase_items(layout, memory, state, [hit.id for hit in erased])
