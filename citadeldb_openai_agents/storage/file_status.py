"""A file's `status`: read where it is open (`live`), or from a file no store holds (`at_rest`).

Both only read. `live` runs in the owner: the sessions and items its listings show, what its
memory keeps of its erasures (receipts.py), retention's backlog. `at_rest` reads a file that no
process serves without opening it for use (inspection.py's way: no memory engine, no sweep, no
recovery), so Citadel's audit entry for the open is the only write; the rules that end a session
(options.StoreOptions) come from the caller's configuration, as they would if it opened the file.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import citadeldb

from ..options import StoreOptions
from ..results import OwnerStatus, StatusReport
from . import reads, registry, retention
from .audit import audit, inventory_of
from .codec import ITEM_KIND
from .completeness import now_micros
from .engine import OpenDatabase
from .erasure_notes import head_of, later
from .inventory import FileInventory
from .records import (
    CATALOG_KIND,
    CATALOG_REGION,
    META_KIND,
    META_REGION,
    CatalogRecord,
    parse_segment,
    record_hid,
)
from .segments import SessionLayout


def live(database: OpenDatabase, layout: SessionLayout, owner: OwnerStatus | None) -> StatusReport:
    """The status of a file open here, by its owner (`owner`: how it serves it, if it does)."""
    sessions: set[str] = set()
    items = ended = 0
    for state in layout.states():  # a session's branches are counted with it
        with database.operation() as memory, state.lock:
            if retention.ended(layout, memory, state):
                ended += 1
                continue
            summary = reads.summary(layout, memory, state)
        if summary:
            sessions.add(state.session_id)
            items += summary[0]
    names = [name for state in layout.states() for name in layout.segment_regions(state)]
    rows = layout.completeness.rows(names) if names else {}
    recent = layout.recent
    head = layout.erasures.head
    return StatusReport(
        path=database.path,
        owner=owner,
        sessions=len(sessions),
        items=items,
        last_erasure=recent.last,
        ledger_head=None if head is None else head.number,
        last_verify=verified(layout.meta.get("last_verify")),
        expired_items=_expired(rows.values(), now_micros()),
        ended_sessions=ended,
        retention_erased=recent.retention_total,
        swept_waiting=recent.waiting,
    )


def at_rest(path: str | os.PathLike[str], key: str, options: StoreOptions) -> StatusReport:
    """The status of a file no process holds, read without opening it for use (see the module's text)."""
    try:
        return registry.inspect_file(path, key, lambda db, resolved: _read(db, resolved, options))
    finally:
        del key


def _read(db: citadeldb.Database, path: str, options: StoreOptions) -> StatusReport:
    inventory = inventory_of(db, path)
    counts = audit(inventory).sessions
    meta_rows = inventory.records.get((META_REGION, META_KIND), [])
    meta: dict[str, Any] = meta_rows[0][1] if meta_rows else {}
    records = [
        CatalogRecord.from_payload(payload)
        for _, payload in inventory.records.get((CATALOG_REGION, CATALOG_KIND), [])
    ]
    head = head_of(meta.get("ledger_head"))
    for record in records:
        head = later(head, head_of(record.ledger))
    ended = _ended(db, inventory, records, bytes.fromhex(meta["salt"]), options) if meta else set()
    held = [count for count in counts if count.expected and count.session_id is not None]
    items = [
        {atom: expires for atom, expires in region.rows.items() if atom not in region.kinds}
        for name, region in inventory.regions.items()
        if parse_segment(name) is not None
    ]
    return StatusReport(
        path=path,
        owner=None,
        sessions=len({count.session_id for count in held} - ended),
        items=sum(count.expected for count in held if count.session_id not in ended),
        last_erasure=None,
        ledger_head=None if head is None else head.number,
        last_verify=verified(meta.get("last_verify")),
        expired_items=_expired(items, inventory.taken_at),
        ended_sessions=len(ended),
    )


def _ended(
    db: citadeldb.Database,
    inventory: FileInventory,
    records: list[CatalogRecord],
    salt: bytes,
    options: StoreOptions,
) -> set[str]:
    """The sessions past their deadline by `options` and their own retention (retention.py's rule)."""
    segments: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for name in inventory.regions:
        parsed = parse_segment(name)
        if parsed is not None:
            segments[parsed[0]].append((parsed[1], name))
    maintenance = db.memory_maintenance()
    ended = set()
    for record in records:
        limit = options.for_session(record.retention).session_limit()
        names = sorted(segments.get(record_hid(salt, record), []))
        if limit is None or not names:
            continue
        newest = maintenance.fetch(names[-1][1], ITEM_KIND, limit=1, newest=True)
        written = [t for t in (newest[0].created_at if newest else None, record.touched) if t is not None]
        if written and max(written) + int(limit[0] * 1_000_000) <= inventory.taken_at:
            ended.add(record.session_id)
    return ended


def _expired(rows: Any, now: int) -> int:
    """Items past their expiry still stored (Citadel hides them until they are purged)."""
    return sum(1 for found in rows for expires in found.values() if expires is not None and expires <= now)


def verified(value: Any) -> tuple[float, bool] | None:
    """The last verify as the layout record keeps it ([when, ok]); None for anything else."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], bool):
        return float(value[0]), value[1]
    return None
