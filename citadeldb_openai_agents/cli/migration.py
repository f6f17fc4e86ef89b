"""`export` and `import`: a user's sessions leaving the file, verbatim, and arriving from the
Agents SDK's files or from an export (the library's migration/ does the work)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from .. import export_all, export_sqlite, import_file, restore_sessions
from ..config import build_embedder
from ..errors import OriginalSourceError
from ..people import check_owner
from ..results import ExportSummary, SessionsRestoreReport
from . import original, owners, receipts, render
from .opening import Refused, open_new_or_existing, open_store, settings_of, usage, warnings_printed


def export(args: argparse.Namespace) -> int:
    """`export SESSION_ID... | --all` with `--out PATH` and `--format jsonl|sqlite`.

    A positional argument is a session id whatever the format, the destination comes from
    --out alone, and every session only from --all: an access request for one person must
    never be answered with everyone's history by a misplaced argument.
    """
    _check_export_arguments(args)
    shards = None if args.owner is None else owners.fleet(args)
    if shards is not None:
        return owners.fleet_export(args, shards)
    session_ids = None if args.every_session or args.owner else list(args.session_ids)
    if args.format == "jsonl" and session_ids is not None and len(session_ids) == 1:
        return _export_one(args, session_ids[0])
    with open_store(args) as store, render.progress_bar("exporting", enabled=not args.json) as progress:
        if args.format == "sqlite":
            summary = export_sqlite(store, args.out, session_ids, progress=progress)
        else:
            summary = export_all(store, args.out, session_ids, owner=args.owner, progress=progress)
        path = store.path
    if args.json:
        render.print_json(render.export_dict(path, summary))
    else:
        render.print_export(path, summary)
    return 0


def _check_export_arguments(args: argparse.Namespace) -> None:
    """Exit 2, before the file is opened, for any export whose sessions or destination are unclear."""
    if args.format == "sqlite" and args.out is None:
        # In 0.1.0 the first argument was the new file: `export user-123 --format sqlite`
        # wrote every session to a file named user-123. Now the same words write nothing.
        usage(
            "export --format sqlite writes the new file --out names, and every other argument is a "
            "session id: export --format sqlite --out DEST.db SESSION_ID... (every session: --all "
            "instead of the ids). Nothing was written."
        )
    if args.owner is not None:
        check_owner(args.owner, "--owner")
        if args.session_ids or args.every_session or args.format != "jsonl" or args.out is None:
            usage(
                "an access request is exported alone, as JSON Lines, into a new directory: "
                "export --owner X --out DIR (no session ids, no --all, no --format sqlite). "
                "Nothing was written."
            )
        return
    if args.every_session and args.session_ids:
        usage(
            "--all exports every session: give session ids or --all, not both (a directory is given "
            "with --out: export --all --out DIR). Nothing was written."
        )
    if not args.every_session and not args.session_ids:
        usage("name the sessions to export, or --all for every session (with --out)")
    if args.format == "jsonl" and (args.every_session or len(args.session_ids) > 1) and args.out is None:
        usage(
            "several sessions are written one JSON Lines file each, with an index.json: "
            "give the new directory with --out DIR"
        )


def _export_one(args: argparse.Namespace, session_id: str) -> int:
    """One session as JSON Lines: on stdout, or in the new file --out names."""
    with (
        open_store(args) as store,
        render.progress_bar("exporting", enabled=True, unit="segment") as progress,
    ):
        items = store.export(session_id, progress=progress)
        path = store.path
    data = render.json_lines(items)
    if args.out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    out = Path(args.out).expanduser().absolute()
    try:
        # A transcript is personal data: only its owner reads it, and no file is replaced.
        descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise Refused(
            f"refusing to overwrite {out}: choose a new file (an export never replaces one)"
        ) from None
    with open(descriptor, "wb") as file:
        file.write(data)
    if args.json:
        render.print_json(render.export_dict(path, ExportSummary(str(out), {session_id: len(items)})))
    else:
        print(f"exported {render.count(len(items), 'item')} of session {session_id!r} to {out}")
    return 0


def import_(args: argparse.Namespace) -> int:
    if args.owner is not None:
        check_owner(args.owner, "--owner")
    settings = settings_of(args)
    if args.dry_run:  # writes nothing, so it never creates the target: a missing one plans as empty
        return original.dry_run(args, settings)
    with open_new_or_existing(args, settings) as store:
        if original.wants_original(args):
            return original.import_2x(args, store)
        try:
            with render.progress_bar("importing", enabled=not args.json, unit="item") as progress:
                report = import_file(
                    store,
                    args.source,
                    session_id=args.session_id,
                    sessions_table=args.sessions_table,
                    messages_table=args.messages_table,
                    mode=args.mode,
                    owner=args.owner,
                    progress=progress,
                )
        except OriginalSourceError:  # a Citadel file: citadeldb-openai-agents 2.x's, read with its passphrase
            return original.import_2x(args, store)
        path = store.path
    if args.json:
        render.print_json(render.import_dict(path, report))
    else:
        render.print_import(path, report)
    return 0


def restore_some(args: argparse.Namespace) -> int:
    """`restore BACKUP --session ID... | --owner X`: those sessions back into the live file."""
    if args.restore_ids and args.owner is not None:
        usage("restore takes --session IDs or --owner, not both; nothing was restored")
    if args.owner is not None:
        check_owner(args.owner, "--owner")
    settings = settings_of(args)
    with warnings_printed(), open_store(args, settings) as store:
        report = restore_sessions(
            store,
            args.backup,
            settings.key.get_secret_value(),
            session_ids=args.restore_ids,
            owner=args.owner,
            replace=args.replace,
            without_ledger=args.without_ledger,
            embedder=build_embedder(settings),
        )
    restored_at = datetime.now(timezone.utc)
    if args.json:
        render.print_json(
            {
                **dataclasses.asdict(report),
                "restored": [receipts.move_dict(moved, restored_at) for moved in report.restored],
                "replaced": {
                    sid: receipts.receipt_dict(sid, erasure, report.path, restored_at)
                    for sid, erasure in report.replaced.items()
                },
            }
        )
        return 0
    _print_restored(report, restored_at)
    return 0


def _print_restored(report: SessionsRestoreReport, restored_at: datetime) -> None:
    items = sum(moved.items for moved in report.restored)
    print(
        f"restored {render.count(len(report.restored), 'session')}, {render.count(items, 'item')} from "
        f"{report.backup} into {report.path}; every other session is as it was"
    )
    for moved in report.restored:
        erased = report.erased.get(moved.session_id, 0)
        since = f" ({render.count(erased, 'item')} erased since the backup stay erased)" if erased else ""
        print(f"  {render.shown_id(moved.session_id)}: {render.count(moved.items, 'item')}{since}")
    for session_id, why in report.skipped.items():
        print(f"  skipped {render.shown_id(session_id)}: {why}")
    for session_id, erasure in report.replaced.items():
        print(f"replaced the live session {render.shown_id(session_id)}:")
        receipts.print_receipt(session_id, erasure, report.path, restored_at)
    if report.ledger is None:
        print("no erasure ledger was replayed: what was erased from these sessions since the backup is back.")
