"""A conversation's structure as `AdvancedSQLiteSession` reads it: each item's type, tool and turn.

The SDK computes these when it stores an item (its ``message_structure`` table); here they are
computed from the items themselves when asked, so nothing about an item is stored twice. A
turn starts at each user message: an item's turn is the number of user messages up to and
including it (0 before the first). The rules below are the SDK's (openai-agents 0.24,
``_classify_message_type``, ``_extract_tool_name``, ``get_tool_usage``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

# Tools whose calls carry no name: the type names them (the SDK's list).
_NAMELESS_TOOLS = {
    "computer_call",
    "file_search_call",
    "web_search_call",
    "code_interpreter_call",
    "shell_call",
    "apply_patch_call",
    "tool_search_call",
    "tool_search_output",
}
# The item types `get_tool_usage` counts as a tool's use.
TOOL_CALLS = {
    "tool_call",
    "function_call",
    "computer_call",
    "file_search_call",
    "web_search_call",
    "code_interpreter_call",
    "tool_search_call",
    "custom_tool_call",
    "mcp_call",
    "mcp_approval_request",
    "shell_call",
    "apply_patch_call",
}


def message_type(item: Any) -> str:
    """ "user", "assistant", the item's type (``function_call``, ...), or "other"."""
    if isinstance(item, dict):
        if item.get("role") == "user":
            return "user"
        if item.get("role") == "assistant":
            return "assistant"
        if item.get("type"):
            return str(item.get("type"))
    return "other"


def tool_name(item: Any) -> str | None:
    """The tool a call or its output names (``server.tool`` for MCP, ``namespace.name``), or None."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind in ("mcp_call", "mcp_approval_request") and "server_label" in item:
        label, name = item.get("server_label"), item.get("name")
        if name and label:
            return f"{label}.{name}"
        return str(label) if label else str(name) if name else None
    if kind in _NAMELESS_TOOLS:
        return "tool_search" if kind in ("tool_search_call", "tool_search_output") else str(kind)
    if "name" not in item or item.get("name") is None:
        return None
    name, namespace = str(item["name"]), item.get("namespace")
    space = str(namespace) if namespace is not None else ""
    # A namespace equal to the name is the SDK's synthetic one: the name alone.
    return f"{space}.{name}" if space and space != name and name else name


@dataclass(frozen=True)
class Placed:
    """One item of a branch with what the SDK's structure table says of it."""

    item: Any
    type: str
    tool: str | None
    turn: int
    created_at: int  # µs since the epoch

    @property
    def timestamp(self) -> str:
        """When it was written, as the SDK's SQLite ``CURRENT_TIMESTAMP`` spells it (UTC)."""
        moment = datetime.fromtimestamp(self.created_at / 1_000_000, tz=timezone.utc)
        return moment.strftime("%Y-%m-%d %H:%M:%S")


def placed(rows: list[tuple[Any, int]]) -> list[Placed]:
    """Each item (with its creation time), oldest first, placed in its turn."""
    found, turn = [], 0
    for item, created_at in rows:
        kind = message_type(item)
        turn += kind == "user"
        found.append(Placed(item, kind, tool_name(item), turn, created_at))
    return found


def preview(content: Any, limit: int | None = None) -> str:
    """A user message's content as text, cut at `limit` characters (then "...")."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return text[:limit] + "..." if limit is not None and len(text) > limit else text


def turn_entry(place: Placed, limit: int | None) -> dict[str, Any]:
    """A user turn as `get_conversation_turns` and `find_turns_by_content` give it."""
    content = place.item.get("content", "")
    return {
        "turn": place.turn,
        "content": preview(content, limit),
        "full_content": content,
        "timestamp": place.timestamp,
        "can_branch": True,
    }


def matches(place: Placed, term: str) -> bool:
    """Whether a user message's text holds `term` (ASCII letters in either case, as SQLite's LIKE)."""
    content = place.item.get("content", "")
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list) and all(isinstance(part, dict) for part in content):
        texts = [str(part.get("text", "")) for part in content]
    else:
        return False
    pattern = re.compile(re.escape(term), re.IGNORECASE | re.ASCII)
    return any(pattern.search(text) for text in texts)


def tool_usage(places: list[Placed]) -> list[tuple[str | None, int, int]]:
    """(tool, uses, turn) for each tool used in each turn, by turn (`get_tool_usage`).

    A tool search's output counts as a use only in a turn where no call of it was made.
    """
    counts: dict[tuple[int, str | None], int] = {}
    called = {(p.turn, p.tool) for p in places if p.type == "tool_search_call"}
    for place in places:
        counted = place.type in TOOL_CALLS or (
            place.type == "tool_search_output" and (place.turn, place.tool) not in called
        )
        if counted:
            key = (place.turn, place.tool)
            counts[key] = counts.get(key, 0) + 1
    return [(tool, uses, turn) for (turn, tool), uses in sorted(counts.items(), key=_by_turn)]


def _by_turn(entry: tuple[tuple[int, str | None], int]) -> tuple[int, str]:
    (turn, tool), _ = entry
    return (turn, tool or "")
