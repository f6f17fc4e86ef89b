"""What this owner erased lately: its last erasure, and what retention erased on its own.

Retention erases a session that ended by itself: the owner's sweep (`retention.Sweeper`), or
the first call that finds the session past its deadline. Each such erasure has its receipt
(logged and counted, telemetry/), and is kept here until `purge` reports it
(`PurgeReport.swept`), so an operator who runs `purge` sees what was erased before it, and
`status` shows the last erasure of any kind. Kept in this process's memory: a new owner starts
empty (the erasure ledger, when one is configured, is the record that outlives processes).
"""

from __future__ import annotations

import threading
import time

from ..results import EndedSession, Erasure, LastErasure

# Retention's receipts kept for the next purge, at most: past it the oldest go (they are logged).
KEPT = 10_000


class RecentErasures:
    """This owner's last erasure, and retention's receipts since the last purge."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: LastErasure | None = None
        self._swept: list[EndedSession] = []
        self.dropped = 0  # retention receipts not kept (past KEPT), since the last purge
        self.retention_total = 0  # sessions retention erased since this owner opened the file

    def erased(self, cause: str, receipt: Erasure) -> None:
        with self._lock:
            self.last = LastErasure(time.time(), cause, receipt)

    def ended(self, session: EndedSession) -> None:
        """A session erased by retention, outside a purge: kept for the next one."""
        with self._lock:
            self.retention_total += 1
            self._swept.append(session)
            if len(self._swept) > KEPT:
                del self._swept[0]
                self.dropped += 1

    @property
    def waiting(self) -> int:
        """Retention's receipts kept for the next purge."""
        return len(self._swept) + self.dropped

    def take_swept(self) -> list[EndedSession]:
        """Retention's receipts since the last call, oldest first (and forgotten here)."""
        with self._lock:
            swept, self._swept, self.dropped = self._swept, [], 0
        return swept
