"""How a session item becomes a Citadel atom, and back.

Items are stored verbatim: the payload is the item's JSON text, not a JSON
object, because Citadel returns object keys sorted and the SDK (and our users)
expect an item back exactly as it went in, key order included. Only a
plain-text projection of the item's content is derived, for search.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InvalidItemError
from ..options import SessionOptions
from ..results import HistoryHit
from .records import MAIN

ITEM_KIND = "item"
# A write marker: the id of a batch another process sent, stored with the batch (writes.py).
BATCH_KIND = "batch"
# Search data: a block of the embeddings and word hashes of items (search_blocks.py).
SEARCH_KIND = "search"
# A run's usage, in the segment of the user message that began its turn (usage.py).
USAGE_KIND = "usage"


def encode_item(item: Any, position: int) -> str:
    """Return the item's JSON text, or raise `InvalidItemError` naming its position."""
    try:
        text = json.dumps(item, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        detail = str(exc)
        if isinstance(exc, ValueError) and "float" in detail:
            detail = "it contains NaN or infinity, which JSON cannot represent"
        if isinstance(exc, RecursionError):
            # Python's json cannot read back what nests deeper than its recursion limit.
            detail = "it is nested too deeply"
        raise InvalidItemError(
            f"item {position} of the batch is not JSON-serialisable ({detail}); "
            "session items must be JSON values (dicts, lists, str, int, finite float, "
            "bool, None). Convert it first, e.g. with item.model_dump(mode='json'). "
            "Nothing of this batch was written."
        ) from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate cannot be stored as UTF-8; the \\u escape round-trips it.
        text = json.dumps(item, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text


@dataclass(frozen=True)
class Batch:
    """Items as the file stores them, written in one commit.

    Each item's JSON text (`payloads`), the text search indexes (`texts`), and whether
    the user said it (`from_user`), in order; `expires_at` (µs since the epoch) for all
    of them, or None; `max_items`: the most items the session keeps once they are written
    (the oldest beyond it are erased in the same call), or None; `retention`: the session's
    own TTL mode and idle time, kept in its record from this write on (retention.py), or None;
    `owner`: the person the session is about, recorded by the write if the session has none
    (data_owners.py), or None; `labels`: the session's labels, recorded by the write, or None.
    """

    payloads: list[str]
    texts: list[str]
    from_user: list[bool]
    expires_at: int | None = None
    max_items: int | None = None
    retention: SessionOptions | None = None
    owner: str | None = None
    labels: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not len(self.payloads) == len(self.texts) == len(self.from_user):
            raise ValueError("a batch's payloads, texts and from_user differ in length")
        if self.max_items is not None and self.max_items < 1:
            raise ValueError("a batch's max_items is below 1")

    def __len__(self) -> int:
        return len(self.payloads)

    def part(self, items: slice, expires_at: int | None) -> Batch:
        """The items in the slice `items`, expiring at `expires_at` (a copy's part: no cap), with
        the batch's owner and labels (an import's every chunk records them)."""
        parts = self.payloads[items], self.texts[items], self.from_user[items]
        return Batch(*parts, expires_at, owner=self.owner, labels=self.labels)


def encode_batch(
    items: list[Any],
    expires_at: int | None = None,
    max_items: int | None = None,
    retention: SessionOptions | None = None,
    owner: str | None = None,
    labels: dict[str, Any] | None = None,
) -> Batch:
    """Items as the file stores them (`InvalidItemError` naming the first that is not JSON)."""
    payloads = [encode_item(item, position) for position, item in enumerate(items)]
    batch = _batch(payloads, items, expires_at)
    return replace(batch, max_items=max_items, retention=retention, owner=owner, labels=labels)


def batch_of_payloads(payloads: list[str], expires_at: int | None = None) -> Batch:
    """Items already stored as JSON text (a move's or a copy's), as a batch."""
    return _batch(payloads, decode_items(payloads), expires_at)


def _batch(payloads: list[str], items: list[Any], expires_at: int | None) -> Batch:
    texts = [search_text(item) for item in items]
    return Batch(payloads, texts, [is_user_message(item) for item in items], expires_at)


def digest(payloads: list[str]) -> str:
    """A digest of items as stored, in order (lengths framed, so no two lists collide)."""
    hashed = hashlib.sha256()
    for payload in payloads:
        data = payload.encode("utf-8", "surrogatepass")
        hashed.update(len(data).to_bytes(8, "big"))
        hashed.update(data)
    return hashed.hexdigest()


def session_digest(branches: dict[str, list[str]], usage: list[tuple[str, int, dict[str, Any]]]) -> str:
    """A digest of a session whole: each branch's items and each turn's usage (a move's
    `expected`, compared by the file that erases the session). `digest` of MAIN's items alone
    when no other branch holds any and no usage is stored."""
    held = {name: items for name, items in branches.items() if items or name == MAIN}
    if set(held) <= {MAIN} and not usage:
        return digest(held.get(MAIN, []))
    used = sorted(json.dumps([branch, turn, counts], sort_keys=True) for branch, turn, counts in usage)
    return digest([part for name in sorted(held) for part in (name, digest(held[name]))] + used)


def decode_item(payload: str) -> Any:
    """Return the item stored as `payload` (the text `encode_item` produced)."""
    return json.loads(payload)


def decode_items(payloads: list[str]) -> list[Any]:
    """`decode_item` for many payloads in one parser call (about twice as fast at 10,000)."""
    if not payloads:
        return []
    try:
        items: list[Any] = json.loads("[" + ",".join(payloads) + "]")
        return items
    except RecursionError:  # the array is one level deeper than the deepest item
        return [decode_item(payload) for payload in payloads]


def answers_a_call(item: Any) -> bool:
    """Whether the item is a tool's output (``function_call_output``, ``computer_call_output``,
    ...): sent to the model without the call it answers, the Responses API refuses the input."""
    kind = item.get("type") if isinstance(item, dict) else None
    return isinstance(kind, str) and kind.endswith("_output")


def is_user_message(item: Any) -> bool:
    """Whether the item is something the user said (a question, more often than an answer)."""
    return isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message"


def search_text(item: Any) -> str:
    """The plain text of an item that search indexes: its content, or a tool call's text.

    Never empty: Citadel can only re-embed (`reembed`) atoms that have text, so an
    item with nothing to say is indexed under its type.
    """
    text = ""
    if isinstance(item, dict):
        content = item.get("content")
        if content is None and item.get("type") == "function_call_output":
            content = item.get("output")
        text = _plain_text(content)
        if not text and item.get("type") == "function_call":
            text = f"{item.get('name', '')} {item.get('arguments', '')}".strip()
        if not text:
            text = str(item.get("type") or item.get("role") or "")
    # The index needs valid UTF-8; the verbatim payload keeps any lone surrogate.
    return (text or "item").encode("utf-8", "replace").decode("utf-8")


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (_part_text(part) for part in content)
        return "\n".join(text for text in parts if text)
    return ""


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        for field in ("text", "refusal"):
            value = part.get(field)
            if isinstance(value, str):
                return value
    return ""


def in_context(question: str, text: str, from_user: bool) -> str:
    """What an item's vector is computed from: a reply's text (a JSON tool output as
    `readable` text) after the question it answers."""
    if from_user:
        return text
    own = readable(text)
    return f"{question}\n{own}" if question else own


# Larger outputs are embedded as they are: the model reads only its first few hundred tokens.
_READABLE_LIMIT = 65_536
# Deeper JSON is embedded as it is. Parsing it is not attempted at all: json's parser recurses
# in C, and near the recursion limit any finaliser the garbage collector runs meanwhile (an
# abandoned generator's, a span's context manager's) fails with RecursionError and is lost.
_READABLE_DEPTH = 64
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _nests_deeper_than(text: str, limit: int) -> bool:
    """Whether the brackets outside JSON strings in `text` nest deeper than `limit`."""
    if text.count("[") + text.count("{") <= limit:  # the common case: no scan
        return False
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub("", text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > limit:
            return True
    return False


def readable(text: str) -> str:
    """A JSON object or array as ``key: value`` pairs (``_`` in keys read as spaces); any other
    text unchanged. A language model embeds `booking ref: FNW-5530` nearer to "garage booking
    reference" than `{"booking_ref": "FNW-5530"}` (benchmarks/search_quality: the development
    set's tool outputs)."""
    if len(text) > _READABLE_LIMIT or text[:1] not in ("{", "[") or _nests_deeper_than(text, _READABLE_DEPTH):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    pairs: list[str] = []
    pending: list[tuple[str, Any]] = [("", value)]  # a stack, not recursion: any depth json accepts
    while pending:
        key, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((str(name).replace("_", " "), inner) for name, inner in reversed(value.items()))
        elif isinstance(value, list):
            pending.extend((key, inner) for inner in reversed(value))
        else:
            shown = value if isinstance(value, str) else json.dumps(value)
            pairs.append(f"{key}: {shown}" if key else shown)
    return "; ".join(pairs) or text


def in_contexts(question: str, texts: list[str], from_user: list[bool]) -> tuple[list[str], str]:
    """What each of these items' vectors is computed from, in order, after `question` (the
    latest user message before them); and the latest user message after them."""
    contexts = []
    for text, user in zip(texts, from_user, strict=True):
        if user:
            question = text
        contexts.append(in_context(question, text, user))
    return contexts, question


# How many of a session's newest items are searched for its latest user message (after a
# restart, or for the segment before one being repaired).
QUESTION_LOOKBACK = 32


def latest_question(payloads: list[str]) -> str | None:
    """The text of the newest user message among these stored items (None: there is none)."""
    for payload in reversed(payloads):
        item = decode_item(payload)
        if is_user_message(item):
            return search_text(item)
    return None


def placed_hits(found: list[tuple[str, int]]) -> list[HistoryHit]:
    """Search results (payload, position) as hits: identical items once, with each position."""
    where: dict[str, list[int]] = {}
    for payload, position in found:
        where.setdefault(payload, []).append(position)
    hits = zip(where, decode_items(list(where)), strict=True)
    return [HistoryHit(sorted(where[payload]), item, search_text(item)) for payload, item in hits]
