"""Changing a session: append a batch, pop, clear, erase with a receipt, and expiry.

Each function runs in a worker thread, under the session's lock. The order of each
write keeps the session's catalog record ahead of the data (records.py), so a crash
anywhere leaves a state the next open explains and finishes (audit.py).
"""

from __future__ import annotations

import citadeldb
from citadeldb.memory import Memory

from ..embedders.protocol import embed_documents
from ..results import Erasure
from .codec import ITEM_KIND, decode_item, in_context, is_user_message, search_text
from .reads import newest, newest_in
from .records import CATALOG_REGION
from .segments import SEGMENT_CAPACITY, SessionLayout, SessionState

_QUESTION_LOOKBACK = 32  # items searched back for the latest user message after a restart


def append(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    payloads: list[str],
    texts: list[str],
    from_user: list[bool],
    expires_at: int | None,
) -> None:
    """Store one batch atomically, in one segment.

    Every item that is not the user's is embedded with the latest user message
    before it: a query matches the user's question better than the reply that
    answers it, so the reply's vector must carry the question's meaning too
    (benchmarks/search_quality). Its keyword text stays its own: the keyword
    index is what a longer text makes a write pay for (+20% a turn), the
    vector costs the same whatever it was computed from.
    """
    question = last_question(layout, memory, state)
    contextual = []
    for text, user in zip(texts, from_user, strict=True):
        if user:
            question = text
        contextual.append(in_context(question, text, user))
    vectors = embed_documents(layout.embedder, contextual)
    if expires_at is not None:
        erase_expired_head(layout, memory, state)
    atoms: list[dict[str, object]] = [
        {"kind": ITEM_KIND, "text": text, "embedding": vector, "payload": payload}
        for payload, text, vector in zip(payloads, texts, vectors, strict=True)
    ]
    if expires_at is not None:
        for atom in atoms:
            atom["expires_at"] = expires_at
    if not state.segments or layout.tail_stored(memory, state) >= SEGMENT_CAPACITY:
        region = layout.open_segment(memory, state)
    else:
        region = layout.region(memory, state, state.segments[-1])
    # A failed batch writes nothing; an empty listed segment is a valid tail.
    ids = memory.remember_batch(region, atoms)
    if state.tail_ids is not None:
        state.tail_ids.extend(ids)
    state.tail_stored += len(ids)
    state.last_question = question


def last_question(layout: SessionLayout, memory: Memory, state: SessionState) -> str:
    """The latest user message's text (looked up once, then kept up to date)."""
    if state.last_question is None:
        state.last_question = ""
        for payload in reversed(newest(layout, memory, state, _QUESTION_LOOKBACK)):
            item = decode_item(payload)
            if is_user_message(item):
                state.last_question = search_text(item)
                break
    return state.last_question


def pop(layout: SessionLayout, memory: Memory, state: SessionState) -> str | None:
    """Erase the newest live item and return its payload (None when there is none)."""
    state.last_question = None  # it may be what goes
    while state.segments:
        number = state.segments[-1]
        hits = newest_in(layout, memory, state, number, 1)
        if not hits:
            # Only expired atoms left in the tail: erase them with their segment.
            layout.drop_segment(memory, state, number)
            continue
        hit = hits[0]
        record = layout.record(state)
        record.popping = hit.id  # announced: a crash mid-erasure is not damage
        if state.tail_ids == [hit.id] and record.segments is not None:
            # The segment's last live item: dropping the segment erases its key too.
            layout.drop_segment(memory, state, number)
            return str(hit.payload)
        layout.write_record(memory, state)
        receipt = memory.forget(layout.region(memory, state, number), [hit.id])
        if receipt.rows_deleted == 0:
            state.tail_ids = None
            continue
        if state.tail_ids:
            state.tail_ids.remove(hit.id)
        state.tail_stored = max(0, state.tail_stored - 1)
        if not state.tail_ids and not layout.has_live(memory, state, number):
            layout.drop_segment(memory, state, number)
        return str(hit.payload)
    return None


def clear(layout: SessionLayout, memory: Memory, state: SessionState) -> str | None:
    """Erase the whole session: mark its record as clearing, drop its segments, forget the record.

    Returns the key-wrapping algorithm from the catalog atom's forget receipt, if
    the session had one (dropping a region gives no receipt).
    """
    state.last_question = None  # it may be what goes
    if state.catalog_id is not None:
        record = layout.record(state)
        if not record.clearing:
            record.clearing = True
            layout.write_record(memory, state)
    for number in list(state.segments):
        layout.drop_segment(memory, state, number, unlist=False)
    algorithm = None
    if state.catalog_id is not None:
        # The last step: a record gone while its segments remain can only be damage.
        algorithm = memory.forget(CATALOG_REGION, [state.catalog_id]).algorithm
        state.catalog_id = None
    state.record = None
    return algorithm


def erase(layout: SessionLayout, memory: Memory, state: SessionState) -> Erasure | None:
    """`clear`, then read back through Citadel that every erased atom is gone.

    Dropping a region returns no receipt, so the evidence is gathered here: the
    ids of every stored item first, then, per dropped segment, a region of the
    same name is attached and Citadel's `verify` must call each of those ids
    ``missing`` (no row, no key). None when the file holds nothing for the session.
    """
    if state.catalog_id is None and not state.segments:
        return None
    erased = {
        number: [hit.id for hit in layout.live_hits(memory, state, number)] for number in state.segments
    }
    algorithm = clear(layout, memory, state) or "AES-256-KW(RFC3394)"
    confirmed = True
    for number, ids in erased.items():
        region = layout.region(memory, state, number)
        verdicts = memory.verify(region, ids) if ids else []
        confirmed = confirmed and all(v.verdict == "missing" for v in verdicts)
        memory.drop_region(region)
        layout.detach(region)
    return Erasure(
        items_erased=sum(len(ids) for ids in erased.values()),
        regions_dropped=len(erased),
        algorithm=algorithm,
        readback_confirmed=confirmed,
    )


def erase_expired_head(layout: SessionLayout, memory: Memory, state: SessionState) -> None:
    """Erase expired atoms from the oldest segments (where expiry happens first)."""
    erased = 0
    while state.segments:
        number = state.segments[0]
        region = layout.region(memory, state, number)
        erased += memory.evict(region, citadeldb.EvictionPolicy.expired())
        if len(state.segments) == 1 or layout.has_live(memory, state, number):
            break
        layout.drop_segment(memory, state, number)
    if erased:
        state.tail_ids = None


def purge_expired(layout: SessionLayout, memory: Memory, state: SessionState) -> int:
    """Erase every expired atom of the session; drop segments left empty."""
    state.last_question = None  # it may be what goes
    erased = 0
    for number in list(state.segments):
        region = layout.region(memory, state, number)
        erased += memory.evict(region, citadeldb.EvictionPolicy.expired())
        if not layout.has_live(memory, state, number):
            layout.drop_segment(memory, state, number)
    if erased:
        state.tail_ids = None
    if not state.segments and state.catalog_id is not None:
        memory.forget(CATALOG_REGION, [state.catalog_id])
        state.catalog_id = None
        state.record = None
    return erased
