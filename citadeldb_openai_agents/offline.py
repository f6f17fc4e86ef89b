"""The calls on a file that no store holds open: inspecting a damaged one, re-embedding, restoring."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from .embedders.protocol import Embedder
from .embedders.providers import resolve_embedder
from .errors import KEY_ARGUMENT, WrongPassphraseError
from .options import Argon2Profile, StoreOptions, SyncMode, check_passphrase
from .results import (
    IntegrityReport,
    Progress,
    ReembedSummary,
    RepairReport,
    RestoreReport,
    SessionLoss,
    StatusReport,
)
from .serving import operations as ops
from .serving.asking import ask_owner
from .storage import inspection, local_file
from .storage.codec import decode_item
from .storage.file_status import at_rest as file_status_at_rest
from .storage.ledger import LedgerHead
from .storage.repair import Fill, Refill, refills, repair
from .storage.restore import restore
from .store import FileStore


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


def file_status(
    path: str | os.PathLike[str], key: str, *, options: StoreOptions | None = None
) -> StatusReport:
    """What `status` shows of a file, changing nothing and never becoming its owner.

    Asked of the process that serves the file (its pid, uptime, clients and socket, what its
    memory keeps of its erasures, retention's backlog); when none serves it, read at rest
    without opening it for use: Citadel's audit entry for the open is the only write. A file
    held by a process that does not serve it raises `DatabaseLockedError` naming it. `options`
    gives the rules that end a session (``ttl_mode``, ``idle_ttl``) and ``socket_dir``, as the
    processes on the file have them.
    """
    given = options or StoreOptions()
    try:
        check_passphrase(key)
        found = ask_owner(path, key, given, ops.STATUS)
        if found is None:
            return file_status_at_rest(path, key, given)
        if found.owner is not None:  # the owner counts the process asking: the others are shown
            found = replace(found, owner=replace(found.owner, clients=max(0, found.owner.clients - 1)))
        return found
    except WrongPassphraseError as exc:
        wrong = exc.came_from(KEY_ARGUMENT)
    finally:
        del key
    raise wrong from None


def repair_file(
    path: str | os.PathLike[str],
    key: str,
    *,
    from_backup: str | os.PathLike[str] | None = None,
    erasure_ledger: str | os.PathLike[str] | None = None,
    ledger_mirror: str | os.PathLike[str] | None = None,
    embedder: Any | None = None,
    argon2_profile: Argon2Profile | None = None,
    sync_mode: SyncMode | None = None,
) -> RepairReport:
    """Put a file refused for damage back in service without a backup, losing only what cannot be read.

    The damaged file and its companions are copied; the copy is rebuilt from every item that
    can still be read (Citadel deletes the rest), its layout record (salt) kept, verified, and
    only then moved into place, the damaged files moved aside (`RepairReport.aside`). The
    report names, per session, the items lost; every other session keeps every item. A file
    that is not damaged is left as it is. Refused while a process holds the file.

    `from_backup` also takes the damaged sessions' lost items from that backup: it is restored
    into a private directory with `erasure_ledger` (and `ledger_mirror`) replayed, as `restore`
    does, so nothing erased since comes back (None: the backup as it is); each damaged session
    is written again with its kept items and the backup's it lacks, in the order written. Every
    other session is left as the live file has it.
    """
    # The ledger in the options too: repair checks it reaches the damaged file's head first.
    options = StoreOptions.of(
        argon2_profile=argon2_profile,
        sync_mode=sync_mode,
        erasure_ledger=erasure_ledger,
        ledger_mirror=ledger_mirror,
    )
    notes: list[str] = []
    fill = None
    if from_backup is not None:
        ledgers = [None if name is None else os.fspath(name) for name in (erasure_ledger, ledger_mirror)]
        fill = _from_backup(os.fspath(from_backup), ledgers, resolve_embedder(embedder), options, notes)
    try:
        report = repair(
            path, check_passphrase(key), embedder=resolve_embedder(embedder), options=options, fill=fill
        )
        return replace(
            report, backup=None if from_backup is None else os.fspath(from_backup), notes=tuple(notes)
        )
    except WrongPassphraseError as exc:
        wrong = exc.came_from(KEY_ARGUMENT)
    finally:
        del key
    raise wrong from None


def _from_backup(
    backup: str, ledgers: list[str | None], embedder: Embedder, options: StoreOptions, notes: list[str]
) -> Fill:
    """`repair`'s fill: the backup restored beside the copy (the ledger replayed, required to reach
    the copy's head), then each damaged session written again whole (storage/repair.py, `refills`)."""

    def fill(copy: str, key: str, lost: list[SessionLoss]) -> dict[str, int]:
        keys = [key]
        del key  # only `keys` holds it, emptied on every path: error trackers record frames' locals
        try:
            found = _refills(copy, keys[0], lost, backup, ledgers, embedder, options, notes)
            with FileStore(
                copy, keys[0], embedder=embedder, create=False, serve=False, sync_mode=options.sync_mode
            ) as store:
                for refill in found:
                    items = [decode_item(text) for text in refill.items]
                    store.import_items(
                        refill.session_id, items, mode="replace", owner=refill.owner, labels=refill.labels
                    )
        finally:
            keys.clear()
        return {refill.loss: refill.taken for refill in found}

    return fill


def _refills(
    copy: str,
    key: str,
    lost: list[SessionLoss],
    backup: str,
    ledgers: list[str | None],
    embedder: Embedder,
    options: StoreOptions,
    notes: list[str],
) -> list[Refill]:
    """What the backup, restored beside the copy with the ledger replayed, holds of the sessions that
    lost items (storage/repair.py, `refills`); the sessions it cannot complete go to `notes`."""
    keys = [key]
    del key
    staged = os.path.join(os.path.dirname(copy), "backup", os.path.basename(copy))
    os.mkdir(os.path.dirname(staged), 0o700)
    try:
        repaired = local_file.LocalFile(copy, keys[0], embedder=embedder, options=options, create=False)
        try:
            replayed = restore(
                backup, staged, keys[0], ledger=ledgers[0], mirror=ledgers[1], at_least=repaired.ledger_head,
                embedder=embedder, options=options, replace=False,
            )  # fmt: skip
            notes.extend(replayed.ledger_notes)
            source = local_file.LocalFile(staged, keys[0], embedder=embedder, options=options, create=False)
            try:
                found, left = refills(repaired, source, lost)
            finally:
                source.release()
        finally:
            repaired.release()
    finally:
        keys.clear()
    notes.extend(left)
    return found


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
