"""`python -m citadeldb_openai_agents`: the parser, and one way to run every command.

Each subcommand names its function in commands.py (``run``); `main` runs it and turns
any failure into one readable ``error:`` line (and a hint) with exit 1. Exit 2 is a
usage error, 0 success.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Any

from .. import __version__
from ..config import CitadelSettings
from ..errors import CitadelSessionError, ConfigurationError, CorruptDatabaseError, DatabaseLockedError
from . import commands, migration, moving, owners, status
from .opening import Refused


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m citadeldb_openai_agents",
        description="Encrypted Agents SDK sessions in a Citadel file.",
        epilog="--config and --json are accepted before the command too, as git and docker accept "
        "their global options: `python -m citadeldb_openai_agents --config prod.toml sessions`.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # SUPPRESS: the attribute exists only when given, so `_apply_global_options` can tell.
    parser.add_argument(
        "--config", dest="before_config", metavar="PATH", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--json", dest="before_json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = subcommands.add_parser(
        "demo", help="a scripted conversation that persists across processes, then is erased"
    )
    demo.add_argument("--dir", help="keep the demo file in this directory (default: a temporary one)")
    demo.add_argument("--step", choices=["remember", "ask", "erase", "tool"], help=argparse.SUPPRESS)
    demo.add_argument("--file", help=argparse.SUPPRESS)
    demo.set_defaults(run=commands.demo)
    check = subcommands.add_parser(
        "check",
        help="validate the configuration and open the database, before a deploy",
        description="Load the settings exactly as from_config() does, print each value with "
        "where it came from (the passphrase only as set/unset), and open the database to "
        "verify the passphrase. Exit 0 when usable, 1 when not (every problem is listed), "
        "2 for a usage error.",
        epilog=_variables_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "--config",
        metavar="PATH",
        help="the TOML file (default: CITADEL_CONFIG, else ./citadel.toml)",
    )
    check.add_argument(
        "--no-open", action="store_true", help="check the settings only; do not open the database"
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON (for CI pipelines)")
    check.set_defaults(run=commands.check)
    _add_operations(subcommands)
    return parser


def _add_operations(subcommands: Any) -> None:
    """The operator commands: each a thin shell over the store method named in its help."""
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument(
        "--config",
        metavar="PATH",
        help="the TOML file (default: CITADEL_CONFIG, else ./citadel.toml), resolved as check does",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON instead of text")

    def add(name: str, summary: str, call: str, details: str, *parents: Any) -> Any:
        """A subcommand whose help names the library call it makes."""
        parser = subcommands.add_parser(
            name,
            parents=[config, *parents],
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. {details} Library: {call}.",
        )
        parser.set_defaults(library_call=call)
        return parser

    _add_init(add, as_json)
    _add_reads(add, as_json)
    _add_import(add, as_json)
    _add_erasures(add, as_json)
    owners.add_owner_command(add, as_json)
    _add_file_operations(add, as_json)
    moving.add_ring_parsers(add, as_json)


_ON_A_FLEET = "with --owner on a fleet: another shard's name and TOML file (repeat for each)"


def _add_init(add: Any, as_json: Any) -> None:
    """init: the database made from the configuration alone."""
    add(
        "init",
        "create the database the configuration names, and print what was made",
        "from_config(create=True)",
        "For a deploy's first step: the file and its companion files (mode 600), with the "
        "configured argon2 profile and embedder. A database that exists already is only opened, "
        "which verifies the passphrase (exit 0); the create setting does not apply here.",
        as_json,
    ).set_defaults(run=commands.init)


def _add_reads(add: Any, as_json: Any) -> None:
    """sessions and export: what the file holds."""
    sessions = add(
        "sessions",
        "list every session with its item count, first and last write, and owner",
        "store.sessions(owner=...)",
        "Times are UTC.",
        as_json,
    )
    which = sessions.add_mutually_exclusive_group()
    which.add_argument("--owner", help="only the sessions of this person")
    which.add_argument("--unowned", action="store_true", help="only the sessions that have no owner")
    moving.add_shard_config(sessions, _ON_A_FLEET)
    sessions.set_defaults(run=commands.sessions)

    export = add(
        "export",
        "write sessions' items, verbatim: JSON Lines, or a file agents.SQLiteSession reads",
        "store.export(session_id); export_all(store, dir, ids); export_sqlite(store, dest, ids)",
        "Every SESSION_ID is a session id, whatever the format, and every session only with --all. "
        "One session: JSON Lines on stdout, or in the file --out names. Several, or --all: one "
        "JSON Lines file per session and an index.json in the directory --out names. --format "
        "sqlite: the sessions in the new file --out names, which agents.SQLiteSession reads as its "
        "own. Files are created with mode 600, and an existing one is never overwritten (nothing "
        "is written then). --owner X --out DIR: every session of one person (an access request). "
        "Exit 1 for an unknown session id or owner, 2 for a usage error.",
        as_json,
    )
    export.add_argument("session_ids", metavar="SESSION_ID", nargs="*", help="a session to export")
    export.add_argument(
        "--all", action="store_true", dest="every_session", help="export every session (with --out)"
    )
    export.add_argument("--owner", help="export every session of this person (with --out DIR)")
    export.add_argument(
        "--out",
        metavar="PATH",
        help="the new file (one session, or --format sqlite) or directory (several sessions, --all)",
    )
    export.add_argument(
        "--format", choices=["jsonl", "sqlite"], default="jsonl", help="jsonl (default) or sqlite"
    )
    moving.add_shard_config(export, _ON_A_FLEET)
    export.set_defaults(run=migration.export)


def _add_import(add: Any, as_json: Any) -> None:
    """import: sessions from the SDK's files or JSON Lines."""
    source = add(
        "import",
        "import sessions from a citadeldb-openai-agents 2.x file, an Agents SDK session file or JSON Lines",
        "import_file(store, source); import_original(store, source, key)",
        "SOURCE: a Citadel file of citadeldb-openai-agents 2.x (passphrase: --source-key-file, "
        "CITADEL_SOURCE_KEY_FILE, CITADEL_SOURCE_KEY or a prompt), an agents.SQLiteSession or "
        "AdvancedSQLiteSession file, or an export's JSON Lines (with --session-id). Items arrive "
        "verbatim, in order; a session holding others is refused unless --append or --replace. "
        "Interrupted, the same command resumes, never duplicating.",
        as_json,
    )
    source.add_argument("source", metavar="SOURCE")
    source.add_argument(
        "--session-id",
        metavar="ID",
        help="the session of a JSON Lines file; in an SDK file, the one to import",
    )
    source.add_argument(
        "--owner",
        metavar="OWNER",
        help="the person every imported session is about (a file export --format sqlite wrote "
        "carries each session's owner and labels without it)",
    )
    source.add_argument(
        "--create", action="store_true", help="create the database file if it does not exist (else it must)"
    )
    modes = source.add_mutually_exclusive_group()
    modes.add_argument(
        "--append",
        action="store_const",
        const="append",
        dest="mode",
        help="add after the items a session holds",
    )
    modes.add_argument(
        "--replace",
        action="store_const",
        const="replace",
        dest="mode",
        help="erase a session's items first (keys destroyed)",
    )
    _add_source_options(source)
    source.set_defaults(run=migration.import_, mode="new")


