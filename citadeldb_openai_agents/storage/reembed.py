"""Re-embedding a file's stored text with another embedder, keeping every item, id and key.

The fix for `EmbedderMismatchError` (the file's vectors were made by another model).
It runs before any `SessionLayout` is built on the file: its regions must not be
attached to the old embedder.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from citadeldb.memory import Memory

from ..embedders.protocol import Embedder, EmbedderIdentity
from .codec import ITEM_KIND, decode_item, in_context, is_user_message, search_text
from .records import CATALOG_REGION, META_KIND, META_REGION, parse_segment, segment_name
from .segments import ALL, regions


def reembed_file(
    memory: Memory,
    embedder: Embedder,
    leftovers: set[str],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Re-embed every region of this layout from its stored text; record the new embedder.

    Runs before any `SessionLayout` is built on the file (its regions must not be
    attached to the old embedder). Items, ids and keys are kept, and each item's
    vector is computed in context, as `append` computes it. Idempotent: if it is
    interrupted, running it again finishes the job. Returns (regions, items).
    """
    stored = {region.name: region for region in regions(memory, leftovers)}
    segments: dict[str, list[int]] = {}
    for name in stored:
        parsed = parse_segment(name)
        if parsed is not None:
            segments.setdefault(parsed[0], []).append(parsed[1])
    items = done = 0
    total = sum(len(numbers) for numbers in segments.values())
    for hid, numbers in segments.items():
        question = ""  # carried across a session's segments, in order
        for number in sorted(numbers):
            region = segment_name(hid, number)
            # Reading the items needs the region attached, to the model it was written with.
            memory.create_encrypted_region(region, _StoredModel(stored[region]))
            contexts: dict[str, deque[str]] = {}
            for hit in memory.fetch(region, ITEM_KIND, limit=ALL):
                item = decode_item(hit.payload)
                user = is_user_message(item)
                own = search_text(
                    item
                )  # not hit.text: files written before 2026-11-30 hold question+own there
                if user:
                    question = own
                contexts.setdefault(hit.text, deque()).append(in_context(question, own, user))
            items += memory.reembed_region(region, _InContext(embedder, contexts)).atoms_migrated
            done += 1
            if progress is not None:
                progress(done, total)
    # The meta region last: it records the embedder, so it moves once the rest has.
    others = [name for name in (CATALOG_REGION, META_REGION) if name in stored]
    for name in others:
        memory.reembed_region(name, embedder)
    found = memory.fetch(META_REGION, META_KIND, limit=1)
    if found:
        meta = dict(found[0].payload)
        meta["embedder"] = EmbedderIdentity.of(embedder).__dict__
        memory.update_atom_payload(META_REGION, found[0].id, meta)
    return total + len(others), items


class _StoredModel:
    """A region's recorded model, to attach it by: reading needs no embedding."""

    def __init__(self, region: Any) -> None:
        self.dim, self.metric, self.model_id = region.dim, region.metric, region.model_id

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        raise RuntimeError(f"{self.model_id!r} is not loaded; this region is being re-embedded")


class _InContext:
    """`embedder` as `reembed_region` should call it: each stored text embedded in context.

    Citadel re-embeds a region from its atoms' stored texts, in id order; `contexts`
    maps each live item's stored text to the texts its vectors come from, in id
    order too. A text it does not know (an expired item) is embedded as it is.
    """

    def __init__(self, embedder: Embedder, contexts: dict[str, deque[str]]) -> None:
        self.dim, self.metric, self.model_id = embedder.dim, embedder.metric, embedder.model_id
        self._embedder = embedder
        self._contexts = contexts

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        in_context = [queue.popleft() if (queue := self._contexts.get(t)) else t for t in texts]
        return self._embedder.embed_with_cancel(in_context, cancel_token)
