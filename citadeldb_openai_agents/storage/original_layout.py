"""Files the original package, citadeldb-openai-agents 2.x, wrote: recognised, read, and erased.

Its layout: each item is one atom of kind ``item`` in one region (``sessions``, or the name
its user gave as ``region=``), with the payload ``{"sid": <session id>, "item": <the item>}``
and an ``expires_at`` when a ``ttl`` was set. A session's items are its atoms in id order.

Everything here goes through Citadel's maintenance handle (`memory_maintenance()`), which
reads and forgets atoms without attaching the region's embedder: the source's embedder is
never needed. Rows are also read from the pages (`region_rows`): they hold the expired atoms
that fetch hides, whose keys live on until they are forgotten, and they tell an atom the
engine dropped unread (damage) from one that was never there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import citadeldb

from ..errors import ImportSourceError
from ..results import SourceErasure
from .inventory import region_rows
from .records import PREFIX

ORIGINAL_KIND = "item"
PAYLOAD_KEYS = {"sid", "item"}
_PAGE = 5_000
# Forget in batches: Citadel's batch forget grows superlinearly (CITADEL_NOTES.md).
_FORGET_BATCH = 500


@dataclass(frozen=True)
class OriginalRegion:
    """A region in the original layout, and how many unexpired items it holds."""

    name: str
    items: int


@dataclass
class OriginalSession:
    """One session of an original file: its unexpired items in the order the original package
    returns them, each with its expiry (µs since the epoch, or None)."""

    session_id: str
    items: list[Any] = field(default_factory=list)
    expires_at: list[int | None] = field(default_factory=list)


def original_regions(db: citadeldb.Database) -> list[OriginalRegion]:
    """Every region of `db` outside this package's layout whose atoms are the original's.

    A region is the original's when its first readable atom's payload is exactly
    ``{"sid": str, "item": ...}``; one whose every atom has expired (none readable) counts
    too, with no items, when it holds rows of the original's kind.
    """
    maintenance = db.memory_maintenance()
    found = []
    for entry in maintenance.inventory():
        name = entry.region.name
        if name.lower().startswith(PREFIX) or entry.unavailable:
            continue
        first = maintenance.fetch(name, ORIGINAL_KIND, limit=1)
        if first:
            if is_original_payload(first[0].payload):
                found.append(OriginalRegion(name, int(entry.live_atoms or 0)))
        elif region_rows(db, [name], ORIGINAL_KIND)[name]:
            found.append(OriginalRegion(name, 0))
    return found


def region_reader(
    region: str | None,
) -> Callable[[citadeldb.Database, str], tuple[str, list[OriginalSession], int]]:
    """What `inspect_file` runs on the source: the region chosen (`region`, or the only one), its
    sessions and how many of its items have expired."""

    def read(db: citadeldb.Database, path: str) -> tuple[str, list[OriginalSession], int]:
        chosen = choose_region(db, path, region)
        sessions, expired = read_region(db, path, chosen)
        return chosen, sessions, expired

    return read


def choose_region(db: citadeldb.Database, path: str, region: str | None) -> str:
    """The region in the original layout to import: `region` (ASCII case folded, as Citadel
    folds it), or the file's only one; `ImportSourceError` naming those there are otherwise."""
    found = {original.name: original for original in original_regions(db)}
    listed = ", ".join(f"{name!r} ({original.items:,} items)" for name, original in found.items())
    if not found:
        ours = any(
            name.startswith("coa.")
            for name in (entry.region.name for entry in db.memory_maintenance().inventory())
        )
        raise ImportSourceError(
            f"{path} holds no sessions of citadeldb-openai-agents 2.x; nothing was imported."
            + (
                " It is a file of this package: `restore --session` or `move` copy its sessions."
                if ours
                else ""
            )
        )
    if region is None:
        if len(found) > 1:
            raise ImportSourceError(
                f"{path} holds several regions of citadeldb-openai-agents 2.x: {listed}; nothing was "
                "imported. Name the one to import with --source-region (region=)."
            )
        return next(iter(found))
    for name in found:  # Citadel folds ASCII case in region names
        if name.casefold() == region.casefold():
            return name
    raise ImportSourceError(
        f"{path} holds no region {region!r} of citadeldb-openai-agents 2.x; it holds {listed}. "
        "Nothing was imported."
    )


