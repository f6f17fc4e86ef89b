"""What a Citadel file holds, read before its memory engine runs, and what Citadel cannot read.

citadeldb 2.7.0 authenticates every page of the file, but not how many atoms a
region holds. Measured (tests/test_damage.py):

* an atom whose key in ``-atomkeys`` is damaged, or cut off by a truncation, is
  skipped by every read, and `Database.memory()` deletes its row when the file
  opens, exactly as it deletes the row of an atom whose erasure a crash interrupted;
* a region whose key in ``-regions`` is damaged reads as "forgotten", exactly as a
  region whose drop a crash interrupted.

So a file is inventoried before `memory()` may delete anything: the rows its pages
hold (Citadel's atom tables, read with SQL; the pages are encrypted and MAC'd,
so these rows are authentic) against what Citadel's maintenance API can read.
Whatever is stored but unreadable is either an erasure of ours that a crash
interrupted (the layout's records say which) or damage; `audit.audit` decides.

The atom tables are Citadel's own: their names and columns are checked here, and
a citadeldb that changed them is refused rather than left unchecked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import citadeldb

from .codec import ITEM_KIND

# Citadel's private tables, read as citadeldb 2.7 lays them out: pyproject.toml pins that
# minor (tests/test_structure.py checks the pin and this constant agree).
CITADEL_MINOR = "2.7"
ATOM_TABLE_PREFIX = "memory_atoms_"
REGION_TABLE = "memory_regions"
_ALL = 2**63 - 1  # the maintenance fetch's default limit is 100
_EPOCH = datetime(1970, 1, 1)


@dataclass
class RegionRows:
    """One region: the atoms its rows hold, and those Citadel cannot read."""

    name: str
    # atom id -> expiry in µs since the epoch (None: never expires)
    rows: dict[int, int | None] = field(default_factory=dict)
    # atom id -> its kind, for the atoms that are not items (records, write markers)
    kinds: dict[int, str] = field(default_factory=dict)
    # Unexpired atoms whose row exists but whose content Citadel cannot read.
    unreadable: set[int] = field(default_factory=set)
    # Citadel cannot read the region at all (its key is unavailable, or its key store is
    # cut short): every atom of it is unreadable. Citadel's reason, in its words.
    unavailable: str | None = None

    @property
    def forgotten(self) -> bool:
        return self.unavailable is not None

    def live_rows(self, now: int) -> list[int]:
        """Ids of the rows that have not expired at `now` (µs), of any kind."""
        return [atom for atom, expires in self.rows.items() if expires is None or expires > now]

    def live_items(self, now: int) -> set[int]:
        """Ids of the unexpired rows that hold items."""
        return {atom for atom in self.live_rows(now) if atom not in self.kinds}


@dataclass
class FileInventory:
    """Every region of a file, read before `Database.memory()` ran."""

    regions: dict[str, RegionRows]
    # When the inventory was finished, in µs: rows expiring after this had to be readable.
    taken_at: int
    # Readable payloads of the atoms the layout keeps its records in, by region and kind.
    records: dict[tuple[str, str], list[tuple[int, Any]]] = field(default_factory=dict)

    @property
    def is_new(self) -> bool:
        """The memory engine never ran on this file (a new file): nothing to check."""
        return not self.regions

    def unreadable(self) -> dict[str, RegionRows]:
        """The regions holding something Citadel cannot read."""
        return {
            name: region for name, region in self.regions.items() if region.forgotten or region.unreadable
        }


# Up to this many regions are looked up one by one through the index, more in one scan: a
# lookup costs ~0.3-2 ms, a scan ~1.7 ms per 1,000 atoms (72,000 atoms: 120 ms).
_LOOKUPS = 16


class UnsupportedEngineError(Exception):
    """Citadel's atom tables are not what this package was written against."""


