"""A session's branches (`AdvancedSQLiteSession`'s): each a history of its own, in segments of its own.

A session is its MAIN branch; another branch is a state of its own (segments.py, keyed
``(id, branch)``), written, read, searched, compacted, capped and expired as any session is.
Creating one copies the items before the turn it starts from into it, with their expiry (a
copy never outlives the item it copies), so deleting it, or the item it copied from, is a
cryptographic erasure that touches nothing else. Every name a session used stays used
(MAIN's record lists them), as the SDK's ``branch_reservations``; an erasure of the session
erases them with it.

The functions here that touch several branches run on MAIN's state, under its lock, and
take each branch's lock in turn: every operation that holds two locks holds MAIN's first,
so no two of them wait on each other.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import groupby
from typing import Any

from citadeldb.memory import Memory

from ..errors import BranchError, MoveConflictError
from ..results import Erasure
from . import reads, retention, usage, writes
from .codec import batch_of_payloads, session_digest
from .reads import item_hits, starts_turn
from .records import MAIN
from .segment_cache import SessionState
from .segments import SEGMENT_CAPACITY, SessionLayout


def item_rows(layout: SessionLayout, memory: Memory, state: SessionState) -> list[tuple[int, int, str]]:
    """(atom id, creation in µs, payload) of every live item of a branch, oldest first."""
    return [(hit.id, hit.created_at, str(hit.payload)) for hit in item_hits(layout, memory, state)]


@contextmanager
def locked(layout: SessionLayout, memory: Memory, main: SessionState, state: SessionState) -> Iterator[None]:
    """`state` under its lock, MAIN's being held already (MAIN's own is not taken twice); a
    branch past its TTL or idle time is erased first, as `LocalFile.on_session` erases a session."""
    with contextlib.nullcontext() if state is main else state.lock:
        if state is not main and retention.ended(layout, memory, state):
            writes.clear(layout, memory, state)
        yield


def every_branch(layout: SessionLayout, main: SessionState) -> list[SessionState]:
    """MAIN (first) and the session's other branches."""
    return [main, *layout.branches(main.session_id)]


def create(
    layout: SessionLayout, memory: Memory, main: SessionState, source: str, turn: int, name: str | None
) -> str:
    """A new branch of the items of `source` before its user turn `turn`; returns its name.

    Raises `BranchError`: no user message starts turn `turn` in `source`, or `name` was used.
    """
    origin = main if source == MAIN else layout.state((main.session_id, source))
    with locked(layout, memory, main, origin):
        found = item_hits(layout, memory, origin)
        retention = None if origin.record is None else origin.record.retention
    starts = [index for index, hit in enumerate(found) if starts_turn(str(hit.payload))]
    if not 1 <= turn <= len(starts):
        raise BranchError(f"Turn {turn} does not contain a user message in branch '{source}'")
    chosen = _free_name(layout, main, name, turn)
    target = layout.state((main.session_id, chosen))
    with locked(layout, memory, main, target):
        if target.segments:  # a copy a crash cut off after it was whole, before its name was kept
            raise BranchError(f"Branch ID '{chosen}' has already been used. Choose a new branch ID.")
        # Marked until whole: a copy a crash interrupts is erased when the file opens (segments.py),
        # and its name stays free, as the SDK's one transaction leaves it.
        layout.record(target).copying = True
        copied = found[: starts[turn - 1]]
        for expires_at, group in groupby(copied, key=lambda hit: hit.expires_at):
            run = [str(hit.payload) for hit in group]
            for start in range(0, len(run), SEGMENT_CAPACITY):
                batch = batch_of_payloads(run[start : start + SEGMENT_CAPACITY], expires_at)
                writes.append(layout, memory, target, replace(batch, retention=retention))
        layout.record(target).copying = False
        if target.catalog_id is not None:
            layout.write_record(memory, target)
    reserve(layout, memory, main, [chosen])
    return chosen


def _free_name(layout: SessionLayout, main: SessionState, name: str | None, turn: int) -> str:
    """`name`, or a new one, if the session never used it; else `BranchError`."""
    used = {MAIN, *layout.record(main).branches}
    if name is not None and name in used:
        raise BranchError(f"Branch ID '{name}' has already been used. Choose a new branch ID.")
    if name is None:
        base = name = f"branch_from_turn_{turn}_{int(time.time())}"
        suffix = 1
        while name in used:
            suffix += 1
            name = f"{base}_{suffix}"
    return name


def reserve(layout: SessionLayout, memory: Memory, main: SessionState, names: list[str]) -> None:
    """Record these branch names as used by the session (an import's), unless they are already."""
    record = layout.record(main)
    new = [name for name in dict.fromkeys(names) if name != MAIN and name not in record.branches]
    if new:
        record.branches.extend(new)
        layout.write_record(memory, main)


def reserved(layout: SessionLayout, memory: Memory, main: SessionState) -> list[str]:
    """Every branch name the session has used but MAIN, deleted branches' included (a move's)."""
    return [] if main.record is None else list(main.record.branches)