def _add_source_options(source: Any) -> None:
    """import's options for one kind of source: an SDK file's tables; a 2.x file's passphrase,
    region, dry run and erasure."""
    source.add_argument(
        "--sessions-table", default="agent_sessions", metavar="NAME", help="default: agent_sessions"
    )
    source.add_argument(
        "--messages-table", default="agent_messages", metavar="NAME", help="default: agent_messages"
    )
    source.add_argument("--source-key-file", metavar="FILE", help="2.x file: a file holding its passphrase")
    source.add_argument(
        "--source-region", metavar="NAME", help="2.x file: the region to import, if it has several"
    )
    source.add_argument(
        "--dry-run", action="store_true", help="2.x file: say what would come over; write nothing"
    )
    source.add_argument(
        "--erase-source",
        action="store_true",
        help="2.x file: once the import reads back whole, erase every atom of the source's region "
        "(Citadel's forget, expired atoms too) and print the receipt",
    )


def _add_erasures(add: Any, as_json: Any) -> None:
    """erase, move and purge: what erases sessions or items, with receipts."""
    erase = add(
        "erase",
        "erase sessions cryptographically and print the receipt",
        "store.erase_sessions(session_ids); store.erase_owner(owner)",
        "Every id is checked first: if one is unknown, nothing is erased (exit 1). --owner X "
        "erases every session of one person, with one receipt (exit 1 for an owner the file never "
        "held; run it again after an interruption to finish). Asks for confirmation on a "
        "terminal; without a terminal, --yes is required. Exit 1 when a readback does not "
        "confirm the erasure.",
        as_json,
    )
    erase.add_argument("session_ids", metavar="SESSION_ID", nargs="*")
    erase.add_argument("--owner", help="erase every session of this person instead")
    moving.add_shard_config(erase, _ON_A_FLEET)
    erase.add_argument("-y", "--yes", action="store_true", help="erase without asking")
    erase.set_defaults(run=commands.erase)

    move = add(
        "move",
        "move sessions to another file: copy, compare item by item, then erase them here",
        "store.move_sessions(session_ids, other_store)",
        "OTHER.toml configures the target file as --config does the source (CITADEL_* variables "
        "apply to both: a target that resolves to the source's file is refused). Every id is "
        "checked first: one in neither file, or whose target holds other items, moves nothing "
        "(exit 1). Each session is erased here, with a receipt, only once the target holds exactly "
        "its items. If interrupted, run the same command again: it finishes the move.",
        as_json,
    )
    move.add_argument("session_ids", metavar="SESSION_ID", nargs="+")
    move.add_argument(
        "--to-config", metavar="OTHER.toml", required=True, help="the TOML file of the target database"
    )
    move.add_argument(
        "--create", action="store_true", help="create the target file if it does not exist (else it must)"
    )
    move.set_defaults(run=moving.move)

    add(
        "purge",
        "erase every expired item and every session that ended, and print what each erased",
        "store.purge()",
        "Expired items and sessions are already invisible; this destroys their keys. Each session "
        "that a retention rule ended (docs/configuration.md) gets a receipt.",
        as_json,
    ).set_defaults(run=commands.purge)


