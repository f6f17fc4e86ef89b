"""Putting a backup in place, with the erasures made since it was taken made again."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import suppress

from ..embedders.protocol import Embedder
from ..errors import (
    BackupExistsError,
    CitadelSessionError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    WrongPassphraseError,
)
from ..options import StoreOptions
from ..results import RestoreReport
from .erasure_notes import later
from .files import COMPANION_SUFFIXES, database_files, resolve_path
from .ledger import LedgerEntry, LedgerHead
from .local_file import LocalFile
from .lockholder import find_lock_holder


def restore(
    backup: str | os.PathLike[str],
    path: str | os.PathLike[str],
    key: str,
    *,
    ledger: str | None,
    mirror: str | None = None,
    at_least: LedgerHead | None = None,
    embedder: Embedder,
    options: StoreOptions,
    replace: bool,
) -> RestoreReport:
    """Copy `backup` beside `path`, erase there what `ledger` (and `mirror`) names, verify it,
    then move it in.

    Nothing at `path` changes until the copy is verified: a wrong passphrase, a damaged
    backup or an untrustworthy ledger leaves it as it was. The ledger must reach the head the
    backup recorded and the one the file at `path` records (when it opens): a ledger cut short
    since would let an erasure come back.
    """
    keys = [key]
    del key  # only `keys` holds it, emptied at the open: error trackers record frames' locals
    source, target = resolve_path(backup), resolve_path(path)  # the file a store on `path` opens
    _check_target(source, target, replace)
    # `at_least`: the caller holds the live file's head (repair's copy of it): no file to ask.
    asked = ledger is not None and at_least is None
    live_head, notes = _live_head(target, keys[0], embedder, options) if asked else (None, [])
    live_head = later(live_head, at_least)
    # A private directory no one can predict or plant a link in (a fixed name gave a raw EEXIST).
    work = tempfile.mkdtemp(prefix=".restoring-", dir=os.path.dirname(target))
    staged = os.path.join(work, os.path.basename(target))
    try:
        copy_files(source, staged)
        local = _open_staged(staged, keys.pop(), source, target, embedder, options)
        try:
            entries, erased = _replay(local, ledger, mirror, live_head, notes)
            report = local.verify()
            sessions = len(local.session_ids())
        finally:
            local.release()
        if not report.ok:
            raise CorruptDatabaseError(
                f"the backup {source} does not verify ({'; '.join(report.findings) or 'damaged items or pages'}); "
                f"{target} was not changed."
            )
        move_in(staged, target)
    finally:
        keys.clear()
        shutil.rmtree(work, ignore_errors=True)
    return RestoreReport(target, source, sessions, len(entries), erased, ledger, tuple(notes))


def copy_files(source: str, target: str) -> None:
    """Private copies of the file `source` and each companion it has, at `target`'s names."""
    for name, copy in zip(database_files(source), database_files(target), strict=True):
        if os.path.isfile(name):
            private_copy(name, copy)


def move_in(staged: str, target: str) -> None:
    """`staged`'s files over `target`'s, each renamed; a companion `staged` has not is removed."""
    for name, copy in zip(database_files(staged), database_files(target), strict=True):
        if os.path.exists(name):
            os.replace(name, copy)
        else:
            with suppress(FileNotFoundError):
                os.remove(copy)  # a companion the backup has not must not stay beside it


def _replay(
    local: LocalFile, ledger: str | None, mirror: str | None, live_head: LedgerHead | None, notes: list[str]
) -> tuple[list[LedgerEntry], dict[str, int]]:
    """Erase in the backup's copy what the ledger names (its entries, and the items per session)."""
    if ledger is None:
        return [], {}
    reading = local.ledger_reading(ledger, mirror, at_least=live_head)
    erased = local.replay(reading.entries)
    # The copy's head is the ledger's now: cutting what this restore replayed shows later.
    local.adopt_ledger_head(reading.head)
    notes += [f"erasure ledger: {note}" for note in reading.disagreements]
    return reading.entries, erased


def _live_head(
    target: str, key: str, embedder: Embedder, options: StoreOptions
) -> tuple[LedgerHead | None, list[str]]:
    """The ledger head the file being replaced records, so the ledger must reach it; None when
    there is no file or it does not open (damaged, another passphrase): said in the report, as
    then only the backup's head and the ledger's copies (a mirror) stand against a cut ledger."""
    if not os.path.isfile(target):
        # Said as for a file that does not open: a deleted file takes its head with it (issue 59).
        return None, [
            f"there is no file at {target}, so the ledger was checked against the backup's head and "
            "its own copies only (docs/reliability.md: what the mirror is for)"
        ]
    try:
        live = LocalFile(target, key, embedder=embedder, options=options, create=False)
    except CitadelSessionError as exc:
        cause = type(exc).__name__
        return None, [
            f"{target} did not open ({cause}), so the ledger was checked against the backup's head and "
            "its own copies only (docs/reliability.md: what the mirror is for)"
        ]
    finally:
        del key
    try:
        return live.ledger_head, []
    finally:
        live.release()


def _open_staged(
    staged: str, key: str, source: str, target: str, embedder: Embedder, options: StoreOptions
) -> LocalFile:
    """The backup's copy, opened; a passphrase it refuses is told as the backup's, not the copy's."""
    try:
        return LocalFile(staged, key, embedder=embedder, options=options, create=False)
    except WrongPassphraseError:
        wrong = _backup_refuses_passphrase(source, target)
    finally:
        del key
    raise wrong from None


def _backup_refuses_passphrase(source: str, target: str) -> WrongPassphraseError:
    # In a restore the likeliest cause is a passphrase changed since the backup was taken.
    return WrongPassphraseError(
        f"wrong passphrase for the backup {source}, or its key file {source}{COMPANION_SUFFIXES[0]} "
        "is damaged: together they do not decrypt it.",
        f": a backup opens only with the passphrase of when it was taken, which a later rotate-key "
        f"does not change. {target} was not changed.",
    )


def _check_target(source: str, target: str, replace: bool) -> None:
    """A backup that is there; a target no process holds, replaced only when asked."""
    if not os.path.isfile(source):
        raise DatabaseNotFoundError(f"there is no backup at {source}: give the path `backup` wrote.")
    holder = find_lock_holder(target)
    if holder is not None:
        raise DatabaseLockedError(
            f"{target} is open in PID {holder.pid}: stop the service before restoring over its file."
        )
    if any(os.path.lexists(name) for name in database_files(target)) and not replace:
        raise BackupExistsError(
            f"{target} exists: restoring replaces it and whatever was written since the backup. "
            "Pass replace=True (--replace) to do that."
        )


def private_copy(source: str, target: str) -> None:
    """A 0600 copy at a new name (never through a symlink)."""
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with open(source, "rb") as reading, os.fdopen(descriptor, "wb") as writing:
        shutil.copyfileobj(reading, writing, 1 << 20)
        writing.flush()
        os.fsync(writing.fileno())
