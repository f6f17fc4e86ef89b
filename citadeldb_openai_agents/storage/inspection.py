"""A file no store holds open, checked without changing it (`verify_file`); the report's assembly."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import citadeldb

from ..results import IntegrityReport, PageLayout, SessionIntegrity
from . import registry
from .audit import audit, inventory_of
from .files import page_layout
from .whole_file import audit_chain

_PAGE = re.compile(r"\bpage:(\d+)")


def integrity_report(
    pages: Mapping[str, Any],
    chain: Mapping[str, Any],
    verdicts: dict[str, int],
    sessions: list[SessionIntegrity],
    findings: list[str] | None = None,
    layout: PageLayout | None = None,
) -> IntegrityReport:
    """Assemble an `IntegrityReport` from Citadel's page check, audit-log check and the sessions'."""
    bad_items = sum(count for verdict, count in verdicts.items() if verdict != "authentic")
    findings = findings or []
    # Citadel checks the current and the previous commit: a page both reach is reported twice.
    page_errors = list(dict.fromkeys(str(error["message"]) for error in pages["errors"]))
    return IntegrityReport(
        ok=bool(pages["ok"])
        and bad_items == 0
        and bool(chain["chain_valid"])
        and all(session.ok for session in sessions)
        and not findings,
        pages_checked=int(pages["pages_checked"]),
        page_errors=page_errors,
        item_verdicts=verdicts,
        audit_entries=int(chain["entries_verified"]),
        # Citadel's `chain_break_at` is the broken entry's own sequence field, read from the
        # altered bytes (4294967297 for entry 1 with its fifth byte altered): the entries
        # before the break verified, so the break is the next one, counted from 1.
        audit_break_at=None if chain["chain_valid"] else int(chain["entries_verified"]) + 1,
        sessions=sessions,
        findings=findings,
        layout=layout,
        damaged_pages=sorted({int(page) for error in page_errors for page in _PAGE.findall(error)}),
    )


def verify_file(path: str | os.PathLike[str], key: str) -> IntegrityReport:
    """`LocalFile.verify` for a file that is not open, changing nothing in it (see `registry.inspect_file`)."""
    try:
        return registry.inspect_file(path, key, _inspect)
    finally:
        del key


def _inspect(db: citadeldb.Database, path: str) -> IntegrityReport:
    pages, chain, layout = (
        db.integrity_check(),
        audit_chain(db),
        page_layout(path, int(db.stats()["high_water_mark"])),
    )
    try:
        return _sessions(db, path, pages, chain, layout)
    except citadeldb.IntegrityError as exc:
        # A damaged page under the records every session is found by: the page check names it.
        finding = f"no session can be read: Citadel failed on a damaged page ({exc})"
        return integrity_report(pages, chain, {}, [], [finding], layout)


def _sessions(
    db: citadeldb.Database,
    path: str,
    pages: Mapping[str, Any],
    chain: Mapping[str, Any],
    layout: PageLayout | None,
) -> IntegrityReport:
    inventory = inventory_of(db, path)
    verdict = audit(inventory)
    maintenance = db.memory_maintenance()
    verdicts: dict[str, int] = {}
    sessions = []
    for count in verdict.sessions:
        found: dict[str, int] = {}
        for name in count.segments:
            region = inventory.regions[name]
            ids = sorted(region.live_items(inventory.taken_at) - region.unreadable)
            for attestation in maintenance.verify(name, ids) if ids and not region.forgotten else []:
                found[attestation.verdict] = found.get(attestation.verdict, 0) + 1
        for kind, number in found.items():
            verdicts[kind] = verdicts.get(kind, 0) + number
        not_authentic = sum(number for kind, number in found.items() if kind != "authentic")
        readable = count.expected - count.unreadable
        if count.other:
            who = "an unknown session" if count.session_id is None else f"session {count.session_id!r}"
            verdict.file.append(f"{count.other} write markers of {who} cannot be read ({count.cause})")
        sessions.append(
            SessionIntegrity(count.session_id, count.expected, readable, not_authentic, count.cause)
        )
    sessions.sort(key=lambda session: (session.session_id is None, session.session_id or ""))
    return integrity_report(pages, chain, verdicts, sessions, verdict.file, layout)
