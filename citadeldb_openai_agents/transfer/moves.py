"""Moving sessions from one file to another: copy, compare, then erase at the source.

The order is what makes it safe to interrupt anywhere:

1. copy: the source's items are written to the target in `import_items`' chunks (chunks.py),
   whose batch ids derive from the items, so a rerun resumes after the chunks an
   interrupted run wrote, and a chunk sent twice is written once;
2. compare: both files are read back, and the target must hold exactly the source's items,
   branch by branch, as the JSON text they are stored as (order and key order included),
   and each turn's usage; then the session's owner is recorded in the target (another owner
   recorded there refuses the move: `OwnerMismatchError`, nothing erased);
3. erase: the source erases the session, every branch and MAIN last, with its receipt,
   only if it still holds the items and usage compared (their `session_digest`, checked with
   every branch's lock held by the file's owner, storage/branches.py `erase_all`).

Until 3 begins the source holds the whole session; an erasure a crash interrupts is
finished when the file next opens. So a session is whole in the source, or in both, or in
the target: never in neither. A rerun finishes the move: a target holding a prefix of the
source (an interrupted copy) gets the rest, one holding all of it is compared and the source
erased, and a session gone from the source but whole in the target is a finished move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import MoveConflictError, SessionNotFoundError
from ..results import MoveSummary, Progress
from ..serving import operations as ops
from ..serving.shared_file import SharedFile
from ..shards import moving_sessions
from ..storage.codec import batch_of_payloads, session_digest
from ..storage.records import MAIN
from ..storage.segments import key_of
from .chunks import write_chunks


@dataclass(frozen=True)
class _Held:
    """One session's items (as stored), branch by branch (MAIN first), in the source and the target."""

    session_id: str
    source: dict[str, list[str]]
    target: dict[str, list[str]]

    def in_source(self) -> bool:
        return _count(self.source) > 0

    def in_target(self) -> bool:
        return _count(self.target) > 0

    def copied_before(self) -> int:
        """The items of the source's branches the target holds already (a copy under way)."""
        return sum(len(self.target.get(name, [])) for name in self.source)

    def conflicts(self) -> bool:
        """Whether the target holds other items than (the start of) a copy of the source's.

        A branch of the target the source lacks is a conflict, unless the target's MAIN is
        already the source's whole: an erase at the source (branches first, MAIN last) that a
        crash interrupted left it so.
        """
        if not self.in_source():
            return False
        prefixes = all(_is_prefix(self.target.get(name, []), items) for name, items in self.source.items())
        extra = [name for name, items in self.target.items() if items and name not in self.source]
        return not prefixes or bool(extra and self.target.get(MAIN) != self.source[MAIN])


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
    unknown = [found.session_id for found in held if not found.in_source() and not found.in_target()]
    if unknown:
        raise SessionNotFoundError(
            f"no session {', '.join(map(repr, unknown))} with live items in {source.path} or "
            f"{target.path}; nothing was moved. `python -m citadeldb_openai_agents sessions` lists them."
        )
    conflicts = [found for found in held if found.conflicts()]
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
    if not found.in_source():
        # Erased by an earlier run (or never here): what the target holds is the session.
        held = _count(found.target)
        return MoveSummary(session_id, source.path, target.path, held, 0, held, None)
    if found.conflicts():
        raise _conflict(source, target, [found])
    start, total = found.copied_before(), _count(found.source)
    # Every name the session used, deleted branches' too: as created there, none can be used again.
    others = list(
        dict.fromkeys(
            [*source.call(ops.RESERVED, session_id), *(name for name in found.source if name != MAIN)]
        )
    )
    if others:
        target.call(ops.RESERVE, session_id, others)
    done = 0
    for name, items in found.source.items():
        told = None if progress is None else _offset(progress, done, total)
        key = key_of(session_id, name)
        write_chunks(target, key, batch_of_payloads(items), len(found.target.get(name, [])), expires_at, told)
        done += len(items)
    usage = source.call(ops.USAGE, session_id, None)
    for branch, turn, used in usage:  # stored again, a turn's usage replaces itself
        target.call(ops.STORE_USAGE, key_of(session_id, branch), used, turn)
    copied = {name: target.call(ops.ALL_ITEMS, key_of(session_id, name)) for name in found.source}
    if copied != found.source or not _holds(target.call(ops.USAGE, session_id, None), usage):
        raise MoveConflictError(
            f"after the copy, session {session_id!r} in {target.path} holds "
            f"{_items(_count(copied))} (or usage) that differ from the {total} of {source.path} "
            f"(something else wrote to it); nothing was erased from {source.path}. {_FIX}"
        )
    _carry_owner(source, target, session_id)
    try:
        erasure = source.call(ops.ERASE, session_id, session_digest(found.source, usage))
    except MoveConflictError as exc:
        raise MoveConflictError(
            f"{exc} {source.path} still holds it; {target.path} holds the copy of it as it was. "
            "Stop the writes to the session, then run the move again: it copies what was added, "
            "or, if items were popped or erased at the source, refuses until the target's copy is erased."
        ) from None
    return MoveSummary(session_id, source.path, target.path, total, total - start, start, erasure)


def _carry_owner(source: SharedFile, target: SharedFile, session_id: str) -> None:
    """The session's owner and labels recorded in the target before the source erases it: the
    person's erasure must find it there (`OwnerMismatchError` if the target records another)."""
    owner, labels = source.call(ops.ABOUT, session_id)
    if owner is not None or labels is not None:
        target.call(ops.CLAIM_OWNER, session_id, owner, labels)


def _read(source: SharedFile, target: SharedFile, session_id: str) -> _Held:
    return _Held(session_id, _branches(source, session_id), _branches(target, session_id))


def _branches(file: SharedFile, session_id: str) -> dict[str, list[str]]:
    """MAIN's items and those of each other branch holding any."""
    names = [name for name, *_ in file.call(ops.BRANCHES, session_id) if name != MAIN]
    return {name: file.call(ops.ALL_ITEMS, key_of(session_id, name)) for name in [MAIN, *sorted(names)]}


def _count(side: dict[str, list[str]]) -> int:
    """The items of a side's branches."""
    return sum(len(items) for items in side.values())


def _holds(
    found: list[tuple[str, int, dict[str, Any]]], expected: list[tuple[str, int, dict[str, Any]]]
) -> bool:
    """Whether the target's usage includes every turn's usage of the source."""
    held = {(branch, turn): counts for branch, turn, counts in found}
    return all(held.get((branch, turn)) == counts for branch, turn, counts in expected)


def _offset(progress: Progress, done: int, total: int) -> Progress:
    """`progress` told of one branch's copy as a part of the whole session's."""
    return lambda copied, _: progress(done + copied, total)


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
        f"{found.session_id!r} ({_items(_count(found.target))} there, "
        f"{_items(_count(found.source))} in the source)"
        for found in conflicts
    )
    return MoveConflictError(
        f"{target.path} already holds other items under {listed}: they are not a copy of the session "
        f"in {source.path}, so moving it would mix two conversations; nothing was moved or erased. {_FIX}"
    )


def _items(count: int) -> str:
    return f"{count} item{'' if count == 1 else 's'}"
