"""A session's search as a tool its agent calls, to find older turns its prompt left out.

With ``SessionSettings(limit=N)`` the model sees only the newest N items; the rest stay
in the file, and `CitadelSession.search_tool` lets the model look them up. The tool
searches that one session (never another's items, never expired ones) and answers in
text: each hit's position in the session, who said it, and its text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agents import FunctionTool, function_tool

from .results import HistoryHit, OwnerHit

# A session's search: (query, limit) -> its hits with their positions, and its item count.
SearchPlaced = Callable[[str, int], Awaitable[tuple[list[HistoryHit], int]]]

DESCRIPTION = (
    "Search the earlier turns of this conversation, including those no longer in your context. "
    "Give a few words about what you are looking for; you get the matching items, best first, "
    "each with its position in the conversation (1 is the oldest) and who said it."
)
_SHOWN = 1_000  # characters of an item's text shown; the rest is cut
_ROLES = {"function_call": "tool call", "function_call_output": "tool output", "reasoning": "reasoning"}


def search_tool(search_placed: SearchPlaced, *, name: str, limit: int) -> FunctionTool:
    """A `FunctionTool` named `name` that answers with a session's `limit` best matches for a query."""
    if limit <= 0:
        raise ValueError(f"limit must be at least 1, not {limit}")

    async def search(query: str) -> str:
        hits, held = await search_placed(query, limit)
        return describe(query, hits, held)

    return function_tool(search, name_override=name, description_override=DESCRIPTION)


# One person's search: (query, limit) -> the hits over their sessions.
SearchOwner = Callable[[str, int], Awaitable[list[OwnerHit]]]

OWNER_DESCRIPTION = (
    "Search everything this person said in their conversations, this one and earlier ones, "
    "including what is no longer in your context. Give a few words about what you are looking "
    "for; you get the matching items, best first, each with its conversation, its position there "
    "(1 is the oldest) and who said it."
)


def owner_search_tool(search: SearchOwner, *, name: str, limit: int) -> FunctionTool:
    """A `FunctionTool` named `name` that answers with the `limit` best matches over one person's
    sessions; the person is bound here, never an argument of the tool."""
    if limit <= 0:
        raise ValueError(f"limit must be at least 1, not {limit}")

    async def search_conversations(query: str) -> str:
        return describe_owner_hits(query, await search(query, limit))

    return function_tool(search_conversations, name_override=name, description_override=OWNER_DESCRIPTION)


def describe_owner_hits(query: str, hits: list[OwnerHit]) -> str:
    """The person-wide tool's answer: one line per hit, best first, naming its conversation."""
    if not hits:
        return f"No item of this person's conversations matches {query!r}."
    lines = [
        f"{len(hits)} item{'s' if len(hits) > 1 else ''} of this person's conversations match {query!r}, best first:"
    ]
    for hit in hits:
        text = hit.text if len(hit.text) <= _SHOWN else hit.text[:_SHOWN] + " [cut]"
        lines.append(f"- conversation {hit.session_id!r}, #{hit.position}, {role(hit.item)}: {text}")
    return "\n".join(lines)


def describe(query: str, hits: list[HistoryHit], held: int) -> str:
    """The tool's answer: one line per hit, best first."""
    if not hits:
        return f"No item of this conversation matches {query!r}."
    lines = [
        f"{len(hits)} item{'s' if len(hits) > 1 else ''} of this conversation match {query!r}, best first "
        f"(positions count from 1, the oldest; the conversation holds {held}):"
    ]
    for hit in hits:
        text = hit.text if len(hit.text) <= _SHOWN else hit.text[:_SHOWN] + " [cut]"
        lines.append(f"- {_where(hit.positions)}, {role(hit.item)}: {text}")
    return "\n".join(lines)


def role(item: Any) -> str:
    """Who an item comes from: its role, else what it is (a tool call, its output, reasoning)."""
    if not isinstance(item, dict):
        return "item"
    kind = item.get("type")
    return str(item.get("role") or _ROLES.get(str(kind)) or kind or "item")


def _where(positions: list[int]) -> str:
    if not positions:
        return "position unknown (removed since)"
    shown = " and ".join(f"#{n}" for n in positions[:3])
    return shown + (f" and {len(positions) - 3} more (identical)" if len(positions) > 3 else "")
