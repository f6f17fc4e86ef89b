"""Sessions that ended (their TTL counted per session, or their idle time), erased with a receipt.

Whoever finds a session past its deadline erases it here: a `purge` (which returns the receipts),
the owner's sweep (retention.Sweeper), or a call that finds the session ended before it reads it.
Each erasure's receipt is logged and counted (telemetry/), and, but for a purge's, kept for the
next purge to report (receipts.py): retention never erases without a trace.
"""

from __future__ import annotations

import time

from citadeldb.memory import Memory

from ..results import EndedSession
from ..telemetry import erasing_for, metrics
from . import retention, writes
from .engine import OpenDatabase
from .segment_cache import SessionState
from .segments import SessionLayout


def erase_ended(database: OpenDatabase, layout: SessionLayout, trigger: str) -> list[EndedSession]:
    """Erase, each with a receipt, the sessions past their TTL (session mode) or idle time, found
    by `trigger`: "purge" (returned to it) or "sweep" (the owner's schedule: kept for the next purge)."""
    ended = []
    for state in layout.states():
        with database.operation() as memory, state.lock:
            if not retention.ended(layout, memory, state):
                continue
            session = erase_one(layout, memory, state, trigger)
        if session is not None:
            ended.append(session)
    return sorted(ended, key=lambda session: (session.session_id, session.branch))


def erase_one(
    layout: SessionLayout, memory: Memory, state: SessionState, trigger: str
) -> EndedSession | None:
    """Erase a session that ended, with its receipt: logged, counted, and (but for a purge, which
    returns it) kept for the next purge's report (receipts.py)."""
    limit = retention.rule(layout, state)
    rule = "ttl" if limit is None else limit[1]
    with erasing_for("retention", rule=rule, trigger=trigger):  # its log line names both
        erasure = writes.erase(layout, memory, state)
    if erasure is None:
        return None
    session = EndedSession(state.session_id, rule, erasure, state.branch, time.time())
    metrics.retention_erased(layout.path, session.rule, trigger)
    if trigger != "purge":
        layout.recent.ended(session)
    return session
