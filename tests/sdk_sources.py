"""Session files written by the Agents SDK itself, for the import tests and the import benchmark."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agents import SQLiteSession
from agents.extensions.memory.advanced_sqlite_session import AdvancedSQLiteSession


def turn_items(session: int, turn: int) -> list[dict[str, Any]]:
    """One turn as the Responses API leaves it: a question, reasoning, a tool call and its output, a reply."""
    call = f"call_{session}_{turn}"
    return [
        {"role": "user", "content": f"Session {session}, question {turn}: où est mon colis? ✓"},
        {
            "id": f"rs_{session}_{turn}",
            "summary": [{"text": f"Look up parcel {turn}.", "type": "summary_text"}],
            "type": "reasoning",
        },
        {
            "arguments": f'{{"parcel": {turn}}}',
            "call_id": call,
            "name": "track_parcel",
            "type": "function_call",
            "id": f"fc_{session}_{turn}",
            "status": "completed",
        },
        {
            "call_id": call,
            "output": f"parcel {turn}: in transit (depot {session})",
            "type": "function_call_output",
        },
        {
            "id": f"msg_{session}_{turn}",
            "content": [
                {
                    "annotations": [],
                    "text": f"Parcel {turn} is in transit.",
                    "type": "output_text",
                    "logprobs": [],
                }
            ],
            "role": "assistant",
            "status": "completed",
            "type": "message",
        },
    ]


def session_items(session: int, count: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    turn = 0
    while len(items) < count:
        items += turn_items(session, turn)
        turn += 1
    return items[:count]


def session_id(number: int) -> str:
    return f"user-{number:03d}"


def write_sqlite_source(path: Path, sessions: int, items: int, *, advanced: bool = False) -> None:
    """`sessions` sessions of `items` items each, written with the SDK's own `add_items` (one turn a call)."""

    async def write() -> None:
        for number in range(sessions):
            if advanced:
                session: SQLiteSession = AdvancedSQLiteSession(
                    session_id=session_id(number), db_path=path, create_tables=True
                )
            else:
                session = SQLiteSession(session_id(number), path)
            written = session_items(number, items)
            for start in range(0, len(written), 5):
                await session.add_items(written[start : start + 5])
            session.close()

    asyncio.run(write())


def read_sqlite_source(path: Path, number: int, *, advanced: bool = False) -> list[Any]:
    """A session's items as the SDK reads them back."""

    async def read() -> list[Any]:
        if advanced:
            session: SQLiteSession = AdvancedSQLiteSession(session_id=session_id(number), db_path=path)
        else:
            session = SQLiteSession(session_id(number), path)
        try:
            return list(await session.get_items())
        finally:
            session.close()

    return asyncio.run(read())


def as_text(items: list[Any]) -> list[str]:
    """Items compared as text: equal lists of equal texts means equal items in equal key order."""
    return [json.dumps(item, ensure_ascii=False) for item in items]