def _add_file_operations(add: Any, as_json: Any) -> None:
    """rotate-key, backup, verify, status and serve (restore and reembed in `_add_recovery`): the whole file."""
    rotate = add(
        "rotate-key",
        "change the passphrase; the old one stops opening the file",
        "store.rotate_key(current_key, new_key)",
        "The current passphrase comes from the configuration. The new one from "
        "--new-key-file, else CITADEL_NEW_KEY or CITADEL_NEW_KEY_FILE (not both), else a "
        "prompt without echo on a terminal. Afterwards, put the new passphrase where the "
        "configuration reads it.",
        as_json,
    )
    rotate.add_argument(
        "--new-key-file", metavar="PATH", help="a file holding the new passphrase (chmod 600)"
    )
    rotate.set_defaults(run=commands.rotate_key)

    backup = add(
        "backup",
        "write a consistent copy of the database and its companion files",
        "store.backup(dest)",
        "Refuses a destination that exists (or whose companion files do). The copy opens "
        "with the current passphrase.",
        as_json,
    )
    backup.add_argument("dest", metavar="DEST", help="the new database file to write")
    backup.set_defaults(run=commands.backup)

    _add_recovery(add, as_json)
    _add_repair(add, as_json)

    _add_watching(add, as_json)

    add(
        "serve",
        "own the file and serve it to other processes until SIGTERM",
        "CitadelSessionStore(..., serve=True)",
        "For a sidecar or a systemd unit: the service's workers, operator commands and cron jobs "
        "that open the file become its clients. Logs clients connecting and leaving to stderr. "
        "Exit 1 if another process already holds the file.",
    ).set_defaults(run=commands.serve)


def _add_watching(add: Any, as_json: Any) -> None:
    """verify (every page and item) and status (what the file and its owner are doing)."""
    add(
        "verify",
        "check every page and item for damage or tampering",
        "store.verify()",
        "Exit 0 when intact, 1 when damage or tampering is found. The result is recorded for status.",
        as_json,
    ).set_defaults(run=commands.verify)

    add(
        "status",
        "the owner, sessions, erasures, ledger, ring, last verify and retention's backlog now",
        "status_from_config()",
        "On a served file it asks the owner and never becomes the owner; on a file no process serves, "
        "it reads it without opening it for use (Citadel's audit entry is the only write). Exit 0.",
        as_json,
    ).set_defaults(run=status.status)


