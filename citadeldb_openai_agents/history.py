"""One session's history on its store's file: what `CitadelSession`'s methods run.

Items become JSON text here and back (storage/codec.py), each write gets its expiry (the
store's TTL, counted per item unless the session's mode counts it per session) and carries
the session's own retention and cap, and every call goes to the file wherever it is open
(serving/shared_file.py), on the session's current branch. The branches, turns and usage
of `AdvancedSQLiteSession` are answered here in its shapes (turns.py computes the turns).
The methods are synchronous: the session runs them in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from . import turns
from .compaction import compaction_snapshot, replace_all
from .errors import BranchError
from .options import SessionOptions
from .results import Erasure, HistoryHit
from .serving import operations as ops
from .storage.codec import decode_item, decode_items, encode_batch, placed_hits
from .storage.records import MAIN
from .storage.segments import SessionKey, key_of

if TYPE_CHECKING:
    from .serving.shared_file import SharedFile

T = TypeVar("T")
USAGE_COUNTS = ("requests", "input_tokens", "output_tokens", "total_tokens")


class History:
    """The history of session `session_id` in `file`, written with the session's own `retention`
    (its TTL mode and idle time, None: the file's), on its current `branch`, about `owner` (the
    person; None: the session's own, if any)."""

    def __init__(
        self,
        file: SharedFile,
        session_id: str,
        retention: SessionOptions | None,
        owner: str | None = None,
        labels: dict[str, Any] | None = None,
    ) -> None:
        self._shared, self.session_id, self.retention = file, session_id, retention
        self.owner, self.labels = owner, labels
        self._claimed = owner is None and labels is None
        self.branch = MAIN

    @property
    def _file(self) -> SharedFile:
        """The file, once the owner is claimed: the first call that touches the session records
        the owner (and labels), or raises `OwnerMismatchError` before anything is read or written."""
        if not self._claimed:
            self._shared.call(ops.CLAIM_OWNER, self.session_id, self.owner, self.labels)
            self._claimed = True
        return self._shared

    def key(self, branch: str | None = None) -> SessionKey:
        """The file's key of a branch of this session (None: the current one)."""
        return key_of(self.session_id, self.branch if branch is None else branch)

    def expires_at(self) -> int | None:
        """When an item written now expires (µs since the epoch), or None (`StoreOptions.item_expiry`)."""
        return self._file.options.for_session(self.retention).item_expiry(time.time())

    def get_items(self, limit: int | None, branch: str | None = None) -> list[Any]:
        """Every item (`limit` None or negative) or the newest `limit`, oldest first."""
        if limit is None or limit < 0:
            return decode_items(self._file.call(ops.ALL_ITEMS, self.key(branch)))
        return decode_items(self._file.call(ops.NEWEST, self.key(branch), limit))

    def add_items(self, items: list[Any], max_items: int | None) -> None:
        batch = encode_batch(items, self.expires_at(), max_items, self.retention, self.owner, self.labels)
        self._file.call(ops.APPEND, self.key(), batch)

    def pop_item(self) -> Any | None:
        return None if (payload := self._file.pop(self.key())) is None else decode_item(payload)

    def clear(self) -> None:
        """Every branch erased; the current one is MAIN again."""
        self._file.clear(self.session_id)
        self.branch = MAIN

    def search(self, query: str, limit: int) -> list[Any]:
        payloads = [payload for payload, _ in self._file.call(ops.SEARCH_PLACED, self.key(), query, limit)[0]]
        return decode_items(payloads)

    def search_with_positions(self, query: str, limit: int) -> tuple[list[HistoryHit], int]:
        """`search`'s hits with their positions (identical hits once, with each position), and
        the session's item count: from the search data, without reading the session."""
        found, held = self._file.call(ops.SEARCH_PLACED, self.key(), query, limit)
        return placed_hits(found), held

    async def compaction_snapshot(self, limit: Any, prune: Any, unexpected: bool) -> Any:
        return await compaction_snapshot(self._file, self.expires_at, self.key(), limit, prune, unexpected)

    def replace_all(self, items: list[Any]) -> bool:
        return replace_all(self._file, self.expires_at, self.key(), items)

    # -- branches ---------------------------------------------------------------------

    def create_branch(self, turn: int, name: str | None) -> str:
        """A branch of the current one's items before user turn `turn`, made current; its name."""
        if name is not None and not name.strip():
            raise BranchError("Branch name cannot be empty")
        if name is not None and not _storable(name):
            raise BranchError(f"Branch name {name!r} holds a lone surrogate, which no file can store")
        self.branch = self._file.call(ops.BRANCH, self.session_id, self.branch, turn, name)
        return self.branch

    def switch(self, branch: str) -> None:
        if not self._file.call(ops.NEWEST, self.key(branch), 1):
            raise BranchError(f"Branch '{branch}' does not exist")
        self.branch = branch

    def delete_branch(self, branch: str, force: bool) -> Erasure:
        """Erase a branch, keys destroyed; the current one only with `force` (then MAIN is current)."""
        if not branch or not branch.strip():
            raise BranchError("Branch ID cannot be empty")
        if branch == MAIN:
            raise BranchError("Cannot delete the 'main' branch")
        if branch == self.branch:
            if not force:
                raise BranchError(
                    f"Cannot delete current branch '{branch}'. Use force=True or switch branches first"
                )
            if branch not in {entry["branch_id"] for entry in self.list_branches()}:
                raise BranchError(f"Branch '{branch}' does not exist")
            self.switch(MAIN)
        return self._file.call(ops.DELETE_BRANCH, self.session_id, branch)

    def list_branches(self) -> list[dict[str, Any]]:
        return [
            {
                "branch_id": name,
                "message_count": count,
                "user_turns": users,
                "is_current": name == self.branch,
                "created_at": turns.Placed(None, "", None, 0, created).timestamp,
            }
            for name, count, users, created in self._file.call(ops.BRANCHES, self.session_id)
        ]

    # -- turns ------------------------------------------------------------------------

    def placed(self, branch: str | None, *, timed: bool = True) -> list[turns.Placed]:
        """The branch's items placed in their turns; without `timed`, from the kept payloads
        (no decryption when they are kept) and with no creation times (0)."""
        if not timed:
            return turns.placed(
                [(decode_item(payload), 0) for payload in self._file.call(ops.ALL_ITEMS, self.key(branch))]
            )
        rows = self._file.call(ops.ITEM_ROWS, self.key(branch))
        return turns.placed([(decode_item(payload), created) for _, created, payload in rows])

    def conversation_turns(self, branch: str | None) -> list[dict[str, Any]]:
        return [turns.turn_entry(p, 100) for p in self.placed(branch) if p.type == "user"]

    def find_turns(self, term: str, branch: str | None) -> list[dict[str, Any]]:
        places = self.placed(branch)
        return [turns.turn_entry(p, None) for p in places if p.type == "user" and turns.matches(p, term)]

    def by_turns(self, branch: str | None) -> dict[int, list[dict[str, str | None]]]:
        found: dict[int, list[dict[str, str | None]]] = {}
        for place in self.placed(branch, timed=False):
            found.setdefault(place.turn, []).append({"type": place.type, "tool_name": place.tool})
        return found

    def tool_usage(self, branch: str | None) -> list[tuple[str | None, int, int]]:
        return turns.tool_usage(self.placed(branch, timed=False))

    # -- usage ------------------------------------------------------------------------

    def store_usage(self, usage: Any) -> bool:
        """The run's `Usage` kept as the current turn's (False: the branch has no turn yet)."""
        counts = {name: int(getattr(usage, name, 0) or 0) for name in USAGE_COUNTS}
        details = {name: _details(getattr(usage, name, None)) for name in TOKEN_DETAILS}
        return self._file.call(ops.STORE_USAGE, self.key(), {**counts, **details}, None)

    def session_usage(self, branch: str | None) -> dict[str, int] | None:
        """Every turn's usage added up, of one branch or (None, or "") of all."""
        found = self._file.call(ops.USAGE, self.session_id, branch or None)
        if not found:
            return None
        total = {name: sum(used[name] for _, _, used in found) for name in USAGE_COUNTS}
        return {**total, "total_turns": len(found)}

    def turn_usage(self, turn: int | None, branch: str | None) -> list[dict[str, Any]] | dict[str, Any]:
        """One turn's usage ({} when it has none), or (None) every turn's, of a branch (None: the current)."""
        found = [
            (number, used)
            for _, number, used in self._file.call(ops.USAGE, self.session_id, branch or self.branch)
        ]
        if turn is not None:
            return next((dict(used) for number, used in found if number == turn), {})
        return [{"user_turn_number": number, **used} for number, used in found]


TOKEN_DETAILS = ("input_tokens_details", "output_tokens_details")


def _storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _details(details: Any) -> dict[str, Any] | None:
    """Token details as the SDK stores them (their attributes), or None when absent or not JSON."""
    if not details:
        return None
    try:
        found = dict(vars(details))
        json.dumps(found)
    except (TypeError, ValueError):
        return None
    return found


async def complete_despite_cancellation(awaitable: Awaitable[T]) -> T:
    """Finish a mutation even if the awaiting task is cancelled, then re-raise the cancel.

    A write that was already handed to Citadel must not be reported lost while it
    completes behind the caller's back; the SDK's own sessions behave the same way.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    result = task.result() if cancelled is None else None
    if cancelled is not None:
        task.exception()  # retrieve it, so an error is not reported as "never retrieved"
        raise cancelled
    return result  # type: ignore[return-value]
