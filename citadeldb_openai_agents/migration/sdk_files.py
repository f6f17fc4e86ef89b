"""The Agents SDK's own session files written: `agents.SQLiteSession` and `AdvancedSQLiteSession`.

A file is written with the schema `SQLiteSession` creates and the tables `AdvancedSQLiteSession`
adds (the same statements), each item as the SDK writes it (``json.dumps(item)``), so
`SQLiteSession(session_id, path)` reads it as its own, and `AdvancedSQLiteSession` its branches
and usage too. sdk_source.py reads them for an import.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Iterable
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import turns
from ..errors import CitadelSessionError, ExportExistsError
from ..results import SessionExport, SessionSummary
from .sdk_schema import (
    MESSAGES_TABLE,
    OWNERS_SCHEMA,
    OWNERS_TABLE,
    RESERVATION_COLUMNS,
    SCHEMA,
    SESSIONS_TABLE,
    STRUCTURE_COLUMNS,
    STRUCTURE_SCHEMA,
    USAGE_COLUMNS,
)


def write_sqlite_file(
    destination: str | os.PathLike[str], sessions: Iterable[tuple[SessionExport, SessionSummary]]
) -> None:
    """Write a new SDK session file of `sessions` (each whole, with its listing: its first and
    last write, its owner and labels), mode 600.

    The tables are `AdvancedSQLiteSession`'s: `SQLiteSession` reads each session's main branch
    (all of it where the session has no other branch), `AdvancedSQLiteSession` its branches and
    usage too. Written aside and linked into place at the end, so an existing file is never
    replaced and an interrupted export leaves no half-written one.

    Raises:
        ExportExistsError: `destination` exists; nothing was written.
    """
    target = Path(destination).expanduser().absolute()
    _refuse_existing(target)
    descriptor, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    os.close(descriptor)  # mkstemp made it 0600; sqlite3 opens it by name
    try:
        with closing(sqlite3.connect(partial)) as connection:
            _write_sessions(connection, sessions)
            connection.commit()
        try:
            os.link(partial, target)  # unlike a rename, never replaces a file that appeared meanwhile
        except FileExistsError:
            _refuse_existing(target)
            raise ExportExistsError(
                f"refusing to overwrite {target}: it appeared during the export"
            ) from None
    finally:
        os.unlink(partial)


def _write_sessions(
    connection: sqlite3.Connection, sessions: Iterable[tuple[SessionExport, SessionSummary]]
) -> None:
    for statement in SCHEMA:
        connection.execute(statement)
    # Structure rows wait aside: AdvancedSQLiteSession's tables are written only if a
    # session has another branch or usage (else the file is exactly SQLiteSession's).
    connection.execute(f"CREATE TEMP TABLE message_structure ({', '.join(STRUCTURE_COLUMNS)})")
    connection.execute(f"CREATE TEMP TABLE turn_usage ({', '.join(USAGE_COLUMNS)})")
    connection.execute(f"CREATE TEMP TABLE branch_reservations ({', '.join(RESERVATION_COLUMNS)})")
    advanced, owned = False, []
    for session, summary in sessions:
        _refuse_unstorable(session.session_id)
        connection.execute(
            f"INSERT INTO {SESSIONS_TABLE} (session_id, created_at, updated_at) "
            "VALUES (?, COALESCE(?, CURRENT_TIMESTAMP), COALESCE(?, CURRENT_TIMESTAMP))",
            (session.session_id, _timestamp(summary.first_write), _timestamp(summary.last_write)),
        )
        _write_session(connection, session)
        if summary.owner is not None or summary.labels is not None:
            labels = None if summary.labels is None else json.dumps(summary.labels)
            owned.append((session.session_id, summary.owner, labels))
        advanced = (
            advanced or bool(session.usage or session.reserved) or any(b != "main" for b in session.branches)
        )
    if owned:
        connection.execute(OWNERS_SCHEMA)
        connection.executemany(f"INSERT INTO {OWNERS_TABLE} VALUES (?, ?, ?)", owned)
    if advanced:
        for statement in STRUCTURE_SCHEMA:
            connection.execute(statement.replace("IF NOT EXISTS ", "IF NOT EXISTS main.", 1))
        tables = (
            ("message_structure", STRUCTURE_COLUMNS),
            ("turn_usage", USAGE_COLUMNS),
            ("branch_reservations", RESERVATION_COLUMNS),
        )
        for table, columns in tables:
            listed = ", ".join(columns)
            connection.execute(f"INSERT INTO main.{table} ({listed}) SELECT {listed} FROM temp.{table}")


def _write_session(connection: sqlite3.Connection, session: SessionExport) -> None:
    """A session's messages, each branch's structure rows (a branch shares the messages its first
    items have in common with main, as the SDK's branches do), its used branch names and its usage rows."""
    sid, sequence = session.session_id, 0
    main: list[tuple[str, int]] = []  # main's messages: their text and row id
    for branch, items in session.branches.items():
        sharing = branch != "main"  # while the branch's items are main's first ones
        for position, place in enumerate(turns.placed(items)):
            text = json.dumps(place.item)
            sharing = sharing and position < len(main) and main[position][0] == text
            if sharing:
                message = main[position][1]
            else:
                inserted = connection.execute(
                    f"INSERT INTO {MESSAGES_TABLE} (session_id, message_data, created_at) VALUES (?, ?, ?)",
                    (sid, text, place.timestamp),
                )
                message = int(inserted.lastrowid or 0)
            if branch == "main":
                main.append((text, message))
            sequence += 1
            connection.execute(
                f"INSERT INTO temp.message_structure ({', '.join(STRUCTURE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    message,
                    branch,
                    place.type,
                    sequence,
                    place.turn,
                    place.turn,
                    place.tool,
                    place.timestamp,
                ),
            )
    for branch in dict.fromkeys([*session.branches, *session.reserved]):  # as the SDK's backfill, main too
        connection.execute(
            "INSERT INTO temp.branch_reservations (session_id, branch_id) VALUES (?, ?)", (sid, branch)
        )
    for branch, turn, used in session.usage:
        connection.execute(
            f"INSERT INTO temp.turn_usage ({', '.join(USAGE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                sid,
                branch,
                turn,
                *(used[name] for name in ("requests", "input_tokens", "output_tokens", "total_tokens")),
                *(_json(used[name]) for name in ("input_tokens_details", "output_tokens_details")),
            ),
        )


def _json(details: dict[str, Any] | None) -> str | None:
    return None if details is None else json.dumps(details)


def _refuse_unstorable(session_id: str) -> None:
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise CitadelSessionError(
            f"session id {session_id!r} holds a lone surrogate, which SQLite's text cannot hold (nor "
            "could the SDK's SQLiteSession use it); nothing was written. Export it with --all (JSON "
            "Lines), or name the other sessions."
        ) from None


def _refuse_existing(target: Path) -> None:
    if os.path.lexists(target):  # a symlink too, dangling or not: nothing is written through one
        raise ExportExistsError(
            f"refusing to overwrite {target}: choose a new file (an export never replaces one)"
        )


def _timestamp(moment: datetime | None) -> str | None:
    # As SQLite's CURRENT_TIMESTAMP writes it (UTC), which is what the SDK's rows hold.
    return None if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")
