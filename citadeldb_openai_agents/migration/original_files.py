"""Sessions of the original package, citadeldb-openai-agents 2.x, brought into a store.

The source is read with Citadel's maintenance handle, without its embedder and without
starting its memory engine (storage/original_layout.py), then closed; each session is
imported with `store.import_items`, each item keeping its expiry, so a rerun resumes and
never duplicates. Erasing the source, when asked, comes only after every session reads back
from the target as it was read from the source.
"""

from __future__ import annotations

import os
from dataclasses import replace

from ..errors import ImportSourceError, SessionNotEmptyError, WrongPassphraseError
from ..options import check_passphrase
from ..results import ImportSummary, OriginalImportReport, Progress
from ..session import CitadelSessionStore
from ..storage.files import is_citadel_file, resolve_path
from ..storage.original_layout import OriginalSession, erase_region, region_reader
from ..storage.registry import inspect_file
from ..transfer.chunks import CHUNK, IMPORT_MODES, ImportMode, as_stored, plan
from .files import named


def import_original(
    store: CitadelSessionStore | None,
    source: str | os.PathLike[str],
    key: str,
    *,
    region: str | None = None,
    mode: ImportMode = "new",
    dry_run: bool = False,
    erase_source: bool = False,
    progress: Progress | None = None,
) -> OriginalImportReport:
    """Import every session of a file citadeldb-openai-agents 2.x wrote into `store`.

    Items arrive verbatim in the order the original package returns them (object keys sorted,
    as Citadel gives payloads back). An expired item is not imported; the others keep their
    expiry, and the store's own TTL applies too (the earlier wins). The store's embedder
    indexes them. The source is not written, save the audit entry Citadel appends on open.

    Args:
        store: The store; None only with `dry_run`, to plan against a file not made yet.
        key: The source file's passphrase (it may differ from the store's).
        region: The region to import; found by itself when the file has one.
        mode: As `CitadelSessionStore.import_items`; with "new", every session is checked
            before anything is written, and a rerun of a finished import writes nothing.
        dry_run: Plan only: each summary's `written` is what would be written, `refused` the
            sessions mode "new" refuses.
        erase_source: Once every session reads back from the store as read, forget every atom
            of the region in the source (expired ones too) and read back that none is left:
            `source_erasure` is the receipt.
        progress: Called with (items done, items) as the chunks are written.

    Raises:
        ImportSourceError: no such file, not a Citadel file, no region in the original
            layout (or several, and no `region`), damage, or the store's own file.
        WrongPassphraseError: `key` does not open the source.
        SessionNotEmptyError: mode "new" and sessions hold other items (each is named;
            nothing was written).
    """
    _check_arguments(store, mode, dry_run)
    try:
        path = _source_path(store, source)
        report, sessions = _read(path, key, region)
        report = _imported(store, report, sessions, mode, dry_run, progress)
        if erase_source and store is not None and not dry_run:
            _check_read_back(store, sessions)
            erasure = inspect_file(path, key, lambda db, at: erase_region(db, at, report.region))
            report = replace(report, source_erasure=erasure)
        return report
    finally:
        del key  # a failed frame's locals are recorded by error trackers


def _check_arguments(store: CitadelSessionStore | None, mode: str, dry_run: bool) -> None:
    if mode not in IMPORT_MODES:
        raise ValueError(f"mode must be one of {', '.join(IMPORT_MODES)}, not {mode!r}")
    if store is None and not dry_run:
        raise ValueError("store=None plans against an empty store: it needs dry_run=True")


def _read(path: str, key: str, region: str | None) -> tuple[OriginalImportReport, list[OriginalSession]]:
    """The source's sessions, and the report to be: its kind, region and expired items."""
    try:
        chosen, sessions, expired = inspect_file(path, check_passphrase(key), region_reader(region))
        kind = f"citadeldb-openai-agents 2.x, region {chosen!r}"
        return OriginalImportReport(path, kind, [], region=chosen, expired=expired), sessions
    except WrongPassphraseError as exc:
        wrong = exc.came_from("import_original's key= argument")
    finally:
        del key
    raise wrong from None


def _source_path(store: CitadelSessionStore | None, source: str | os.PathLike[str]) -> str:
    path = resolve_path(source)
    if not os.path.isfile(path):
        raise ImportSourceError(f"there is no file {path} to import; nothing was imported.")
    if not is_citadel_file(path):
        raise ImportSourceError(
            f"{path} is not a Citadel file; nothing was imported. `import` takes a file of "
            "citadeldb-openai-agents 2.x, an Agents SDK session file, or an export's JSON Lines."
        )
    if store is not None and path == resolve_path(store.path):
        raise ImportSourceError(
            f"{path} is the file being imported into; nothing was imported. Configure a new "
            "file (CITADEL_PATH, --create) and import the 2.x file into it."
        )
    return path


def _imported(
    store: CitadelSessionStore | None,
    report: OriginalImportReport,
    sessions: list[OriginalSession],
    mode: ImportMode,
    dry_run: bool,
    progress: Progress | None,
) -> OriginalImportReport:
    """Plan every session; then, unless a dry run or a refusal, import each in turn."""
    planned, refused = [], []
    for session in sessions:
        held = _held(store, session.session_id)
        chosen = plan(held, as_stored(session.items), mode, CHUNK, session.expires_at)
        if chosen.refused:
            refused.append(session.session_id)
        start = 0 if chosen.clear else chosen.start
        planned.append(
            ImportSummary(
                session.session_id, len(session.items), len(session.items) - start, start, chosen.clear
            )
        )
    if dry_run:
        return OriginalImportReport(
            **{**report.__dict__, "sessions": planned, "dry_run": True, "refused": refused}
        )
    assert store is not None  # import_original refuses None unless dry_run
    if refused:
        raise SessionNotEmptyError(
            f"{named(refused)} in {store.path} already hold{'s' * (len(refused) == 1)} other items than "
            "this import's; nothing was written. Add the import after them (--append), or erase them "
            "first (--replace)."
        )
    total, done, imported = sum(len(session.items) for session in sessions), 0, []
    for session in sessions:
        step = None if progress is None else _offset(progress, done, total)
        imported.append(
            store.import_items(
                session.session_id, session.items, mode=mode, progress=step, expires_at=session.expires_at
            )
        )
        done += len(session.items)
        if progress is not None:
            progress(done, total)
    return replace(report, sessions=imported)


def _check_read_back(store: CitadelSessionStore, sessions: list[OriginalSession]) -> None:
    """Every session ends with the items read from the source, before the source is erased."""
    short = []
    for session in sessions:
        held = _held(store, session.session_id)
        incoming = as_stored(session.items)
        if held[len(held) - len(incoming) :] != incoming:
            short.append(session.session_id)
    if short:
        raise ImportSourceError(
            f"{named(short)} did not read back from {store.path} as imported, so the source was not "
            "erased. Run `verify`, then the import again."
        )


def _held(store: CitadelSessionStore | None, session_id: str) -> list[str]:
    """The session's items in the store, as stored (none in a store to be made)."""
    if store is None or not store.summary(session_id):
        return []
    return as_stored(store.export(session_id))


def _offset(progress: Progress, before: int, total: int) -> Progress:
    return lambda done, _: progress(before + done, total)
