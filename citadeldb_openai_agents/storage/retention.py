"""How long a session lives: its TTL counted per item or per session, and its idle time.

Two rules can end a whole session, a TTL counted per session (RedisSession's: a conversation
that goes on never loses its beginning, its items written with no expiry of their own) and an
idle time; `StoreOptions.session_limit` (options.py) says which applies and when. Both count
from the session's last write (the newest item's creation, or a later pop, which the record
keeps as `touched`).

The file's options (options.StoreOptions, the owner's) apply to every session; a session may
carry its own (options.SessionOptions), kept in its catalog record by the write that brought
them. A session past its deadline is erased before any
operation reads or writes it (local_file.py), hidden from the file's listings, and erased
with a receipt by `purge` or by the owner's sweep (`Sweeper`), keys destroyed as `clear`
destroys them. A TTL counted per item (the default) is Citadel's own expiry of each atom.

Citadel's eviction policies (`EvictionPolicy.stale`, `lru`) judge atoms one by one, by their
age or their last access, inside one region: neither knows a session spread over several
regions, or when it was last written. So the deadline is computed here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from citadeldb.memory import Memory

from ..options import SessionOptions
from .completeness import now_micros
from .reads import newest_hit
from .segment_cache import SessionState
from .segments import SessionLayout

logger = logging.getLogger("citadeldb_openai_agents")


def last_write(layout: SessionLayout, memory: Memory, state: SessionState) -> int | None:
    """When the session was last written (µs): its newest item's creation, or a later pop."""
    if state.last_write is None:
        newest = newest_hit(layout, memory, state)
        touched = None if state.record is None else state.record.touched
        known = [t for t in (None if newest is None else newest.created_at, touched) if t is not None]
        state.last_write = max(known) if known else None
    return state.last_write


def deadline(layout: SessionLayout, memory: Memory, state: SessionState) -> int | None:
    """When the session ends (µs), by the rule `StoreOptions.session_limit` names; None: never."""
    limit = rule(layout, state)
    if limit is None or not state.segments:
        return None
    written = last_write(layout, memory, state)
    return None if written is None else written + int(limit[0] * 1_000_000)


def rule(layout: SessionLayout, state: SessionState) -> tuple[float, str] | None:
    """How long the session lives after its last write, by the file's options and its own, and
    the setting that ends it then; None: no rule ends it."""
    return layout.retention.for_session(
        None if state.record is None else state.record.retention
    ).session_limit()


def ended(layout: SessionLayout, memory: Memory, state: SessionState) -> bool:
    """Whether the session is past its deadline (it is then erased before anything else)."""
    end = deadline(layout, memory, state)
    return end is not None and end <= now_micros()


def keep(layout: SessionLayout, memory: Memory, state: SessionState, own: SessionOptions | None) -> None:
    """Before a write: the session's own retention, if the write brings one its record lacks."""
    record = layout.record(state)
    if own is not None and own != record.retention:
        record.retention = own
        if state.catalog_id is not None:  # else the write lists its first segment with it
            layout.write_record(memory, state)


def sweep_period(layout: SessionLayout, states: list[SessionState]) -> float:
    """Seconds between two sweeps: a quarter of the shortest lifetime a session has, within 0.25-60 s."""
    limits = [layout.retention.session_limit()] + [
        layout.retention.for_session(state.record.retention).session_limit()
        for state in states
        if state.record is not None and state.record.retention is not None
    ]
    known = [limit[0] for limit in limits if limit is not None]
    return 60.0 if not known else min(60.0, max(0.25, min(known) / 4))


class Sweeper:
    """The owner's own schedule: erases the sessions past their deadline, one sweep per period.

    Args:
        sweep: Erases them, returns what it erased (LocalFile.erase_ended).
        period: The seconds to wait before the next sweep.
    """

    def __init__(self, sweep: Callable[[], object], period: Callable[[], float]) -> None:
        self._sweep, self._period = sweep, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="citadel-retention", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period()):
            try:
                self._sweep()
            except Exception as exc:  # the next sweep tries again; purge reports it to an operator
                # The failure's type only: its text can name the session it met.
                logger.warning("the retention sweep failed (%s); it runs again", type(exc).__name__)

    def stop(self) -> None:
        """Stop sweeping (a sweep under way finishes first)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
