"""The Agents SDK's own session files: `agents.SQLiteSession` and `AdvancedSQLiteSession`, read and written.

A source is read with sqlite3 in read-only mode (an import changes nothing there), each session
as the SDK's own `get_items()` returns it: `SQLiteSession` rows in id order;
`AdvancedSQLiteSession` (a file with its ``message_structure`` table) the main branch in
sequence order. Rows that are not JSON are skipped, as the SDK skips them, and counted.

A file is written with the schema `SQLiteSession` creates (the same statements), each item
as the SDK writes it (``json.dumps(item)``), so `SQLiteSession(session_id, path)` reads it as
its own.
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
from urllib.parse import quote

from ..errors import CitadelSessionError, ExportExistsError, ImportSourceError

SQLITE_HEADER = b"SQLite format 3\x00"
SESSIONS_TABLE, MESSAGES_TABLE = "agent_sessions", "agent_messages"

# `SQLiteSession._create_schema_for_connection`, for the default table names.
_SCHEMA = (
    f"""
            CREATE TABLE IF NOT EXISTS {SESSIONS_TABLE} (
                session_id TEXT PRIMARY KEY,
                created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
                updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
            )
        """,
    f"""
            CREATE TABLE IF NOT EXISTS {MESSAGES_TABLE} (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                session_id TEXT NOT NULL,
                message_data TEXT NOT NULL,
                created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
                FOREIGN KEY (session_id) REFERENCES {SESSIONS_TABLE} (session_id)
                    ON DELETE CASCADE
            )
        """,
    f"""
            CREATE INDEX IF NOT EXISTS idx_{MESSAGES_TABLE}_session_id
            ON {MESSAGES_TABLE} (session_id, id)
        """,
)


def is_sqlite(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as file:
        return file.read(len(SQLITE_HEADER)) == SQLITE_HEADER


class SqliteSource:
    """The sessions of an SDK SQLite session file, read without changing it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sessions_table: str = SESSIONS_TABLE,
        messages_table: str = MESSAGES_TABLE,
    ) -> None:
        self.path = os.path.abspath(path)
        # Read-only: still, SQLite would create -wal and -shm files beside a WAL database. With
        # no -wal there, nothing is pending in one, and "immutable" reads the file alone.
        untouched = "" if os.path.exists(self.path + "-wal") else "&immutable=1"
        self._connection = sqlite3.connect(f"file:{quote(self.path)}?mode=ro{untouched}", uri=True)
        self._messages = _quoted(messages_table)
        try:
            tables = {row[0] for row in self._connection.execute("SELECT name FROM sqlite_master")}
        except sqlite3.DatabaseError as exc:
            self.close()
            raise ImportSourceError(f"{self.path} cannot be read as a SQLite database: {exc}") from None
        if messages_table not in tables:
            self.close()
            raise ImportSourceError(
                f"{self.path} has no table {messages_table!r} (its tables: {', '.join(sorted(tables)) or 'none'}); "
                "name the SDK's tables with --sessions-table and --messages-table."
            )
        self.advanced = "message_structure" in tables
        self.kind = "AdvancedSQLiteSession file" if self.advanced else "SQLiteSession file"
        # Rows that are not JSON, skipped as the SDK skips them: per session, so that a
        # session read twice (a check, then the import) is counted once.
        self._skipped: dict[str, int] = {}

    def sessions(self) -> list[tuple[str, int]]:
        """Each session id with its row count, in the order the sessions began."""
        rows = self._connection.execute(
            f"SELECT session_id, COUNT(*) FROM {self._messages} GROUP BY session_id ORDER BY MIN(id)"
        )
        return [(str(session_id), int(count)) for session_id, count in rows]

    def items(self, session_id: str) -> list[Any]:
        """The session's items, as the SDK's `get_items()` returns them."""
        rows = self._main_branch(session_id) if self.advanced else None
        if not rows:
            rows = self._connection.execute(
                f"SELECT message_data FROM {self._messages} WHERE session_id = ? ORDER BY id", (session_id,)
            ).fetchall()
        items = []
        skipped = 0
        for (data,) in rows:
            try:
                items.append(json.loads(data))
            except (json.JSONDecodeError, TypeError):
                skipped += 1
        self._skipped[session_id] = skipped
        return items

    @property
    def skipped(self) -> int:
        return sum(self._skipped.values())

    def _main_branch(self, session_id: str) -> list[Any]:
        return self._connection.execute(
            f"SELECT m.message_data FROM {self._messages} m JOIN message_structure s ON m.id = s.message_id "
            "WHERE m.session_id = ? AND s.branch_id = 'main' ORDER BY s.sequence_number",
            (session_id,),
        ).fetchall()

    def close(self) -> None:
        self._connection.close()


def write_sqlite_file(
    destination: str | os.PathLike[str],
    sessions: Iterable[tuple[str, list[Any], datetime | None, datetime | None]],
) -> None:
    """Write a new SDK session file of `sessions` (id, items, first and last write), mode 600.

    Written aside and linked into place at the end, so an existing file is never replaced
    and an interrupted export leaves no half-written one.

    Raises:
        ExportExistsError: `destination` exists; nothing was written.
    """
    target = Path(destination).expanduser().absolute()
    _refuse_existing(target)
    descriptor, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    os.close(descriptor)  # mkstemp made it 0600; sqlite3 opens it by name
    try:
        with closing(sqlite3.connect(partial)) as connection:
            for statement in _SCHEMA:
                connection.execute(statement)
            for session_id, items, first, last in sessions:
                _refuse_unstorable(session_id)
                connection.execute(
                    f"INSERT INTO {SESSIONS_TABLE} (session_id, created_at, updated_at) "
                    "VALUES (?, COALESCE(?, CURRENT_TIMESTAMP), COALESCE(?, CURRENT_TIMESTAMP))",
                    (session_id, _timestamp(first), _timestamp(last)),
                )
                connection.executemany(
                    f"INSERT INTO {MESSAGES_TABLE} (session_id, message_data) VALUES (?, ?)",
                    ((session_id, json.dumps(item)) for item in items),
                )
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


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
