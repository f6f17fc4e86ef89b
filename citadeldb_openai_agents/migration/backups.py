"""Some sessions back from a backup, into the live file, leaving every other session as it is.

The backup is restored into a private directory beside the live file (`restore_backup`:
copied, the erasure ledger replayed, verified), so nothing erased since it was taken can
come back; the chosen sessions are then moved from that copy into the live store, as `move`
moves them (copy, compare, branches, usage, owner and labels), through the live file's owner
when it is served. The copy is deleted at the end, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigurationError, SessionNotEmptyError, SessionNotFoundError
from ..offline import restore_backup
from ..people import check_owner
from ..results import Erasure, Progress, RestoreReport, SessionsRestoreReport
from ..session import CitadelSessionStore
from .files import named

ERASED_SINCE = "erased after the backup was taken (the erasure ledger): it stays erased"


def restore_sessions(
    store: CitadelSessionStore,
    backup: str | os.PathLike[str],
    key: str,
    *,
    session_ids: Sequence[str] | None = None,
    owner: str | None = None,
    replace: bool = False,
    without_ledger: bool = False,
    embedder: Any | None = None,
    progress: Progress | None = None,
) -> SessionsRestoreReport:
    """Bring `session_ids` (or every session of `owner`) back from `backup` into `store`.

    The store's erasure ledger is replayed on the backup's copy first: a session erased
    since the backup was taken is skipped, saying why, and items erased from a session since
    (a pop, a compaction) stay erased. A session the live file holds is replaced by the
    backup's copy only with `replace` (its erasure receipt is in the report). `key` opens the
    backup (the live file's passphrase, or the one it had then); `embedder` is the one the
    file was made with, as for the store.

    Raises:
        ConfigurationError: the store keeps no erasure ledger and `without_ledger` is False
            (every erasure since the backup would come back); nothing was restored.
        SessionNotFoundError: the backup never held a named session, or holds nothing of
            `owner`; nothing was restored.
        SessionNotEmptyError: the live file holds a chosen session and `replace` is False;
            nothing was restored.
    """
    if (session_ids is None) == (owner is None):
        raise ValueError("restore_sessions takes session_ids or owner (one of them)")
    owner = None if owner is None else check_owner(owner, "restore_sessions' owner=")
    ledger = _ledger(store, without_ledger)
    # Beside the live file (one filesystem, one owner), in a directory only this user reads.
    staging = tempfile.mkdtemp(prefix=".restoring-", dir=os.path.dirname(store.path))
    try:
        copy_path = os.path.join(staging, "backup.cdl")
        replayed = restore_backup(backup, copy_path, key, embedder=embedder, **ledger)
        with CitadelSessionStore(copy_path, key, embedder=embedder, create=False, serve=False) as copy:
            chosen, skipped = _chosen(copy, replayed, session_ids, owner)
            replaced = _make_room(store, chosen, replace)
            moved = copy.move_sessions(chosen, store, progress=progress) if chosen else []
    finally:
        del key  # as in CitadelSessionStore.__init__: a failed frame's locals are recorded
        shutil.rmtree(staging, ignore_errors=True)
    erased = {sid: n for sid, n in replayed.erased.items() if sid in chosen or sid in skipped}
    return SessionsRestoreReport(
        store.path, replayed.backup, moved, replaced, skipped, erased, ledger["erasure_ledger"]
    )


def _make_room(store: CitadelSessionStore, chosen: list[str], replace: bool) -> dict[str, Erasure]:
    """The live sessions the backup's copies replace, erased (their receipts); refused without `replace`."""
    held = [sid for sid in chosen if store.summary(sid) is not None]
    if held and not replace:
        raise SessionNotEmptyError(
            f"{named(held)} {'is' if len(held) == 1 else 'are'} in {store.path} now: pass replace=True "
            f"(--replace) to replace {'it' if len(held) == 1 else 'them'} with the backup's copy; nothing was "
            "restored."
        )
    return {sid: store.erase_session(sid) for sid in held}


def _ledger(store: CitadelSessionStore, without_ledger: bool) -> dict[str, Any]:
    """The ledger to replay on the backup's copy (`restore_backup`'s arguments): the store's, its
    copies required to reach the head the live file records, as over a whole file; refused when
    the store keeps none."""
    if without_ledger:
        return {"erasure_ledger": None}
    if store.options.erasure_ledger is None:
        raise ConfigurationError(
            [
                f"{store.path} keeps no erasure ledger, so a session erased since the backup was taken "
                "would come back: set erasure_ledger (CITADEL_ERASURE_LEDGER), or restore the sessions "
                "as the backup holds them (without_ledger=True, --without-ledger); nothing was restored"
            ]
        )
    return {
        "erasure_ledger": store.options.erasure_ledger,
        "ledger_mirror": store.options.ledger_mirror,
        "ledger_head": store.erasure_ledger_head,
    }


def _chosen(
    copy: CitadelSessionStore,
    replayed: RestoreReport,
    session_ids: Sequence[str] | None,
    owner: str | None,
) -> tuple[list[str], dict[str, str]]:
    """The sessions to move from the backup's copy, and those named that the ledger erased."""
    if owner is not None:
        chosen = [summary.session_id for summary in copy.sessions(owner=owner)]
        if not chosen:
            raise SessionNotFoundError(
                f"the backup {replayed.backup} holds no session of this owner (or the ledger erased "
                "them all since); nothing was restored."
            )
        return chosen, {}
    assert session_ids is not None
    chosen, skipped, unknown = [], {}, []
    for sid in dict.fromkeys(session_ids):
        if copy.summary(sid) is not None:
            chosen.append(sid)
        elif sid in replayed.erased:
            skipped[sid] = ERASED_SINCE
        else:
            unknown.append(sid)
    if unknown:
        raise SessionNotFoundError(
            f"the backup {replayed.backup} holds no {named(unknown)}; nothing was restored."
        )
    return chosen, skipped
