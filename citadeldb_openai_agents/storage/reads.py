"""Reading a session: its newest items, all of them, a summary, what verify needs, and search.

Each function runs in a worker thread, under the session's lock, with the file's
`Memory` (segments.py: how a session maps onto regions). Every read of items
checks that Citadel returned all the pages hold (completeness.py).
"""

from __future__ import annotations

import numpy as np
from citadeldb.memory import AtomHit, Memory

from ..embedders.protocol import embed_query
from ..results import Progress
from . import search_upkeep
from .codec import ITEM_KIND, decode_item
from .completeness import now_micros
from .records import segment_name
from .search_blocks import word_hashes
from .search_index import rank
from .segment_cache import SessionState, Stamp
from .segments import SessionLayout


def newest(layout: SessionLayout, memory: Memory, state: SessionState, limit: int) -> list[str]:
    """The payloads of the newest `limit` live items, oldest first."""
    hits: list[AtomHit] = []
    for number in reversed(state.segments):
        need = limit - len(hits)
        if need <= 0:
            break
        hits[:0] = newest_in(layout, memory, state, number, need)
    return [hit.payload for hit in hits]


def newest_in(
    layout: SessionLayout, memory: Memory, state: SessionState, number: int, need: int
) -> list[AtomHit]:
    region = layout.region(memory, state, number)
    if number == state.segments[-1]:
        ids = layout.tail_ids(state)
        expected = ids[-need:]
        after = ids[-need - 1] if len(ids) > need else None
        hits = memory.fetch(region, ITEM_KIND, limit=need, after_id=after)
        if [hit.id for hit in hits] == expected:
            return hits
        # Something expired meanwhile, or went missing: the newest by a scan, checked.
    hits = memory.fetch(region, ITEM_KIND, limit=need, newest=True)
    layout.completeness.check(state, {number: [hit.id for hit in hits]}, newest=need)
    return hits


def newest_hit(layout: SessionLayout, memory: Memory, state: SessionState) -> AtomHit | None:
    """The session's newest live item (its id and payload), or None."""
    for number in reversed(state.segments):
        hits = newest_in(layout, memory, state, number, 1)
        if hits:
            return hits[0]
    return None


def all_items(
    layout: SessionLayout, memory: Memory, state: SessionState, progress: Progress | None = None
) -> list[str]:
    """The payloads of every live item, oldest first; `progress` after each segment."""
    read: dict[int, list[int]] = {}
    fetched: dict[int, tuple[Stamp, list[tuple[int, str]]]] = {}
    payloads: list[str] = []
    now = now_micros()
    for done, number in enumerate(state.segments, 1):
        cached = layout.caches.payloads(state, number, now)
        if cached is not None:
            payloads.extend(cached)
        else:
            writes = layout.caches.stamp(state, number)
            hits = layout.live_hits(memory, state, number)
            read[number] = [hit.id for hit in hits]
            fetched[number] = (writes, [(hit.id, hit.payload) for hit in hits])
            payloads.extend(hit.payload for hit in hits)
        if progress is not None:
            progress(done, len(state.segments))
    if read:
        layout.completeness.check(state, read)
        for number, (writes, found) in fetched.items():
            layout.caches.payloads_read(state, number, found, writes)
    return payloads


def item_hits(layout: SessionLayout, memory: Memory, state: SessionState) -> list[AtomHit]:
    """Every live item, oldest first, with its id, creation and expiry (not kept: a branch's
    structure and its usage need these, not the session's turns); checked whole."""
    read: dict[int, list[int]] = {}
    found: list[AtomHit] = []
    for number in state.segments:
        got = layout.live_hits(memory, state, number)
        read[number] = [hit.id for hit in got]
        found.extend(got)
    if read:
        layout.completeness.check(state, read)
    return found


