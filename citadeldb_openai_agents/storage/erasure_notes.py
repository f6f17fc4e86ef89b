"""Where a file's erasures are noted: its erasure ledger (ledger.py), and the ledger's head in the file.

The ledger alone cannot show that its newest lines were removed, so the file keeps the chain's
head (the newest entry's number and MAC). It goes in the catalog record of the session being
erased, in the commit that announces the erasure, after the ledger line and before anything is
erased; the file's head is the newest of every record's and the layout record's, to which a
record hands its head before it is forgotten. A ledger short of it is refused (ledger.py).
"""

from __future__ import annotations

from typing import Any

from citadeldb.memory import AtomHit

from ..errors import LedgerError
from .ledger import ErasureLedger, LedgerHead, LedgerReading, rolled_back
from .records import CatalogRecord
from .segment_cache import SessionState


class ErasureNotes:
    """The file's ledger (None: erasures are not recorded) and the head its records hold."""

    def __init__(self, salt: bytes, recorded: Any) -> None:
        self._salt = salt
        self.head = head_of(recorded)  # the layout record's, until the catalog's are seen
        self.ledger: ErasureLedger | None = None

    def saw(self, record: CatalogRecord) -> None:
        """A catalog record read at open: its head counts."""
        self.head = later(self.head, head_of(record.ledger))

    def at(self, path: str, mirror: str | None = None) -> ErasureLedger:
        """The ledger at `path` (and `mirror`) as this file reads it: keyed by its salt, required to
        reach its head."""
        return ErasureLedger(path, self._salt, mirror=mirror, head=lambda: self.head)

    def keep(self, path: str | None, mirror: str | None = None) -> None:
        """Record this file's erasures there from now on (the first store to name a ledger sets it)."""
        if path is not None and self.ledger is None:
            self.ledger = self.at(path, mirror)

    def at_open(self, database: str, marked: bool) -> tuple[bool, LedgerHead | None]:
        """Refuse a file older than its ledger (`ledger.rolled_back`), before it is read or served;
        else whether the layout record must be written at this open, and the head it takes then.

        A file not `marked` as keeping heads, that records none, was made before files kept them:
        it takes the ledger's. One entry ahead is a crash's (the line written, the erasure never
        announced): the file takes it, so crash after crash never adds up to a rollback. A ledger
        cut short or changed is not refused here: `verify`, the next erasure and a restore are.
        """
        reading = self.newest()
        if reading is None:
            return self.ledger is not None and not marked, None
        if self.head is None and not marked:
            return True, reading.head
        rollback = rolled_back(len(reading.entries), self.head, database)
        if rollback is not None:
            raise rollback
        crashed = len(reading.entries) == (0 if self.head is None else self.head.number) + 1
        return not marked or crashed, reading.head if crashed else None

    def newest(self) -> LedgerReading | None:
        """The ledger's entries, not required to reach the file's head; None when there is no
        ledger or it cannot be trusted (`verify` says why; the next erasure refuses it)."""
        if self.ledger is None:
            return None
        try:
            return self.ledger.read(reach_head=False)
        except LedgerError:
            return None

    def items(self, state: SessionState, hits: list[AtomHit]) -> bool:
        """In the ledger, before they are erased: these items of the session. True when an entry
        was written: the caller's next record write (before the erasure) carries the new head."""
        if self.ledger is None:
            return False
        return self._noted(state, self.ledger.record_items(state.hid, [(h.id, h.created_at) for h in hits]))

    def session(self, state: SessionState, newest: AtomHit | None) -> int | None:
        """In the ledger, before they are erased: every item of the session up to `newest` (the
        entry's number; None: no ledger, or nothing to erase)."""
        if self.ledger is None or newest is None:
            return None
        head = self.ledger.record_session(state.hid, newest.created_at)
        self._noted(state, head)
        return head.number

    def handed_over(self, recorded: Any, record: CatalogRecord | None) -> LedgerHead | None:
        """The head to store in the layout record (which holds `recorded`) before `record` is
        forgotten: its own, when newer; None when it holds none newer."""
        held = head_of(None if record is None else record.ledger)
        return held if held is not None and later(head_of(recorded), held) == held else None

    def adopted(self, head: LedgerHead | None) -> bool:
        """Whether `head` (a restored copy's ledger's) is newer than the file's; it is the file's now."""
        if head is None or later(self.head, head) == self.head:
            return False
        self.head = head
        return True

    def _noted(self, state: SessionState, head: LedgerHead | None) -> bool:
        if head is None:
            return False
        self.head = head
        if state.record is None:
            state.record = CatalogRecord(state.session_id, state.branch)
        state.record.ledger = list(head)
        return True


def head_of(value: Any) -> LedgerHead | None:
    """A head as a record holds it ([number, mac]); None for anything else."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int)
        and isinstance(value[1], str)
    ):
        return LedgerHead(value[0], value[1])
    return None


def later(one: LedgerHead | None, other: LedgerHead | None) -> LedgerHead | None:
    """The later of two heads (None: none recorded)."""
    if one is None or (other is not None and other.number > one.number):
        return other
    return one
