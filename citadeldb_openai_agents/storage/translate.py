"""citadeldb's errors, turned into ours: the one place that knows how Citadel words its failures.

Each error names the file, the cause and the fix (errors.py). Citadel reports a
damaged key file as a wrong passphrase or an unsupported setting, and a damaged
audit log as a key-file mismatch; the wording and the files' headers (measured
on citadeldb 2.7.0) are read here to name the file at fault. Anything this module
does not recognise still becomes a `StorageError`: no citadeldb exception reaches
a caller.
"""

from __future__ import annotations

import os
import re

import citadeldb

from ..embedders.protocol import embedder_failed
from ..errors import (
    RUN_VERIFY,
    CitadelSessionError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    StorageError,
    WrongPassphraseError,
)
from .files import AUDIT_SUFFIX, COMPANION_SUFFIXES, page_layout
from .lockholder import find_lock_holder

# How citadeldb 2.7.0 reports an exception raised by the embedder it called.
CITADEL_EMBEDDER_FAILURE = "embedding backend error: "


def translate_open_error(exc: BaseException, path: str) -> BaseException:
    """Turn citadeldb's errors on open into ours, each naming the cause and the fix."""
    message = str(exc).lower()
    if isinstance(exc, CitadelSessionError):
        return exc
    if isinstance(exc, citadeldb.OperationalError) and "its database does not" in message:
        return DatabaseNotFoundError(
            f"{path} does not exist, but its companion files do: the database file was deleted "
            "or moved without them. Restore it from a backup, or move the companion files "
            f"({path}.citadel-*) aside to create a new database here."
        )
    damaged = _damaged_companion(exc, path)
    if damaged is not None:
        return damaged
    if isinstance(exc, citadeldb.IntegrityError) or (
        # A file shorter than Citadel's header: truncated, or not a Citadel file at all.
        isinstance(exc, citadeldb.OperationalError) and "fill whole buffer" in message
    ):
        return _corrupt(path, exc)
    if os.path.isdir(path):
        return DatabaseNotFoundError(
            f"{path} is a directory, not a Citadel file: pass the path of the database file "
            f"inside it (e.g. {os.path.join(path, 'agent.cdl')})."
        )
    missing = _missing_companions(path, COMPANION_SUFFIXES[:1])
    if missing:
        return companions_missing(path, missing)
    if isinstance(exc, citadeldb.EncryptionError):
        # Citadel cannot tell these apart: the key file decrypts nothing either way.
        # The public call that took the passphrase adds where it came from (errors.py).
        return WrongPassphraseError(
            f"wrong passphrase for {path}, or its key file {path}{COMPANION_SUFFIXES[0]} is "
            "damaged: together they do not decrypt this file.",
            f"; if it is right, restore {path}{COMPANION_SUFFIXES[0]}, with the database and its "
            "other companion files, from a backup. The files were left untouched.",
        )
    if isinstance(exc, citadeldb.OperationalError) and "locked" in message:
        return _locked(path)
    if isinstance(exc, (FileNotFoundError, citadeldb.CitadelError)) and (
        "no such file" in message or "not found" in message or "missing" in message
    ):
        return DatabaseNotFoundError(
            f"cannot open {path}: {exc}. A Citadel file comes with companion files "
            "(.citadel-keys, -regions, -atomkeys); restore them together from a backup."
        )
    if isinstance(exc, citadeldb.CitadelError):
        return _unrecognised(path, exc)
    return exc


# How citadeldb 2.7.0 words damage to the headers of the key file and the audit log, which it
# otherwise reports as a wrong passphrase, an unsupported format or a bad KDF setting.
_KEY_FILE_DAMAGE = (
    "invalid key file magic",
    "key file integrity check failed",
    "unsupported cipher",
    "argon2 time cost too high",
    "argon2 memory cost",
    "argon2 parallelism",
)

_AUDIT_MAGIC = "0x41554454"  # "AUDT", the audit log's magic number


def _locked(path: str) -> DatabaseLockedError:
    holder = find_lock_holder(path)
    who = "another process" if holder is None else f"another process, {holder}"
    # What to do about it depends on serving, which the caller (serving/shared_file.py) adds.
    return DatabaseLockedError(
        f"{path} is held by {who}: one process owns a Citadel file at a time.", holder=holder
    )


