"""The calls on a file that no store holds open: inspecting a damaged one, re-embedding, restoring."""

from __future__ import annotations

import os
from typing import Any

from .embedders.providers import resolve_embedder
from .errors import KEY_ARGUMENT, WrongPassphraseError
from .options import Argon2Profile, StoreOptions, SyncMode, check_passphrase
from .results import IntegrityReport, Progress, ReembedSummary, RestoreReport
from .storage import inspection, local_file
from .storage.ledger import LedgerHead
from .storage.restore import restore


def verify_file(path: str | os.PathLike[str], key: str) -> IntegrityReport:
    """`CitadelSessionStore.verify` for a file that is not open, changing nothing in it.

    The way to inspect a damaged file, which refuses to open for use: Citadel's page
    check, the audit log's chain, and per session the items the file holds, those
    Citadel can read, and its verdict on each, all read without starting Citadel's
    memory engine (which would delete what it cannot read).
    """
    try:
        return inspection.verify_file(path, check_passphrase(key))
    except WrongPassphraseError as exc:
        wrong = exc.came_from(KEY_ARGUMENT)  # raised below, as CitadelSessionStore.__init__ does
    finally:
        del key  # as in CitadelSessionStore.__init__: a failed frame's locals are recorded
    raise wrong from None


def reembed(
    path: str | os.PathLike[str], key: str, embedder: Any, *, progress: Progress | None = None
) -> ReembedSummary:
    """Re-embed a file's stored text with `embedder`, keeping every item.

    The fix for `EmbedderMismatchError`: after it, the file opens with `embedder`.
    The file must not be open elsewhere in this process or in another process.
    `progress(regions done, regions)` is called after each region.
    """
    try:
        return local_file.reembed(path, check_passphrase(key), resolve_embedder(embedder), progress)
    except WrongPassphraseError as exc:
        wrong = exc.came_from(KEY_ARGUMENT)
    finally:
        del key  # as in CitadelSessionStore.__init__: a failed frame's locals are recorded
    raise wrong from None


def restore_backup(
    backup: str | os.PathLike[str],
    path: str | os.PathLike[str],
    key: str,
    *,
    erasure_ledger: str | os.PathLike[str] | None,
    ledger_mirror: str | os.PathLike[str] | None = None,
    embedder: Any | None = None,
    argon2_profile: Argon2Profile | None = None,
    sync_mode: SyncMode | None = None,
    replace: bool = False,
    ledger_head: tuple[int, str] | None = None,
) -> RestoreReport:
    """Put the backup `backup` at `path`, erasing again what the erasure ledger recorded since.

    A backup taken before an erasure still holds what was erased; with the ledger the
    store kept (``erasure_ledger``), nothing erased comes back: the report names each
    session the backup held that the ledger erased. `erasure_ledger=None` restores the
    backup as it is (every erasure since it was taken comes back). The copy is verified
    before it replaces anything; a file at `path` is replaced only with ``replace=True``,
    and never while a process holds it (`DatabaseLockedError`).

    The ledger must reach the head that the backup and the file at `path` recorded (`LedgerError`
    naming the missing entry otherwise: someone cut it short); with `ledger_mirror`, the
    longer authentic chain of the two copies is replayed, and the report's `ledger_notes` say
    where they disagree. `ledger_head` is one more head it must reach (`restore_sessions` gives
    the live store's `erasure_ledger_head`).
    """
    try:
        return restore(
            backup,
            path,
            check_passphrase(key),
            ledger=None if erasure_ledger is None else os.fspath(erasure_ledger),
            mirror=None if ledger_mirror is None else os.fspath(ledger_mirror),
            at_least=None if ledger_head is None else LedgerHead(*ledger_head),
            embedder=resolve_embedder(embedder),
            options=StoreOptions.of(argon2_profile=argon2_profile, sync_mode=sync_mode),
            replace=replace,
        )
    except WrongPassphraseError as exc:
        wrong = exc.came_from(KEY_ARGUMENT)
    finally:
        del key
    raise wrong from None
