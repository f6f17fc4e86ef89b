"""Search data derived from items, and the block atoms that hold it at rest.

Citadel's `recall` costs time in proportion to every atom of the file that shares
the session's table (one table per vector width: measured in docs/search.md), and
Citadel returns no stored vector. So search keeps its own copy of what it ranks by:
for each item, its vector (int8, one scale per item: the labelled set ranks the
same as with float32) and its words (32-bit hashes of its lowercased word tokens,
for the keyword signal). That copy is personal data like the text it comes from:

* it is stored in *block atoms* (kind ``search``) in the item's own encrypted
  segment, written by the same `remember_batch` as the items, so it is encrypted
  with them and dropped with their segment;
* all entries of one block share the expiry of their items, and the block atom
  carries it, so Citadel's eviction erases a block with its items;
* popping or clearing an item forgets the block that holds its entry in the same
  `forget` (search_upkeep.py).

A block written with its batch lists no ids: its entries are, in order, the
`own` atoms just before it (checked when it is written). A block written later
(entries re-covered after a pop, or repaired) lists its ids.
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .codec import SEARCH_KIND

_BLOCK_FORMAT = 1
_WORD = re.compile(r"\w+")

IntArray = npt.NDArray[np.int64]


@dataclass
class Entries:
    """Search data for some items, column by column (one row per item).

    `ids` is empty until the items' atom ids are known (a block written with its batch).
    """

    ids: IntArray
    vectors: npt.NDArray[np.int8]  # rows quantized to int8
    scales: npt.NDArray[np.float32]  # a row's value = int8 * scale
    # A user message that asks (`asks`): its distance is weighed up. Blocks written before
    # 2026-12-03 flag every user message, until `reembed` rewrites them.
    user: npt.NDArray[np.bool_]
    tokens: npt.NDArray[np.uint32]  # every row's word hashes, one row after the other
    lengths: npt.NDArray[np.int32]  # how many of `tokens` each row has

    def __len__(self) -> int:
        return len(self.scales)

    @property
    def nbytes(self) -> int:
        return sum(
            a.nbytes for a in (self.ids, self.vectors, self.scales, self.user, self.tokens, self.lengths)
        )

    def with_ids(self, ids: list[int] | IntArray) -> Entries:
        return Entries(
            np.asarray(ids, dtype=np.int64), self.vectors, self.scales, self.user, self.tokens, self.lengths
        )

    def select(self, rows: npt.NDArray[np.bool_]) -> Entries:
        """The rows where `rows` is True."""
        keep_tokens = np.repeat(rows, self.lengths)
        return Entries(
            self.ids[rows] if len(self.ids) else self.ids,
            self.vectors[rows],
            self.scales[rows],
            self.user[rows],
            self.tokens[keep_tokens],
            self.lengths[rows],
        )

    @staticmethod
    def concat(parts: list[Entries], dim: int) -> Entries:
        if not parts:
            return empty_entries(dim)
        return Entries(
            np.concatenate([p.ids for p in parts]),
            np.concatenate([p.vectors for p in parts]),
            np.concatenate([p.scales for p in parts]),
            np.concatenate([p.user for p in parts]),
            np.concatenate([p.tokens for p in parts]),
            np.concatenate([p.lengths for p in parts]),
        )


def empty_entries(dim: int) -> Entries:
    return Entries(
        np.zeros(0, np.int64),
        np.zeros((0, dim), np.int8),
        np.zeros(0, np.float32),
        np.zeros(0, np.bool_),
        np.zeros(0, np.uint32),
        np.zeros(0, np.int32),
    )


def word_hashes(text: str) -> list[int]:
    """The text's lowercased word tokens, each as a 32-bit hash (what the keyword signal matches)."""
    return [zlib.crc32(word.encode("utf-8", "replace")) for word in _WORD.findall(text.lower())]


# A user message that asks something: a question mark, or a question's first word.
_ASKING = re.compile(
    r"\?|^\W*(what|why|how|when|where|who|which|whose|can|could|do|does|did|is|are|was|were|"
    r"should|would|will|shall|may|might|any)\b",
    re.IGNORECASE,
)


