"""The Agents SDK's own session files read for an import: `agents.SQLiteSession` and `AdvancedSQLiteSession`.

A source is read with sqlite3 in read-only mode (an import changes nothing there), each session
as the SDK's own `get_items()` returns it: `SQLiteSession` rows in id order;
`AdvancedSQLiteSession` (a file with its ``message_structure`` table) the main branch in
sequence order. Rows that are not JSON are skipped, as the SDK skips them, and counted. A file
that is hostile or unusual is bounded (`ITEM_BYTES`, `SESSION_ROWS`, `QUERY_SECONDS`) and refused
by row with nothing imported (issue 59). sdk_files.py writes such files.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any
from urllib.parse import quote

from ..errors import CitadelSessionError, ImportSourceError
from ..people import check_labels, check_owner
from .sdk_schema import (
    MESSAGES_TABLE,
    OWNERS_TABLE,
    SESSIONS_TABLE,
)

SQLITE_HEADER = b"SQLite format 3\x00"

# What a source may make an import read (a hostile or unusual file, issue 59), each limit named
# in the error that refuses a file past it, before anything is imported.
ITEM_BYTES = 16 * 1024 * 1024  # one item's JSON (a 200 MB item took 2.7 GB to import)
SESSION_ROWS = 1_000_000  # one session's rows, held at once
QUERY_SECONDS = 300.0  # one query (a recursive view never ends)


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
        # Text that is not UTF-8 comes back as bytes, refused by name where it is read (sqlite3's
        # own error would quote it, and it may be a person's words).
        self._connection.text_factory = _text
        # Every query is bounded: it stops past QUERY_SECONDS, or when the process that started
        # this one exits (an import is not left running for a parent that is gone).
        self._parent, self._deadline, self._stopped = os.getppid(), 0.0, ""
        self._connection.set_progress_handler(self._should_stop, 10_000)
        self._messages = quoted(messages_table)
        try:
            self._deadline = time.monotonic() + QUERY_SECONDS
            self._tables = {str(row[0]) for row in self._connection.execute("SELECT name FROM sqlite_master")}
        except sqlite3.DatabaseError as exc:
            self.close()
            raise ImportSourceError(f"{self.path} cannot be read as a SQLite database: {exc}") from None
        if messages_table not in self._tables:
            self.close()
            raise ImportSourceError(
                f"{self.path} has no table {messages_table!r} (its tables: {', '.join(sorted(self._tables)) or 'none'}); "
                "name the SDK's tables with --sessions-table and --messages-table."
            )
        self.advanced = "message_structure" in self._tables
        self.kind = "AdvancedSQLiteSession file" if self.advanced else "SQLiteSession file"
        # Rows that are not JSON, skipped as the SDK skips them: per session, so that a
        # session read twice (a check, then the import) is counted once.
        self._skipped: dict[str, int] = {}

    def sessions(self) -> list[tuple[str, int]]:
        """Each session id with its row count, in the order the sessions began; `ImportSourceError`
        for rows no session of the SDK can hold (an id that is not text) and for a source past
        `ITEM_BYTES` or `SESSION_ROWS`, before anything is imported."""
        rows = self._query(
            f"SELECT session_id, typeof(session_id), COUNT(*) FROM {self._messages} GROUP BY session_id "
            "ORDER BY MIN(id)",
            (),
            "its sessions",
        )
        bad = sum(
            count for session_id, kind, count in rows if kind != "text" or isinstance(session_id, bytes)
        )
        if bad:
            raise ImportSourceError(
                f"{self.path} holds {bad} rows whose session id is not UTF-8 text (a blob, a number, "
                "none, or bytes that are not UTF-8): no session of the SDK holds them, and importing "
                "them as another would lose them; nothing was imported. Give them text ids first."
            )
        large = [(str(sid), count) for sid, _, count in rows if count > SESSION_ROWS]
        if large:
            raise ImportSourceError(
                f"{self.path}: session {large[0][0]!r} holds {large[0][1]} rows, over the {SESSION_ROWS} "
                "one import reads of a session (SESSION_ROWS); nothing was imported."
            )
        oversized = self._query(
            f"SELECT id, session_id FROM {self._messages} WHERE length(CAST(message_data AS BLOB)) > ? LIMIT 1",
            (ITEM_BYTES,),
            "its items' sizes",
        )
        if oversized:
            raise ImportSourceError(
                f"{self.path}: row {oversized[0][0]} of session {str(oversized[0][1])!r} is larger than "
                f"{ITEM_BYTES // 2**20} MiB, the most one item may be here (ITEM_BYTES); nothing was imported."
            )
        return [(str(session_id), int(count)) for session_id, _, count in rows]

    def items(self, session_id: str) -> list[Any]:
        """The session's items, as the SDK's `get_items()` returns them; `ImportSourceError` naming
        the row for one that is not UTF-8 or nests too deeply to be read (the SDK would fail)."""
        rows = self._main_branch(session_id) if self.advanced else None
        if not rows:
            rows = self._query(
                f"SELECT id, message_data FROM {self._messages} WHERE session_id = ? ORDER BY id",
                (session_id,),
                f"session {session_id!r}",
            )
        decoded = self._decoded(session_id, rows)
        items = [item for item in decoded if item is not _SKIPPED]
        self._skipped[session_id] = len(decoded) - len(items)
        return items

    def check(self, session_ids: list[str]) -> None:
        """Read every row the import of `session_ids` will (an `ImportSourceError` names the first
        it cannot take), so that a source is imported whole or refused with nothing written."""
        for session_id in session_ids:
            self.items(session_id)
            self.other_branches(session_id)

    def _query(self, sql: str, parameters: tuple[Any, ...], what: str) -> list[Any]:
        """The rows of one bounded query (`_should_stop`); its failure an `ImportSourceError`."""
        self._deadline, self._stopped = time.monotonic() + QUERY_SECONDS, ""
        try:
            return self._connection.execute(sql, parameters).fetchall()
        except sqlite3.Error as exc:
            why = self._stopped or type(exc).__name__  # sqlite3's text may quote the file's data
            raise ImportSourceError(
                f"{self.path}: {what} cannot be read ({why}); nothing was imported."
            ) from None

    def _should_stop(self) -> int:
        if os.getppid() != self._parent:
            self._stopped = "the process that started this import has exited"
        elif time.monotonic() > self._deadline:
            self._stopped = f"one query ran past {QUERY_SECONDS:g} s (QUERY_SECONDS): a view that never ends?"
        return 1 if self._stopped else 0

    def _decoded(self, session_id: str, rows: list[Any]) -> list[Any]:
        """Each row's item, or `_SKIPPED` where it is not JSON (the SDK skips it too)."""
        found = []
        for row_id, data in rows:
            where = f"{self.path}: row {row_id} of session {session_id!r}"
            if isinstance(data, bytes):
                try:
                    data = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise ImportSourceError(f"{where} is not UTF-8 text; nothing was imported.") from None
            try:
                found.append(json.loads(data))
            except RecursionError:
                raise ImportSourceError(
                    f"{where} nests deeper than its JSON can be read (Python's recursion limit); nothing "
                    "was imported."
                ) from None
            except (json.JSONDecodeError, TypeError):
                found.append(_SKIPPED)
        return found

    @property
    def skipped(self) -> int:
        return sum(self._skipped.values())

    def _main_branch(self, session_id: str) -> list[Any]:
        return self._branch(session_id, "main")

    def _branch(self, session_id: str, branch: str) -> list[Any]:
        return self._query(
            f"SELECT m.id, m.message_data FROM {self._messages} m JOIN message_structure s ON m.id = s.message_id "
            "WHERE m.session_id = ? AND s.branch_id = ? ORDER BY s.sequence_number",
            (session_id, branch),
            f"session {session_id!r}, branch {branch!r}",
        )

    def other_branches(self, session_id: str) -> dict[str, list[Any]]:
        """An AdvancedSQLiteSession's branches other than main, each as its `get_items(branch_id=)`."""
        if not self.advanced:
            return {}
        names = self._query(
            "SELECT branch_id FROM message_structure WHERE session_id = ? AND branch_id != 'main' "
            "GROUP BY branch_id ORDER BY MIN(id)",
            (session_id,),
            f"session {session_id!r}'s branches",
        )
        found = {}
        for (name,) in names:
            decoded = self._decoded(session_id, self._branch(session_id, name))
            found[str(name)] = [item for item in decoded if item is not _SKIPPED]
        return found

    def used_branch_names(self, session_id: str) -> list[str]:
        """Every branch name the session used: those it holds, and (0.24) those it deleted."""
        if "branch_reservations" not in self._tables:
            return list(self.other_branches(session_id))
        rows = self._query(
            "SELECT branch_id FROM branch_reservations WHERE session_id = ? AND branch_id != 'main'",
            (session_id,),
            f"session {session_id!r}'s branch names",
        )
        return sorted({str(name) for (name,) in rows} | set(self.other_branches(session_id)))

    def usage(self, session_id: str) -> list[tuple[str, int, dict[str, Any]]]:
        """Each turn's usage an AdvancedSQLiteSession stored: (branch, user turn, usage)."""
        if not self.advanced:
            return []
        rows = self._query(
            "SELECT branch_id, user_turn_number, requests, input_tokens, output_tokens, total_tokens, "
            "input_tokens_details, output_tokens_details FROM turn_usage WHERE session_id = ? "
            "ORDER BY branch_id, user_turn_number",
            (session_id,),
            f"session {session_id!r}'s usage",
        )
        found = []
        for branch, turn, requests, tokens_in, tokens_out, total, details_in, details_out in rows:
            used = {
                "requests": int(requests or 0),
                "input_tokens": int(tokens_in or 0),
                "output_tokens": int(tokens_out or 0),
                "total_tokens": int(total or 0),
                "input_tokens_details": _details(details_in),
                "output_tokens_details": _details(details_out),
            }
            found.append((str(branch), int(turn), used))
        return found

    def about(self) -> dict[str, tuple[str | None, dict[str, Any] | None]]:
        """Each session's owner and labels, as an export from this package records them (its own
        table; none in the SDK's files). Checked as the store checks them: a row it would refuse
        is an `ImportSourceError` naming it, before anything is imported."""
        if OWNERS_TABLE not in self._tables:
            return {}
        found: dict[str, tuple[str | None, dict[str, Any] | None]] = {}
        for session_id, owner, labels in self._query(
            f"SELECT session_id, owner, labels FROM {OWNERS_TABLE} ORDER BY rowid", (), "its owners"
        ):
            where = f"{self.path}, table {OWNERS_TABLE}, session {session_id!r}"
            try:
                found[str(session_id)] = (
                    None if owner is None else check_owner(owner, f"{where}: owner"),
                    None if labels is None else check_labels(json.loads(labels), f"{where}: labels"),
                )
            except CitadelSessionError as exc:  # names `where` itself
                raise ImportSourceError(f"{exc}; nothing was imported.") from None
            except (ValueError, TypeError) as exc:
                raise ImportSourceError(
                    f"{where}: labels are not JSON ({exc}); nothing was imported."
                ) from None
        return found

    def close(self) -> None:
        self._connection.close()


_SKIPPED = object()


def _text(raw: bytes) -> str | bytes:
    """A TEXT value as str, or its bytes when they are not UTF-8 (refused where it matters)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _details(data: Any) -> dict[str, Any] | None:
    """Token details as the SDK reads them back: its JSON, or None (absent or not JSON)."""
    try:
        found = json.loads(data) if data else None
    except (json.JSONDecodeError, TypeError):
        return None
    return found if isinstance(found, dict) else None


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
