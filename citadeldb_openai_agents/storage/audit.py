"""The open-time audit: is whatever Citadel cannot read an interrupted erasure of ours, or damage?

`inventory.take_inventory` lists, before Citadel's memory engine runs, the atoms
and regions a file stores but Citadel cannot read. Our own erasures leave such
things when a crash interrupts them (Citadel erases a key, then deletes the row
or region); damage to ``-atomkeys`` or ``-regions`` leaves the same. The catalog
records (records.py) tell them apart: every erasure is announced in the record
before it starts. Anything unannounced is damage, reported per session before the
engine runs, so nothing is deleted and a restore from a backup loses nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    MIGRATION_PAGE,
    RUN_VERIFY_OR_REPAIR,
    CorruptDatabaseError,
    OriginalLayoutError,
    StorageError,
)
from .codec import SEARCH_KIND
from .inventory import FileInventory, UnsupportedEngineError, take_inventory
from .original_layout import original_regions
from .records import (
    CATALOG_KIND,
    CATALOG_REGION,
    META_KIND,
    META_REGION,
    RECORD_KINDS,
    CatalogRecord,
    parse_segment,
    record_hid,
)

ATOM_KEYS = "their keys in the .citadel-atomkeys file are damaged or missing"
REGION_KEYS = "a segment's key cannot be read"
CATALOG_RECORD = "the session's catalog record cannot be read, so neither can its id"
UNLISTED = "its catalog record does not list the segment that holds them"


@dataclass(frozen=True)
class SessionCount:
    """One session's items: how many the file holds, and how many of those Citadel cannot read."""

    session_id: str | None  # None when the session's catalog record (its id) is unreadable
    expected: int  # items stored for the session (unexpired)
    unreadable: int = 0
    cause: str | None = None
    # The segments holding them.
    segments: tuple[str, ...] = ()
    # Other atoms of the session (write markers) the file holds but Citadel cannot read.
    other: int = 0
    # Search data atoms Citadel cannot read: derived from the items, so not a loss; their
    # rows go when the file opens and the items they covered are embedded again.
    search_data: int = 0


@dataclass
class AuditVerdict:
    """What the audit found, and the erasures a crash interrupted (finished after the open)."""

    # Every session found, damaged or not.
    sessions: list[SessionCount] = field(default_factory=list)
    # Damage not tied to one session (the layout record, the whole catalog).
    file: list[str] = field(default_factory=list)
    # Regions an interrupted erasure left behind: dropped once the file is open.
    leftovers: set[str] = field(default_factory=set)
    layout_format: int | None = None

    @property
    def damaged(self) -> list[SessionCount]:
        return [count for count in self.sessions if count.unreadable or count.other]

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.file

    def describe(self, limit: int = 5, *, for_log: bool = False) -> str:
        """The damage in one sentence per finding (the first `limit` sessions); `for_log`: each
        session by its salted hash (`logged_name`), as a log line names one."""
        findings = list(self.file)
        damaged = self.damaged
        for damage in damaged[:limit]:
            if for_log:
                who = logged_name(damage)
            else:
                who = "an unknown session" if damage.session_id is None else f"session {damage.session_id!r}"
            markers = f" and {damage.other} of its write markers" if damage.other else ""
            findings.append(
                f"{damage.unreadable} of {damage.expected} items{markers} of {who} cannot be read ({damage.cause})"
            )
        if len(damaged) > limit:
            findings.append(f"and {len(damaged) - limit} more damaged sessions")
        return "; ".join(findings)


def logged_name(count: SessionCount) -> str:
    """A session as a log line names it: by its salted hash (its segments' HID), never its id,
    which can name a person (docs/operations.md, what is logged)."""
    parsed = parse_segment(count.segments[0]) if count.segments else None
    return "a session" if parsed is None else f"the session hashed {parsed[0]}"


def audit(inventory: FileInventory) -> AuditVerdict:
    """Classify everything `inventory` found unreadable (see the module docstring)."""
    verdict = AuditVerdict()
    if inventory.is_new:
        return verdict
    meta = inventory.records.get((META_REGION, META_KIND), [])
    used = any(name != META_REGION and region.rows for name, region in inventory.regions.items())
    if not meta:
        if used:
            verdict.file.append(
                "the layout record (region coa.meta) cannot be read, and without the salt it "
                "holds no session can be found"
            )
        return verdict
    layout = meta[0][1]
    salt = bytes.fromhex(layout["salt"])
    verdict.layout_format = int(layout.get("format", 1))
    catalog = inventory.regions.get(CATALOG_REGION)
    if catalog is not None and catalog.forgotten:
        verdict.file.append(
            f"the catalog cannot be read ({catalog.unavailable}), so no session can be listed"
        )
        return verdict
    records = {}
    for _, payload in inventory.records.get((CATALOG_REGION, CATALOG_KIND), []):
        record = CatalogRecord.from_payload(payload)
        records[record_hid(salt, record)] = record
    segments: dict[str, dict[int, str]] = defaultdict(dict)
    for name in inventory.regions:
        parsed = parse_segment(name)
        if parsed is not None:
            segments[parsed[0]][parsed[1]] = name
    for hid, record in records.items():
        _audit_session(inventory, record, segments.get(hid, {}), verdict)
    unreadable_records = bool(catalog is not None and catalog.unreadable)
    for hid in segments.keys() - records.keys():
        _audit_orphan(inventory, segments[hid], unreadable_records, verdict)
    return verdict


