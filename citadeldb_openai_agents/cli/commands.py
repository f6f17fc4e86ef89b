"""The commands: each opens the configured store, calls the one library method it is named
after, and prints the result (render.py). The rules live in the library, so a script
gets the same behaviour as the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from .. import (
    CitadelSessionStore,
    CorruptDatabaseError,
    DatabaseNotFoundError,
    export_all,
    export_sqlite,
    import_file,
)
from ..config import (
    CitadelSettings,
    check_configuration,
    configuration_warnings,
    database_files,
    from_config,
    load_settings,
    new_passphrase,
    open_existing_store,
    reembed_from_config,
    restore_from_config,
    verify_from_config,
)
from ..options import DEFAULT_SYNC_MODE
from ..results import ExportSummary
from ..storage.files import resolve_path
from ..storage.inspection import page_layout
from . import receipts, render


class Refused(Exception):
    """The command itself declines to run (no confirmation, no new passphrase, ...)."""


def demo(args: argparse.Namespace) -> int:
    from .. import demo as scripted  # loads the Agents SDK, which no other command needs

    if args.step:
        scripted.run_step(args.step, Path(args.file))
        return 0
    return scripted.main(args.dir)


def check(args: argparse.Namespace) -> int:
    report = check_configuration(args.config, open_database=not args.no_open)
    if args.json:
        render.print_json(report.to_dict())
    else:
        render.print_check_report(report)
    return 0 if report.ok else 1


_UNSET_PROFILE = "unset (Citadel's default)"


def init(args: argparse.Namespace) -> int:
    """Create the database the configuration names (a deploy's first step); verify one that exists."""
    settings = _settings(args)
    existed = os.path.exists(settings.path)
    with _open(args, settings.model_copy(update={"create": True}), create=True) as store:
        path, identity, served_by = store.path, store.embedder_identity, store.served_by
    if args.json:
        files = (
            {}
            if existed
            else {os.path.basename(f): f"{os.stat(f).st_mode & 0o777:o}" for f in database_files(path)}
        )
        render.print_json(
            {
                "database": path,
                "created": not existed,
                "served_by": served_by,
                "files": dict(sorted(files.items())),
                "argon2_profile": settings.argon2_profile,
                "sync_mode": settings.sync_mode or DEFAULT_SYNC_MODE,
                "embedder": render.describe_embedder(identity),
            }
        )
        return 0
    if existed:
        holder = f"; process {served_by} holds it and serves it" if served_by is not None else ""
        print(f"{path} exists already: nothing was created, the passphrase opens it{holder}")
        return 0
    print(f"created {path}")
    for made in sorted(database_files(path)):
        print(f"  {os.path.basename(made):<34} mode {os.stat(made).st_mode & 0o777:o}")
    print(f"  argon2 profile: {settings.argon2_profile or _UNSET_PROFILE}")
    print(f"  sync mode:      {settings.sync_mode or DEFAULT_SYNC_MODE + ' (the default)'}")
    print(f"  embedder:       {render.describe_embedder(identity)}")
    return 0


def sessions(args: argparse.Namespace) -> int:
    with _open(args) as store:
        summaries = store.sessions()
        path = store.path
    if args.json:
        render.print_json([render.summary_dict(summary) for summary in summaries])
    else:
        render.print_sessions(path, summaries)
    return 0


def export(args: argparse.Namespace) -> int:
    """`export SESSION_ID... | --all` with `--out PATH` and `--format jsonl|sqlite`.

    A positional argument is a session id whatever the format, the destination comes from
    --out alone, and every session only from --all: an access request for one person must
    never be answered with everyone's history by a misplaced argument.
    """
    _check_export_arguments(args)
    session_ids = None if args.every_session else list(args.session_ids)
    if args.format == "jsonl" and session_ids is not None and len(session_ids) == 1:
        return _export_one(args, session_ids[0])
    with _open(args) as store, render.progress_bar("exporting", enabled=not args.json) as progress:
        if args.format == "sqlite":
            summary = export_sqlite(store, args.out, session_ids, progress=progress)
        else:
            summary = export_all(store, args.out, session_ids, progress=progress)
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
        _usage(
            "export --format sqlite writes the new file --out names, and every other argument is a "
            "session id: export --format sqlite --out DEST.db SESSION_ID... (every session: --all "
            "instead of the ids). Nothing was written."
        )
    if args.every_session and args.session_ids:
        _usage(
            "--all exports every session: give session ids or --all, not both (a directory is given "
            "with --out: export --all --out DIR). Nothing was written."
        )
    if not args.every_session and not args.session_ids:
        _usage("name the sessions to export, or --all for every session (with --out)")
    if args.format == "jsonl" and (args.every_session or len(args.session_ids) > 1) and args.out is None:
        _usage(
            "several sessions are written one JSON Lines file each, with an index.json: "
            "give the new directory with --out DIR"
        )


def _export_one(args: argparse.Namespace, session_id: str) -> int:
    """One session as JSON Lines: on stdout, or in the new file --out names."""
    with _open(args) as store, render.progress_bar("exporting", enabled=True, unit="segment") as progress:
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
    with (
        _open_new_or_existing(args, _settings(args)) as store,
        render.progress_bar("importing", enabled=not args.json, unit="item") as progress,
    ):
        report = import_file(
            store,
            args.source,
            session_id=args.session_id,
            sessions_table=args.sessions_table,
            messages_table=args.messages_table,
            mode=args.mode,
            progress=progress,
        )
        path = store.path
    if args.json:
        render.print_json(render.import_dict(path, report))
    else:
        render.print_import(path, report)
    return 0


def _usage(message: str) -> NoReturn:
    """A usage error ends the command as argparse ends its own: the message, then exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def erase(args: argparse.Namespace) -> int:
    with _open(args) as store:
        path = store.path
        erased_at = datetime.now(timezone.utc)
        erased = store.erase_sessions(args.session_ids, confirm=None if args.yes else _confirmed(path))
    if args.json:
        render.print_json([receipts.receipt_dict(sid, erasure, path, erased_at) for sid, erasure in erased])
    else:
        for session_id, erasure in erased:
            receipts.print_receipt(session_id, erasure, path, erased_at)
    refuse_unconfirmed([session_id for session_id, erasure in erased if not erasure.readback_confirmed])
    return 0


def refuse_unconfirmed(session_ids: list[str], where: str = "") -> None:
    """Exit 1 after printing receipts whose readback did not confirm the erasure."""
    if session_ids:
        raise Refused(
            f"the readback did not confirm the erasure of {', '.join(map(repr, session_ids))}{where}: "
            "the keys were destroyed, but Citadel did not read every item back as missing. "
            "Keep this receipt and run `python -m citadeldb_openai_agents verify`."
        )


def _open_new_or_existing(args: argparse.Namespace, target: CitadelSettings) -> CitadelSessionStore:
    """The file the command writes to: created only with --create (a typo must not start a new file)."""
    try:
        return _open(args, target, create=args.create)
    except DatabaseNotFoundError as exc:
        if not exc.creation_refused:
            raise
        raise Refused(f"{exc} To start a new, empty file there, pass --create.") from None


def _confirmed(path: str) -> Callable[[dict[str, int]], None]:
    def ask(counts: dict[str, int]) -> None:
        if not sys.stdin.isatty():
            raise Refused("not erasing without a confirmation: stdin is not a terminal; pass --yes")
        listed = ", ".join(f"{sid!r} ({render.count(n, 'item')})" for sid, n in counts.items())
        print(
            f"Erase {render.count(len(counts), 'session')} from {path}: {listed}?\n"
            "Their keys are destroyed; this cannot be undone. [y/N] ",
            end="",
            file=sys.stderr,
            flush=True,
        )
        try:
            answer = sys.stdin.readline()
        except KeyboardInterrupt:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            raise Refused("not confirmed; nothing was erased")

    return ask


def purge(args: argparse.Namespace) -> int:
    with _open(args) as store, render.progress_bar("purging", enabled=not args.json) as progress:
        purged_at = datetime.now(timezone.utc)
        report = store.purge(progress=progress)
        path, ttl, mode, idle = store.path, store.ttl, store.ttl_mode, store.idle_ttl
    if args.json:
        render.print_json(receipts.purge_dict(report, path, purged_at))
    else:
        # Sessions are only mentioned where a rule could end one.
        receipts.print_purge(report, path, purged_at, ttl, ends=bool(idle) or mode == "session")
    refuse_unconfirmed([s.session_id for s in report.ended if not s.erasure.readback_confirmed])
    return 0


def reembed(args: argparse.Namespace) -> int:
    with (
        _warnings_printed(),
        render.progress_bar("re-embedding", enabled=not args.json, unit="region") as progress,
    ):
        summary = reembed_from_config(args.config, progress=progress)
    if args.json:
        render.print_json(dataclasses.asdict(summary))
        return 0
    print(
        f"re-embedded {render.count(summary.items, 'item')} in {render.count(summary.regions, 'region')} "
        f"with {summary.model_id}; every item was kept"
    )
    return 0


def rotate_key(args: argparse.Namespace) -> int:
    settings = _settings(args)
    current_key = settings.key.get_secret_value()
    # Asked before the file is opened: the service stays stopped no longer than needed.
    new_key, source = _new_passphrase(args)
    if not new_key:
        raise Refused(f"the new passphrase (from {source}) is empty; nothing was changed")
    if new_key == current_key:
        raise Refused(f"the new passphrase (from {source}) is the current one; nothing was changed")
    with _open(args, settings) as store:
        store.rotate_key(current_key, new_key)
        path = store.path
    del current_key, new_key  # held no longer than needed
    if args.json:
        render.print_json(
            {
                "database": path,
                "changed": True,
                "verified": True,
                "key_source": str(settings.provenance("key").origin),
            }
        )
        return 0
    print(f"passphrase changed and verified for {path}: the new one opens it, the old one no longer does.")
    print(
        "next: the configuration still gives the old passphrase "
        f"({settings.provenance('key').origin});\n"
        "      put the new one there before the service restarts."
    )
    print("note: backups made before now open with the old passphrase only.")
    return 0


def _new_passphrase(args: argparse.Namespace) -> tuple[str, str]:
    """The new passphrase and where it came from: the configuration's sources, else a prompt."""
    try:
        with _warnings_printed():
            given = new_passphrase(args.new_key_file)
    except ValueError as exc:
        raise Refused(f"{exc}; nothing was changed") from None
    if given is not None:
        return given
    if not sys.stdin.isatty():
        raise Refused(
            "no new passphrase: pass --new-key-file PATH, set CITADEL_NEW_KEY or "
            "CITADEL_NEW_KEY_FILE, or run on a terminal to be asked for it"
        )
    try:
        new_key = getpass.getpass("New passphrase: ")
        repeated = getpass.getpass("Repeat the new passphrase: ")
    except (EOFError, KeyboardInterrupt):
        raise Refused("no new passphrase given; nothing was changed") from None
    if new_key != repeated:
        raise Refused("the two passphrases differ; nothing was changed")
    return new_key, "the prompt"


def backup(args: argparse.Namespace) -> int:
    with _open(args) as store, render.progress_bar("backing up", enabled=not args.json, unit="B") as progress:
        written = store.backup(args.dest, progress=progress)
        path = store.path
    if args.json:
        files = [{"path": name, "bytes": os.path.getsize(name)} for name in written]
        render.print_json({"database": path, "files": files})
        return 0
    print(f"backed up {path} to {len(written)} files:")
    for name in written:
        print(f"  {name}  ({render.human(os.path.getsize(name))})")
    print(
        "to restore: stop the service, then run restore with this path (erasures made since are made again)."
    )
    print("The copy opens with the passphrase of now; a later rotate-key does not change it.")
    return 0


def restore(args: argparse.Namespace) -> int:
    with _warnings_printed():
        report = restore_from_config(
            args.backup, args.config, replace=args.replace, ledger=not args.without_ledger
        )
    if args.json:
        render.print_json(dataclasses.asdict(report) | {"items_erased": report.items_erased})
        return 0
    print(f"restored {report.backup} to {report.path}: {render.count(report.sessions, 'session')}, verified")
    if report.ledger is None:
        print("no erasure ledger was replayed: every session erased since the backup is back.")
        return 0
    print(
        f"the erasure ledger {report.ledger} ({render.count(report.ledger_entries, 'entry', 'entries')} for this file) "
        f"erased again {render.count(report.items_erased, 'item')} the backup held:"
    )
    for session_id, items in sorted(report.erased.items()):
        print(f"  {session_id}  {render.count(items, 'item')}")
    return 0


def verify(args: argparse.Namespace) -> int:
    settings = _settings(args)
    try:
        with _warnings_printed(), render.progress_bar("verifying", enabled=not args.json) as progress:
            path, report = verify_from_config(settings, progress=progress)
    except CorruptDatabaseError as exc:
        # Too damaged to inspect (its header, or a page Citadel reads to open it): `main` prints
        # it, with what to do instead; a page it names is given by its bytes.
        layout = page_layout(resolve_path(settings.path), {"high_water_mark": 0})
        raise CorruptDatabaseError(render.page_named(without_advice_to_verify(str(exc)), layout)) from None
    if args.json:
        render.print_json({"database": path, **render.integrity_dict(report)})
    else:
        render.print_integrity(path, report)
    return 0 if report.ok else 1


_RUN_VERIFY = "python -m citadeldb_openai_agents verify`"


def without_advice_to_verify(message: str) -> str:
    """`message` without its sentence advising to run `verify`: what `verify` itself prints."""
    while (advice := message.find(_RUN_VERIFY)) >= 0:
        before, after = message.rfind(". ", 0, advice), message.find(". ", advice)
        start, end = before + 2 if before >= 0 else 0, after + 2 if after >= 0 else len(message)
        message = (message[:start] + message[end:]).strip()
    return message


def serve(args: argparse.Namespace) -> int:
    """Own the file and serve it until SIGTERM or SIGINT (a sidecar, a systemd unit)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("citadeldb_openai_agents.connections").setLevel(logging.DEBUG)  # a sidecar shows them
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    settings = _settings(args)
    if not settings.serve:
        raise Refused(
            f"serve is false (from {settings.provenance('serve').origin}): this command serves the file; "
            "set serve = true (CITADEL_SERVE=true)"
        )
    with _open(args, settings, create=settings.create) as store:
        if store.served_by is not None:
            raise Refused(
                f"process {store.served_by} already holds {store.path} and serves it; "
                "this one would only be its client"
            )
        print(f"serving {store.path} until SIGTERM (pid {os.getpid()})", flush=True)
        stop.wait()
    print("stopped: the file is closed and no longer served", flush=True)
    return 0


# -- opening the store ---------------------------------------------------------------


def _settings(args: argparse.Namespace) -> CitadelSettings:
    with _warnings_printed():
        return load_settings(args.config)


def _open(
    args: argparse.Namespace, settings: CitadelSettings | None = None, *, create: bool = False
) -> CitadelSessionStore:
    with _warnings_printed():
        settings = settings if settings is not None else load_settings(args.config)
        return from_config(settings) if create else open_existing_store(settings)


@contextmanager
def _warnings_printed() -> Iterator[None]:
    """Print the configuration's warnings as ``warning:`` lines, before any error that follows."""
    messages: list[str] = []
    try:
        with configuration_warnings() as messages:
            yield
    finally:
        for message in messages:
            print(f"warning: {message}", file=sys.stderr)
