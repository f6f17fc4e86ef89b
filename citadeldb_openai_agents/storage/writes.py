"""Changing a session: append a batch, pop, clear, erase with a receipt, and expiry.

Each function runs in a worker thread, under the session's lock. The order of each
write keeps the session's catalog record ahead of the data (records.py), so a crash
anywhere leaves a state the next open explains and finishes (audit.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import citadeldb
from citadeldb.memory import Memory

from ..embedders.protocol import embed_documents
from ..results import Erasure
from ..telemetry import erasing_for, erasure_cause, erasure_detail, events, metrics, on
from . import data_owners, retention, search_upkeep, usage
from .codec import (
    BATCH_KIND,
    ITEM_KIND,
    QUESTION_LOOKBACK,
    SEARCH_KIND,
    USAGE_KIND,
    Batch,
    answers_a_call,
    decode_item,
    in_contexts,
    latest_question,
)
from .completeness import now_micros
from .reads import newest, newest_hit, newest_in
from .search_blocks import Entries, block_atom, derive, placeholder_vector
from .segment_cache import SessionState, live_ids
from .segments import ALL, SEGMENT_CAPACITY, SessionLayout


def append(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    batch: Batch,
    batch_id: str | None = None,
    resent: bool = False,
) -> None:
    """Store one batch atomically, in one segment (its owner checked first: a mismatch writes nothing).

    With `batch_id` (an id another process chose), a write marker holding it is stored in the
    same commit: if that process sends the batch again (`resent`), not knowing whether the owner
    wrote it before dying, `committed` finds it and it is not written twice.

    Every item that is not the user's is embedded with the latest user message before it:
    a query matches the user's question better than the reply that answers it
    (benchmarks/search_quality). Its keyword text stays its own: a longer text would make
    each write pay for a bigger keyword index (+20% a turn).
    """
    if resent and batch_id is not None and committed(layout, memory, state, batch_id):
        if batch.max_items is not None:  # the owner that wrote it may have died before trimming
            trim(layout, memory, state, batch.max_items)
        return
    data_owners.keep(layout, memory, state, batch.owner, batch.labels)
    retention.keep(layout, memory, state, batch.retention)
    contextual, question = in_contexts(last_question(layout, memory, state), batch.texts, batch.from_user)
    vectors = embed_documents(layout.embedder, contextual)
    entries = derive(vectors, batch.texts, batch.from_user, layout.identity.metric)
    if batch.expires_at is not None:
        erase_expired_head(layout, memory, state)
    atoms = _batch_atoms(batch, vectors, entries, layout.identity.dim, batch_id)
    region = _tail_region(layout, memory, state)
    number = state.segments[-1]
    with layout.caches.writing(state, number) as cached:
        # Entries a pop left without a block go in the same commit, instead of one of their own.
        pending, pending_atoms = search_upkeep.pending_atoms(layout, cached.search)
        # A failed batch writes nothing; an empty listed segment is a valid tail.
        written = memory.remember_batch(region, atoms + pending_atoms)
        ids, block = written[: len(batch)], written[len(batch)]
        if ids != list(range(block - len(ids), block)):
            # The block names its items by position (the ids just before it); these are not.
            payload = block_atom(entries.with_ids(ids), layout.identity.dim, None, own=False)["payload"]
            memory.update_atom_payload(region, block, payload)
        flushed = list(zip(pending, written[len(atoms) :], strict=True))
        search_upkeep.appended(cached, entries.with_ids(ids), block, batch.expires_at, flushed)
        cached.add(dict(zip(ids, batch.payloads, strict=True)), batch.expires_at)
    state.last_write = now_micros()
    layout.caches.set_question(state, question)
    if batch.max_items is not None:
        trim(layout, memory, state, batch.max_items)


def trim(layout: SessionLayout, memory: Memory, state: SessionState, keep: int) -> None:
    """Erase the session's oldest items beyond its newest `keep`, as `clear_through` erases
    (announced in the record, noted in the erasure ledger, keys destroyed).

    Counted from the newest segment back, from the pages' list of live ids: only the
    segments holding the newest `keep` items and the one the cut falls in are looked at.
    The cut then moves past the tool outputs right after it, whose calls it erases (the
    session keeps fewer items rather than a history the model's API refuses), but never
    past the newest item.
    """
    now = now_micros()
    kept = 0
    newest: int | None = None
    for position in range(len(state.segments) - 1, -1, -1):
        number = state.segments[position]
        ids = live_ids(layout.completeness.atoms(state, [number])[number], now)
        newest = ids[-1] if newest is None and ids else newest
        if kept + len(ids) > keep and newest is not None:
            cut = len(ids) - (keep - kept)  # this segment's oldest `cut` items go, and any before
            through = _past_outputs(layout, memory, state, position, ids[cut - 1], newest)
            with erasing_for("max_items"):
                clear_through(layout, memory, state, through)
            return
        kept += len(ids)


def _past_outputs(
    layout: SessionLayout, memory: Memory, state: SessionState, position: int, through: int, newest: int
) -> int:
    """`through` moved past the tool outputs that follow it (their calls are at or before it)."""
    for number in state.segments[position:]:
        region = layout.region(memory, state, number)
        while hits := memory.fetch(region, ITEM_KIND, limit=8, after_id=through):
            for hit in hits:
                if hit.id >= newest or not answers_a_call(decode_item(hit.payload)):
                    return through
                through = hit.id
    return through


def _batch_atoms(
    batch: Batch, vectors: list[list[float]], entries: Entries, dim: int, batch_id: str | None
) -> list[dict[str, object]]:
    """The atoms of one batch's commit: its items, their search block, and its write marker."""
    atoms: list[dict[str, object]] = [
        {"kind": ITEM_KIND, "text": text, "embedding": vector, "payload": payload}
        for payload, text, vector in zip(batch.payloads, batch.texts, vectors, strict=True)
    ]
    if batch.expires_at is not None:
        for atom in atoms:
            atom["expires_at"] = batch.expires_at
    # The batch's search data, in the same commit: it is written, and erased, with the items.
    atoms.append(block_atom(entries, dim, batch.expires_at, own=True))
    if batch_id is not None:
        marker = {"kind": BATCH_KIND, "text": "batch", "payload": {"batch": batch_id}}
        atoms.append({**marker, "embedding": placeholder_vector(dim)})
    return atoms


def _tail_region(layout: SessionLayout, memory: Memory, state: SessionState) -> str:
    """The region a new batch goes in: the session's last segment, or a new one when it is full."""
    if state.segments and layout.tail_stored(state) < SEGMENT_CAPACITY:
        return layout.region(memory, state, state.segments[-1])
    search_upkeep.store_all_pending_of(layout, memory, state)
    return layout.open_segment(memory, state)


def committed(layout: SessionLayout, memory: Memory, state: SessionState, batch: str) -> bool:
    """Whether a batch with this id was written (its marker is in one of the last two segments)."""
    for number in state.segments[-2:]:
        region = layout.region(memory, state, number)
        if memory.fetch(region, BATCH_KIND, payload_filter={"batch": batch}, limit=1):
            return True
    return False


def last_question(layout: SessionLayout, memory: Memory, state: SessionState) -> str:
    """The latest user message's text (looked up once, then kept while nothing else writes)."""
    question = layout.caches.question(state)
    if question is None:
        question = latest_question(newest(layout, memory, state, QUESTION_LOOKBACK)) or ""
        layout.caches.set_question(state, question)
    return question


def pop(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    before_erasing: Callable[[tuple[int, str]], None] | None = None,
) -> str | None:
    """Erase the newest live item and return its payload (None when there is none).

    `before_erasing` is told the item's atom id and payload before anything of it is
    erased: a client of another process learns what it pops before the pop is done,
    so if the owner dies mid-call it can finish the pop safely (`pop_if_newest`).
    """
    while state.segments:
        number = state.segments[-1]
        hits = newest_in(layout, memory, state, number, 1)
        if not hits:
            # Only expired atoms left in the tail: erase them with their segment.
            layout.drop_segment(memory, state, number)
            continue
        hit = hits[0]
        if before_erasing is not None:
            before_erasing((hit.id, str(hit.payload)))
        layout.erasures.items(state, [hit])
        record = layout.record(state)
        # A pop is a write: the session's TTL (session mode) and idle time count from it, and
        # every path below writes the record.
        record.touched = state.last_write = now_micros()
        if layout.tail_ids(state) == [hit.id] and record.segments is not None:
            # The segment's last live item: dropping the segment erases its key too.
            layout.drop_segment(memory, state, number)
            metrics.erased(1, layout.path, "pop")
            return str(hit.payload)
        with layout.caches.writing(state, number) as cached:
            # Its search data and its turn's usage go in the same forget (the block's other
            # entries wait in memory).
            blocks = search_upkeep.take_out(layout, memory, state, number, [hit.id])
            blocks += usage.popped(layout, memory, state, number, hit)
            record.erasing = [hit.id, *blocks]  # announced: a crash mid-erasure is not damage
            layout.write_record(memory, state)
            receipt = memory.forget(layout.region(memory, state, number), [hit.id, *blocks])
            cached.remove([hit.id])
        if receipt.rows_deleted == 0:
            continue  # gone meanwhile (expired): the next newest
        if not layout.tail_ids(state) and not layout.has_live(memory, state, number):
            layout.drop_segment(memory, state, number)
        metrics.erased(1, layout.path, "pop")
        return str(hit.payload)
    return None


def pop_if_newest(layout: SessionLayout, memory: Memory, state: SessionState, atom: int) -> str:
    """Pop the newest item if it is `atom`: "popped"; "gone" if `atom` is no longer stored; else "moved".

    What a client sends after reading the newest item (`reads.newest_hit`): sent again
    after the owner died without answering, it finds the atom gone and pops nothing more.
    """
    hit = newest_hit(layout, memory, state)
    if hit is not None and hit.id == atom:
        pop(layout, memory, state)
        return "popped"
    return "moved" if stored(layout, memory, state, atom) else "gone"


def clear_through(layout: SessionLayout, memory: Memory, state: SessionState, through: int) -> None:
    """Erase the items up to atom `through`, keeping any written since (`through` 0: none).

    What a client sends after reading the newest item's id: sent again, it finds them
    gone, and an item another process added meanwhile is never erased by it.
    """
    hit = newest_hit(layout, memory, state)
    if hit is None or through <= 0:
        return
    if hit.id <= through:
        clear(layout, memory, state)
        return
    for number in list(state.segments):
        older = [hit for hit in layout.live_hits(memory, state, number) if hit.id <= through]
        ids = [hit.id for hit in older]
        if not ids:
            break
        layout.erasures.items(state, older)
        metrics.erased(len(ids), layout.path, "clear" if erasure_cause() == "erase" else erasure_cause())
        if not any(hit.id > through for hit in newest_in(layout, memory, state, number, 1)):
            layout.drop_segment(memory, state, number)  # all of it is older
            continue
        with layout.caches.writing(state, number) as cached:
            # Their search data and the usage of the turns they began go in the same forget.
            blocks = search_upkeep.take_out(layout, memory, state, number, ids)
            blocks += usage.anchored(layout, memory, state, number, ids)
            record = layout.record(state)
            record.erasing = ids + blocks  # announced: a crash mid-erasure is not damage
            layout.write_record(memory, state)
            memory.forget(layout.region(memory, state, number), ids + blocks)
            cached.remove(ids)
            search_upkeep.store_pending(layout, memory, state, number)
        break


def stored(layout: SessionLayout, memory: Memory, state: SessionState, atom: int) -> bool:
    """Whether the session still holds the live item `atom`."""
    for number in state.segments:
        found = memory.fetch_by_ids(layout.region(memory, state, number), [atom])
        if found and found[0] is not None:
            return True
    return False


def clear(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    before_erasing: Callable[[int], None] | None = None,
) -> str | None:
    """Erase the whole session: mark its record as clearing, drop its segments, forget the record.

    Returns the key-wrapping algorithm from the catalog atom's forget receipt, if
    the session had one (dropping a region gives no receipt). `before_erasing` is told
    the newest item's atom id (0: none) before anything is erased: a client that heard
    it and then lost the owner finishes with `clear_through` that id, so items another
    process added since are kept, and nothing is erased twice.
    """
    if before_erasing is not None or layout.erasures.ledger is not None:
        hit = newest_hit(layout, memory, state)
        if before_erasing is not None:
            before_erasing(0 if hit is None else hit.id)
        layout.erasures.session(state, hit)
    if on():  # counted only for a meter: it reads each segment's ids
        held = sum(len(layout.live_hits(memory, state, number)) for number in state.segments)
        metrics.erased(held, layout.path, "clear" if erasure_cause() == "erase" else erasure_cause())
    return _drop_session(layout, memory, state)


def _drop_session(layout: SessionLayout, memory: Memory, state: SessionState) -> str | None:
    """`clear` once the ledger has the erasure: the record marked, the segments dropped, the record forgotten."""
    if state.catalog_id is not None:
        record = layout.record(state)
        record.clearing = True  # in the commit that carries the ledger's new head, if any
        layout.write_record(memory, state)
    for number in list(state.segments):
        layout.drop_segment(memory, state, number, unlist=False)
    algorithm = None
    if state.catalog_id is not None:
        # The last step: a record gone while its segments remain can only be damage.
        algorithm = layout.forget_record(memory, state)
    state.record = state.last_write = None
    return algorithm


def erase(
    layout: SessionLayout, memory: Memory, state: SessionState, receipt_id: str | None = None
) -> Erasure | None:
    """`clear`, then read back through Citadel that every erased atom is gone.

    Dropping a region returns no receipt, so the evidence is gathered here: the
    ids of every stored item first, then, per dropped segment, a region of the
    same name is attached and Citadel's `verify` must call each of those ids
    ``missing`` (no row, no key). None when the file holds nothing for the session.
    (A move's check that the session is still what it copied: `branches.erase_all`.)
    The receipt is logged and counted (telemetry/) under `receipt_id` (new if None), for
    the cause its caller set (`telemetry.erasing_for`).
    """
    if state.catalog_id is None and not state.segments:
        return None
    erased = {
        number: [hit.id for hit in layout.live_hits(memory, state, number)] for number in state.segments
    }
    # The items' search data (and their turns' usage) is read back too: no copy may survive them.
    derived = {
        number: [
            hit.id
            for kind in (SEARCH_KIND, USAGE_KIND)
            for hit in memory.fetch(layout.region(memory, state, number), kind, limit=ALL)
        ]
        for number in state.segments
    }
    entry = layout.erasures.session(state, newest_hit(layout, memory, state))
    algorithm = _drop_session(layout, memory, state) or "AES-256-KW(RFC3394)"
    confirmed = True
    for number, ids in erased.items():
        region = layout.region(memory, state, number)
        atoms = ids + derived[number]
        verdicts = memory.verify(region, atoms) if atoms else []
        confirmed = confirmed and all(v.verdict == "missing" for v in verdicts)
        memory.drop_region(region)
        layout.detach(region)
    receipt = Erasure(
        items_erased=sum(len(ids) for ids in erased.values()),
        regions_dropped=len(erased),
        algorithm=algorithm,
        readback_confirmed=confirmed,
        ledger=None if layout.erasures.ledger is None else layout.erasures.ledger.path,
        ledger_entries=() if entry is None else (entry,),
        receipt_id=receipt_id or uuid.uuid4().hex,
    )
    reported(layout, state, receipt)
    return receipt


def reported(layout: SessionLayout, state: SessionState, receipt: Erasure) -> None:
    """An erasure's receipt in the log (its one line, by the session's salted hash) and the metrics."""
    cause = erasure_cause()
    events.erasure(
        layout.path,
        receipt.receipt_id,
        cause,
        receipt.items_erased,
        receipt.readback_confirmed,
        receipt.ledger_entries,
        layout.keyed(b"telemetry session", state.session_id),
        **erasure_detail(),
    )
    metrics.erased(receipt.items_erased, layout.path, cause)
    metrics.erasure(layout.path, cause, receipt.readback_confirmed)
    layout.recent.erased(cause, receipt)


def erase_expired_head(layout: SessionLayout, memory: Memory, state: SessionState) -> None:
    """Erase expired atoms from the oldest segments (where expiry happens first)."""
    while state.segments:
        number = state.segments[0]
        _evict_expired(layout, memory, state, number)
        if len(state.segments) == 1 or layout.has_live(memory, state, number):
            break
        layout.drop_segment(memory, state, number)


def purge_expired(layout: SessionLayout, memory: Memory, state: SessionState) -> None:
    """Erase every expired atom of the session (items, their search data, write markers);
    drop segments left empty. `LocalFile.purge_expired` counts the items."""
    for number in list(state.segments):
        _evict_expired(layout, memory, state, number)
        if not layout.has_live(memory, state, number):
            layout.drop_segment(memory, state, number)
    # The record goes with the last segment, unless it lists the names of branches still held.
    if not state.segments and state.catalog_id is not None and not layout.branches(state.session_id):
        layout.forget_record(memory, state)
        state.record = state.last_write = None


def _evict_expired(layout: SessionLayout, memory: Memory, state: SessionState, number: int) -> None:
    """Citadel's eviction of what has expired in one segment; its cache entry loses the same."""
    before = now_micros()  # Citadel's now is later: whatever expired by this time goes
    with layout.caches.writing(state, number) as cached:
        if memory.evict(layout.region(memory, state, number), citadeldb.EvictionPolicy.expired()):
            cached.expired(before)
