"""`import OLD.cdl`: a file citadeldb-openai-agents 2.x wrote, its passphrase, and the receipt.

The source's passphrase comes from --source-key-file, CITADEL_SOURCE_KEY_FILE or
CITADEL_SOURCE_KEY, or a prompt on a terminal: never from an argument, which every process
of the machine can read in /proc.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import sys
from datetime import datetime, timezone
from typing import Any

from .. import (
    CitadelSessionStore,
    DatabaseNotFoundError,
    OriginalImportReport,
    WrongPassphraseError,
    import_original,
)
from ..config import CitadelSettings, source_passphrase
from . import render
from .opening import Refused, open_store, warnings_printed

# What only an import of a 2.x file takes: given any, the source must be one.
ORIGINAL_OPTIONS = ("source_key_file", "source_region", "dry_run", "erase_source")


def wants_original(args: argparse.Namespace) -> bool:
    """Whether the command line asks for what only a 2.x file's import does."""
    return any(getattr(args, name) not in (None, False) for name in ORIGINAL_OPTIONS)


def dry_run(args: argparse.Namespace, settings: CitadelSettings) -> int:
    """`import OLD.cdl --dry-run`: planned against the target if it exists, else against nothing."""
    try:
        store = open_store(args, settings)
    except DatabaseNotFoundError as exc:
        if not exc.creation_refused:
            raise
        return import_2x(args, None, f"{settings.path} (not made yet: nothing is held there)")
    with store:
        return import_2x(args, store)


def import_2x(args: argparse.Namespace, store: CitadelSessionStore | None, target: str = "") -> int:
    """Import the 2.x file `args.source` into `store`, and print what came over (or would).

    `store` is None in a dry run against a target not made yet, which `target` describes.
    """
    if args.owner is not None or args.session_id is not None:
        raise Refused(
            "--owner and --session-id apply to SDK files and JSON Lines; a 2.x file is imported "
            "whole (set owners after with `owner set`); nothing was imported"
        )
    key, came_from = _source_key(args.source_key_file, args.source)
    wrong: WrongPassphraseError | None = None
    try:
        with render.progress_bar(
            "importing", enabled=not (args.json or args.dry_run), unit="item"
        ) as progress:
            report = import_original(
                store,
                args.source,
                key,
                region=args.source_region,
                mode=args.mode,
                dry_run=args.dry_run,
                erase_source=args.erase_source,
                progress=progress,
            )
    except WrongPassphraseError as exc:
        wrong = exc.came_from(came_from)
    finally:
        del key  # a failed frame's locals are recorded by error trackers
    if wrong is not None:
        raise wrong from None
    at = datetime.now(timezone.utc)
    target = target if store is None else store.path
    if args.json:
        render.print_json({**dataclasses.asdict(report), "database": target, "at": render.utc(at)})
    else:
        _print(target, report, at)
    return 0


def _source_key(key_file: str | None, source: str) -> tuple[str, str]:
    """The source file's passphrase and where it came from: the options, else a prompt."""
    try:
        with warnings_printed():
            given = source_passphrase(key_file)
    except ValueError as exc:
        raise Refused(f"{exc}; nothing was imported") from None
    if given is not None:
        return given
    if not sys.stdin.isatty():
        raise Refused(
            f"no passphrase for {source}: pass --source-key-file PATH, set CITADEL_SOURCE_KEY_FILE "
            "or CITADEL_SOURCE_KEY, or run on a terminal to be asked for it; nothing was imported"
        )
    try:
        return getpass.getpass(f"Passphrase of {source} (citadeldb-openai-agents 2.x): "), "the prompt"
    except (EOFError, KeyboardInterrupt):
        raise Refused("no passphrase given; nothing was imported") from None


def _print(path: str, report: OriginalImportReport, at: datetime) -> None:
    items = sum(session.items for session in report.sessions)
    verb = "would import" if report.dry_run else "imported"
    print(
        f"{'dry run, nothing was written: ' if report.dry_run else ''}{verb} "
        f"{render.count(len(report.sessions), 'session')}, {render.count(items, 'item')} from "
        f"{report.source} ({report.kind}) into {path}"
    )
    if report.expired:
        print(
            f"  {render.count(report.expired, 'item')} had expired and {'would not be' if report.dry_run else 'were not'} imported"
        )
    for session in report.sessions:
        print(f"  {render.shown_id(session.session_id)}: {_outcome(session, report)}")
    if not report.dry_run:
        if report.sessions and not report.written:
            print("every item was already here from an earlier run: nothing was written")
        if report.source_erasure is None:
            print(
                f"the source is unchanged: {report.source}. Once you have checked the import, erase it "
                "with the same command and --erase-source (Citadel's forget, read back), then delete its files."
            )
    if report.source_erasure is not None:
        _print_erasure(report, at)


def _outcome(session: Any, report: OriginalImportReport) -> str:
    items = render.count(session.items, "item")
    if session.session_id in report.refused:
        return f"{items}; refused: the session holds other items (--append or --replace)"
    if session.replaced:
        return f"{items}, replacing what the session held (keys destroyed)"
    if session.already_held and not session.written:
        return f"{items}, already imported: none {'would be' if report.dry_run else 'was'} written"
    if session.already_held:
        return f"{items}: {session.already_held} already imported, {session.written} new"
    return items


def _print_erasure(report: OriginalImportReport, at: datetime) -> None:
    erased = report.source_erasure
    assert erased is not None
    print(
        f"erased the source's region {erased.region!r} after the import read back whole: "
        f"{render.count(erased.atoms, 'atom')} ({erased.expired} of them expired), each atom's key destroyed "
        f"({erased.algorithm}), read back: none left; at {render.utc(at)}"
    )
