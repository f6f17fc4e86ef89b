"""One session's history on its store's file: what `CitadelSession`'s methods run.

Items become JSON text here and back (storage/codec.py), each write gets its expiry (the
store's TTL, counted per item unless the session's mode counts it per session) and carries
the session's own retention and cap, and every call goes to the file wherever it is open
(serving/shared_file.py). The methods are synchronous: the session runs them in a worker
thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .compaction import compaction_snapshot, replace_all
from .results import HistoryHit
from .storage.codec import decode_item, decode_items, encode_batch, placed_hits
from .storage.records import Retention

if TYPE_CHECKING:
    from .serving.shared_file import SharedFile


class History:
    """The history of session `session_id` in `file`, written with the session's own `retention`
    (its TTL mode and idle time, None: the file's)."""

    def __init__(self, file: SharedFile, session_id: str, retention: Retention | None) -> None:
        self._file, self.session_id, self.retention = file, session_id, retention

    def expires_at(self) -> int | None:
        """When an item written now expires (µs since the epoch), or None: never, or not on its
        own (in session mode the whole session expires, storage/retention.py)."""
        terms, own = self._file.terms, self.retention
        mode = terms.ttl_mode if own is None or own.ttl_mode is None else own.ttl_mode
        ttl = terms.ttl
        return None if ttl is None or mode == "session" else int((time.time() + ttl) * 1_000_000)

    def get_items(self, limit: int | None) -> list[Any]:
        """Every item (`limit` None or negative) or the newest `limit`, oldest first."""
        if limit is None or limit < 0:
            return decode_items(self._file.all_items(self.session_id))
        return decode_items(self._file.newest(self.session_id, limit))

    def add_items(self, items: list[Any], max_items: int | None) -> None:
        batch = encode_batch(items, self.expires_at(), max_items, self.retention)
        self._file.append(self.session_id, batch)

    def pop_item(self) -> Any | None:
        return None if (payload := self._file.pop(self.session_id)) is None else decode_item(payload)

    def clear(self) -> None:
        self._file.clear(self.session_id)

    def search(self, query: str, limit: int) -> list[Any]:
        payloads = [payload for payload, _ in self._file.search_placed(self.session_id, query, limit)[0]]
        return decode_items(payloads)

    def search_with_positions(self, query: str, limit: int) -> tuple[list[HistoryHit], int]:
        """`search`'s hits with their positions (identical hits once, with each position), and
        the session's item count: from the search data, without reading the session."""
        found, held = self._file.search_placed(self.session_id, query, limit)
        return placed_hits(found), held

    async def compaction_snapshot(self, limit: Any, prune: Any, unexpected: bool) -> Any:
        return await compaction_snapshot(
            self._file, self.expires_at, self.session_id, limit, prune, unexpected
        )

    def replace_all(self, items: list[Any]) -> bool:
        return replace_all(self._file, self.expires_at, self.session_id, items)
