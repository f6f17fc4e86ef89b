"""Moving sessions from one file to another: copy, compare, then erase at the source.

The order is what makes it safe to interrupt anywhere:

1. copy: the source's items are written to the target in `import_items`' chunks (chunks.py),
   whose batch ids derive from the items, so a rerun resumes after the chunks an
   interrupted run wrote, and a chunk sent twice is written once;
2. compare: both files are read back, and the target must hold exactly the source's items,
   as the JSON text they are stored as (order and key order included);
3. erase: the source erases the session, with its receipt, only if it still holds the
   items compared (checked under the session's lock by the file's owner, writes.py).

Until 3 begins the source holds the whole session; an erasure a crash interrupts is
finished when the file next opens. So a session is whole in the source, or in both, or in
the target: never in neither. A rerun finishes the move: a target holding a prefix of the
source (an interrupted copy) gets the rest, one holding all of it is compared and the source
erased, and a session gone from the source but whole in the target is a finished move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import MoveConflictError, SessionNotFoundError
from ..results import MoveSummary, Progress
from ..serving.shared_file import SharedFile
from ..shards import moving_sessions
from ..storage.codec import batch_of_payloads, digest
from .chunks import write_chunks


@dataclass(frozen=True)
class _Held:
    """One session's items (as stored) in the source and in the target."""

    session_id: str
    source: list[str]
    target: list[str]


def move_sessions(
    source: SharedFile,
    target: SharedFile,
    session_ids: list[str],
    expires_at: Callable[[], int | None],
    progress: Progress | None,
) -> list[MoveSummary]:
    """Move each session in turn, once every one is known to be movable (found, no conflict).

    During a ring change the sessions it moves are refused to everyone else (`ShardMovingError`);
    the move itself may read them at the shard they leave and write them at the one they go to.
    """
    with moving_sessions():
        return _move_all(source, target, session_ids, expires_at, progress)


def _move_all(
    source: SharedFile,
    target: SharedFile,
    session_ids: list[str],
    expires_at: Callable[[], int | None],
    progress: Progress | None,
) -> list[MoveSummary]:
    if source.path == target.path:
        raise ValueError(
            f"cannot move sessions from {source.path} to itself: the target must be another file "
            "(a configuration whose path, or CITADEL_PATH, names the same file is refused)."
        )
    held = [_read(source, target, session_id) for session_id in session_ids]
    unknown = [found.session_id for found in held if not found.source and not found.target]
    if unknown:
        raise SessionNotFoundError(
            f"no session {', '.join(map(repr, unknown))} with live items in {source.path} or "
            f"{target.path}; nothing was moved. `python -m citadeldb_openai_agents sessions` lists them."
        )
    conflicts = [found for found in held if found.source and not _is_prefix(found.target, found.source)]
    if conflicts:
        raise _conflict(source, target, conflicts)
    return [_move(source, target, found.session_id, expires_at, progress) for found in held]


def _move(
    source: SharedFile,
    target: SharedFile,
    session_id: str,
    expires_at: Callable[[], int | None],
    progress: Progress | None,
) -> MoveSummary:
    found = _read(source, target, session_id)  # again: it may have changed since it was checked
    if not found.source:
        # Erased by an earlier run (or never here): what the target holds is the session.
        return MoveSummary(
            session_id, source.path, target.path, len(found.target), 0, len(found.target), None
        )
    if not _is_prefix(found.target, found.source):
        raise _conflict(source, target, [found])
    start = len(found.target)
    write_chunks(target, session_id, batch_of_payloads(found.source), start, expires_at, progress)
    copied = target.all_items(session_id)
    if copied != found.source:
        raise MoveConflictError(
            f"after the copy, session {session_id!r} in {target.path} holds {_items(len(copied))} that "
            f"differ from the {len(found.source)} of {source.path} (something else wrote to it); "
            f"nothing was erased from {source.path}. {_FIX}"
        )
    try:
        erasure = source.erase(session_id, digest(found.source))
    except MoveConflictError as exc:
        raise MoveConflictError(
            f"{exc} {source.path} still holds it; {target.path} holds the copy of it as it was. "
            "Stop the writes to the session, then run the move again: it copies what was added, "
            "or, if items were popped or erased at the source, refuses until the target's copy is erased."
        ) from None
    return MoveSummary(session_id, source.path, target.path, len(copied), len(copied) - start, start, erasure)


def _read(source: SharedFile, target: SharedFile, session_id: str) -> _Held:
    return _Held(session_id, source.all_items(session_id), target.all_items(session_id))


def _is_prefix(held: list[str], items: list[str]) -> bool:
    """Whether the target holds the first items of the source's (none, some, or all): a copy under way."""
    return len(held) <= len(items) and held == items[: len(held)]


_FIX = (
    "If the target's items are an older copy of this session (from a move started before the "
    "session changed at the source), erase them there (`python -m citadeldb_openai_agents erase "
    "SESSION_ID --config OTHER.toml`, or `other_store.erase_session(session_id)`) and run the move "
    "again; if they are another conversation under the same id, move this session to another file."
)


def _conflict(source: SharedFile, target: SharedFile, conflicts: list[_Held]) -> MoveConflictError:
    listed = ", ".join(
        f"{found.session_id!r} ({_items(len(found.target))} there, {_items(len(found.source))} in the source)"
        for found in conflicts
    )
    return MoveConflictError(
        f"{target.path} already holds other items under {listed}: they are not a copy of the session "
        f"in {source.path}, so moving it would mix two conversations; nothing was moved or erased. {_FIX}"
    )


def _items(count: int) -> str:
    return f"{count} item{'' if count == 1 else 's'}"
