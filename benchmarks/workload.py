"""The deterministic items every benchmark writes, identical for every backend.

A turn is what one `add_items` call of a Runner stores: a user message of ~200
characters and an assistant output message of ~400 in the Responses format; one
turn in four is a tool turn instead, a user message, a function_call and its
function_call_output. So turns carry 2 or 3 items, and the mix has every kind.
"""

from __future__ import annotations

import json
from typing import Any

_USER = "lorem ipsum dolor sit amet, " * 10
_REPLY = "consectetur adipiscing elit, sed do eiusmod tempor. " * 10


def make_turn(i: int) -> list[dict[str, Any]]:
    """Turn `i`: 2 items (user, assistant), or 3 for a tool turn (user, call, output)."""
    user = {"role": "user", "content": (f"question {i}: " + _USER)[:200]}
    if i % 4 == 1:
        call = {
            "type": "function_call",
            "id": f"fc_{i:08d}",
            "call_id": f"call_{i:08d}",
            "name": "lookup_order",
            "arguments": json.dumps({"order_id": i, "fields": ["status", "eta"]}),
            "status": "completed",
        }
        output = {
            "type": "function_call_output",
            "call_id": f"call_{i:08d}",
            "output": json.dumps({"order_id": i, "status": "shipped", "eta": "2 days"}),
        }
        return [user, call, output]
    reply = {
        "id": f"msg_{i:08d}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": (f"answer {i}: " + _REPLY)[:400], "annotations": []}],
    }
    return [user, reply]


def turns_from(start: int):
    """Turns start, start + 1, ... forever."""
    i = start
    while True:
        yield make_turn(i)
        i += 1


def items(n: int, first_turn: int = 0) -> list[dict[str, Any]]:
    """The first `n` items of the turns from `first_turn` on."""
    out: list[dict[str, Any]] = []
    for turn in turns_from(first_turn):
        if len(out) >= n:
            break
        out.extend(turn)
    return out[:n]
