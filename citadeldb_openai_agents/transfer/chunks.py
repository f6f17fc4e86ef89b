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
from collections.abc import Callable
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


def chunk_ids(key: SessionKey, payloads: list[str], chunk: int) -> list[str]:
    """One batch id per chunk of `chunk` items: the import's identity and the chunk's number."""
    target = key if isinstance(key, str) else json.dumps(list(key))  # a branch's: another identity
    identity = hashlib.sha256(
        target.encode("utf-8", "surrogatepass") + b"\0" + digest(payloads).encode()
    ).hexdigest()[:32]
    return [f"import-{identity}-{number}" for number in range(-(-len(payloads) // chunk))]


def as_stored(items: list[Any]) -> list[str]:
    """Items as the JSON text a session stores them as: what `plan` compares."""
    return [encode_item(item, position) for position, item in enumerate(items)]


def plan(held: list[str], incoming: list[str], mode: ImportMode, chunk: int) -> ImportPlan:
    """Where an import of `incoming` into a session holding `held` starts.

    * the session holds nothing: from the start;
    * it ends with this import's first chunks (held from an interrupted run, or a complete
      one): after them, whatever the mode: a rerun neither duplicates nor loses an item.
      With "new" and "replace" the session must hold exactly those chunks; with "append",
      they follow what it held before;
    * otherwise "append" starts after what it holds, "replace" clears it first, and "new"
      is refused.
    """
    if not held or not incoming:
        return ImportPlan(0)
    boundaries = [*range(chunk, len(incoming), chunk), len(incoming)]
    if mode == "append":
        for end in reversed(boundaries):
            if end <= len(held) and held[len(held) - end :] == incoming[:end]:
                return ImportPlan(end)
        return ImportPlan(0)
    if len(held) in boundaries and held == incoming[: len(held)]:
        return ImportPlan(len(held))
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
) -> ImportSummary:
    """`CitadelSessionStore.import_items` on its file: plan, refuse or clear, then write each chunk once.

    Into another `branch` than MAIN, "replace" replaces nothing: a replacement of the session
    (its MAIN import) erased every branch already.
    """
    key = key_of(session_id, branch)
    chosen = plan(file.call(ops.ALL_ITEMS, key), batch.payloads, mode, CHUNK)
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
            chosen = plan(file.call(ops.ALL_ITEMS, key), batch.payloads, "append", CHUNK)
        else:
            file.clear(session_id)
    write_chunks(file, key, batch, chosen.start, expires_at, progress)
    return ImportSummary(session_id, len(batch), len(batch) - chosen.start, chosen.start, chosen.clear)


def write_chunks(
    file: SharedFile,
    session_id: SessionKey,
    batch: Batch,
    start: int,
    expires_at: Callable[[], int | None],
    progress: Progress | None,
) -> None:
    """Append the items from `start` on, chunk by chunk, each under its chunk's batch id.

    Chunks are counted from the first item whatever `start` is, so a rerun that starts where
    a run left off sends each chunk under the id the first run sent it under.
    """
    ids = chunk_ids(session_id, batch.payloads, CHUNK)
    done = start
    while done < len(batch):
        number = done // CHUNK
        part = slice(done, min((number + 1) * CHUNK, len(batch)))
        file.append_batch(session_id, batch.part(part, expires_at()), ids[number])
        done = part.stop
        if progress is not None:
            progress(done, len(batch))
