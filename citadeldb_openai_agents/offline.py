"""The calls on a file that no store holds open: inspecting a damaged one, and re-embedding."""

from __future__ import annotations

import os
from typing import Any

from .embedders.providers import resolve_embedder
from .options import check_passphrase
from .results import IntegrityReport, Progress, ReembedSummary
from .storage import local


def verify_file(path: str | os.PathLike[str], key: str) -> IntegrityReport:
    """`CitadelSessionStore.verify` for a file that is not open, changing nothing in it.

    The way to inspect a damaged file, which refuses to open for use: Citadel's page
    check, the audit log's chain, and per session the items the file holds, those
    Citadel can read, and its verdict on each, all read without starting Citadel's
    memory engine (which would delete what it cannot read).
    """
    try:
        return local.verify_file(path, check_passphrase(key))
    finally:
        del key  # as in CitadelSessionStore.__init__: a failed frame's locals are recorded


def reembed(
    path: str | os.PathLike[str], key: str, embedder: Any, *, progress: Progress | None = None
) -> ReembedSummary:
    """Re-embed a file's stored text with `embedder`, keeping every item.

    The fix for `EmbedderMismatchError`: after it, the file opens with `embedder`.
    The file must not be open elsewhere in this process or in another process.
    `progress(regions done, regions)` is called after each region.
    """
    try:
        return local.reembed(path, check_passphrase(key), resolve_embedder(embedder), progress)
    finally:
        del key  # as in CitadelSessionStore.__init__: a failed frame's locals are recorded
