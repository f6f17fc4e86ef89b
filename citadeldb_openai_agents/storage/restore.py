"""Putting a backup in place, with the erasures made since it was taken made again."""

from __future__ import annotations

import os
import shutil
from contextlib import suppress

from ..embedders.protocol import Embedder
from ..errors import (
    BackupExistsError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    WrongPassphraseError,
)
from ..options import StoreOptions
from ..results import RestoreReport
from .files import COMPANION_SUFFIXES, database_files, resolve_path
from .local_file import LocalFile
from .lockholder import find_lock_holder


def restore(
    backup: str | os.PathLike[str],
    path: str | os.PathLike[str],
    key: str,
    *,
    ledger: str | None,
    embedder: Embedder,
    options: StoreOptions,
    replace: bool,
) -> RestoreReport:
    """Copy `backup` beside `path`, erase there what `ledger` names, verify it, then move it in.

    Nothing at `path` changes until the copy is verified: a wrong passphrase, a damaged
    backup or an untrustworthy ledger leaves it as it was.
    """
    keys = [key]
    del key  # only `keys` holds it, emptied at the open: error trackers record frames' locals
    source, target = resolve_path(backup), resolve_path(path)  # the file a store on `path` opens
    _check_target(source, target, replace)
    staged = f"{target}.restoring-{os.getpid()}"
    try:
        for name, copy in zip(database_files(source), database_files(staged), strict=True):
            if os.path.isfile(name):
                _private_copy(name, copy)
        local = _open_staged(staged, keys.pop(), source, target, embedder, options)
        try:
            entries = [] if ledger is None else local.ledger_entries(ledger)
            erased = local.replay(entries)
            report = local.verify()
            sessions = len(local.session_ids())
        finally:
            local.release()
        if not report.ok:
            raise CorruptDatabaseError(
                f"the backup {source} does not verify ({'; '.join(report.findings) or 'damaged items or pages'}); "
                f"{target} was not changed."
            )
        for name, copy in zip(database_files(staged), database_files(target), strict=True):
            if os.path.exists(name):
                os.replace(name, copy)
            else:
                with suppress(FileNotFoundError):
                    os.remove(copy)  # a companion the backup has not must not stay beside it
    finally:
        keys.clear()
        for name in database_files(staged):
            with suppress(FileNotFoundError):
                os.remove(name)
    return RestoreReport(target, source, sessions, len(entries), erased, ledger)


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


def _private_copy(source: str, target: str) -> None:
    """A 0600 copy at a new name (never through a symlink)."""
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with open(source, "rb") as reading, os.fdopen(descriptor, "wb") as writing:
        shutil.copyfileobj(reading, writing, 1 << 20)
        writing.flush()
        os.fsync(writing.fileno())
