"""A segment's search data in memory, and the ranking of a session's items by it.

The owner of a file keeps, per segment it has searched, the entries of its block
atoms (search_blocks.py) decrypted in memory, so a search reads nothing but the
items it returns. Every write to a segment updates its index in the same step
(search_upkeep.py); an erased item's entry leaves the index with its block.
Indexes are dropped, least recently used first, past the file's cache budget
(segment_cache.py), and rebuilt from the blocks when next needed.

Ranking (benchmarks/search_quality): by vector distance, the distance of a user
message that asks something weighed up by `USER_DISTANCE_FACTOR` (a question
resembles a query more than its answer does; a user's statement is not weighed),
minus a small keyword bonus: BM25 over the session's
items, scaled to the best match, times `KEYWORD_WEIGHT`. Ties go to the newer item.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .search_blocks import Entries, IntArray

# Chosen on the tuning parts of benchmarks/search_quality (dataset.json and development.json,
# pooled), for user messages that ask something (search_blocks.asks); docs/search.md.
USER_DISTANCE_FACTOR = 1.5
# The labelled set's recall@1 and recall@5 are flat for weights 0.01 to 0.04 with
# all-MiniLM-L6-v2, and better than without it (docs/search.md); 0.2 hurts it.
KEYWORD_WEIGHT = 0.03
_BM25_K1, _BM25_B = 1.2, 0.75


@dataclass
class Chunk:
    """The entries of one block atom, or entries waiting for one (`block` 0)."""

    entries: Entries
    block: int
    expires_at: int | None


class SegmentIndex:
    """One segment's entries, chunk by chunk.

    `complete` is False while it holds only entries waiting to be stored (the
    segment's blocks were not read): such an index is never searched.
    """

    def __init__(self, dim: int, *, complete: bool) -> None:
        self.dim = dim
        self.complete = complete
        self.chunks: list[Chunk] = []
        self._nbytes = 0  # of every chunk's entries, kept as they change (counted at every write)
        self._view: tuple[Entries, IntArray, npt.NDArray[np.int64]] | None = None

    def add(self, entries: Entries, block: int, expires_at: int | None) -> None:
        if len(entries):
            self.chunks.append(Chunk(entries, block, expires_at))
            self._view = None
            self._nbytes += entries.nbytes

    @property
    def ids(self) -> set[int]:
        return {int(atom) for atom in self.view()[0].ids}

    @property
    def pending(self) -> list[Chunk]:
        return [chunk for chunk in self.chunks if chunk.block == 0]

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def take_out(self, ids: set[int]) -> list[int]:
        """Remove these items' entries; return the blocks that held them.

        Those blocks are to be forgotten with the items; their other entries stay,
        waiting for a new block (`pending`).
        """
        blocks = []
        for position, chunk in enumerate(self.chunks):
            hit = np.isin(chunk.entries.ids, list(ids))
            if not hit.any():
                continue
            if chunk.block:
                blocks.append(chunk.block)
            self.chunks[position] = Chunk(chunk.entries.select(~hit), 0, chunk.expires_at)
        self.chunks = [chunk for chunk in self.chunks if len(chunk.entries)]
        self._view = None
        self._nbytes = sum(chunk.entries.nbytes for chunk in self.chunks)
        return blocks

    def drop_expired(self, now: int) -> None:
        self.chunks = [c for c in self.chunks if c.expires_at is None or c.expires_at > now]
        self._view = None
        self._nbytes = sum(chunk.entries.nbytes for chunk in self.chunks)

    def view(self) -> tuple[Entries, IntArray, npt.NDArray[np.int64]]:
        """(every entry, each entry's expiry (max int64: never), each word's row)."""
        if self._view is None:
            entries = Entries.concat([chunk.entries for chunk in self.chunks], self.dim)
            never = np.iinfo(np.int64).max
            expiry = np.concatenate(
                [
                    np.full(len(c.entries), never if c.expires_at is None else c.expires_at, np.int64)
                    for c in self.chunks
                ]
                or [np.zeros(0, np.int64)]
            )
            rows = np.repeat(np.arange(len(entries), dtype=np.int64), entries.lengths)
            self._view = (entries, expiry, rows)
        return self._view


def rank(
    indexes: list[SegmentIndex], query: list[float], words: list[int], metric: str, now: int
) -> tuple[IntArray, IntArray]:
    """The ids of the live entries of `indexes`, best match first, and the position in
    `indexes` of each one's segment."""
    views = [index.view() for index in indexes]
    live = [expiry > now for _, expiry, _ in views]
    vector = np.asarray(query, dtype=np.float32)
    distances = [_distances(entries, vector, metric) for entries, _, _ in views]
    keyword = _keyword_scores(views, live, sorted(set(words)))
    ids, keys, where = [], [], []
    for position, ((entries, _, _), alive, distance, bonus) in enumerate(
        zip(views, live, distances, keyword, strict=True)
    ):
        key = np.where(entries.user, distance * USER_DISTANCE_FACTOR, distance) - bonus
        ids.append(entries.ids[alive])
        keys.append(key[alive])
        where.append(np.full(int(alive.sum()), position, np.int64))
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    all_ids, all_keys = np.concatenate(ids), np.concatenate(keys)
    order = np.lexsort((-all_ids, all_keys))  # by key, then newest first
    return all_ids[order], np.concatenate(where)[order]


def _distances(
    entries: Entries, query: npt.NDArray[np.float32], metric: str
) -> npt.NDArray[np.floating[Any]]:
    """Each entry's distance to the query, in Citadel's sense of the file's metric."""
    if not len(entries):
        return np.zeros(0)
    dots = (entries.vectors.astype(np.float32) @ query) * entries.scales
    if metric == "cosine":
        norm = float(np.linalg.norm(query))
        return 1.0 - dots / (norm if norm > 0 else 1.0)
    if metric == "l2":
        rows = entries.vectors.astype(np.float32) * entries.scales[:, None]
        squared = (rows * rows).sum(axis=1) - 2 * dots + float(query @ query)
        root: npt.NDArray[np.floating[Any]] = np.sqrt(np.maximum(squared, 0.0))
        return root
    return 1.0 - dots  # inner product


def _keyword_scores(
    views: list[tuple[Entries, IntArray, npt.NDArray[np.int64]]],
    live: list[npt.NDArray[np.bool_]],
    words: list[int],
) -> list[npt.NDArray[np.float64]]:
    """BM25 of each entry for the query's words over the session's live entries, scaled to
    [0, KEYWORD_WEIGHT] (the best match gets the full bonus)."""
    scores = [np.zeros(len(entries)) for entries, _, _ in views]
    total = sum(int(alive.sum()) for alive in live)
    if not words or not total:
        return scores
    lengths = sum(
        float(entries.lengths[alive].sum()) for (entries, _, _), alive in zip(views, live, strict=True)
    )
    average = lengths / total or 1.0
    counts: list[dict[int, npt.NDArray[np.int64]]] = []
    documents = dict.fromkeys(words, 0)
    for (entries, _, rows), alive in zip(views, live, strict=True):
        per_word = {}
        for word in words:
            tf = np.bincount(rows[entries.tokens == word], minlength=len(entries))
            tf[~alive] = 0
            documents[word] += int((tf > 0).sum())
            per_word[word] = tf
        counts.append(per_word)
    for score, (entries, _, _), per_word in zip(scores, views, counts, strict=True):
        norm = _BM25_K1 * (1 - _BM25_B + _BM25_B * entries.lengths / average)
        for word, tf in per_word.items():
            if documents[word]:
                idf = math.log(1 + (total - documents[word] + 0.5) / (documents[word] + 0.5))
                score += idf * tf * (_BM25_K1 + 1) / (tf + norm)
    best = max((float(score.max()) for score in scores if len(score)), default=0.0)
    return [score * (KEYWORD_WEIGHT / best) if best > 0 else score for score in scores]
