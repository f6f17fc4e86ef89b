"""`repair`: a file refused for damage, back in service without a backup, losing only what is unreadable.

Citadel's `Database.memory()` silently deletes the rows of atoms it cannot read (a damaged key
in ``-atomkeys``), which is why a damaged file is refused at open (audit.py). Repair lets that
happen, but only on a copy, and only after the inventory has counted what will go, per session:

1. The file and its companions are copied into a private directory beside it. The originals
   are never written.
2. The copy is opened with the audit's verdict kept, not raised, so the memory engine deletes
   its unreadable rows.
3. Two kinds of segment are dropped, and the records stop listing them: segments whose own key
   is damaged, and segments no session can claim (their catalog record is unreadable, so the
   session is named by its hashed name, its HID).
4. The copy opens as any file does (audit, recovery) and must verify.
5. The damaged files are moved aside, into ``PATH.damaged-STAMP/``, and the copy takes their place.

The copy keeps the file's own layout record, so session names, the erasure ledger's fingerprint
and the ledger's head stay valid. The ring file lives outside the database and is not touched.
A damaged layout record (the salt) or catalog cannot be repaired: the message says to restore.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from ..embedders.protocol import Embedder
from ..errors import CorruptDatabaseError, DatabaseLockedError, DatabaseNotFoundError
from ..options import StoreOptions
from ..results import RepairReport, SessionLoss
from . import branches, data_owners, registry
from .audit import AuditVerdict, SessionCount, audit, inventory_of, refuse_original_layout
from .engine import database_options
from .files import database_files, resolve_path
from .local_file import LocalFile
from .lockholder import find_lock_holder
from .records import (
    CATALOG_KIND,
    CATALOG_REGION,
    MAIN,
    META_KIND,
    META_REGION,
    CatalogRecord,
    parse_segment,
    record_hid,
)
from .restore import copy_files, move_in
from .segment_cache import SessionState

# Told the copy's path, the passphrase and the sessions that lost items, before the copy is verified:
# puts back what it can (from a backup), and returns the items it put back per session (`Refill`).
Fill = Callable[[str, str, list[SessionLoss]], dict[str, int]]


def repair(
    path: str | os.PathLike[str],
    key: str,
    *,
    embedder: Embedder,
    options: StoreOptions,
    fill: Fill | None = None,
) -> RepairReport:
    """Repair the file at `path` (see the module's docstring); nothing changes at `path` until the
    repaired copy verifies. A file that is not damaged is left as it is (`RepairReport.repaired` False).
    `fill` puts back, in the copy, what a backup holds of the sessions that lost items."""
    keys = [key]
    del key  # only `keys` holds it: error trackers record frames' locals
    target = resolve_path(path)
    _check_target(target)
    work = tempfile.mkdtemp(prefix=".repairing-", dir=os.path.dirname(target))
    copy = os.path.join(work, os.path.basename(target))
    try:
        copy_files(target, copy)
        verdict = _clean(copy, target, keys[0], embedder, options)
        lost = [] if verdict.ok else _losses(verdict)
        if lost and fill is not None:
            put_back = fill(copy, keys[0], lost)
            lost = [replace(loss, items_restored=put_back.get(loss.name, 0)) for loss in lost]
        # Opened without the ledger, which is read, not appended to: replaying it appends nothing.
        plain = replace(options, erasure_ledger=None, ledger_mirror=None)
        local = LocalFile(copy, keys.pop(), embedder=embedder, options=plain, create=False)
        try:
            replayed, erased = _replay_missing(local, options)
            if verdict.ok and not replayed:
                return RepairReport(target, False, [], None, "")
            report = local.verify()
        finally:
            local.release()
        if not report.ok:
            raise CorruptDatabaseError(
                f"{target} could not be repaired: the repaired copy does not verify "
                f"({'; '.join(report.findings) or 'damaged pages'}). Nothing was changed: restore it from a backup."
            )
        aside = _put_in_place(copy, target, kept=not verdict.ok)
        damage = "" if verdict.ok else verdict.describe(limit=3)
        return RepairReport(
            target, True, lost, aside, damage, replayed=replayed, items_erased=sum(erased.values())
        )
    finally:
        keys.clear()
        shutil.rmtree(work, ignore_errors=True)


def _replay_missing(local: LocalFile, options: StoreOptions) -> tuple[int, dict[str, int]]:
    """Erase again in the copy what the ledger records beyond its head (a rolled-back file's lost
    erasures), and give it the ledger's head: the entries replayed, the items erased per session.
    The ledger must reach the head the damaged file recorded (`LedgerError` otherwise: a record
    may have been damaged on purpose to lose a head; the layout record holds every head too)."""
    if options.erasure_ledger is None:
        return 0, {}
    reading = local.ledger_reading(options.erasure_ledger, options.ledger_mirror)
    recorded = 0 if local.ledger_head is None else local.ledger_head.number
    if len(reading.entries) <= recorded:
        return 0, {}
    erased = local.replay(reading.entries)
    local.adopt_ledger_head(reading.head)
    return len(reading.entries) - recorded, erased


def _put_in_place(copy: str, target: str, kept: bool) -> str | None:
    """The copy moved in, the old parts aside (`kept`: damaged, kept for a look); where they are.
    Parts only rolled back are deleted: they hold nothing but what the replay erased again."""
    aside = _move_aside(target)
    move_in(copy, target)
    if kept:
        return aside
    shutil.rmtree(aside, ignore_errors=True)
    return None


def _check_target(target: str) -> None:
    if not os.path.isfile(target):
        raise DatabaseNotFoundError(f"there is no database at {target} to repair.")
    holder = find_lock_holder(target)
    if holder is not None:
        raise DatabaseLockedError(
            f"{target} is open in PID {holder.pid}: stop the service before repairing its file."
        )


def _clean(copy: str, target: str, key: str, embedder: Embedder, options: StoreOptions) -> AuditVerdict:
    """Open the copy with its damage counted, not refused (its unreadable rows go), then drop the
    segments no record can claim or whose key is lost; the audit's verdict, from before. A file
    of the original package (no layout record, but whole) is refused by name: it is imported."""
    found: list[tuple[AuditVerdict, set[str]]] = []

    def counted(db: Any, path: str) -> AuditVerdict:
        inventory = inventory_of(db, path)
        verdict = audit(inventory)
        if verdict.layout_format is None and verdict.file:
            refuse_original_layout(db, target)
        if verdict.file:
            raise CorruptDatabaseError(
                f"{path} cannot be repaired: {'; '.join(verdict.file)}. Nothing was changed: restore the file "
                "and its companion files together from a backup."
            )
        found.append((verdict, {name for name, region in inventory.regions.items() if region.forgotten}))
        return AuditVerdict([], [], set(verdict.leftovers), verdict.layout_format)

    try:
        database = registry.acquire(copy, key, database_options(options), counted)
    finally:
        del key  # gone from this frame on every path: error trackers record its locals
    try:
        verdict, forgotten = found[0]
        lost: set[str] = set()
        for count in verdict.damaged:
            lost |= set(count.segments) if count.session_id is None else set(count.segments) & forgotten
        if lost:
            with database.operation() as memory:
                for name in sorted(lost):
                    memory.drop_region(name)
                _unlist(memory, embedder, lost)
    finally:
        registry.release(database)
    return verdict


def _unlist(memory: Any, embedder: Embedder, dropped: set[str]) -> None:
    """The records of the sessions whose segments were dropped stop listing them."""
    memory.create_encrypted_region(META_REGION, embedder)
    memory.create_encrypted_region(CATALOG_REGION, embedder)
    salt = bytes.fromhex(memory.fetch(META_REGION, META_KIND, limit=1)[0].payload["salt"])
    gone: dict[str, set[int]] = {}
    for name in dropped:
        parsed = parse_segment(name)
        if parsed is not None:
            gone.setdefault(parsed[0], set()).add(parsed[1])
    for hit in memory.fetch(CATALOG_REGION, CATALOG_KIND, limit=2**31):
        record = CatalogRecord.from_payload(hit.payload)
        numbers = gone.get(record_hid(salt, record), set())
        if numbers and record.segments is not None:
            record.segments = [number for number in record.segments if number not in numbers]
            memory.update_atom_payload(CATALOG_REGION, hit.id, record.to_payload())


def _losses(verdict: AuditVerdict) -> list[SessionLoss]:
    return [_loss(count) for count in verdict.damaged if count.unreadable]


def _loss(count: SessionCount) -> SessionLoss:
    if count.session_id is not None:
        return SessionLoss(count.session_id, None, count.unreadable, count.expected, count.cause or "")
    parsed = parse_segment(count.segments[0]) if count.segments else None
    return SessionLoss(
        None, None if parsed is None else parsed[0], count.unreadable, count.expected, count.cause or ""
    )


def _move_aside(target: str) -> str:
    """The damaged files, moved (not changed) into a private directory beside the file."""
    aside = f"{target}.damaged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    os.mkdir(aside, 0o700)
    for name in database_files(target):
        with suppress(FileNotFoundError):
            os.replace(name, os.path.join(aside, os.path.basename(name)))
    return aside


@dataclass(frozen=True)
class Refill:
    """A session that lost items, as a backup's copy can complete it: every item, in order (those
    the repaired copy kept, and the backup's it lacks), and its owner and labels."""

    session_id: str
    loss: str  # the `SessionLoss.name` it completes
    items: list[str]  # payloads, oldest first
    taken: int  # how many of them come from the backup
    owner: str | None
    labels: dict[str, Any] | None


def refills(copy: LocalFile, backup: LocalFile, lost: list[SessionLoss]) -> tuple[list[Refill], list[str]]:
    """What `backup` (a restored copy, its ledger replayed) holds of the sessions in `lost` that
    the repaired `copy` lacks, matched by atom id and creation time; and the sessions left as they
    are, with why (one with branches: its branches would not survive being written again)."""
    by_hid = {backup.on_session(session_id, _hid): session_id for session_id in backup.session_ids()}
    found, left = [], []
    for loss in lost:
        session_id = loss.session_id if loss.session_id is not None else by_hid.get(loss.hid or "")
        if session_id is None:
            left.append(f"{loss.name}: the backup does not hold it")
            continue
        theirs = backup.on_session(session_id, branches.item_rows)
        mine = copy.on_session(session_id, branches.item_rows)
        have = {(atom, created) for atom, created, _ in mine}
        missing = [row for row in theirs if (row[0], row[1]) not in have]
        if not missing:
            left.append(f"{loss.name}: the backup holds none of the items lost")
            continue
        if any(name != MAIN for name, *_ in copy.on_session(session_id, branches.listing)):
            left.append(f"{loss.name}: it has branches, which writing it again would not keep")
            continue
        owner, labels = (copy if mine else backup).on_session(session_id, data_owners.recorded)
        ordered = sorted(mine + missing, key=lambda row: (row[1], row[0]))  # as they were written
        found.append(
            Refill(session_id, loss.name, [text for _, _, text in ordered], len(missing), owner, labels)
        )
    return found, left


def _hid(layout: Any, memory: Any, state: SessionState) -> str:
    """A session's hashed name (the one a damaged record leaves to name it by)."""
    return state.hid
