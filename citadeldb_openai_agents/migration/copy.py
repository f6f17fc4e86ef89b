"""`copy_session`: every item of one Agents SDK session into another, resumably.

Any two objects with the SDK's `Session` protocol work (SQLiteSession, Redis, SQLAlchemy,
EncryptedSession, ours). Into a `CitadelSession` it is `store.import_items`; into any other
session the same plan is followed with the protocol's own calls (transfer/chunks.py).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from ..errors import SessionNotEmptyError
from ..results import ImportSummary
from ..session import CitadelSessionStore
from ..transfer.chunks import CHUNK, IMPORT_MODES, ImportMode, as_stored, plan


async def copy_session(source: Any, target: Any, *, mode: ImportMode = "new") -> ImportSummary:
    """Copy every item of `source` into `target`, verbatim and in order.

    Args:
        source: Any SDK session; all its items are read, whatever its ``session_settings.limit``.
        target: Any SDK session.
        mode: "new" (default) refuses a target that holds other items; "append" adds after
            them; "replace" clears them first. Either way, a target that already holds this
            copy's first items (an interrupted copy, run again) gets only the rest.

    Raises:
        SessionNotEmptyError: mode "new" and the target holds other items; nothing was written.
    """
    if mode not in IMPORT_MODES:
        raise ValueError(f"mode must be one of {', '.join(IMPORT_MODES)}, not {mode!r}")
    items = await all_items(source)
    target_id = str(getattr(target, "session_id", ""))
    store = getattr(target, "store", None)
    if isinstance(store, CitadelSessionStore):
        return await asyncio.to_thread(store.import_items, target_id, items, mode=mode)
    chosen = plan(as_stored(await all_items(target)), as_stored(items), mode, CHUNK)
    if chosen.refused:
        raise SessionNotEmptyError(
            f"the target session {target_id!r} already holds items other than these; nothing was "
            "written. Pass mode='append' to add after them, or mode='replace' to clear them first."
        )
    if chosen.clear:
        await target.clear_session()
    for start in range(chosen.start, len(items), CHUNK):
        await target.add_items(items[start : start + CHUNK])
    return ImportSummary(target_id, len(items), len(items) - chosen.start, chosen.start, chosen.clear)


async def all_items(session: Any) -> list[Any]:
    """Every item of a session: `get_items()` would stop at its ``session_settings.limit``."""
    settings = getattr(session, "session_settings", None)
    limited = getattr(settings, "limit", None) is not None
    return list(await session.get_items(limit=sys.maxsize if limited else None))
