"""One person's search: a query ranked over every session of one owner (issue 44), so that an
agent recalls what this person said in an earlier conversation, and never what another said.

The sessions' search data are ranked together (search_index.rank: one keyword scale over all of
them), with every session's lock held, taken in one order (by region stem) so that two such
searches cannot wait on each other. A session past its deadline is left out (its erasure is the
sweep's); a hit is read from the file as `reads.search_placed` reads one, damage raised the same.
"""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
from citadeldb.memory import Memory

from ..embedders.protocol import embed_query
from . import retention, search_upkeep
from .codec import ITEM_KIND
from .completeness import now_micros
from .records import segment_name
from .search_blocks import word_hashes
from .search_index import rank
from .segment_cache import SessionState
from .segments import SessionLayout


def search_sessions(
    layout: SessionLayout, memory: Memory, states: list[SessionState], query: str, limit: int
) -> list[tuple[str, str, int]]:
    """(session id, item as stored, its position in its session) of the `limit` best matches
    over `states` (MAIN states), best first."""
    if limit <= 0 or not states:
        return []
    vector = embed_query(layout.embedder, query)
    with ExitStack() as held:
        for state in sorted(states, key=lambda state: state.hid):
            held.enter_context(state.lock)
        live = [state for state in states if state.segments and not retention.ended(layout, memory, state)]
        places = [(state, number) for state in live for number in state.segments]
        indexes = [search_upkeep.loaded(layout, memory, state, number) for state, number in places]
        ids, where = rank(indexes, vector, word_hashes(query), layout.identity.metric, now_micros())
        rank_of = {id(state): position for position, state in enumerate(live)}
        session_of = np.asarray([rank_of[id(state)] for state, _ in places], np.int64)[where]
        in_order = [np.sort(ids[session_of == position]) for position in range(len(live))]
        found: list[tuple[str, str, int]] = []
        for atom, place in zip(ids.tolist(), where.tolist(), strict=True):
            if len(found) == limit:
                break
            state, number = places[place]
            payload = _read(layout, memory, state, number, atom, limit)
            if payload is not None:
                position = int(np.searchsorted(in_order[rank_of[id(state)]], atom)) + 1
                found.append((state.session_id, payload, position))
        return found


def _read(
    layout: SessionLayout, memory: Memory, state: SessionState, number: int, atom: int, limit: int
) -> str | None:
    """The hit's item as stored; None if it expired or was erased since the ranking."""
    hits = memory.fetch(layout.region(memory, state, number), ITEM_KIND, limit=1, after_id=atom - 1)
    if hits and hits[0].id == atom:
        return str(hits[0].payload)
    name = segment_name(state.hid, number)
    expires = layout.completeness.rows([name])[name].get(atom, 0)
    if expires == 0 or (expires is not None and expires <= now_micros()):
        return None
    raise layout.completeness.damaged(state, 1, limit)