def is_original_payload(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.keys() == PAYLOAD_KEYS and isinstance(payload["sid"], str)


def read_region(db: citadeldb.Database, path: str, region: str) -> tuple[list[OriginalSession], int]:
    """Every session of `region` with its unexpired items, and how many items have expired.

    Raises:
        ImportSourceError: an atom is not in the original layout, or an unexpired atom the
            pages hold cannot be read (damage): nothing may be imported short.
    """
    now = int(time.time() * 1_000_000)
    rows = region_rows(db, [region], ORIGINAL_KIND)[region]
    live = {atom for atom, expires in rows.items() if expires is None or expires > now}
    sessions: dict[str, OriginalSession] = {}
    seen = set()
    for hit in _every_atom(db.memory_maintenance(), region):
        if not is_original_payload(hit.payload):
            raise ImportSourceError(
                f"atom {hit.id} of region {region!r} in {path} is not an item of citadeldb-openai-agents "
                '2.x (its payload is not {"sid", "item"}); nothing was imported. Import another '
                "region (--source-region), or repair the file with the package that wrote it."
            )
        session = sessions.setdefault(hit.payload["sid"], OriginalSession(hit.payload["sid"]))
        session.items.append(hit.payload["item"])
        session.expires_at.append(None if hit.expires_at is None else int(hit.expires_at))
        seen.add(hit.id)
    # An atom that expired while being read was read or not: only one still live and unseen is lost.
    after = int(time.time() * 1_000_000)
    unread = {atom for atom in live - seen if (expiry := rows[atom]) is None or expiry > after}
    if unread:
        raise ImportSourceError(
            f"{len(unread)} of the {len(live)} items of region {region!r} in {path} cannot be read "
            f"(atoms {', '.join(map(str, sorted(unread)[:5]))}): the file is damaged. Nothing was "
            "imported. Restore it from a backup, then import again."
        )
    return list(sessions.values()), len(rows) - len(live)


def _every_atom(maintenance: Any, region: str) -> Iterator[Any]:
    """The region's readable atoms in id order, page by page (a fetch's limit is bounded)."""
    after = None
    while True:
        page = maintenance.fetch(region, ORIGINAL_KIND, limit=_PAGE, after_id=after)
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1].id


def erase_region(db: citadeldb.Database, path: str, region: str) -> SourceErasure:
    """Forget every atom of `region`, expired ones included, and read back that none is left.

    Raises:
        ImportSourceError: a receipt is not a confirmed cryptographic erasure, or an atom is
            still there after the forget.
    """
    maintenance = db.memory_maintenance()
    now = int(time.time() * 1_000_000)
    rows = region_rows(db, [region], ORIGINAL_KIND)[region]
    atoms = sorted(rows)
    cryptographic = confirmed = True
    algorithm = ""
    for start in range(0, len(atoms), _FORGET_BATCH):
        receipt = maintenance.forget(region, atoms[start : start + _FORGET_BATCH])
        cryptographic &= bool(receipt.cryptographic_erasure)
        confirmed &= bool(receipt.readback_confirmed)
        algorithm = str(receipt.algorithm)
    left = region_rows(db, [region], ORIGINAL_KIND)[region]
    if left or maintenance.fetch(region, ORIGINAL_KIND, limit=1) or not (cryptographic and confirmed):
        raise ImportSourceError(
            f"erasing region {region!r} of {path} was not confirmed: {len(left)} of its {len(atoms)} "
            f"atoms are still there (cryptographic erasure: {cryptographic}, read back: {confirmed}). "
            "The import itself is complete; run the import again with --erase-source to finish."
        )
    expired = sum(1 for expires in rows.values() if expires is not None and expires <= now)
    return SourceErasure(region, len(atoms), expired, cryptographic, confirmed, algorithm)