def _audit_session(
    inventory: FileInventory, record: CatalogRecord, numbers: dict[int, str], verdict: AuditVerdict
) -> None:
    if record.clearing or record.copying:
        # An erasure under way, or a branch's copy a crash cut off: finished (erased) on open.
        verdict.leftovers.update(numbers.values())
        return
    listed = set(numbers) if record.segments is None else set(record.segments)
    expected = unreadable = 0
    causes = []
    kept = []
    other = search_data = 0
    for number, name in sorted(numbers.items()):
        region = inventory.regions[name]
        # Items only: a segment also holds write markers (client writes), counted apart.
        # An erasure a crash interrupted leaves its atoms unreadable: they go when the file
        # opens. Those it had not reached yet are still live, and counted.
        live = region.live_items(inventory.taken_at) - (set(record.erasing) & region.unreadable)
        if number not in listed:
            # Unlisted before its drop, which a crash then interrupted. A number the
            # record never handed out cannot come from us.
            if number < record.next_segment or not live:
                verdict.leftovers.add(name)
                continue
            expected += len(live)
            unreadable += len(live)
            causes.append(UNLISTED)
            continue
        expected += len(live)
        kept.append(name)
        # A pop a crash interrupted leaves its atom unreadable: it goes when the file opens.
        lost = region.unreadable - set(record.erasing)
        derived = {atom for atom in lost if region.kinds.get(atom) == SEARCH_KIND}
        search_data += len(derived)
        lost -= derived
        if lost:
            unreadable += len(lost & live)
            other += len(lost - live)
            causes.append(f"{REGION_KEYS}: {region.unavailable}" if region.forgotten else ATOM_KEYS)
        elif region.forgotten:
            verdict.leftovers.add(name)  # a key lost with nothing live under it: nothing lost
    cause = "; ".join(dict.fromkeys(causes)) if unreadable or other else None
    verdict.sessions.append(
        SessionCount(record.session_id, expected, unreadable, cause, tuple(kept), other, search_data)
    )


def _audit_orphan(
    inventory: FileInventory, numbers: dict[int, str], unreadable_records: bool, verdict: AuditVerdict
) -> None:
    """Segments whose session has no readable catalog record."""
    live = sum(len(inventory.regions[name].live_items(inventory.taken_at)) for name in numbers.values())
    # Format 1 forgot the record first, then dropped the segments: a crash between left
    # exactly this. Format 2 forgets the record last, so only damage leaves it there.
    interrupted_clear = verdict.layout_format == 1 and not unreadable_records
    if live == 0 or interrupted_clear:
        verdict.leftovers.update(numbers.values())
        return
    verdict.sessions.append(SessionCount(None, live, live, CATALOG_RECORD, tuple(numbers.values())))


def check_before_memory(db: Any, path: str) -> AuditVerdict:
    """Inventory and audit a file before Citadel's memory engine runs; raise if it is damaged.

    The `CorruptDatabaseError` carries the verdict as ``error.verdict`` (for `verify`).
    Nothing is written: the damaged files stay as they are, for a restore.
    """
    verdict = audit(inventory_of(db, path))
    if verdict.layout_format is None and verdict.file:
        refuse_original_layout(db, path)
    if not verdict.ok:
        error = CorruptDatabaseError(
            f"{path} is damaged: {verdict.describe()}. Nothing was changed.", RUN_VERIFY_OR_REPAIR
        )
        error.verdict = verdict  # type: ignore[attr-defined]
        # The message names sessions for whoever called; the log line, by their hashes only.
        error.logged = f"{path} is damaged: {verdict.describe(for_log=True)}. Nothing was changed."  # type: ignore[attr-defined]
        raise error
    return verdict


def inventory_of(db: Any, path: str) -> FileInventory:
    """`take_inventory`, with a citadeldb whose tables changed refused by name."""
    try:
        return take_inventory(db, RECORD_KINDS)
    except UnsupportedEngineError as exc:
        raise StorageError(
            f"cannot check {path} for damage: this citadeldb stores atoms differently from "
            f"the version this package was built for ({exc}). Install citadeldb 2.7 "
            "(pip install 'citadeldb>=2.7,<2.8'), or a release of citadeldb-openai-agents "
            "that supports yours."
        ) from None


def refuse_original_layout(db: Any, path: str) -> None:
    """Raise `OriginalLayoutError` when the file is the original package's, with no layout of ours:
    whole, not damaged, and to be imported rather than restored."""
    regions = original_regions(db)
    if not regions:
        return
    what = ", ".join(
        f"region {region.name!r}, {region.items:,} item{'s' * (region.items != 1)}" for region in regions
    )
    choose = f" --source-region {regions[0].name}" if len(regions) > 1 else ""
    raise OriginalLayoutError(
        f"{path} was written by citadeldb-openai-agents 2.x: {what}. The file is whole and nothing "
        "was changed, but this package keeps sessions in a layout of its own. Import them into a "
        f"new file: CITADEL_PATH=NEW.cdl python -m citadeldb_openai_agents import {path}{choose} "
        "--create (it asks for the 2.x passphrase, or reads CITADEL_SOURCE_KEY_FILE); "
        f"see {MIGRATION_PAGE}.",
        {region.name: region.items for region in regions},
    )