def _damaged_companion(exc: BaseException, path: str) -> CorruptDatabaseError | None:
    """Damage to the key file or the audit log, named; None for any other error."""
    message = str(exc).lower()
    keys, audit = path + COMPANION_SUFFIXES[0], path + AUDIT_SUFFIX
    restore = "Restore the database and all its companion files together from one backup."
    culprit = _header_at_fault(path, message)
    if culprit == keys or keys.lower() in message or any(sign in message for sign in _KEY_FILE_DAMAGE):
        return CorruptDatabaseError(
            f"the key file {keys} of {path} is damaged ({exc}); the passphrase is not the cause. {restore}"
        )
    if culprit == audit or audit.lower() in message or _AUDIT_MAGIC.lower() in message:
        return CorruptDatabaseError(
            f"the audit log {audit} of {path} is damaged ({exc}). {restore} To keep serving "
            "without the log's history instead, move the audit log aside: Citadel starts a new one."
        )
    if culprit is not None:
        return CorruptDatabaseError(f"{culprit}, a companion file of {path}, is damaged ({exc}). {restore}")
    if "file_id mismatch" in message or "unsupported format version" in message:
        return CorruptDatabaseError(
            f"the key file {keys} or the audit log {audit} of {path} is damaged, or comes from "
            f"another database ({exc}). {restore}"
        )
    return None


_FORMAT_VERSION = re.compile(r"unsupported format version: (\d+)")


def _header_at_fault(path: str, message: str) -> str | None:
    """The companion file whose header Citadel's error is about, when its words allow telling.

    citadeldb 2.7.0 reports a bad header field without naming the file. Every file
    starts with a 4-byte magic, a 4-byte little-endian format version and the 8-byte
    file id that the database file holds at offset 24 (measured): the file showing
    the version the error quotes, or another id, is the one.
    """
    version = _FORMAT_VERSION.search(message)
    if version is None and "file_id mismatch" not in message:
        return None
    try:
        with open(path, "rb") as database:
            file_id = database.read(32)[24:32]
    except OSError:
        return None
    for suffix in (*COMPANION_SUFFIXES, AUDIT_SUFFIX):
        try:
            with open(path + suffix, "rb") as companion:
                header = companion.read(16)
        except OSError:
            continue
        if version is not None and int.from_bytes(header[4:8], "little") == int(version.group(1)):
            return path + suffix
        if version is None and header[8:16] != file_id:
            return path + suffix
    return None


def _unrecognised(path: str, exc: BaseException) -> StorageError:
    return StorageError(
        f"Citadel failed on {path} ({type(exc).__name__}: {exc}).",
        "Run `python -m citadeldb_openai_agents verify`; if it reports damage, restore the file and "
        "its companion files from a backup, otherwise report this error with its message.",
    )


def translate_storage_error(exc: BaseException, path: str) -> BaseException:
    """Turn citadeldb's errors on a file in use into ours: damage, or a lost companion file.

    Citadel checks a page's MAC when it reads the page, so damage can surface on any
    read or write, long after the file opened; a missing ``-regions`` or ``-atomkeys``
    file surfaces as the first region or atom is touched.
    """
    if isinstance(exc, citadeldb.IntegrityError):
        return _corrupt(path, exc)
    if isinstance(exc, citadeldb.OperationalError) and str(exc).startswith(CITADEL_EMBEDDER_FAILURE):
        # Citadel calls the embedder itself only to re-embed a file, which is idempotent.
        return embedder_failed(
            None,
            str(exc)[len(CITADEL_EMBEDDER_FAILURE) :],
            "the call stopped there (a re-embedding finishes when run again)",
        )
    # Both read as "this region's keys are gone"; a fresh file lacks these files legitimately
    # only until its first region is created, which the layout does on the first open.
    missing = _missing_companions(path, COMPANION_SUFFIXES)
    if missing and isinstance(exc, (citadeldb.EncryptionError, citadeldb.DataError)):
        return companions_missing(path, missing)
    damaged = _damaged_companion(exc, path)
    if damaged is not None:
        return damaged
    if isinstance(exc, citadeldb.CitadelError):
        return _unrecognised(path, exc)
    return exc


def _corrupt(path: str, exc: BaseException) -> CorruptDatabaseError:
    layout = page_layout(path)  # a page Citadel names is given by its bytes, for an operator
    cause = str(exc) if layout is None else layout.named(str(exc))
    return CorruptDatabaseError(f"{path} is damaged or is not a Citadel database ({cause}).", RUN_VERIFY)


def _missing_companions(path: str, suffixes: tuple[str, ...]) -> list[str]:
    if not os.path.isfile(path):
        return []
    return [path + suffix for suffix in suffixes if not os.path.exists(path + suffix)]


def companions_missing(path: str, missing: list[str]) -> DatabaseNotFoundError:
    return DatabaseNotFoundError(
        f"cannot use {path}: its companion file{'s' if len(missing) > 1 else ''} "
        f"{', '.join(missing)} {'are' if len(missing) > 1 else 'is'} missing, and the data "
        "cannot be decrypted without it. Restore the file and all its companion files "
        "together from the same backup."
    )
