"""Reading a session: its newest items, all of them, a summary, what verify needs, and search.

Each function runs in a worker thread, under the session's lock, with the file's
`Memory` (segments.py: how a session maps onto regions). Every read of items
checks that Citadel returned all the pages hold (`SessionLayout.check_complete`).
"""

from __future__ import annotations

from citadeldb.memory import AtomHit, Memory

from ..embedders.protocol import embed_query
from ..results import Progress
from . import search_upkeep
from .codec import ITEM_KIND
from .records import segment_name
from .search_blocks import word_hashes
from .search_index import rank
from .segments import SessionLayout, SessionState, now_micros


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
        ids = layout.tail_ids(memory, state)
        expected = ids[-need:]
        after = ids[-need - 1] if len(ids) > need else None
        hits = memory.fetch(region, ITEM_KIND, limit=need, after_id=after)
        if [hit.id for hit in hits] == expected:
            return hits
        state.tail_ids = None  # something expired (or went missing): look again
    hits = memory.fetch(region, ITEM_KIND, limit=need, newest=True)
    layout.check_complete(state, {number: [hit.id for hit in hits]}, newest=need)
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
    payloads: list[str] = []
    for done, number in enumerate(state.segments, 1):
        hits = layout.live_hits(memory, state, number)
        read[number] = [hit.id for hit in hits]
        payloads.extend(hit.payload for hit in hits)
        if progress is not None:
            progress(done, len(state.segments))
    if read:
        layout.check_complete(state, read)
    return payloads


def summary(layout: SessionLayout, memory: Memory, state: SessionState) -> tuple[int, int, int] | None:
    """(live items, creation time of the oldest, of the newest) in µs; None when empty."""
    oldest = next(
        (
            hits[0]
            for n in state.segments
            if (hits := memory.fetch(layout.region(memory, state, n), ITEM_KIND, limit=1))
        ),
        None,
    )
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
    stored = layout.rows(list(names.values())) if names else {}
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


def search(layout: SessionLayout, memory: Memory, state: SessionState, query: str, limit: int) -> list[str]:
    """The session's live items best matching `query`, best first (search_index.rank).

    Ranked over the search data of every segment, held in memory once read
    (search_upkeep.py): only the items returned are read from the file, so the
    cost does not depend on what else the file holds.
    """
    if not state.segments or limit <= 0:
        return []
    vector = embed_query(layout.embedder, query)
    indexes = {number: search_upkeep.loaded(layout, memory, state, number) for number in state.segments}
    segment_of = {atom: number for number, index in indexes.items() for atom in index.ids}
    ranked = rank(list(indexes.values()), vector, word_hashes(query), layout.identity.metric, now_micros())
    found: list[str] = []
    while ranked and len(found) < limit:
        chosen, ranked = ranked[: limit - len(found)], ranked[limit - len(found) :]
        by_segment: dict[int, list[int]] = {}
        for atom in chosen:
            by_segment.setdefault(segment_of[atom], []).append(atom)
        payloads: dict[int, str] = {}
        for number, atoms in by_segment.items():
            hits = memory.fetch_by_ids(layout.region(memory, state, number), atoms)
            unread = [atom for atom, hit in zip(atoms, hits, strict=True) if hit is None]
            if unread:
                # Expired (or erased) since the ranking is fine; stored and unreadable is damage.
                name = segment_name(state.hid, number)
                rows, now = layout.rows([name])[name], now_micros()
                lost = [a for a in unread if a in rows and (rows[a] is None or rows[a] > now)]  # type: ignore[operator]
                if lost:
                    raise layout.damaged(state, len(lost), len(atoms))
            payloads.update({hit.id: str(hit.payload) for hit in hits if hit is not None})
        found.extend(payloads[atom] for atom in chosen if atom in payloads)
    return found
