"""The log lines an operator acts on: one line per event, with structured fields.

Each goes to ``logging.getLogger("citadeldb_openai_agents")`` with its fields in ``extra``
(`FIELDS`: ``citadel_event`` names the event), so a JSON formatter gets them as keys: a
handover, damage found at an open, an erasure with its receipt id, a ring change. A session
appears only by its salted hash (``citadel_session_hash``), never by its id, and no line
holds an item's text or anything of a passphrase. Refusals at the owner's socket are logged
by the server, ten a minute, then counted (``citadel_event`` "refusal", ``citadel_left_out``:
the lines not written one by one; serving/server.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger("citadeldb_openai_agents")

# Every field a line may carry, for a formatter that wants them all.
FIELDS = (
    "citadel_event",
    "citadel_path",
    "citadel_receipt",
    "citadel_cause",
    "citadel_items",
    "citadel_readback_confirmed",
    "citadel_ledger_entries",
    "citadel_session_hash",
    "citadel_rule",
    "citadel_trigger",
    "citadel_previous_owner",
    "citadel_shards",
    "citadel_previous_shards",
    "citadel_left_out",
)


def erasure(
    path: str,
    receipt: str,
    cause: str,
    items: int,
    confirmed: bool,
    ledger_entries: Sequence[int],
    session_hash: str,
    rule: str | None = None,
    trigger: str | None = None,
) -> None:
    """A session (or one branch) erased with a readback: its receipt id, why, what went, the
    readback; for retention, the rule that ended it and who found it (the sweep, a purge, a call)."""
    entries = ", ".join(f"#{entry}" for entry in ledger_entries) or "not configured"
    why = cause if rule is None else f"{cause}: it ended by {rule}, found by the {trigger}"
    fields = {
        "citadel_event": "erasure",
        "citadel_path": path,
        "citadel_receipt": receipt,
        "citadel_cause": cause,
        "citadel_items": items,
        "citadel_readback_confirmed": confirmed,
        "citadel_ledger_entries": list(ledger_entries),
        "citadel_session_hash": session_hash,
    }
    if rule is not None:
        fields.update(citadel_rule=rule, citadel_trigger=trigger)
    log.info(
        "erased a session of %s (%s): %d items, keys destroyed, readback %s, receipt %s, erasure ledger %s",
        path,
        why,
        items,
        "confirmed" if confirmed else "NOT confirmed",
        receipt,
        entries,
        extra=fields,
    )


def handover(path: str, previous: int | None) -> None:
    """This process took the file over from its owner, which stopped."""
    log.warning(
        "took %s over from process %s, which stopped; this process owns and serves it now",
        path,
        previous if previous is not None else "(unknown)",
        extra={"citadel_event": "handover", "citadel_path": path, "citadel_previous_owner": previous},
    )


def damaged(path: str, message: str) -> None:
    """An open refused because the file is damaged (the error raised says the fix)."""
    log.error(
        "refused to open %s: %s",
        path,
        message,
        extra={"citadel_event": "damage", "citadel_path": path},
    )


def ring_changed(path: str, shards: Sequence[str], previous: Sequence[str]) -> None:
    """The fleet's ring this store follows changed (read again from its ring file)."""
    log.warning(
        "the ring of %s changed: %s%s",
        path,
        ", ".join(shards),
        f" (moving from {', '.join(previous)})" if previous else "",
        extra={
            "citadel_event": "ring_change",
            "citadel_path": path,
            "citadel_shards": list(shards),
            "citadel_previous_shards": list(previous),
        },
    )