def starts_turn(payload: str) -> bool:
    """Whether an item is a user message: `AdvancedSQLiteSession`'s turns start there."""
    item = decode_item(payload)
    return isinstance(item, dict) and item.get("role") == "user"


def oldest_hit(layout: SessionLayout, memory: Memory, state: SessionState) -> AtomHit | None:
    """The session's oldest live item, or None."""
    return next(
        (
            hits[0]
            for n in state.segments
            if (hits := memory.fetch(layout.region(memory, state, n), ITEM_KIND, limit=1))
        ),
        None,
    )


def summary(layout: SessionLayout, memory: Memory, state: SessionState) -> tuple[int, int, int] | None:
    """(live items, creation time of the oldest, of the newest) in µs; None when empty."""
    oldest = oldest_hit(layout, memory, state)
    if oldest is None:
        return None
    newest = next(
        (hits[0] for n in reversed(state.segments) if (hits := newest_in(layout, memory, state, n, 1))),
        oldest,
    )
    count = sum(memory.count(layout.region(memory, state, n), ITEM_KIND) for n in state.segments)
    return count, oldest.created_at, newest.created_at


def inspect(layout: SessionLayout, memory: Memory, state: SessionState) -> tuple[int, int, dict[str, int]]:
    """(items the pages hold, items Citadel reads, Citadel's verdicts on those) for `verify`."""
    read = {n: [hit.id for hit in layout.live_hits(memory, state, n)] for n in state.segments}
    names = {n: segment_name(state.hid, n) for n in read}
    stored = layout.completeness.rows(list(names.values())) if names else {}
    now = now_micros()
    expected = readable = 0
    verdicts: dict[str, int] = {}
    for number, ids in read.items():
        live = {a for a, expires in stored[names[number]].items() if expires is None or expires > now}
        expected += len(live | set(ids))
        readable += len(ids)
        for attestation in memory.verify(names[number], ids) if ids else []:
            verdicts[attestation.verdict] = verdicts.get(attestation.verdict, 0) + 1
    return expected, readable, verdicts


def has_live_item(layout: SessionLayout, memory: Memory, state: SessionState) -> bool:
    return any(layout.has_live(memory, state, n) for n in reversed(state.segments))


def search_placed(
    layout: SessionLayout, memory: Memory, state: SessionState, query: str, limit: int
) -> tuple[list[tuple[str, int]], int]:
    """The session's live items best matching `query`, best first (search_index.rank), each
    with its position in the session (1: the oldest); and how many live items it holds.

    Ranked over the search data of every segment, held in memory once read
    (search_upkeep.py), which has one entry per live item: the positions come from it, and
    only the items returned are read from the file, so the cost does not depend on what
    else the file, or the session, holds.
    """
    if not state.segments or limit <= 0:
        return [], 0
    vector = embed_query(layout.embedder, query)
    numbers = list(state.segments)
    indexes = [search_upkeep.loaded(layout, memory, state, number) for number in numbers]
    ids, where = rank(indexes, vector, word_hashes(query), layout.identity.metric, now_micros())
    in_order = np.sort(ids)
    found: list[tuple[str, int]] = []
    for atom, position in zip(ids.tolist(), where.tolist(), strict=True):
        if len(found) == limit:
            break
        number = numbers[position]
        # One atom by position: measured 0.45 ms, where fetch_by_ids costs 2 ms a call.
        hits = memory.fetch(layout.region(memory, state, number), ITEM_KIND, limit=1, after_id=atom - 1)
        if hits and hits[0].id == atom:
            found.append((str(hits[0].payload), int(np.searchsorted(in_order, atom)) + 1))
            continue
        # Expired (or erased) since the ranking is fine; stored and unreadable is damage.
        name = segment_name(state.hid, number)
        expires = layout.completeness.rows([name])[name].get(atom, 0)
        if expires == 0 or (expires is not None and expires <= now_micros()):
            continue
        raise layout.completeness.damaged(state, 1, limit)
    return found, len(in_order)
