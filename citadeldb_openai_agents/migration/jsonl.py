"""JSON Lines, as the export command writes them: one session's file read back, and one file per session.

Every session gets a file whose name is safe on any filesystem whatever its id (any
unicode, ``/``, thousands of characters, ids equal but for case): the id's readable
characters kept, the rest percent-encoded, cut short, then a digest of the whole id.
``index.json`` maps each file to its session id.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import ExportExistsError, ImportSourceError
from ..results import Progress, SessionExport, SessionSummary
from .sdk_source import ITEM_BYTES

INDEX = "index.json"
_READABLE = 48  # characters of the escaped id kept in a file name, before its digest


def json_line(item: Any) -> bytes:
    """An item as one line of UTF-8 JSON, keys in stored order (a lone surrogate \\u-escaped)."""
    try:
        return (json.dumps(item, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(item) + "\n").encode()


class JsonlSource:
    """A JSON Lines file of one session's items (what ``export`` writes), for an import."""

    kind = "JSON Lines file"
    skipped = 0

    def __init__(self, path: str | os.PathLike[str], session_id: str) -> None:
        self.path = os.path.abspath(path)
        self.session_id = session_id
        self._items: list[Any] = []
        with open(self.path, "rb") as file:
            for number, raw in enumerate(_lines(file, self.path), 1):
                if raw.strip():
                    self._items.append(self._item(raw, number))

    def _item(self, raw: bytes, number: int) -> Any:
        """One line's item; `ImportSourceError` naming the line for one that cannot be (issue 59)."""
        where = f"{self.path}, line {number},"
        try:
            return json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ImportSourceError(f"{where} is not UTF-8 text; nothing was imported.") from None
        except RecursionError:
            raise ImportSourceError(
                f"{where} nests deeper than its JSON can be read (Python's recursion limit); nothing was imported."
            ) from None
        except json.JSONDecodeError as exc:
            raise ImportSourceError(
                f"{where} is not JSON ({exc.msg}); nothing was imported. "
                "An import reads JSON Lines as `export` writes them: one item per line."
            ) from None

    def sessions(self) -> list[tuple[str, int]]:
        return [(self.session_id, len(self._items))]

    def items(self, session_id: str) -> list[Any]:
        return self._items if session_id == self.session_id else []

    def close(self) -> None:
        self._items = []


def _lines(file: Any, path: str) -> Iterator[bytes]:
    """The file's lines, each at most `ITEM_BYTES` (one is read no further than that)."""
    number = 0
    while line := file.readline(ITEM_BYTES + 1):
        number += 1
        if len(line) > ITEM_BYTES:
            raise ImportSourceError(
                f"{path}, line {number}, is larger than {ITEM_BYTES // 2**20} MiB, the most one item may "
                "be here (ITEM_BYTES); nothing was imported."
            )
        yield line


def file_name(session_id: str) -> str:
    """A file name for a session: its id made safe and short, and a digest of the whole id."""
    # As UTF-8 bytes that keep a lone surrogate (the store accepts any str as an id).
    escaped = (
        quote(session_id.encode("utf-8", "surrogatepass"), safe="").replace("%", "_")[:_READABLE] or "session"
    )
    if escaped.startswith("."):
        escaped = "_" + escaped[1:]
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{escaped}.{digest}.jsonl"


def write_session_files(
    directory: str | os.PathLike[str],
    session_ids: list[str],
    read: Callable[[str], SessionExport],
    progress: Progress | None = None,
    about: Mapping[str, SessionSummary] | None = None,
    shards: Mapping[str, str] | None = None,
) -> dict[str, tuple[str, int]]:
    """Write each session's items to its own file in `directory`, and the index; mode 600.
    A session `about` describes has its owner and first and last write in its index entry,
    one in `shards` the fleet's shard it was read from.

    A session's other branches get a file each too, and its index entry its stored usage.
    Every target is checked before anything is written: if one exists, nothing is.
    Returns each session id with its (main) file name and item count.

    Raises:
        ExportExistsError: a target file exists; nothing was written.
    """
    folder = Path(directory).expanduser().absolute()
    names = {session_id: file_name(session_id) for session_id in session_ids}
    existing = [name for name in [*names.values(), INDEX] if os.path.lexists(folder / name)]
    if existing:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise ExportExistsError(
            f"refusing to overwrite {shown} in {folder}: nothing was written. Choose a new or empty "
            "directory (an export never replaces a file)."
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    written: dict[str, tuple[str, int]] = {}
    index: list[dict[str, Any]] = []
    for done, session_id in enumerate(session_ids, 1):
        session = read(session_id)
        for branch, rows in session.branches.items() or {"main": []}.items():
            name = names[session_id] if branch == "main" else file_name(json.dumps([session_id, branch]))
            _write_new(folder / name, b"".join(json_line(item) for item, _ in rows))
            entry: dict[str, Any] = {"file": name, "session_id": session_id, "items": len(rows)}
            if branch == "main":
                shard = None if shards is None else shards.get(session_id)
                entry |= _described((about or {}).get(session_id), shard, session.reserved)
            index.append(entry | _branch_entry(session, branch))
        written[session_id] = (names[session_id], len(session.items))
        if progress is not None:
            progress(done, len(session_ids))
    _write_new(folder / INDEX, json_line(index))
    return written


def _described(summary: SessionSummary | None, shard: str | None, reserved: list[str]) -> dict[str, Any]:
    """A session's main entry: its owner, labels and writes, its shard, its used branch names."""
    entry: dict[str, Any] = {}
    if summary is not None:
        entry |= {
            "owner": summary.owner,
            "labels": summary.labels,
            "first_write": summary.first_write.isoformat(),
            "last_write": summary.last_write.isoformat(),
        }
    if shard is not None:
        entry["shard"] = shard
    if reserved:
        entry["used_branch_names"] = reserved  # deleted branches' too
    return entry


def _branch_entry(session: SessionExport, branch: str) -> dict[str, Any]:
    """A branch's name (other than main) and the usage stored for its turns."""
    entry: dict[str, Any] = {} if branch == "main" else {"branch": branch}
    used = [{"user_turn_number": turn, **usage} for b, turn, usage in session.usage if b == branch]
    return entry | ({"usage": used} if used else {})


def _write_new(path: Path, data: bytes) -> None:
    # O_EXCL: a file that appeared since the check is still never replaced.
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ExportExistsError(f"refusing to overwrite {path}: it appeared during the export") from None
    with open(descriptor, "wb") as file:
        file.write(data)