def delete(layout: SessionLayout, memory: Memory, main: SessionState, branch: str) -> Erasure:
    """Erase a branch other than MAIN, keys destroyed, with a receipt (its name stays used)."""
    target = layout.state((main.session_id, branch))
    with locked(layout, memory, main, target):
        erasure = writes.erase(layout, memory, target) if target.segments else None
        if erasure is None:
            raise BranchError(f"Branch '{branch}' does not exist")
        layout.forget_state(target)
    return erasure


def listing(layout: SessionLayout, memory: Memory, main: SessionState) -> list[tuple[str, int, int, int]]:
    """(name, items, user messages, first item's creation in µs) of each branch holding items,
    the oldest first (a branch's first items are the copies made when it was created)."""
    found = []
    for state in every_branch(layout, main):
        with locked(layout, memory, main, state):
            payloads = reads.all_items(layout, memory, state)  # kept payloads: no decryption
            oldest = reads.oldest_hit(layout, memory, state)
        if payloads and oldest is not None:
            # Only a text naming the user's role can be a user message: the rest is not parsed.
            users = sum('"role":"user"' in payload and starts_turn(payload) for payload in payloads)
            found.append((state.branch, len(payloads), users, oldest.created_at))
    return sorted(found, key=lambda branch: (branch[3], branch[0]))


def clear_all(
    layout: SessionLayout,
    memory: Memory,
    main: SessionState,
    before_erasing: Callable[[int], None] | None = None,
) -> str | None:
    """Erase the whole session: every branch, then MAIN (`writes.clear` tells `before_erasing`)."""
    for state in layout.branches(main.session_id):
        with locked(layout, memory, main, state):
            writes.clear(layout, memory, state)
            layout.forget_state(state)
    return writes.clear(layout, memory, main, before_erasing)


def clear_through_all(layout: SessionLayout, memory: Memory, main: SessionState, through: int) -> None:
    """A clear the owner began and died in: the branches whole, MAIN up to `through`."""
    for state in layout.branches(main.session_id):
        with locked(layout, memory, main, state):
            writes.clear(layout, memory, state)
            layout.forget_state(state)
    writes.clear_through(layout, memory, main, through)


def erase_all(
    layout: SessionLayout, memory: Memory, main: SessionState, expected: str | None = None
) -> Erasure | None:
    """`writes.erase` of every branch, MAIN last, one receipt for them all; None when the file
    holds nothing. With `expected` (a move's `session_digest` of what it copied and compared),
    only if every branch still holds exactly those items and that usage: checked with every
    branch's lock held, so no write slips in between; else `MoveConflictError`, nothing erased."""
    branches = layout.branches(main.session_id)
    receipts = []
    with contextlib.ExitStack() as held:
        for state in branches:  # MAIN's lock is held: no other holder of two waits on these
            held.enter_context(locked(layout, memory, main, state))
        if expected is not None:
            states = [main, *branches]
            current = {state.branch: reads.all_items(layout, memory, state) for state in states}
            used = [
                (s.branch, turn, counts) for s in states for turn, counts in usage.by_turn(layout, memory, s)
            ]
            if session_digest(current, used) != expected:
                raise MoveConflictError(
                    f"session {main.session_id!r} changed after the move copied and compared it (an item "
                    "was added, popped or erased meanwhile, a branch made, or a turn's usage stored); "
                    "nothing was erased."
                )
        receipt_id = uuid.uuid4().hex  # one receipt for every branch: each branch's log line names it
        for state in [*branches, main]:
            receipt = writes.erase(layout, memory, state, receipt_id)
            if state is not main:
                layout.forget_state(state)
            if receipt is not None:
                receipts.append(receipt)
    if not receipts:
        return None
    return Erasure(
        items_erased=sum(r.items_erased for r in receipts),
        regions_dropped=sum(r.regions_dropped for r in receipts),
        algorithm=receipts[-1].algorithm,
        readback_confirmed=all(r.readback_confirmed for r in receipts),
        ledger=receipts[-1].ledger,
        ledger_entries=tuple(entry for r in receipts for entry in r.ledger_entries),
        receipt_id=receipt_id,
    )


def summary_all(layout: SessionLayout, memory: Memory, main: SessionState) -> tuple[int, int, int] | None:
    """`reads.summary` over every branch: the items held, the first write, the last; None: none."""
    found = []
    for state in every_branch(layout, main):
        with locked(layout, memory, main, state):
            summary = reads.summary(layout, memory, state)
        if summary is not None:
            found.append(summary)
    if not found:
        return None
    return sum(s[0] for s in found), min(s[1] for s in found), max(s[2] for s in found)


def usage_of(
    layout: SessionLayout, memory: Memory, main: SessionState, branch: str | None
) -> list[tuple[str, int, dict[str, Any]]]:
    """(branch, turn, usage) of each turn with usage stored, of one branch or (None) of all."""
    found = []
    for state in every_branch(layout, main):
        if branch is None or state.branch == branch:
            with locked(layout, memory, main, state):
                found += [(state.branch, turn, used) for turn, used in usage.by_turn(layout, memory, state)]
    return found
