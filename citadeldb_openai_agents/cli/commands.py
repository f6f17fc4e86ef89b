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
from datetime import datetime, timezone
from pathlib import Path

from ..config import (
    check_configuration,
    database_files,
    new_passphrase,
    reembed_from_config,
    repair_from_config,
    restore_from_config,
    verify_from_config,
)
from ..options import DEFAULT_SYNC_MODE
from ..people import check_owner
from . import migration, owners, receipts, render
from .opening import Refused, open_store, settings_of, usage, warnings_printed


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
    settings = settings_of(args)
    existed = os.path.exists(settings.path)
    with open_store(args, settings.model_copy(update={"create": True}), create=True) as store:
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
    if args.owner is not None:
        check_owner(args.owner, "--owner")
        shards = owners.fleet(args)
        if shards is not None:
            return owners.fleet_sessions(args, shards)
    with open_store(args) as store:
        summaries = store.sessions(owner=args.owner, owned=False if args.unowned else None)
        path = store.path
    if args.json:
        render.print_json([render.summary_dict(summary) for summary in summaries])
    else:
        render.print_sessions(path, summaries)
    return 0


def erase(args: argparse.Namespace) -> int:
    if args.owner is not None:
        return owners.erase_owner(args)
    if not args.session_ids:
        usage("name the sessions to erase, or --owner for every session of one person")
    with open_store(args) as store:
        path = store.path
        erased_at = datetime.now(timezone.utc)
        erased = store.erase_sessions(
            args.session_ids, confirm=None if args.yes else receipts.confirm_erasure(path)
        )
    if args.json:
        render.print_json([receipts.receipt_dict(sid, erasure, path, erased_at) for sid, erasure in erased])
    else:
        for session_id, erasure in erased:
            receipts.print_receipt(session_id, erasure, path, erased_at)
    receipts.refuse_unconfirmed(
        [session_id for session_id, erasure in erased if not erasure.readback_confirmed]
    )
    return 0


def purge(args: argparse.Namespace) -> int:
    with open_store(args) as store, render.progress_bar("purging", enabled=not args.json) as progress:
        purged_at = datetime.now(timezone.utc)
        report = store.purge(progress=progress)
        path, options = store.path, store.options
    if args.json:
        render.print_json(receipts.purge_dict(report, path, purged_at))
    else:
        # Sessions are only mentioned where a rule could end one.
        receipts.print_purge(report, path, purged_at, options.ttl, ends=options.ends_sessions())
    receipts.refuse_unconfirmed([s.session_id for s in report.ended if not s.erasure.readback_confirmed])
    return 0


def reembed(args: argparse.Namespace) -> int:
    with (
        warnings_printed(),
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
    settings = settings_of(args)
    current_key = settings.key.get_secret_value()
    # Asked before the file is opened: the service stays stopped no longer than needed.
    new_key, source = _new_passphrase(args)
    if not new_key:
        raise Refused(f"the new passphrase (from {source}) is empty; nothing was changed")
    if new_key == current_key:
        raise Refused(f"the new passphrase (from {source}) is the current one; nothing was changed")
    with open_store(args, settings) as store:
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
        "      put the new one there now: the processes on the file read it again from a key file, a\n"
        "      secrets directory or key_command and carry on; one given it by CITADEL_KEY or key= must be\n"
        "      restarted with it."
    )
    print("note: backups made before now open with the old passphrase only.")
    return 0


def _new_passphrase(args: argparse.Namespace) -> tuple[str, str]:
    """The new passphrase and where it came from: the configuration's sources, else a prompt."""
    try:
        with warnings_printed():
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
    with (
        open_store(args) as store,
        render.progress_bar("backing up", enabled=not args.json, unit="B") as progress,
    ):
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
    if args.restore_ids or args.owner is not None:
        return migration.restore_some(args)
    with warnings_printed():
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
    for note in report.ledger_notes:
        print(f"note: {note}")
    return 0


def repair(args: argparse.Namespace) -> int:
    if not args.yes:
        raise Refused(
            "repair drops, for good, every item that cannot be read (`verify` lists them per session); "
            "pass --yes to repair, or restore a backup instead; nothing was changed"
        )
    with warnings_printed():
        report = repair_from_config(args.config, from_backup=args.from_backup)
    if args.json:
        render.print_json(dataclasses.asdict(report) | {"items_lost": report.items_lost})
    elif not report.repaired:
        print(f"{report.path} is not damaged: nothing to repair.")
    elif not report.lost:  # a rolled-back file: only its missing erasures were done again
        print(
            f"repaired {report.path}: it lacked {render.count(report.replayed, 'erasure')} of its erasure "
            f"ledger (its parts were put back from an older copy); erased again: "
            f"{render.count(report.items_erased, 'item')}; verified"
        )
    else:
        unread = render.count(report.items_lost, "item")
        back = sum(loss.items_restored for loss in report.lost)
        taken = f", {back} put back from {report.backup}" if report.backup is not None else ""
        print(f"repaired {report.path}: {unread} could not be read in {render.count(len(report.lost), 'session')}"
              f"{taken}; every other session kept whole; verified")  # fmt: skip
        for loss in report.lost:
            put = f", {loss.items_restored} put back" if report.backup is not None else ""
            print(
                f"  {loss.name}  {loss.items_lost} of {loss.items_stored} items unreadable ({loss.cause}){put}"
            )
        for note in report.notes:
            print(f"note: {note}")
        print(f"the damaged files are kept in {report.aside}")
    return 0


def verify(args: argparse.Namespace) -> int:
    with warnings_printed(), render.progress_bar("verifying", enabled=not args.json) as progress:
        path, report = verify_from_config(settings_of(args), progress=progress)
    if args.json:
        render.print_json({"database": path, **render.integrity_dict(report)})
    else:
        render.print_integrity(path, report)
    return 0 if report.ok else 1


def serve(args: argparse.Namespace) -> int:
    """Own the file and serve it until SIGTERM or SIGINT (a sidecar, a systemd unit)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("citadeldb_openai_agents.connections").setLevel(logging.DEBUG)  # a sidecar shows them
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    settings = settings_of(args)
    if not settings.serve:
        raise Refused(
            f"serve is false (from {settings.provenance('serve').origin}): this command serves the file; "
            "set serve = true (CITADEL_SERVE=true)"
        )
    with open_store(args, settings, create=settings.create) as store:
        if store.served_by is not None:
            raise Refused(
                f"process {store.served_by} already holds {store.path} and serves it; "
                "this one would only be its client"
            )
        print(f"serving {store.path} until SIGTERM (pid {os.getpid()})", flush=True)
        stop.wait()
    print("stopped: the file is closed and no longer served", flush=True)
    return 0
