"""CitadelSession's side of the SDK's compaction: a snapshot of the newest items, and their atomic replacement.

`agents.OpenAIResponsesCompactionSession` asks the session it wraps for
``_get_compaction_snapshot(limit, *, prune_prefix=None)`` (openai-agents 0.24; a private
hook, probed with `getattr`). Without it, or when it answers None, the SDK replaces the
whole history with ``clear_session()`` then ``add_items()``, and a crash between the two
loses it all. Here the snapshot is the newest `limit` items with their atom ids, and its
``replace_suffix(start, output)`` compares them with what is stored and replaces them in
one crash-safe replacement (storage/suffix.py), as `SQLiteSession`'s does in one
transaction: False, and nothing changed, when the suffix changed since the snapshot.

A private hook can change shape in any release. A call this module does not recognise,
or an SDK whose snapshot type differs, gets None: the SDK's own fallback, which works
with any session (tests/test_compaction.py pins both).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .serving import operations as ops
from .storage.codec import decode_item, decode_items, encode_batch

if TYPE_CHECKING:
    from .serving.shared_file import SharedFile
    from .storage.segments import SessionKey

# When an item written now expires (the store's TTL), in µs since the epoch, or None.
ExpiresAt = Callable[[], "int | None"]

SNAPSHOT_FIELDS = ("items", "complete", "replace_suffix")  # `_CompactionSnapshot`, openai-agents 0.24
_EVERYTHING = 2**62  # "every item" for `newest_rows`
_PRUNE_PAGE = 256  # older items read at a time for `prune_prefix`


def snapshot_type() -> Any | None:
    """The SDK's `_CompactionSnapshot`, if this SDK has one of the shape this module builds."""
    try:
        from agents.memory.session import _CompactionSnapshot
    except ImportError:
        return None
    if not dataclasses.is_dataclass(_CompactionSnapshot):
        return None
    if tuple(field.name for field in dataclasses.fields(_CompactionSnapshot)) != SNAPSHOT_FIELDS:
        return None
    return _CompactionSnapshot


async def compaction_snapshot(
    file: SharedFile,
    expires_at: ExpiresAt,
    session_id: SessionKey,
    limit: Any,
    prune_prefix: Callable[[Any], bool] | None,
    unexpected: bool,
) -> Any | None:
    """The snapshot for ``_get_compaction_snapshot``; None (the SDK's fallback) for a call of another shape."""
    snapshot = snapshot_type()
    if snapshot is None or unexpected or type(limit) is not int or limit <= 0:
        return None
    if prune_prefix is not None and not callable(prune_prefix):
        return None
    rows, complete = await asyncio.to_thread(file.call, ops.NEWEST_ROWS, session_id, limit)
    items = decode_items([payload for _, payload in rows])

    async def replace_suffix(start: int, output: list[Any]) -> bool:
        expected = rows[start:]
        if not expected:
            return False
        return await asyncio.to_thread(
            replace, file, expires_at, session_id, expected, list(output), prune_prefix
        )

    return snapshot(items, complete, replace_suffix)


def replace(
    file: SharedFile,
    expires_at: ExpiresAt,
    session_id: SessionKey,
    expected: list[tuple[int, str]],
    output: list[Any],
    prune_prefix: Callable[[Any], bool] | None = None,
) -> bool:
    """Replace the stored items `expected` (the newest ones) by `output`; False, changing nothing, if they changed.

    With `prune_prefix`, the oldest items it calls True (up to the first it does not)
    are erased in the same replacement, as `SQLiteSession` deletes them in its transaction.
    """
    batch = encode_batch(output, expires_at())
    prune = _expired_prefix(file, session_id, expected[0][0], prune_prefix) if prune_prefix else []
    return file.call(ops.REPLACE_SUFFIX, session_id, expected, batch, prune)


def replace_all(file: SharedFile, expires_at: ExpiresAt, session_id: SessionKey, output: list[Any]) -> bool:
    """The whole history replaced by `output` in one crash-safe replacement (``_atomic_replace_items``).

    False when it changed between the read and the replacement (the SDK then falls back).
    """
    rows, _ = file.call(ops.NEWEST_ROWS, session_id, _EVERYTHING)
    if not rows:
        if output:
            file.call(ops.APPEND, session_id, encode_batch(output, expires_at()))
        return True
    return replace(file, expires_at, session_id, rows, output)


def _expired_prefix(
    file: SharedFile, session_id: SessionKey, before: int, prune_prefix: Callable[[Any], bool]
) -> list[int]:
    """The ids of the oldest items `prune_prefix` calls True, up to the first it does not (or `before`)."""
    pruned: list[int] = []
    after = 0
    while True:
        rows = file.call(ops.OLDEST_ROWS, session_id, after, before, _PRUNE_PAGE)
        for atom, payload in rows:
            if not prune_prefix(decode_item(payload)):
                return pruned
            pruned.append(atom)
        if len(rows) < _PRUNE_PAGE:
            return pruned
        after = rows[-1][0]
