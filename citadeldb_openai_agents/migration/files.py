"""The import and export calls the operator commands make, each on an open store.

`import_file` reads an SDK session file or an exported JSON Lines file and imports each
session with `store.import_items`; `export_sqlite` and `export_all` write sessions out,
through `store.export`, as the SDK's SQLite file or as one JSON Lines file per session.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import (
    ImportSourceError,
    OriginalSourceError,
    OwnerMismatchError,
    OwnerNotFoundError,
    SessionNotEmptyError,
    SessionNotFoundError,
)
from ..people import check_owner
from ..results import ExportSummary, ImportReport, ImportSummary, Progress, SessionExport, SessionSummary
from ..session import CitadelSessionStore
from ..storage.files import is_citadel_file
from ..transfer.chunks import CHUNK, IMPORT_MODES, ImportMode, as_stored, plan
from .jsonl import JsonlSource, write_session_files
from .sdk_files import write_sqlite_file
from .sdk_schema import MESSAGES_TABLE, SESSIONS_TABLE
from .sdk_source import SqliteSource, is_sqlite


def import_file(
    store: CitadelSessionStore,
    source: str | os.PathLike[str],
    *,
    session_id: str | None = None,
    sessions_table: str = SESSIONS_TABLE,
    messages_table: str = MESSAGES_TABLE,
    mode: ImportMode = "new",
    owner: str | None = None,
    progress: Progress | None = None,
) -> ImportReport:
    """Import every session of an SDK session file, or a JSON Lines file, into `store`.

    Args:
        source: An `agents.SQLiteSession` or `AdvancedSQLiteSession` file (read-only), or a
            JSON Lines file as ``export`` writes it (then `session_id` names its session).
        session_id: For a JSON Lines file, the session it holds; for an SDK file, the one
            session to import (default: all).
        mode: As `CitadelSessionStore.import_items`. With "new", every session is checked
            before anything is written.
        owner: The owner to record for every imported session. A file that `export --format
            sqlite` wrote carries each session's owner and labels, and they are recorded
            without it; an owner given here must then agree with the file's.
        progress: Called with (items done, items) as the chunks are written.

    Raises:
        ImportSourceError: the source cannot be read, or records another owner than `owner`
            (nothing was imported).
        SessionNotEmptyError: mode "new" and sessions hold other items (each is named;
            nothing was written).
        OwnerMismatchError: sessions in `store` belong to other owners than the import's
            (each is named; nothing was written).
    """
    if mode not in IMPORT_MODES:
        raise ValueError(f"mode must be one of {', '.join(IMPORT_MODES)}, not {mode!r}")
    owner = None if owner is None else check_owner(owner, "import's owner")
    reader = _open_source(source, session_id, sessions_table, messages_table)
    try:
        chosen = [(sid, count) for sid, count in reader.sessions() if session_id in (None, sid)]
        if session_id is not None and not chosen:
            raise ImportSourceError(f"{reader.path} holds no session {session_id!r}; nothing was imported.")
        if isinstance(reader, SqliteSource):
            reader.check([sid for sid, _ in chosen])  # every row read first: whole, or nothing written
        people = _owners(store, reader, [sid for sid, _ in chosen], owner)
        if mode == "new":
            _refuse_occupied(store, reader, [sid for sid, _ in chosen])
        imported = _import_sessions(store, reader, chosen, people, mode, progress)
        return ImportReport(reader.path, reader.kind, imported, reader.skipped)
    finally:
        reader.close()


def _import_sessions(
    store: CitadelSessionStore,
    reader: SqliteSource | JsonlSource,
    chosen: list[tuple[str, int]],
    people: dict[str, tuple[str | None, dict[str, Any] | None]],
    mode: ImportMode,
    progress: Progress | None,
) -> list[ImportSummary]:
    """Each chosen session in turn, with its owner and labels (an SDK file's branches and usage too)."""
    total, done = sum(count for _, count in chosen), 0
    imported: list[ImportSummary] = []
    for sid, count in chosen:
        step = None if progress is None else _offset(progress, done, total)
        whose, labels = people.get(sid, (None, None))
        summary = store.import_items(
            sid, reader.items(sid), mode=mode, progress=step, owner=whose, labels=labels
        )
        summary = dataclasses.replace(summary, owner=whose)
        if isinstance(reader, SqliteSource):
            branches, turns = _import_branches(store, reader, sid)
            summary = dataclasses.replace(summary, branches=branches, usage_turns=turns)
        imported.append(summary)
        done += count
        if progress is not None:
            progress(done, total)
    return imported


def _owners(
    store: CitadelSessionStore, reader: SqliteSource | JsonlSource, ids: list[str], owner: str | None
) -> dict[str, tuple[str | None, dict[str, Any] | None]]:
    """Each session's owner and labels as the import records them (the source's, else `owner`),
    every one checked against the source and the store before anything is written."""
    recorded = reader.about() if isinstance(reader, SqliteSource) else {}
    people = {sid: recorded.get(sid, (None, None)) for sid in ids}
    disagree = [sid for sid, (whose, _) in people.items() if owner is not None and whose not in (None, owner)]
    if disagree:
        raise ImportSourceError(
            f"{reader.path} records another owner than the one given for {named(disagree)}; nothing "
            "was imported. Leave the owner out to keep the file's, or import those sessions apart."
        )
    people = {sid: (owner if whose is None else whose, labels) for sid, (whose, labels) in people.items()}
    taken = []
    for sid, (whose, _) in people.items():
        summary = None if whose is None else store.summary(sid)
        if summary is not None and summary.owner not in (None, whose):
            taken.append(sid)
    if taken:
        raise OwnerMismatchError(
            f"{named(taken)} in {store.path} belong{'s' if len(taken) == 1 else ''} to another owner "
            "than the import's; nothing was written. An owner changes only explicitly (owner set)."
        )
    return people


def named(ids: list[str]) -> str:
    """Session ids as an error names them: the first five, quoted."""
    return f"session{'s' if len(ids) > 1 else ''} {', '.join(map(repr, ids[:5]))}{' ...' if len(ids) > 5 else ''}"


def _import_branches(store: CitadelSessionStore, reader: SqliteSource, session_id: str) -> tuple[int, int]:
    """An AdvancedSQLiteSession's other branches and its usage, after its main branch: how many
    branches, and turns with usage."""
    branches = reader.other_branches(session_id)
    for branch, items in branches.items():
        store.import_items(session_id, items, mode="append", branch=branch)
    names = reader.used_branch_names(session_id)
    usage = reader.usage(session_id)
    turns = store.import_usage(session_id, usage, branch_names=names) if names or usage else 0
    return len(branches), turns


def export_sqlite(
    store: CitadelSessionStore,
    destination: str | os.PathLike[str],
    session_ids: list[str] | None = None,
    *,
    progress: Progress | None = None,
) -> ExportSummary:
    """Write sessions (default: every one) to a new file that `agents.SQLiteSession` reads as its own.

    The file gets the SDK's schema and default table names, mode 600; an existing one is
    never replaced. `progress(sessions done, sessions)` after each session.

    Raises:
        ExportExistsError: `destination` exists; nothing was written.
        SessionNotFoundError: a named session holds no live item; nothing was written.
    """
    summaries = store.sessions() if session_ids is None else _named(store, session_ids)
    counts: dict[str, int] = {}

    def sessions() -> Iterator[tuple[SessionExport, SessionSummary]]:
        for done, summary in enumerate(summaries, 1):
            session = store.export_session(summary.session_id)
            counts[summary.session_id] = len(session.items)
            yield session, summary
            if progress is not None:
                progress(done, len(summaries))

    write_sqlite_file(destination, sessions())
    return ExportSummary(str(Path(destination).expanduser().absolute()), counts)


def export_all(
    store: CitadelSessionStore,
    directory: str | os.PathLike[str],
    session_ids: list[str] | None = None,
    *,
    owner: str | None = None,
    progress: Progress | None = None,
) -> ExportSummary:
    """Write each session (default: every one; with `owner`, every one of that person: an access
    request) to its own JSON Lines file in `directory`, mode 600.

    File names are safe whatever the id (jsonl.py); ``index.json`` maps them to the ids, with
    each session's owner, first and last write and item count. Every target is checked first:
    if one exists, nothing is written.

    Raises:
        ExportExistsError: a target file exists; nothing was written.
        SessionNotFoundError: a named session holds no live item; nothing was written.
        OwnerNotFoundError: the file holds no session of `owner`; nothing was written.
    """
    if owner is not None and session_ids is not None:
        raise ValueError("export_all takes session_ids or owner, not both")
    if owner is not None:
        summaries = store.sessions(owner=owner)
        if not summaries:
            raise OwnerNotFoundError(f"{store.path} holds no session of this owner; nothing was exported.")
    else:
        summaries = store.sessions() if session_ids is None else _named(store, session_ids)
    about = {summary.session_id: summary for summary in summaries}
    return _written(
        directory, write_session_files(directory, list(about), store.export_session, progress, about)
    )


def export_fleet(
    stores: Mapping[str, CitadelSessionStore],
    directory: str | os.PathLike[str],
    *,
    owner: str,
    progress: Progress | None = None,
) -> ExportSummary:
    """An access request on a fleet: every session of `owner` on each shard (`stores`: each
    shard's open store, by shard name), in one `directory` as `export_all` writes one file's;
    each index entry names its session's shard. Every shard is listed before anything is
    written. A session found whole on two shards (a move killed between its copy and its
    erase) is written once, from the first shard named.

    Raises:
        OwnerNotFoundError: no shard holds a session of `owner`; nothing was written.
        ExportExistsError: a target file exists; nothing was written.
    """
    owner = check_owner(owner, "export_fleet's owner=")
    found: dict[str, tuple[str, CitadelSessionStore, SessionSummary]] = {}
    for name, store in stores.items():
        for summary in store.sessions(owner=owner):
            found.setdefault(summary.session_id, (name, store, summary))
    if not found:
        raise OwnerNotFoundError(
            f"no shard of the fleet ({', '.join(stores)}) holds a session of this owner; nothing was exported."
        )
    written = write_session_files(
        directory,
        list(found),
        lambda sid: found[sid][1].export_session(sid),
        progress,
        {sid: summary for sid, (_, _, summary) in found.items()},
        {sid: name for sid, (name, _, _) in found.items()},
    )
    return _written(directory, written)


def _written(directory: str | os.PathLike[str], written: dict[str, tuple[str, int]]) -> ExportSummary:
    """What `write_session_files` wrote, as the export's summary."""
    return ExportSummary(
        str(Path(directory).expanduser().absolute()),
        {sid: count for sid, (_, count) in written.items()},
        {sid: name for sid, (name, _) in written.items()},
    )


def _open_source(
    source: str | os.PathLike[str], session_id: str | None, sessions_table: str, messages_table: str
) -> SqliteSource | JsonlSource:
    if not os.path.isfile(source):
        raise ImportSourceError(
            f"there is no file {os.path.abspath(source)} to import; nothing was imported."
        )
    if is_citadel_file(source):
        raise OriginalSourceError(
            f"{os.path.abspath(source)} is a Citadel file: one that citadeldb-openai-agents 2.x wrote "
            "is imported with import_original(store, source, key), which takes its passphrase."
        )
    if is_sqlite(source):
        return SqliteSource(source, sessions_table=sessions_table, messages_table=messages_table)
    if session_id is None:
        raise ImportSourceError(
            f"{os.path.abspath(source)} is not a SQLite file, so it is read as JSON Lines, which hold "
            "one session's items: name that session with --session-id (session_id=)."
        )
    return JsonlSource(source, session_id)


def _refuse_occupied(store: CitadelSessionStore, reader: SqliteSource | JsonlSource, ids: list[str]) -> None:
    """Mode "new": every target session is empty, or holds this very import's first chunks."""
    occupied = []
    for sid in ids:
        if store.summary(sid) is None:
            continue
        held, incoming = as_stored(store.export(sid)), as_stored(reader.items(sid))
        if plan(held, incoming, "new", CHUNK).refused:
            occupied.append(sid)
    if occupied:
        raise SessionNotEmptyError(
            f"{len(occupied)} session{'s' if len(occupied) > 1 else ''} in {store.path} already "
            f"hold{'s' if len(occupied) == 1 else ''} other items: {', '.join(map(repr, occupied[:5]))}"
            f"{' ...' if len(occupied) > 5 else ''}; nothing was written. Add the import after them "
            "(--append), or erase them first (--replace)."
        )


def _named(store: CitadelSessionStore, session_ids: list[str]) -> list[Any]:
    found = {sid: store.summary(sid) for sid in dict.fromkeys(session_ids)}
    unknown = [sid for sid, summary in found.items() if summary is None]
    if unknown:
        raise SessionNotFoundError(
            f"no session {', '.join(map(repr, unknown))} with live items in {store.path}; nothing was "
            "exported. `python -m citadeldb_openai_agents sessions` lists them."
        )
    return list(found.values())


def _offset(progress: Progress, before: int, total: int) -> Progress:
    return lambda done, _: progress(before + done, total)