def asks(text: str) -> bool:
    """Whether a user message asks something: such a message resembles a query more than the
    reply that answers it does, so the ranking weighs its distance up. A statement of the user's
    ("my budget is 9,000") is an answer like any other (benchmarks/search_quality/holdout.py)."""
    return bool(_ASKING.search(text))


def derive(vectors: list[list[float]], texts: list[str], from_user: list[bool], metric: str) -> Entries:
    """Search data for items: their vectors (normalised first for cosine), words, and whether
    each is a user message that `asks` (stored as the entry's `user` flag)."""
    if not vectors:
        return empty_entries(0)
    matrix = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), -1)
    if metric == "cosine":
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        matrix = (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    peaks = np.abs(matrix).max(axis=1) if matrix.size else np.zeros(len(vectors), np.float32)
    scales = np.where(peaks > 0, peaks / 127.0, 1.0).astype(np.float32)
    quantized = np.rint(matrix / scales[:, None]).astype(np.int8)
    words = [word_hashes(text) for text in texts]
    return Entries(
        np.zeros(0, np.int64),
        quantized,
        scales,
        np.asarray([user and asks(text) for text, user in zip(texts, from_user, strict=True)], np.bool_),
        np.asarray([h for hashes in words for h in hashes], dtype=np.uint32),
        np.asarray([len(hashes) for hashes in words], dtype=np.int32),
    )


def placeholder_vector(dim: int) -> list[float]:
    """The vector Citadel wants for an atom that is never recalled (a block, a write marker)."""
    return [1.0] + [0.0] * (dim - 1)


def block_atom(entries: Entries, dim: int, expires_at: int | None, *, own: bool) -> dict[str, Any]:
    """The atom holding `entries`: for the `own` items written just before it, or for `entries.ids`."""
    payload: dict[str, Any] = {
        "format": _BLOCK_FORMAT,
        "vectors": _b64(entries.vectors),
        "scales": _b64(entries.scales),
        "user": _b64(entries.user.astype(np.uint8)),
        "tokens": _b64(entries.tokens),
        "lengths": _b64(entries.lengths),
    }
    if own:
        payload["own"] = len(entries)
    else:
        payload["ids"] = [int(atom) for atom in entries.ids]
    atom: dict[str, Any] = {
        "kind": SEARCH_KIND,
        "text": "search",
        "embedding": placeholder_vector(dim),
        "payload": payload,
    }
    if expires_at is not None:
        atom["expires_at"] = expires_at
    return atom


def read_block(atom_id: int, payload: Any, dim: int) -> Entries:
    """The entries a block atom holds, with their item ids."""
    if not isinstance(payload, dict) or payload.get("format") != _BLOCK_FORMAT:
        raise ValueError(f"search block {atom_id} has an unknown format")
    vectors = _array(payload["vectors"], np.int8)
    count = len(vectors) // dim
    own = payload.get("own")
    ids = (
        np.arange(atom_id - own, atom_id, dtype=np.int64)
        if own is not None
        else np.asarray(payload["ids"], dtype=np.int64)
    )
    entries = Entries(
        ids,
        vectors.reshape(count, dim),
        _array(payload["scales"], np.float32),
        _array(payload["user"], np.uint8).astype(np.bool_),
        _array(payload["tokens"], np.uint32),
        _array(payload["lengths"], np.int32),
    )
    if not (len(ids) == count == len(entries.scales) == len(entries.user) == len(entries.lengths)) or int(
        entries.lengths.sum()
    ) != len(entries.tokens):
        raise ValueError(f"search block {atom_id} is inconsistent")
    return entries


def _b64(array: npt.NDArray[Any]) -> str:
    return base64.b64encode(
        np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
    ).decode()


def _array(text: str, dtype: Any) -> npt.NDArray[Any]:
    return np.frombuffer(base64.b64decode(text), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
