"""How the commands print: text for people, JSON for scripts, progress on a terminal.

Text goes to stdout, warnings, problems and progress to stderr. Progress bars
(tqdm) show only when stderr is a terminal and the output is not JSON.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from .. import EmbedderIdentity
from ..config import CheckReport
from ..options import DURATIONS, UNSET_MEANS, format_duration
from ..results import ExportSummary, ImportReport, IntegrityReport, PageLayout, SessionSummary


def print_check_report(report: CheckReport) -> None:
    print(f"configuration file: {report.config_file or 'none'}")
    if report.settings:
        _print_settings(report)
    database = report.database
    if database is not None:
        print(f"database: {database.path}")
        if not database.exists:
            if _value(report, "create"):
                print("  not created yet (created on first use, or now by the init command)")
            else:
                print("  does not exist, and create is false (see the problems)")
        elif database.locked:
            holder = "" if database.held_by is None else f", {database.held_by}"
            print(f"  held by another process{holder}: not opened, so the passphrase was not verified")
        elif database.passphrase_verified and database.served_by is not None:
            print(f"  held by process {database.served_by}, serving; passphrase verified through the owner")
            for name, value in database.adopted.items():
                print(f"  {name}: {_text(name, value)}, the owner's (not set here, so adopted)")
            print(f"  sessions:   {database.sessions}")
            print(f"  size:       {database.size_bytes} bytes ({human(database.size_bytes)})")
        elif database.passphrase_verified:
            print("  passphrase: verified")
            print(f"  sessions:   {database.sessions}")
            print(f"  size:       {database.size_bytes} bytes ({human(database.size_bytes)})")
        else:
            print("  not opened (see the problems)")
    # Keeps the report before the warnings and problems when both streams go to one log.
    sys.stdout.flush()
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if report.ok:
        opened = " and the database opens" if database is not None and database.exists else ""
        print(f"OK: the configuration is usable{opened}.")
        return
    count = len(report.problems)
    print(f"not usable, {count} problem{'s' if count > 1 else ''}:", file=sys.stderr)
    for problem in report.problems:
        print(f"  - {problem}", file=sys.stderr)


def _print_settings(report: CheckReport) -> None:
    print("settings:")
    width = max(len(row.name) for row in report.settings)
    adopted = {} if report.database is None else report.database.adopted
    values = [
        f"the owner's: {_text(row.name, adopted[row.name])}"
        if row.name in adopted
        else _text(row.name, row.value)
        for row in report.settings
    ]
    value_width = min(max(len(value) for value in values), 40)
    for row, value in zip(report.settings, values, strict=True):
        source = str(row.origin)
        if row.overrides:
            source += f" (overrides {', '.join(str(origin) for origin in row.overrides)})"
        print(f"  {row.name:<{width}}  {value:<{value_width}}  {source}")
    used, *overridden = report.passphrase_sources or [""]
    if overridden:  # one source: its row says it all
        print(f"passphrase sources:\n  used:        {used}")
        print("\n".join(f"  overridden:  {source} (not read or run)" for source in overridden))


def _value(report: CheckReport, name: str) -> Any:
    return next(row.value for row in report.settings if row.name == name)


# What an unset setting means, where it is not simply "nothing" (the store decides it).
_UNSET_MEANS = {**UNSET_MEANS, "max_items": "no cap"}


def _text(name: str, value: Any) -> str:
    if value is None:
        meaning = _UNSET_MEANS.get(name)
        return f"unset ({meaning})" if meaning else "unset"
    if isinstance(value, list):
        return ", ".join(value) if value else "none"
    if name in DURATIONS:
        return format_duration(value)
    if isinstance(value, EmbedderIdentity):
        return describe_embedder(value)
    if isinstance(value, bool):
        return str(value).lower()  # as written in the TOML file and the variables
    return str(value)


def describe_embedder(identity: EmbedderIdentity) -> str:
    return f"{identity.model_id} (dim {identity.dim}, {identity.metric})"


def human(size: float) -> str:
    if size < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


def summary_dict(summary: SessionSummary) -> dict[str, Any]:
    return {
        "session_id": summary.session_id,
        "items": summary.items,
        "first_write": summary.first_write.isoformat(),
        "last_write": summary.last_write.isoformat(),
        "owner": summary.owner,
        "labels": summary.labels,
    }


def integrity_dict(report: IntegrityReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "pages_checked": report.pages_checked,
        "page_errors": list(report.page_errors),
        "item_verdicts": dict(report.item_verdicts),
        "audit_entries": report.audit_entries,
        "audit_break_at": report.audit_break_at,  # counted from 1, as the text says
        "layout": _layout_dict(report.layout),
        "damaged_pages": [{"page": page, **_span_dict(report.layout, page)} for page in report.damaged_pages],
        "findings": list(report.findings),
        "sessions": [
            {
                "session_id": session.session_id,
                "expected": session.expected,
                "readable": session.readable,
                "missing": session.missing,
                "not_authentic": session.not_authentic,
                "cause": session.cause,
            }
            for session in report.sessions
        ],
    }


def _layout_dict(layout: PageLayout | None) -> dict[str, Any] | None:
    if layout is None:
        return None
    return {
        "header_bytes": layout.header_bytes,
        "page_size": layout.page_size,
        "high_water_mark": layout.high_water_mark,
        "file_size": layout.file_size,
        # [first, last] (inclusive), None when empty: what the text's "in use" and "past the mark" say.
        "pages_in_use": [0, layout.high_water_mark - 1] if layout.high_water_mark else None,
        "unused_bytes": [layout.used_end, layout.file_size - 1]
        if layout.used_end < layout.file_size
        else None,
    }


def _span_dict(layout: PageLayout | None, page: int) -> dict[str, int | None]:
    first, last = layout.page_span(page) if layout is not None else (None, None)
    return {"first_byte": first, "last_byte": last}


def page_named(message: str, layout: PageLayout | None) -> str:
    """Citadel's "page:N" as "page N (bytes A-B)", where the file's layout is known."""
    return message if layout is None else layout.named(message)


def _print_layout(path: str, layout: PageLayout) -> None:
    """Where each page lies, which are in use, and what lies past the high-water mark."""
    size, header = layout.page_size, layout.header_bytes
    print(
        f"pages:         page N is bytes {header}+{size}*N to {header}+{size}*N+{size - 1} of "
        f"{os.path.basename(path)}, counted from 0 (bytes 0-{header - 1}: the header)"
    )
    mark = layout.high_water_mark
    used = f"pages 0-{mark - 1}" if mark else "no page"
    print(
        f"in use:        {used}, below the high-water mark {mark} (bytes 0-{layout.used_end - 1}); "
        "a free page among them holds no data and is not read"
    )
    if layout.used_end >= layout.file_size:
        print("past the mark: nothing, the file ends there")
        return
    tail = layout.file_size - max(layout.used_end, header + layout.file_pages * size)
    parts = [f"pages {mark}-{layout.file_pages - 1}"] if layout.file_pages > mark else []
    parts += [count(tail, "byte")] if tail else []
    print(
        f"past the mark: bytes {layout.used_end}-{layout.file_size - 1} ({' and '.join(parts)}): "
        "unused, they hold no data and are not read"
    )


def print_integrity(path: str, report: IntegrityReport) -> None:
    print(f"database:      {path}")
    if report.layout is not None:
        _print_layout(path, report.layout)
    print(
        f"pages checked: {report.pages_checked} (Citadel's page reads: each page the last two commits reach)"
    )
    print(f"page errors:   {len(report.page_errors) or 'none'}")
    for error in report.page_errors:
        print(f"  - {page_named(error, report.layout)}")
    verdicts = ", ".join(f"{count} {verdict}" for verdict, count in sorted(report.item_verdicts.items()))
    print(f"items:         {verdicts or 'none'}")
    if report.audit_break_at is None:
        # Citadel's chain shows an entry changed or removed inside it, not one cut from its end.
        print(
            f"audit log:     {count(report.audit_entries, 'entry', 'entries')} verified, each chained to the one before (entries cut from its end do not show here)"
        )
    else:
        before = report.audit_break_at - 1
        verified = {0: "none verified", 1: "entry 1 verified"}.get(before, f"entries 1-{before} verified")
        print(
            f"audit log:     chain broken at entry {report.audit_break_at} (entries counted from 1; "
            f"{verified}); the log was altered"
        )
    damaged = report.damaged_sessions
    print(f"sessions:      {len(report.sessions)} checked, {len(damaged) or 'none'} damaged")
    for session in damaged:
        who = "an unknown session" if session.session_id is None else repr(session.session_id)
        print(
            f"  - {who}: {session.readable} of {session.expected} items readable, "
            f"{session.missing} missing, {session.not_authentic} not authentic"
            + (f" ({session.cause})" if session.cause else "")
        )
    for finding in report.findings:
        print(f"  - {page_named(finding, report.layout)}")
    sys.stdout.flush()
    if report.ok:
        print("OK: no damage or tampering found.")
        return
    bad_items = sum(count for verdict, count in report.item_verdicts.items() if verdict != "authentic")
    missing = sum(session.missing for session in report.sessions)
    audit = "" if report.audit_break_at is None else ", the audit log altered"
    print(
        f"verify: FAILED ({count(len(report.page_errors), 'page error')}, "
        f"{count(missing, 'item')} missing, {count(bad_items, 'item')} not authentic{audit}"
        f"{', ' + count(len(report.findings), 'other finding') if report.findings else ''}). "
        "Restore the file and its companion files together from a backup.",
        file=sys.stderr,
    )


def count(number: int, noun: str, plural: str | None = None) -> str:
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def shown_id(session_id: str) -> str:
    """An id as typed, unless control characters would garble the table."""
    return session_id if session_id.isprintable() else repr(session_id)


def print_sessions(path: str, summaries: list[SessionSummary]) -> None:
    """The sessions as a table, with totals."""
    if not summaries:
        print(f"no sessions in {path}")
        return
    rows = [
        (shown_id(s.session_id), str(s.items), utc(s.first_write), utc(s.last_write), _owner(s.owner))
        for s in summaries
    ]
    header = ("SESSION", "ITEMS", "FIRST WRITE (UTC)", "LAST WRITE (UTC)", "OWNER")
    width = max(len(row[0]) for row in [header, *rows])
    items_width = max(len(row[1]) for row in [header, *rows])
    owned = any(s.owner is not None for s in summaries)  # a file without owners shows no column
    for row in [header, *rows]:
        line = f"{row[0]:<{width}}  {row[1]:>{items_width}}  {row[2]:<19}  {row[3]}"
        print(f"{line:<{width + items_width + 44}}  {row[4]}" if owned else line)
    total = sum(s.items for s in summaries)
    print(f"{count(len(summaries), 'session')}, {count(total, 'item')} in {path}")


def _owner(owner: str | None) -> str:
    return "-" if owner is None else shown_id(owner)


def import_dict(path: str, report: ImportReport) -> dict[str, Any]:
    return {
        "source": report.source,
        "source_kind": report.kind,
        "database": path,
        "sessions": [
            {
                "session_id": session.session_id,
                "items": session.items,
                "written": session.written,
                "already_held": session.already_held,
                "replaced": session.replaced,
                "owner": session.owner,
            }
            for session in report.sessions
        ],
        "items_written": report.written,
        "rows_skipped": report.skipped,
        "source_still_exists": True,
        "delete_source": _shred(report.source),
    }


def print_import(path: str, report: ImportReport) -> None:
    items = sum(session.items for session in report.sessions)
    print(
        f"imported {count(len(report.sessions), 'session')}, {count(items, 'item')} from {report.source} "
        f"({report.kind}) into {path}"
    )
    held = sum(session.already_held for session in report.sessions)
    if held:
        print(f"  {count(report.written, 'item')} written now; {held} were already there from an earlier run")
    replaced = sum(session.replaced for session in report.sessions)
    if replaced:
        print(f"  {count(replaced, 'session')} replaced: their previous items erased (keys destroyed)")
    branches = sum(session.branches for session in report.sessions)
    turns = sum(session.usage_turns for session in report.sessions)
    if branches or turns:
        print(
            f"  with {count(branches, 'branch', 'branches')} other than main, and the usage of {count(turns, 'turn')}"
        )
    owners = {session.owner for session in report.sessions if session.owner is not None}
    if owners:
        owned = sum(session.owner is not None for session in report.sessions)
        print(f"  {count(owned, 'session')} with their owner recorded ({count(len(owners), 'owner')})")
    if report.skipped:
        print(f"  {count(report.skipped, 'row')} skipped: not JSON (the SDK's own sessions skip them too)")
    print(
        f"note: the plaintext source still exists: {report.source}. Once you have checked the import "
        "(`python -m citadeldb_openai_agents sessions`), delete it:\n"
        f"  {_shred(report.source)}\n"
        "  (shred cannot reach the copies a journaling or copy-on-write filesystem or an SSD keeps: "
        "use rm there), and delete its backups and copies too: they hold the same conversations in plain text."
    )


def _shred(source: str) -> str:
    # SQLite may keep part of the data in its -wal and -shm files beside the database.
    companions = [
        f"{source}{suffix}" for suffix in ("-wal", "-shm", "-journal") if os.path.exists(source + suffix)
    ]
    return "shred -u " + " ".join(shlex.quote(name) for name in [source, *companions])


def print_export(path: str, summary: ExportSummary) -> None:
    print(
        f"exported {count(len(summary.sessions), 'session')}, {count(summary.items, 'item')} from {path} "
        f"to {summary.destination}"
    )
    if summary.files:
        print("  one JSON Lines file per session (mode 600); index.json maps the files to the session ids")
    print("These are plaintext copies of the conversations: keep them safe, and delete them when done.")


def export_dict(path: str, summary: ExportSummary) -> dict[str, Any]:
    """An export's report for --json: where it wrote, and each session with its item count."""
    return {
        "database": path,
        "destination": summary.destination,
        "sessions": summary.sessions,
        "items": summary.items,
        "files": summary.files,
    }


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def json_lines(items: list[Any]) -> bytes:
    """Items as JSON Lines, UTF-8 whatever the terminal's locale, keys in stored order."""
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode()


@contextmanager
def progress_bar(
    description: str, *, enabled: bool, unit: str = "session"
) -> Iterator[Callable[[int, int], None] | None]:
    """A `progress(done, total)` callback drawing a bar on stderr, or None when not `enabled`.

    Enabled only on a terminal: a log or a pipe gets no control characters.
    """
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm  # loaded only for a bar on a terminal

    bar = tqdm(desc=description, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()