def take_inventory(db: citadeldb.Database, record_kinds: dict[str, str]) -> FileInventory:
    """Read the file's rows and what Citadel can read of them, changing nothing.

    `record_kinds` maps a region to the kind of the records to read back from it
    (the layout's meta and catalog), for `damage.audit` to interpret.
    """
    regions = _stored_rows(db)
    if not regions:
        return FileInventory({}, _now())
    maintenance = db.memory_maintenance()
    readable_counts = {}
    for entry in maintenance.inventory():
        name = entry.region.name
        if name not in regions:
            regions[name] = RegionRows(name)
        if entry.unavailable:
            regions[name].unavailable = str(entry.unavailable)
        else:
            readable_counts[name] = entry.live_atoms
    before = _now()
    suspects = [
        region
        for region in regions.values()
        if not region.forgotten and readable_counts.get(region.name) != len(region.live_rows(before))
    ]
    for region in suspects:
        # Rare (damage, an interrupted erasure, or an item expiring during the count):
        # only here is every atom of the region read, to tell which ones are missing.
        readable = {hit.id for hit in maintenance.fetch(region.name, None, limit=_ALL)}
        region.unreadable = set(region.live_rows(_now())) - readable
    for region in regions.values():
        if region.forgotten:
            region.unreadable = set(region.live_rows(before))
    records = {
        (name, kind): [(hit.id, hit.payload) for hit in maintenance.fetch(name, kind, limit=_ALL)]
        for name, kind in record_kinds.items()
        if name in regions and not regions[name].forgotten
    }
    return FileInventory(regions, _now(), records)


def region_rows(db: citadeldb.Database, names: list[str], kind: str) -> dict[str, dict[int, int | None]]:
    """The rows of kind `kind` in the named regions (atom id -> expiry), read from the pages."""
    ids = _region_ids(db, names)
    found: dict[str, dict[int, int | None]] = {name: {} for name in names}
    if not ids:
        return found
    by_id = {region_id: name for name, region_id in ids.items()}
    for table in _atom_tables(db):
        if len(by_id) <= _LOOKUPS:
            # One lookup per region: `region_id = ?` uses the (region_id, kind) index, where
            # `IN (...)` or `OR` scans the whole table (EXPLAIN on citadeldb 2.7.0: 2 ms
            # against 120 ms at 72,000 atoms, growing with the file).
            rows = [
                row
                for region_id in by_id
                for row in _query(
                    db,
                    f"SELECT id, region_id, expires_at FROM {table} WHERE region_id = $1 AND kind = $2",
                    [region_id, kind],
                )
            ]
        else:  # many regions: one scan costs less than that many lookups
            rows = [
                row
                for row in _query(
                    db, f"SELECT id, region_id, expires_at FROM {table} WHERE kind = $1", [kind]
                )
                if row[1] in by_id
            ]
        for atom, region_id, expires in rows:
            found[by_id[region_id]][int(atom)] = _micros(expires)
    return found


def _stored_rows(db: citadeldb.Database) -> dict[str, RegionRows]:
    tables = set(db.tables())
    if REGION_TABLE not in tables:
        return {}
    names = {region_id: name for region_id, name in _query(db, f"SELECT id, name FROM {REGION_TABLE}")}
    regions = {name: RegionRows(name) for name in names.values()}
    for table in _atom_tables(db):
        for atom, region_id, kind, expires in _query(
            db, f"SELECT id, region_id, kind, expires_at FROM {table}"
        ):
            name = names.get(region_id)
            if name is None:
                raise UnsupportedEngineError(f"{table} holds atom {atom} of an unknown region {region_id}")
            regions[name].rows[int(atom)] = _micros(expires)
            if kind != ITEM_KIND:
                regions[name].kinds[int(atom)] = str(kind)
    return regions


def _region_ids(db: citadeldb.Database, names: list[str]) -> dict[str, int]:
    if len(names) <= _LOOKUPS:  # `name = ?` uses the unique index; `IN (...)` scans (see region_rows)
        rows = [
            row
            for name in names
            for row in _query(db, f"SELECT name, id FROM {REGION_TABLE} WHERE name = $1", [name])
        ]
    else:
        wanted = set(names)
        rows = [row for row in _query(db, f"SELECT name, id FROM {REGION_TABLE}") if row[0] in wanted]
    return {name: int(region_id) for name, region_id in rows}


def _atom_tables(db: citadeldb.Database) -> list[str]:
    return sorted(table for table in db.tables() if table.startswith(ATOM_TABLE_PREFIX))


def _query(db: citadeldb.Database, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    try:
        return [tuple(row) for row in db.query(sql, params).rows]
    except citadeldb.ProgrammingError as exc:
        raise UnsupportedEngineError(str(exc)) from None


def _micros(expires: Any) -> int | None:
    """Citadel's expiry column: a naive UTC datetime, or None."""
    if expires is None:
        return None
    if not isinstance(expires, datetime):
        raise UnsupportedEngineError(f"expires_at holds a {type(expires).__name__}, not a datetime")
    if expires.tzinfo is not None:
        expires = expires.astimezone(timezone.utc).replace(tzinfo=None)
    return int((expires - _EPOCH) // timedelta(microseconds=1))


def _now() -> int:
    return time.time_ns() // 1000
