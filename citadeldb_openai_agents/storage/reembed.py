"""Re-embedding a file's stored text with another embedder, keeping every item, id and key.

The fix for `EmbedderMismatchError` (the file's vectors were made by another model).
It runs before any `SessionLayout` is built on the file: its regions must not be
attached to the old embedder.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import groupby
from typing import Any

import numpy as np
from citadeldb.memory import Memory

from ..embedders.protocol import Embedder, EmbedderIdentity, embed_documents
from .codec import ITEM_KIND, SEARCH_KIND, decode_item, in_contexts, is_user_message, search_text
from .records import CATALOG_REGION, META_KIND, META_REGION, parse_segment, segment_name
from .search_blocks import Entries, block_atom, derive
from .segments import ALL, regions

_REBUILT_BLOCK = 256  # items per search block written by a re-embedding
_STOPPED = "the call stopped there (a re-embedding finishes when run again)"


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
            count, question = _reembed_segment(memory, embedder, region, stored[region], question)
            items += count
            done += 1
            if progress is not None:
                progress(done, total)
    # The meta region last: it records the embedder, so it moves once the rest has.
    others = [name for name in (CATALOG_REGION, META_REGION) if name in stored]
    for name in others:
        memory.reembed_region(name, embedder)
        # With the model the region already has, reembed_region leaves it unattached (citadeldb
        # 2.7.0), and the fetch below fails: attach it (create-or-attach) to the new embedder.
        memory.create_encrypted_region(name, embedder)
    found = memory.fetch(META_REGION, META_KIND, limit=1)
    if found:
        meta = dict(found[0].payload)
        meta["embedder"] = EmbedderIdentity.of(embedder).__dict__
        memory.update_atom_payload(META_REGION, found[0].id, meta)
    return total + len(others), items


def _reembed_segment(
    memory: Memory, embedder: Embedder, region: str, stored: Any, question: str
) -> tuple[int, str]:
    """One segment's vectors and search data made anew; (its items, the last user message so far)."""
    # Reading the items needs the region attached, to the model it was written with.
    memory.create_encrypted_region(region, _StoredModel(stored))
    hits = memory.fetch(region, ITEM_KIND, limit=ALL)
    decoded = [decode_item(hit.payload) for hit in hits]
    texts = [search_text(item) for item in decoded]  # not hit.text: older files hold question+own
    users = [is_user_message(item) for item in decoded]
    contexts, question = in_contexts(question, texts, users)
    vectors = embed_documents(embedder, contexts, _STOPPED) if hits else []
    by_text: dict[str, deque[list[float]]] = {}
    for hit, vector in zip(hits, vectors, strict=True):
        by_text.setdefault(hit.text, deque()).append(vector)
    memory.reembed_region(region, _Precomputed(embedder, by_text))
    _rebuild_search_data(memory, region, embedder, hits, derive(vectors, texts, users, embedder.metric))
    return len(hits), question


class _StoredModel:
    """A region's recorded model, to attach it by: reading needs no embedding."""

    def __init__(self, region: Any) -> None:
        self.dim, self.metric, self.model_id = region.dim, region.metric, region.model_id

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        raise RuntimeError(f"{self.model_id!r} is not loaded; this region is being re-embedded")


def _rebuild_search_data(
    memory: Memory, region: str, embedder: Embedder, hits: list[Any], entries: Entries
) -> None:
    """Write the segment's search blocks from the new vectors, then forget the old ones.

    New before old: an interruption leaves both (a rerun replaces them again), never
    items without search data. Blocks of `_REBUILT_BLOCK` items, each item's expiry kept.
    """
    old = [hit.id for hit in memory.fetch(region, SEARCH_KIND, limit=ALL)]
    atoms = []
    if hits:
        entries = entries.with_ids([hit.id for hit in hits])
        for start in range(0, len(hits), _REBUILT_BLOCK):
            rows = range(start, min(start + _REBUILT_BLOCK, len(hits)))
            for expires_at, run in groupby(rows, key=lambda row: hits[row].expires_at):
                mask = np.zeros(len(hits), dtype=np.bool_)
                mask[list(run)] = True
                atoms.append(block_atom(entries.select(mask), embedder.dim, expires_at, own=False))
    if atoms:
        memory.remember_batch(region, atoms)
    if old:
        memory.forget(region, old)


class _Precomputed:
    """`embedder` as `reembed_region` should call it: each item's vector, computed in context.

    Citadel re-embeds a region from its atoms' stored texts, in id order; `vectors`
    maps each live item's stored text to its vectors, in id order too. A text it
    does not know (an expired item, a search block, a write marker) is embedded as it is.
    """

    def __init__(self, embedder: Embedder, vectors: dict[str, deque[list[float]]]) -> None:
        self.dim, self.metric, self.model_id = embedder.dim, embedder.metric, embedder.model_id
        self._embedder = embedder
        self._vectors = vectors

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        known = [queue.popleft() if (queue := self._vectors.get(t)) else None for t in texts]
        unknown = [t for t, vector in zip(texts, known, strict=True) if vector is None]
        fresh = iter(self._embedder.embed_with_cancel(unknown, cancel_token) if unknown else [])
        return [vector if vector is not None else next(fresh) for vector in known]
