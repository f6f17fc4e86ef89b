"""`AdvancedSQLiteSession`'s branches, turns and usage, on `CitadelSession`.

The same methods, arguments, results and error messages as openai-agents 0.24's
``agents.extensions.memory.AdvancedSQLiteSession`` (tests/test_branches.py runs one script
against both and compares every answer), on encrypted storage: a branch's items are
encrypted atoms of its own, deleting it destroys their keys (and returns a receipt, where the
SDK returns None), and a run's usage is stored encrypted beside the turn it belongs to.
Errors are `BranchError`, a `ValueError` as the SDK's. Through another process's owner they
behave the same. How they are stored: storage/branches.py and storage/usage.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .errors import BranchError
from .history import History, complete_despite_cancellation

if TYPE_CHECKING:
    from .results import Erasure

logger = logging.getLogger("citadeldb_openai_agents")


class Branching:
    """The branch, turn and usage methods `CitadelSession` takes from this class."""

    _history: History

    def _check_open(self) -> None:
        raise NotImplementedError

    @property
    def current_branch(self) -> str:
        """The branch `add_items`, `pop_item` and reads without ``branch_id`` use ("main" at first)."""
        return self._history.branch

    async def create_branch_from_turn(self, turn_number: int, branch_name: str | None = None) -> str:
        """Copy the current branch's items before user turn `turn_number` into a new branch, and
        switch to it; return its name (`branch_name`, never one used before in this session, or
        ``branch_from_turn_<n>_<time>``).

        Raises:
            BranchError: no user message starts that turn, or the name is blank or was used.
        """
        self._check_open()
        return await complete_despite_cancellation(
            asyncio.to_thread(self._history.create_branch, turn_number, branch_name)
        )

    async def create_branch_from_content(self, search_term: str, branch_name: str | None = None) -> str:
        """`create_branch_from_turn` from the first user turn of the current branch holding `search_term`."""
        matching = await self.find_turns_by_content(search_term)
        if not matching:
            raise BranchError(f"No user turns found containing '{search_term}'")
        return await self.create_branch_from_turn(matching[0]["turn"], branch_name)

    async def switch_to_branch(self, branch_id: str) -> None:
        """Make `branch_id` the current branch (`BranchError` if it holds no item)."""
        self._check_open()
        await asyncio.to_thread(self._history.switch, branch_id)

    async def delete_branch(self, branch_id: str, force: bool = False) -> Erasure:
        """Erase a branch, keys destroyed, and return the receipt; its name stays used.

        Raises:
            BranchError: it does not exist, is "main", or is the current one without
                ``force=True`` (with it, "main" becomes current first).
        """
        self._check_open()
        return await complete_despite_cancellation(
            asyncio.to_thread(self._history.delete_branch, branch_id, force)
        )

    async def list_branches(self) -> list[dict[str, Any]]:
        """Each branch holding items: ``branch_id``, ``message_count``, ``user_turns``,
        ``is_current``, ``created_at`` (UTC, as SQLite writes it), the oldest first."""
        self._check_open()
        return await asyncio.to_thread(self._history.list_branches)

    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        """Each user turn of a branch (None: the current one): ``turn``, ``content`` (cut at 100
        characters), ``full_content``, ``timestamp``, ``can_branch``."""
        self._check_open()
        return await asyncio.to_thread(self._history.conversation_turns, branch_id)

    async def find_turns_by_content(
        self, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The user turns holding `search_term` (ASCII letters in either case), as `get_conversation_turns`."""
        self._check_open()
        return await asyncio.to_thread(self._history.find_turns, search_term, branch_id)

    async def get_conversation_by_turns(
        self, branch_id: str | None = None
    ) -> dict[int, list[dict[str, str | None]]]:
        """Each turn's items in order, as ``{"type": ..., "tool_name": ...}`` (turn 0: before any user message)."""
        self._check_open()
        return await asyncio.to_thread(self._history.by_turns, branch_id)

    async def get_tool_usage(self, branch_id: str | None = None) -> list[tuple[str | None, int, int]]:
        """(tool name, calls, turn) for each tool called in each turn of a branch, by turn."""
        self._check_open()
        return await asyncio.to_thread(self._history.tool_usage, branch_id)

    async def store_run_usage(self, result: Any) -> None:
        """Keep a run's usage (``result.context_wrapper.usage``) as the current turn's, encrypted.

        As the SDK's, it never raises: a failure is logged, and the run's result stands.
        """
        try:
            self._check_open()
            usage = result.context_wrapper.usage
            if usage is not None:
                await complete_despite_cancellation(asyncio.to_thread(self._history.store_usage, usage))
        except Exception as exc:
            logger.error("failed to store the session's usage: %s: %s", type(exc).__name__, exc)

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """Every stored turn's usage added up (``requests``, the token counts, ``total_turns``), of
        one branch or (None) of all; None when none is stored."""
        self._check_open()
        return await asyncio.to_thread(self._history.session_usage, branch_id)

    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """One turn's usage with its token details ({} when none), or (None) every turn's, of a
        branch (None: the current one)."""
        self._check_open()
        return await asyncio.to_thread(self._history.turn_usage, user_turn_number, branch_id)
