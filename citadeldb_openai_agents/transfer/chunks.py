"""An import as chunks with deterministic ids, and where a rerun of an interrupted one resumes.

A chunk is written in one atomic batch whose id is derived from the import's identity
(the target session and a digest of every item imported, in order) and the chunk's
number: the same import always produces the same ids, so a chunk sent twice (a rerun
racing a write still in flight, an owner that died before answering) is written once.

A rerun recognises what an interrupted run left by the items themselves, compared as the
JSON text they are stored as (key order included): chunks are atomic and written in
order, so the session holds this import's first ``k`` chunks exactly, after whatever it
held before when appending.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import SessionNotEmptyError
from ..results import ImportSummary, Progress
from ..serving import operations as ops
from ..serving.shared_file import SharedFile
from ..storage.codec import Batch, digest, encode_item
from ..storage.records import MAIN
from ..storage.segments import SEGMENT_CAPACITY, SessionKey, key_of

# One segment's worth: each chunk fills a segment of its own in a new session (segments.py).
CHUNK = SEGMENT_CAPACITY
ImportMode = Literal["new", "append", "replace"]
IMPORT_MODES: tuple[ImportMode, ...] = ("new", "append", "replace")


@dataclass(frozen=True)
class ImportPlan:
    """What to write: the chunks from `start` on (`clear` first for a replacement)."""

    start: int  # items of this import the session already holds
    clear: bool = False
    refused: bool = False


def cuts(count: int, chunk: int, own_expiry: Sequence[int | None] | None = None) -> list[int]:
    """Where each of the chunks of `count` items ends: every `chunk` items, and, for items that
    keep an expiry of their own (`own_expiry`, an import from the original package's files),
    wherever it changes: one chunk is one batch, and a batch has one expiry."""
    if own_expiry is None:
        return [*range(chunk, count, chunk), count] if count else []
    ends, start = [], 0
    for end in range(1, count + 1):
        if end == count or end - start == chunk or own_expiry[end] != own_expiry[start]:
            ends.append(end)
            start = end
    return ends


def earliest(first: int | None, second: int | None) -> int | None:
    """The earlier of two expiries (None: never)."""
    return second if first is None else first if second is None else min(first, second)


def chunk_ids(
    key: SessionKey, payloads: list[str], chunk: int, own_expiry: Sequence[int | None] | None = None
) -> list[str]:
    """One batch id per chunk (`cuts`): the import's identity and the chunk's number."""
    target = key if isinstance(key, str) else json.dumps(list(key))  # a branch's: another identity
    identity = hashlib.sha256(
        target.encode("utf-8", "surrogatepass") + b"\0" + digest(payloads).encode()
    ).hexdigest()[:32]
    return [f"import-{identity}-{number}" for number in range(len(cuts(len(payloads), chunk, own_expiry)))]


def as_stored(items: list[Any]) -> list[str]:
    """Items as the JSON text a session stores them as: what `plan` compares."""
    return [encode_item(item, position) for position, item in enumerate(items)]


def plan(
    held: list[str],
    incoming: list[str],
    mode: ImportMode,
    chunk: int,
    own_expiry: Sequence[int | None] | None = None,
) -> ImportPlan:
    """Where an import of `incoming` into a session holding `held` starts.

    * the session holds nothing: from the start;
    * it ends with this import's first chunks (held from an interrupted run, or a complete
      one): after them, whatever the mode: a rerun neither duplicates nor loses an item.
      With "new" and "replace" the session must hold exactly this import's first items (at a
      chunk's end, or anywhere: the items an earlier import of a source that has grown since
      brought); with "append", whole chunks that follow what it held before;
    * otherwise "append" starts after what it holds, "replace" clears it first, and "new"
      is refused.
    """
    if not held or not incoming:
        return ImportPlan(0)
    boundaries = cuts(len(incoming), chunk, own_expiry)
    if mode == "append":
        for end in reversed(boundaries):
            if end <= len(held) and held[len(held) - end :] == incoming[:end]:
                return ImportPlan(end)
        return ImportPlan(0)
    if len(held) <= len(incoming) and held == incoming[: len(held)]:
        return ImportPlan(len(held))  # a run's whole chunks, or an earlier import of a source that grew
    if mode == "replace":
        return ImportPlan(0, clear=True)
    return ImportPlan(0, refused=True)


def import_chunks(
    file: SharedFile,
    session_id: str,
    batch: Batch,
    mode: ImportMode,
    expires_at: Callable[[], int | None],
    progress: Progress | None,
    branch: str = MAIN,
    own_expiry: Sequence[int | None] | None = None,
) -> ImportSummary:
    """`CitadelSessionStore.import_items` on its file: plan, refuse or clear, then write each chunk once.

    Into another `branch` than MAIN, "replace" replaces nothing: a replacement of the session
    (its MAIN import) erased every branch already. `own_expiry`: each item's own, when it has
    one (the store's own expiry still applies: the earlier wins).
    """
    key = key_of(session_id, branch)
    chosen = plan(file.call(ops.ALL_ITEMS, key), batch.payloads, mode, CHUNK, own_expiry)
    if chosen.refused:
        raise SessionNotEmptyError(
            f"session {session_id!r} in {file.path} already holds items other than this import's; "
            "nothing was written. Add the import after them (mode='append', --append), or erase "
            "them first (mode='replace', --replace)."
        )
    if batch.owner is not None or batch.labels is not None:  # a mismatch refuses before any write
        file.call(ops.CLAIM_OWNER, session_id, batch.owner, batch.labels)
    if chosen.clear:
        if branch != MAIN:
            chosen = plan(file.call(ops.ALL_ITEMS, key), batch.payloads, "append", CHUNK, own_expiry)
        else:
            file.clear(session_id)
    write_chunks(file, key, batch, chosen.start, expires_at, progress, own_expiry)
    return ImportSummary(session_id, len(batch), len(batch) - chosen.start, chosen.start, chosen.clear)


def write_chunks(
    file: SharedFile,
    session_id: SessionKey,
    batch: Batch,
    start: int,
    expires_at: Callable[[], int | None],
    progress: Progress | None,
    own_expiry: Sequence[int | None] | None = None,
) -> None:
    """Append the items from `start` on, chunk by chunk, each under its chunk's batch id.

    Chunks are counted from the first item whatever `start` is, so a rerun that starts where
    a run left off sends each chunk under the id the first run sent it under.
    """
    ends = cuts(len(batch), CHUNK, own_expiry)
    ids = chunk_ids(session_id, batch.payloads, CHUNK, own_expiry)
    for number, end in enumerate(ends):
        begin = ends[number - 1] if number else 0
        if end <= start:
            continue
        expiry = expires_at() if own_expiry is None else earliest(expires_at(), own_expiry[begin])
        file.append_batch(session_id, batch.part(slice(max(begin, start), end), expiry), ids[number])
        if progress is not None:
            progress(end, len(batch))
