"""Keeping search data in step with the items: loading, checking, repairing and storing it.

A segment's index (search_index.py) is loaded from its block atoms the first time
the segment is searched, and checked against the segment's items, counted in its
region (Citadel's `count`, which costs the same in a file of any size):

* as many live items as entries: the index is complete (the common case);
* otherwise the items' ids are read (and checked against the pages): an entry
  whose item is gone (a crash between erasing an item and re-storing its block's
  other entries) is erased, its block forgotten and its live entries stored anew;
  a live item without an entry (the same crash, a file written before search
  data existed, a block whose key was damaged and dropped at open) is embedded
  again from its stored text, and stored.

So a crash anywhere costs at most some re-embedding, never a wrong result, and
no derived copy outlives its item. Entries left without a block by a pop wait in
memory for the session's next write (one commit instead of two per pop), or for
the file's close.
"""

from __future__ import annotations

import logging
from itertools import groupby

import numpy as np
from citadeldb.memory import AtomHit, Memory

from ..embedders.protocol import embed_documents
from ..errors import CorruptDatabaseError
from .codec import (
    ITEM_KIND,
    QUESTION_LOOKBACK,
    SEARCH_KIND,
    decode_item,
    in_contexts,
    is_user_message,
    latest_question,
    search_text,
)
from .search_blocks import Entries, block_atom, derive, read_block
from .search_index import Chunk, SegmentIndex
from .segment_cache import SegmentCache, SessionState
from .segments import ALL, SessionLayout

logger = logging.getLogger("citadeldb_openai_agents")


def loaded(layout: SessionLayout, memory: Memory, state: SessionState, number: int) -> SegmentIndex:
    """The segment's complete index: kept in memory, or read from its blocks (checked, repaired)."""
    cached = layout.caches.entry(state, number)
    index = cached.search
    if index is not None and index.complete:
        layout.caches.touch(state, number, cached)
        return index
    with layout.caches.writing(state, number) as cached:  # a repair writes
        index = cached.search = _load(layout, memory, state, number, index)
    return index


def _load(
    layout: SessionLayout, memory: Memory, state: SessionState, number: int, pending: SegmentIndex | None
) -> SegmentIndex:
    region = layout.region(memory, state, number)
    blocks = []
    for hit in memory.fetch(region, SEARCH_KIND, limit=ALL):
        try:
            blocks.append((hit, read_block(hit.id, hit.payload, layout.identity.dim)))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptDatabaseError(
                f"{layout.path}: search data atom {hit.id} of session {state.session_id!r} cannot be "
                f"decoded ({exc}). Run `python -m citadeldb_openai_agents reembed` to rebuild search data."
            ) from None
    # Only the entries still without a block: those a block holds are read from the file.
    waiting = pending.pending if pending is not None else []
    covered = {int(atom) for chunk in waiting for atom in chunk.entries.ids}
    covered.update(int(atom) for _, entries in blocks for atom in entries.ids)
    # The common case, read from this region alone: as many live items as entries. Only
    # otherwise (a crash, an older file, a lost block) are the item ids read to tell which.
    hits = (
        None if memory.count(region, ITEM_KIND) == len(covered) else _live_hits(layout, memory, state, number)
    )
    live = None if hits is None else {hit.id for hit in hits}
    index = SegmentIndex(layout.identity.dim, complete=True)
    seen: set[int] = set()
    stale: list[int] = []
    for chunk in waiting:
        index.add(chunk.entries, 0, chunk.expires_at)
        seen.update(int(atom) for atom in chunk.entries.ids)
    for hit, entries in blocks:
        fresh = np.asarray([int(atom) not in seen for atom in entries.ids], dtype=np.bool_)
        gone = np.asarray(
            [live is not None and int(atom) not in live for atom in entries.ids], dtype=np.bool_
        )
        if gone.any():
            stale.append(hit.id)  # holds an erased item's entry: it goes, its live entries stay
            index.add(entries.select(fresh & ~gone), 0, hit.expires_at)
        else:
            index.add(entries.select(fresh), hit.id, hit.expires_at)
        seen.update(int(atom) for atom in entries.ids)
    if stale:
        memory.forget(region, stale)
        logger.info("erased %d search data atoms of erased items in %s", len(stale), layout.path)
    if hits is not None and live is not None and live - seen:
        _repair(layout, memory, state, number, index, hits, live - seen)
    store_pending(layout, memory, state, number, index)
    return index


def _live_hits(layout: SessionLayout, memory: Memory, state: SessionState, number: int) -> list[AtomHit]:
    """The segment's live items, checked against the pages (a short read is damage)."""
    hits = layout.live_hits(memory, state, number)
    layout.completeness.check(state, {number: [hit.id for hit in hits]})
    return hits


