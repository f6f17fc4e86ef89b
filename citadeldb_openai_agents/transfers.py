"""What `CitadelSessionStore` offers to move sessions in and out: export, import and move.

A data-access request (`export`, `export_session`, with every branch and the usage stored),
an import (`import_items`, `import_usage`: an SDK file's sessions, branches and usage arrive
as they were) and a move to another file (transfer/moves.py). `migration/` builds the
operator's import and export of whole files on these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import SessionNotFoundError
from .results import MoveSummary, Progress, SessionExport
from .storage.codec import decode_item, decode_items, encode_batch
from .storage.records import MAIN
from .storage.segments import key_of
from .transfer.chunks import IMPORT_MODES, ImportMode, import_chunks
from .transfer.moves import move_sessions

if TYPE_CHECKING:
    from .history import History
    from .results import ImportSummary
    from .serving.shared_file import SharedFile
    from .storage.records import Retention


class Transfers:
    """The export, import and move methods `CitadelSessionStore` takes from this class."""

    _file: SharedFile

    def _check_open(self) -> None:
        raise NotImplementedError

    def _not_found(self, *session_ids: str, done: str = "") -> SessionNotFoundError:
        raise NotImplementedError

    def _history(self, session_id: str, retention: Retention | None) -> History:
        raise NotImplementedError

    def export(self, session_id: str, *, progress: Progress | None = None) -> list[Any]:
        """A session's items, oldest first, exactly as stored (for a data-access request).

        `progress(done, total)` is called after each of the session's segments (256 items).

        Raises:
            SessionNotFoundError: the session holds no live item.
        """
        self._check_open()
        items = decode_items(self._file.all_items(session_id, progress))
        if not items:
            raise self._not_found(session_id)
        return items

    def import_items(
        self,
        session_id: str,
        items: Iterable[Any],
        *,
        mode: ImportMode = "new",
        progress: Progress | None = None,
        branch: str = MAIN,
    ) -> ImportSummary:
        """Import items into a session, verbatim and in order; a rerun resumes, never duplicates.

        Written in atomic chunks of 256 items whose ids derive from this import (transfer/chunks.py).
        `mode`: "new" refuses a session that holds other items than this import's, "append" adds
        after them, "replace" erases them first (every branch). `progress(items done, items)` after
        each chunk. Another `branch` than "main" gets the items after what it holds ("replace"
        replaces nothing there: the session's own replacement erased it); its name is recorded
        as used, as a branch created here.

        Raises:
            SessionNotEmptyError: mode "new" and the session holds other items; nothing was written.
            InvalidItemError: an item is not JSON (its position is named); nothing was written.
        """
        self._check_open()
        if mode not in IMPORT_MODES:
            raise ValueError(f"mode must be one of {', '.join(IMPORT_MODES)}, not {mode!r}")
        if branch != MAIN:
            self._file.reserve(session_id, [branch])
        return import_chunks(
            self._file,
            session_id,
            encode_batch(list(items)),
            mode,
            self._history(session_id, None).expires_at,
            progress,
            branch,
        )

    def import_usage(
        self,
        session_id: str,
        usage: Iterable[tuple[str, int, dict[str, Any]]],
        *,
        branch_names: Iterable[str] = (),
    ) -> int:
        """Store each (branch, user turn, usage) as `store_run_usage` would have stored it then, and
        record `branch_names` as used; returns the turns whose usage was stored (a turn the
        branch does not hold is skipped). Running it again stores the same."""
        self._check_open()
        names = list(branch_names)
        if names:
            self._file.reserve(session_id, names)
        return sum(
            self._file.store_usage(key_of(session_id, branch), used, turn) for branch, turn, used in usage
        )

    def export_session(self, session_id: str) -> SessionExport:
        """A session whole (a data-access request): every branch's items with when each was written,
        every turn's usage stored, and every branch name the session used.

        Raises:
            SessionNotFoundError: no branch of the session holds a live item.
        """
        self._check_open()
        names = [name for name, *_ in self._file.branches(session_id)]
        if not names:
            raise self._not_found(session_id)
        branches = {}
        for name in sorted(names, key=lambda branch: branch != MAIN):
            rows = self._file.item_rows(key_of(session_id, name))
            branches[name] = [(decode_item(payload), created) for _, created, payload in rows]
        usage = self._file.usage(session_id, None)
        return SessionExport(session_id, branches, usage, self._file.reserved(session_id))

    def move_session(
        self, session_id: str, other: Transfers, *, progress: Progress | None = None
    ) -> MoveSummary:
        """Move a session to `other` (another file): copy, compare item by item, then erase it here;
        safe to interrupt and run again (transfer/moves.py): the session stays whole here, or in
        both files with the erase still to do, never in neither; the copy resumes, and the erase
        (with its receipt) happens only if this file still holds exactly the items compared. One
        found only in `other` was moved earlier (`erasure` None). `progress(copied, items)`.

        Raises:
            SessionNotFoundError: neither file holds the session.
            MoveConflictError: `other` holds other items under this id, or the session changed; nothing erased.
            ValueError: `other` is a store on this very file.
        """
        return self.move_sessions([session_id], other, progress=progress)[0]

    def move_sessions(
        self, session_ids: list[str], other: Transfers, *, progress: Progress | None = None
    ) -> list[MoveSummary]:
        """`move_session` for each id in turn, once every one is found and free of conflict."""
        self._check_open()
        other._check_open()
        ids = list(dict.fromkeys(session_ids))
        return move_sessions(self._file, other._file, ids, other._history("", None).expires_at, progress)
