"""A run's token usage per turn (`AdvancedSQLiteSession.store_run_usage`), encrypted as the items are.

One atom per turn, in the segment of the user message that began the turn (its anchor),
with that message's expiry: it goes with its segment, its branch and its session, and it
expires with its turn. Storing a turn's usage again replaces it (the old atom's key is
destroyed); erasing the turn's user message erases it in the same forget, whatever erases
it (a pop, the `max_items` cap, `clear_through`, a compaction's replacement), as the SDK
drops the turn's usage row with the turn (its `clear_session`: no stale usage is kept).
Turn numbers are not stored: a turn's is its anchor's rank among the branch's user messages
when asked, so usage follows its turn even after older turns expired or were capped away.
"""

from __future__ import annotations

from typing import Any

from citadeldb.memory import AtomHit, Memory

from .codec import USAGE_KIND
from .reads import item_hits, starts_turn
from .segment_cache import SessionState
from .segments import ALL, SessionLayout


def store(
    layout: SessionLayout, memory: Memory, state: SessionState, usage: dict[str, Any], turn: int | None = None
) -> bool:
    """Keep `usage` as the current turn's (the newest user message's), or (an import's) as user turn
    `turn`'s; False: there is no such turn to keep it for."""
    anchor = (
        _newest_user_message(layout, memory, state)
        if turn is None
        else _user_message(layout, memory, state, turn)
    )
    if anchor is None:
        return False
    number, hit = anchor
    region = layout.region(memory, state, number)
    record = layout.record(state)
    with layout.caches.writing(state, number):
        replaced = anchored(layout, memory, state, number, [hit.id])
        atom: dict[str, Any] = {"kind": USAGE_KIND, "text": "usage", "payload": {"anchor": hit.id, **usage}}
        if hit.expires_at is not None:
            atom["expires_at"] = hit.expires_at
        # The new one first: a crash before the old one goes leaves both, and the newer counts.
        memory.remember(region, atom)
        if replaced:
            record.erasing = replaced  # announced: a crash mid-erasure is not damage
            layout.write_record(memory, state)
            memory.forget(region, replaced)
    if not record.usage:
        record.usage = True  # from now on, a pop of a user message looks for its usage
        layout.write_record(memory, state)
    return True


def anchored(
    layout: SessionLayout, memory: Memory, state: SessionState, number: int, anchors: list[int]
) -> list[int]:
    """The ids of segment `number`'s usage atoms anchored to any of `anchors`."""
    if state.record is None or not state.record.usage:
        return []
    region = layout.region(memory, state, number)
    wanted = set(anchors)
    return [
        hit.id for hit in memory.fetch(region, USAGE_KIND, limit=ALL) if hit.payload.get("anchor") in wanted
    ]


def popped(
    layout: SessionLayout, memory: Memory, state: SessionState, number: int, hit: AtomHit
) -> list[int]:
    """The usage atoms a pop of `hit` takes with it: its turn's, when it began one."""
    if state.record is None or not state.record.usage or not starts_turn(str(hit.payload)):
        return []
    return anchored(layout, memory, state, number, [hit.id])


def by_turn(layout: SessionLayout, memory: Memory, state: SessionState) -> list[tuple[int, dict[str, Any]]]:
    """(turn number, usage) of each turn of the branch that has usage stored, by turn."""
    if state.record is None or not state.record.usage:
        return []
    turns, turn = {}, 0
    for hit in item_hits(layout, memory, state):
        if starts_turn(str(hit.payload)):
            turn += 1
            turns[hit.id] = turn
    found: dict[int, dict[str, Any]] = {}
    for number in state.segments:
        for hit in memory.fetch(layout.region(memory, state, number), USAGE_KIND, limit=ALL):
            payload = dict(hit.payload)
            number_of_turn = turns.get(payload.pop("anchor", None))
            if number_of_turn is not None:
                found[number_of_turn] = payload
    return sorted(found.items())


def _newest_user_message(
    layout: SessionLayout, memory: Memory, state: SessionState
) -> tuple[int, AtomHit] | None:
    for number in reversed(state.segments):
        hits = layout.live_hits(memory, state, number)
        layout.completeness.check(state, {number: [hit.id for hit in hits]})
        for hit in reversed(hits):
            if starts_turn(str(hit.payload)):
                return number, hit
    return None


def _user_message(
    layout: SessionLayout, memory: Memory, state: SessionState, turn: int
) -> tuple[int, AtomHit] | None:
    """The user message that begins turn `turn`, with its segment."""
    seen = 0
    for number in state.segments:
        hits = layout.live_hits(memory, state, number)
        layout.completeness.check(state, {number: [hit.id for hit in hits]})
        for hit in hits:
            seen += starts_turn(str(hit.payload))
            if seen == turn and starts_turn(str(hit.payload)):
                return number, hit
    return None