def _add_recovery(add: Any, as_json: Any) -> None:
    """restore (a backup put in place, the ledger's erasures made again) and reembed."""
    restore = add(
        "restore",
        "put a backup in place, erasing again what the erasure ledger recorded since",
        "citadeldb_openai_agents.restore_backup(backup, path, key, erasure_ledger=...)",
        "Stop the service first. The backup is copied beside the database, the erasures the "
        "ledger (erasure_ledger) recorded are made again in the copy, the copy is verified, and "
        "only then does it replace the database's files. Prints each session erased again. With "
        "--session ID or --owner X, only those sessions come back, into the live file (served or "
        "not: restore_sessions(store, backup, key, session_ids=...)), and every other is left as it is.",
        as_json,
    )
    restore.add_argument("backup", metavar="BACKUP", help="the database file a backup wrote")
    restore.add_argument(
        "--session",
        metavar="ID",
        action="append",
        dest="restore_ids",
        help="bring only this session back into the live file, every other as it is (repeat for each)",
    )
    restore.add_argument("--owner", help="bring back only this person's sessions into the live file")
    restore.add_argument(
        "--replace",
        action="store_true",
        help="replace the database if it exists (with --session/--owner: the live sessions named)",
    )
    restore.add_argument(
        "--without-ledger",
        action="store_true",
        help="restore the backup as it is (erased sessions come back)",
    )
    restore.set_defaults(run=commands.restore)

    add(
        "reembed",
        "re-embed the stored text with the configured embedder, keeping every item",
        "citadeldb_openai_agents.reembed(path, key, embedder)",
        "The fix when the file's items were embedded with another model than the configured "
        "one (EmbedderMismatchError). If interrupted, run it again.",
        as_json,
    ).set_defaults(run=commands.reembed)


def _variables_help() -> str:
    lines = [
        "environment variables (precedence: arguments, variables, secrets directory, TOML file, defaults):"
    ]
    for name, meaning in CitadelSettings.environment_variables().items():
        wrapped = textwrap.wrap(meaning, 68) or [""]
        lines.append(f"  {name}")
        lines.extend(f"      {line}" for line in wrapped)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 failure, 2 usage)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return 2
    _apply_global_options(parser, args)
    try:
        return int(args.run(args))
    except ConfigurationError as exc:
        _error(exc)
        print(
            "hint: `python -m citadeldb_openai_agents check` shows every setting and its source",
            file=sys.stderr,
        )
    except DatabaseLockedError as exc:
        _error(exc)
        print(
            "hint: stop the service that owns the file and retry, or run this inside it "
            f"through the library: {args.library_call}",
            file=sys.stderr,
        )
    except CorruptDatabaseError as exc:
        _error(exc)
        if args.run is commands.verify:  # the error says what to do; this, the verdict
            print("verify: FAILED, the damage stops the file from being read", file=sys.stderr)
    except BrokenPipeError:
        # The reader (`| head`) left; stop quietly instead of failing again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (Refused, CitadelSessionError, OSError) as exc:
        _error(exc)
    return 1


def _apply_global_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--config and --json given before the command count as if given after it.

    A command that has no such option refuses it (exit 2), wherever it stands; the same
    option given on both sides with different values is refused rather than one silently winning.
    """
    if hasattr(args, "before_config"):
        if not hasattr(args, "config"):
            parser.error(f"{args.command} reads no configuration: --config does not apply to it")
        if args.config is not None and args.config != args.before_config:
            parser.error(f"--config given twice, as {args.before_config} and {args.config}: give one")
        args.config = args.before_config
    if hasattr(args, "before_json"):
        if not hasattr(args, "json"):
            parser.error(f"{args.command} prints no report: --json does not apply to it")
        args.json = True


def _error(exc: BaseException) -> None:
    sys.stdout.flush()
    print(f"error: {exc}", file=sys.stderr)


def _add_repair(add: Any, as_json: Any) -> None:
    """repair: a file refused for damage rebuilt from what can be read (or a backup's copy of it)."""
    repair = add(
        "repair",
        "put a file refused for damage back in service, losing only what cannot be read",
        "citadeldb_openai_agents.repair_file(path, key)",
        "Stop the service first. The file is copied, the copy rebuilt from every item that can be "
        "read and verified, then moved in; the damaged files are kept aside. Prints each session's loss.",
        as_json,
    )
    repair.add_argument("-y", "--yes", action="store_true", help="repair (it drops what cannot be read)")
    repair.add_argument(
        "--from-backup", metavar="BACKUP", help="take the lost items from this backup (ledger replayed)"
    )
    repair.set_defaults(run=commands.repair)