def _repair(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    number: int,
    index: SegmentIndex,
    hits: list[AtomHit],
    ids: set[int],
) -> None:
    """Embed these items (of the segment's live `hits`) again from their stored text, as
    `append` did: each after the user message before it."""
    items = [decode_item(hit.payload) for hit in hits]
    texts = [search_text(item) for item in items]
    users = [is_user_message(item) for item in items]
    contexts, _ = in_contexts(_question_before(layout, memory, state, number), texts, users)
    chosen = [row for row, hit in enumerate(hits) if hit.id in ids]
    if not chosen:
        return
    logger.info("re-embedding %d items without search data in %s", len(chosen), layout.path)
    vectors = embed_documents(
        layout.embedder, [contexts[row] for row in chosen], "the search stopped there; nothing was lost"
    )
    entries = derive(
        vectors, [texts[row] for row in chosen], [users[row] for row in chosen], layout.identity.metric
    )
    entries = entries.with_ids([hits[row].id for row in chosen])
    expiry = [hits[row].expires_at for row in chosen]
    for expires_at, rows in groupby(range(len(chosen)), key=lambda row: expiry[row]):
        mask = np.zeros(len(chosen), dtype=np.bool_)
        mask[list(rows)] = True
        index.add(entries.select(mask), 0, expires_at)


def _question_before(layout: SessionLayout, memory: Memory, state: SessionState, number: int) -> str:
    """The latest user message before segment `number` (looked for in the segment before it)."""
    earlier = [n for n in state.segments if n < number]
    if not earlier:
        return ""
    region = layout.region(memory, state, earlier[-1])
    hits = memory.fetch(region, ITEM_KIND, limit=QUESTION_LOOKBACK, newest=True)
    return latest_question([str(hit.payload) for hit in hits]) or ""


def pending_atoms(
    layout: SessionLayout, index: SegmentIndex | None
) -> tuple[list[Chunk], list[dict[str, object]]]:
    """The entries of a segment's index that wait for a block, and the block atoms that would store them."""
    chunks = index.pending if index is not None else []
    atoms = [block_atom(c.entries, layout.identity.dim, c.expires_at, own=False) for c in chunks]
    return chunks, atoms


def store_pending(
    layout: SessionLayout, memory: Memory, state: SessionState, number: int, index: SegmentIndex | None = None
) -> None:
    """Store, in one commit, the entries of the segment's index (or of `index`) that wait for a block."""
    with layout.caches.writing(state, number) as cached:
        chunks, atoms = pending_atoms(layout, index if index is not None else cached.search)
        if atoms:
            ids = memory.remember_batch(layout.region(memory, state, number), atoms)
            for chunk, atom in zip(chunks, ids, strict=True):
                chunk.block = atom


def store_all_pending_of(layout: SessionLayout, memory: Memory, state: SessionState) -> None:
    """The session's entries that wait for a block, in every segment (under its lock)."""
    waiting = [n for n, cached in state.cache.items() if cached.search is not None and cached.search.pending]
    for number in waiting:
        if number in state.segments:
            store_pending(layout, memory, state, number)


def store_all_pending(layout: SessionLayout, memory: Memory) -> None:
    """Before the file closes: every session's entries that wait for a block."""
    for state in layout.states():
        with state.lock:
            store_all_pending_of(layout, memory, state)


def take_out(
    layout: SessionLayout, memory: Memory, state: SessionState, number: int, ids: list[int]
) -> list[int]:
    """Before erasing these items of a segment: the block atoms holding their entries, to be
    forgotten with them. The blocks' other entries wait in memory for a new block."""
    index = layout.caches.entry(state, number).search
    if index is None or not index.complete:
        fast = _own_block(layout, memory, state, number, ids, index)
        if fast is not None:
            return fast
        index = loaded(layout, memory, state, number)
    return index.take_out(set(ids))


def _own_block(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    number: int,
    ids: list[int],
    waiting: SegmentIndex | None,
) -> list[int] | None:
    """Without the index: the block written with the newest item's batch sits right after it.

    Its other entries join `waiting` (the entries earlier pops left without a block), so
    that they are stored again and none of them is lost from sight."""
    if len(ids) != 1:
        return None
    region = layout.region(memory, state, number)
    hit = memory.fetch_one(region, ids[0] + 1)
    if hit is None or hit.kind != SEARCH_KIND:
        return None
    try:
        entries = read_block(hit.id, hit.payload, layout.identity.dim)
    except (ValueError, KeyError, TypeError):
        return None
    if ids[0] not in {int(atom) for atom in entries.ids}:
        return None
    rest = waiting if waiting is not None else SegmentIndex(layout.identity.dim, complete=False)
    rest.add(entries.select(entries.ids != ids[0]), 0, hit.expires_at)
    layout.caches.entry(state, number).search = rest
    return [hit.id]


def appended(
    cached: SegmentCache,
    entries: Entries,
    block: int,
    expires_at: int | None,
    flushed: list[tuple[Chunk, int]],
) -> None:
    """A batch and its block were stored (with `flushed`: pending chunks and their new blocks)."""
    for chunk, atom in flushed:
        chunk.block = atom
    index = cached.search
    if index is not None and index.complete:
        index.add(entries, block, expires_at)
