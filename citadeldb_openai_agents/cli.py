"""`python -m citadeldb_openai_agents`: commands over the store (each a thin shell)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import textwrap
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import citadeldb

from .config import (
    CheckReport,
    check_configuration,
    load_settings,
    open_existing_store,
    reembed_from_config,
    verify_from_config,
)
from .errors import CitadelSessionError, CorruptDatabaseError, DatabaseLockedError
from .layout import Erasure
from .settings import CitadelSettings, ConfigurationError, ConfigurationWarning, read_key_file
from .store import DEFAULT_CACHE_PAGES, CitadelSessionStore, IntegrityReport, SessionSummary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m citadeldb_openai_agents",
        description="Encrypted Agents SDK sessions in a Citadel file.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="a scripted conversation that persists across processes, then is erased"
    )
    demo.add_argument("--dir", help="keep the demo file in this directory (default: a temporary one)")
    demo.add_argument("--step", choices=["remember", "ask", "erase"], help=argparse.SUPPRESS)
    demo.add_argument("--file", help=argparse.SUPPRESS)
    check = commands.add_parser(
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
    check.add_argument(
        "--json", action="store_true", help="print the report as JSON (for CI pipelines)"
    )
    _add_operations(commands)
    return parser


def _add_operations(commands: Any) -> None:
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
        parser = commands.add_parser(
            name, parents=[config, *parents], help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. {details} Library: {call}.",
        )
        parser.set_defaults(library_call=call)
        return parser

    add(
        "sessions", "list every session with its item count and first and last write",
        "store.sessions()", "Times are UTC.", as_json,
    ).set_defaults(run=_sessions)

    export = add(
        "export", "print a session's items as JSON Lines, verbatim (a data-access request)",
        "store.export(session_id)",
        "One item per line, keys in stored order, UTF-8. Exit 1 for an unknown session id.",
    )
    export.add_argument("session_id", metavar="SESSION_ID")
    export.add_argument(
        "--out", metavar="FILE",
        help="write to FILE (created with mode 600; an existing file is never overwritten)",
    )
    export.set_defaults(run=_export)

    erase = add(
        "erase", "erase sessions cryptographically and print the receipt",
        "store.erase_session(session_id)",
        "Every id is checked first: if one is unknown, nothing is erased (exit 1). Asks for "
        "confirmation on a terminal; without a terminal, --yes is required. Exit 1 when a "
        "readback does not confirm the erasure.",
        as_json,
    )
    erase.add_argument("session_ids", metavar="SESSION_ID", nargs="+")
    erase.add_argument("-y", "--yes", action="store_true", help="erase without asking")
    erase.set_defaults(run=_erase)

    add(
        "purge", "erase every expired item now and print how many",
        "store.purge_expired()", "Expired items are already invisible; this destroys their keys.",
    ).set_defaults(run=_purge)

    rotate = add(
        "rotate-key", "change the passphrase; the old one stops opening the file",
        "store.rotate_key(current_key, new_key)",
        "The current passphrase comes from the configuration. The new one from "
        "--new-key-file, else CITADEL_NEW_KEY or CITADEL_NEW_KEY_FILE (not both), else a "
        "prompt without echo on a terminal. Afterwards, put the new passphrase where the "
        "configuration reads it.",
    )
    rotate.add_argument(
        "--new-key-file", metavar="PATH", help="a file holding the new passphrase (chmod 600)"
    )
    rotate.set_defaults(run=_rotate_key)

    backup = add(
        "backup", "write a consistent copy of the database and its companion files",
        "store.backup(dest)",
        "Refuses a destination that exists (or whose companion files do). The copy opens "
        "with the current passphrase.",
    )
    backup.add_argument("dest", metavar="DEST", help="the new database file to write")
    backup.set_defaults(run=_backup)

    add(
        "reembed", "re-embed the stored text with the configured embedder, keeping every item",
        "citadeldb_openai_agents.reembed(path, key, embedder)",
        "The fix when the file's items were embedded with another model than the configured "
        "one (EmbedderMismatchError). If interrupted, run it again.",
    ).set_defaults(run=_reembed)

    add(
        "verify", "check every page and item for damage or tampering",
        "store.verify()", "Exit 0 when intact, 1 when damage or tampering is found.", as_json,
    ).set_defaults(run=_verify)


def _variables_help() -> str:
    lines = [
        "environment variables (precedence: arguments, variables, secrets directory, "
        "TOML file, defaults):"
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
    if args.command == "demo":
        from . import demo

        if args.step:
            demo.run_step(args.step, Path(args.file))
            return 0
        return demo.main(args.dir)
    if args.command == "check":
        report = check_configuration(args.config, open_database=not args.no_open)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            _print_report(report)
        return 0 if report.ok else 1
    if hasattr(args, "run"):
        return _operate(args)
    parser.print_help(sys.stderr)
    return 2


def _print_report(report: CheckReport) -> None:
    print(f"configuration file: {report.config_file or 'none'}")
    if report.settings:
        print("settings:")
        width = max(len(row.name) for row in report.settings)
        values = [_text(row.name, row.value) for row in report.settings]
        value_width = min(max(len(value) for value in values), 40)
        for row, value in zip(report.settings, values):
            source = str(row.origin)
            if row.overrides:
                source += f" (overrides {', '.join(str(origin) for origin in row.overrides)})"
            print(f"  {row.name:<{width}}  {value:<{value_width}}  {source}")
    database = report.database
    if database is not None:
        print(f"database: {database.path}")
        if not database.exists:
            if _value(report, "create"):
                print("  not created yet (created on first use)")
            else:
                print("  does not exist, and create is false (see the problems)")
        elif database.locked:
            holder = "" if database.held_by is None else f", {database.held_by}"
            print(f"  held by another process{holder}: not opened, so the passphrase was not verified")
        elif database.passphrase_verified:
            print("  passphrase: verified")
            print(f"  sessions:   {database.sessions}")
            print(f"  size:       {database.size_bytes} bytes ({_human(database.size_bytes)})")
        else:
            print("  not opened (see the problems)")
    # Keeps the report before the warnings and problems when both streams go to one log.
    sys.stdout.flush()
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if report.ok:
        opened = " and the database opens" if database is not None and database.exists else ""
        print(f"OK: the configuration is usable{opened}.")
        return
    count = len(report.problems)
    print(f"not usable, {count} problem{'s' if count > 1 else ''}:", file=sys.stderr)
    for problem in report.problems:
        print(f"  - {problem}", file=sys.stderr)


def _value(report: CheckReport, name: str) -> Any:
    return next(row.value for row in report.settings if row.name == name)


# What an unset setting means, where it is not simply "nothing" (the store decides it).
_UNSET_MEANS = {"ttl": "keep forever", "cache_size": f"{DEFAULT_CACHE_PAGES} pages"}


def _text(name: str, value: Any) -> str:
    if value is None:
        meaning = _UNSET_MEANS.get(name)
        return f"unset ({meaning})" if meaning else "unset"
    if isinstance(value, list):
        return ", ".join(value) if value else "none"
    if name == "ttl":
        return f"{value:g} s"
    if isinstance(value, bool):
        return str(value).lower()  # as written in the TOML file and the variables
    return str(value)


def _human(size: float) -> str:
    if size < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


# -- operator commands ---------------------------------------------------------------------


class _Refused(Exception):
    """The command itself declines to run (no confirmation, no new passphrase, ...)."""


def _operate(args: argparse.Namespace) -> int:
    """Run an operator command: every failure is one readable message and exit 1."""
    try:
        return int(args.run(args))
    except ConfigurationError as exc:
        _error(exc)
        print("hint: `python -m citadeldb_openai_agents check` shows every setting and its "
              "source", file=sys.stderr)
    except DatabaseLockedError as exc:
        _error(exc)
        print("hint: stop the service that owns the file and retry, or run this inside it "
              f"through the library: {args.library_call}", file=sys.stderr)
    except CorruptDatabaseError as exc:
        _error(exc)
        if args.run is _verify:
            print("verify: FAILED, the damage stops the file from being read; restore the "
                  "file and its companion files from a backup", file=sys.stderr)
    except BrokenPipeError:
        # The reader (`| head`) left; stop quietly instead of failing again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (_Refused, CitadelSessionError, citadeldb.CitadelError, OSError) as exc:
        _error(exc)
    return 1


def _error(exc: BaseException) -> None:
    sys.stdout.flush()
    print(f"error: {exc}", file=sys.stderr)


@contextmanager
def _configuration_warnings() -> Iterator[None]:
    """Print ConfigurationWarnings as `warning:` lines, as check does."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigurationWarning)
            yield
    finally:
        # Printed before any error that follows: a world-readable key file may be why.
        for caught_warning in caught:
            if issubclass(caught_warning.category, ConfigurationWarning):
                print(f"warning: {caught_warning.message}", file=sys.stderr)
            else:
                warnings.warn_explicit(
                    caught_warning.message, caught_warning.category,
                    caught_warning.filename, caught_warning.lineno,
                )


def _settings(args: argparse.Namespace) -> CitadelSettings:
    with _configuration_warnings():
        return load_settings(args.config)


def _open(settings: CitadelSettings) -> CitadelSessionStore:
    with _configuration_warnings():
        return open_existing_store(settings)


def _sessions(args: argparse.Namespace) -> int:
    with _open(_settings(args)) as store:
        summaries = store.sessions()
        path = store.path
    if args.json:
        print(json.dumps([_summary_dict(summary) for summary in summaries], indent=2))
        return 0
    if not summaries:
        print(f"no sessions in {path}")
        return 0
    rows = [
        (_shown_id(s.session_id), str(s.items), _utc(s.first_write), _utc(s.last_write))
        for s in summaries
    ]
    header = ("SESSION", "ITEMS", "FIRST WRITE (UTC)", "LAST WRITE (UTC)")
    width = max(len(row[0]) for row in [header, *rows])
    items_width = max(len(row[1]) for row in [header, *rows])
    for row in [header, *rows]:
        print(f"{row[0]:<{width}}  {row[1]:>{items_width}}  {row[2]:<19}  {row[3]}")
    total = sum(s.items for s in summaries)
    print(f"{_count(len(summaries), 'session')}, {_count(total, 'item')} in {path}")
    return 0


def _summary_dict(summary: SessionSummary) -> dict[str, Any]:
    return {
        "session_id": summary.session_id,
        "items": summary.items,
        "first_write": summary.first_write.isoformat(),
        "last_write": summary.last_write.isoformat(),
    }


def _export(args: argparse.Namespace) -> int:
    with _open(_settings(args)) as store:
        items = store.export(args.session_id)
    # JSON Lines is UTF-8 whatever the terminal's locale, so bytes, not sys.stdout's encoding.
    data = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode()
    if args.out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    out = Path(args.out).expanduser().absolute()
    try:
        # A transcript is personal data: only its owner reads it, and no file is replaced.
        descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise _Refused(
            f"refusing to overwrite {out}: choose a new file (an export never replaces one)"
        ) from None
    with open(descriptor, "wb") as file:
        file.write(data)
    print(f"exported {_count(len(items), 'item')} of session {args.session_id!r} to {out}")
    return 0


def _erase(args: argparse.Namespace) -> int:
    session_ids = list(dict.fromkeys(args.session_ids))
    with _open(_settings(args)) as store:
        # One summary per named id, not `sessions()`: that would count every session in the file.
        summaries = {session_id: store.summary(session_id) for session_id in session_ids}
        counts = {sid: summary.items for sid, summary in summaries.items() if summary is not None}
        unknown = [session_id for session_id in session_ids if session_id not in counts]
        if unknown:
            raise _Refused(
                f"no session {', '.join(repr(u) for u in unknown)} with live items in "
                f"{store.path}; nothing was erased. `python -m citadeldb_openai_agents "
                "sessions` lists them."
            )
        if not args.yes:
            _confirm_erasure(store.path, {session_id: counts[session_id] for session_id in session_ids})
        erased_at = datetime.now(timezone.utc)
        receipts = [(session_id, store.erase_session(session_id)) for session_id in session_ids]
        path = store.path
    if args.json:
        print(json.dumps(
            [_receipt_dict(session_id, erasure, path, erased_at) for session_id, erasure in receipts],
            indent=2,
        ))
    else:
        for session_id, erasure in receipts:
            _print_receipt(session_id, erasure, path, erased_at)
    unconfirmed = [session_id for session_id, erasure in receipts if not erasure.readback_confirmed]
    if unconfirmed:
        raise _Refused(
            f"the readback did not confirm the erasure of {', '.join(map(repr, unconfirmed))}: "
            "the keys were destroyed, but Citadel did not read every item back as missing. "
            "Keep this receipt and run `python -m citadeldb_openai_agents verify`."
        )
    return 0


def _confirm_erasure(path: str, counts: dict[str, int]) -> None:
    if not sys.stdin.isatty():
        raise _Refused("not erasing without a confirmation: stdin is not a terminal; pass --yes")
    listed = ", ".join(f"{session_id!r} ({_count(count, 'item')})" for session_id, count in counts.items())
    print(
        f"Erase {_count(len(counts), 'session')} from {path}: {listed}?\n"
        "Their keys are destroyed; this cannot be undone. [y/N] ",
        end="", file=sys.stderr, flush=True,
    )
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise _Refused("not confirmed; nothing was erased")


def _receipt_dict(session_id: str, erasure: Erasure, path: str, erased_at: datetime) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "database": path,
        "erased_at": erased_at.isoformat(),
        "items_erased": erasure.items_erased,
        "regions_dropped": erasure.regions_dropped,
        "algorithm": erasure.algorithm,
        "readback_confirmed": erasure.readback_confirmed,
    }


def _print_receipt(session_id: str, erasure: Erasure, path: str, erased_at: datetime) -> None:
    readback = (
        "yes (every erased item reads back as missing)" if erasure.readback_confirmed else "NO"
    )
    print(f"erased session {session_id!r} from {path} at {_utc(erased_at)} UTC")
    print(f"  items erased:       {erasure.items_erased}")
    print(f"  regions dropped:    {erasure.regions_dropped}")
    print(f"  algorithm:          {erasure.algorithm} (keys destroyed)")
    print(f"  readback confirmed: {readback}")


def _purge(args: argparse.Namespace) -> int:
    with _open(_settings(args)) as store:
        erased = store.purge_expired()
        path, ttl = store.path, store.ttl
    note = "" if ttl is not None else " (ttl is unset: items written with this configuration never expire)"
    print(f"erased {_count(erased, 'expired item')} from {path}{note}")
    return 0


def _reembed(args: argparse.Namespace) -> int:
    with _configuration_warnings():
        summary = reembed_from_config(args.config)
    print(
        f"re-embedded {_count(summary.items, 'item')} in {_count(summary.regions, 'region')} "
        f"with {summary.model_id}; every item was kept"
    )
    return 0


def _rotate_key(args: argparse.Namespace) -> int:
    settings = _settings(args)
    current_key = settings.key.get_secret_value()
    # Asked before the file is opened: the service stays stopped no longer than needed.
    new_key, source = _new_passphrase(args)
    if not new_key:
        raise _Refused(f"the new passphrase (from {source}) is empty; nothing was changed")
    if new_key == current_key:
        raise _Refused(
            f"the new passphrase (from {source}) is the current one; nothing was changed"
        )
    with _open(settings) as store:
        store.rotate_key(current_key, new_key)
        path = store.path
    print(f"passphrase changed and verified for {path}: the new one opens it, the old one no longer does.")
    print(
        "next: the configuration still gives the old passphrase "
        f"({settings.provenance('key').origin});\n"
        "      put the new one there before the service restarts."
    )
    print("note: backups made before now open with the old passphrase only.")
    return 0


def _new_passphrase(args: argparse.Namespace) -> tuple[str, str]:
    """The new passphrase and where it came from: --new-key-file, a variable, or a prompt."""
    if args.new_key_file is not None:
        return _key_file(args.new_key_file), f"--new-key-file {args.new_key_file}"
    value, file = os.environ.get("CITADEL_NEW_KEY"), os.environ.get("CITADEL_NEW_KEY_FILE")
    if value is not None and file is not None:
        raise _Refused(
            "the new passphrase is set twice, by CITADEL_NEW_KEY and by CITADEL_NEW_KEY_FILE; "
            "unset one of them"
        )
    if value is not None:
        return value, "CITADEL_NEW_KEY"
    if file is not None:
        return _key_file(file), f"CITADEL_NEW_KEY_FILE {file}"
    if not sys.stdin.isatty():
        raise _Refused(
            "no new passphrase: pass --new-key-file PATH, set CITADEL_NEW_KEY or "
            "CITADEL_NEW_KEY_FILE, or run on a terminal to be asked for it"
        )
    try:
        new_key = getpass.getpass("New passphrase: ")
        repeated = getpass.getpass("Repeat the new passphrase: ")
    except (EOFError, KeyboardInterrupt):
        raise _Refused("no new passphrase given; nothing was changed") from None
    if new_key != repeated:
        raise _Refused("the two passphrases differ; nothing was changed")
    return new_key, "the prompt"


def _key_file(path: str) -> str:
    try:
        with _configuration_warnings():
            return read_key_file(path)
    except ValueError as exc:
        raise _Refused(f"{exc}; nothing was changed") from None


def _backup(args: argparse.Namespace) -> int:
    with _open(_settings(args)) as store:
        written = store.backup(args.dest)
        path = store.path
    print(f"backed up {path} to {len(written)} files:")
    for name in written:
        print(f"  {name}  ({_human(os.path.getsize(name))})")
    print("to restore: stop the service, then copy these files back together under the database's name.")
    print("The copy opens with the passphrase of now; a later rotate-key does not change it.")
    return 0


def _verify(args: argparse.Namespace) -> int:
    with _configuration_warnings():
        path, report = verify_from_config(_settings(args))
    if args.json:
        print(json.dumps({"database": path, **_integrity_dict(report)}, indent=2))
    else:
        _print_integrity(path, report)
    return 0 if report.ok else 1


def _integrity_dict(report: IntegrityReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "pages_checked": report.pages_checked,
        "page_errors": list(report.page_errors),
        "item_verdicts": dict(report.item_verdicts),
        "audit_entries": report.audit_entries,
        "audit_break_at": report.audit_break_at,
        "findings": list(report.findings),
        "sessions": [
            {
                "session_id": session.session_id,
                "expected": session.expected,
                "readable": session.readable,
                "missing": session.missing,
                "not_authentic": session.not_authentic,
                "cause": session.cause,
            }
            for session in report.sessions
        ],
    }


def _print_integrity(path: str, report: IntegrityReport) -> None:
    print(f"database:      {path}")
    print(f"pages checked: {report.pages_checked}")
    print(f"page errors:   {len(report.page_errors) or 'none'}")
    for error in report.page_errors:
        print(f"  - {error}")
    verdicts = ", ".join(f"{count} {verdict}" for verdict, count in sorted(report.item_verdicts.items()))
    print(f"items:         {verdicts or 'none'}")
    if report.audit_break_at is None:
        print(f"audit log:     {_count(report.audit_entries, 'entry', 'entries')} verified, chain intact")
    else:
        print(f"audit log:     chain broken at entry {report.audit_break_at}; the log was altered")
    damaged = report.damaged_sessions
    print(f"sessions:      {len(report.sessions)} checked, {len(damaged) or 'none'} damaged")
    for session in damaged:
        who = "an unknown session" if session.session_id is None else repr(session.session_id)
        print(
            f"  - {who}: {session.readable} of {session.expected} items readable, "
            f"{session.missing} missing, {session.not_authentic} not authentic"
            + (f" ({session.cause})" if session.cause else "")
        )
    for finding in report.findings:
        print(f"  - {finding}")
    sys.stdout.flush()
    if report.ok:
        print("OK: no damage or tampering found.")
        return
    bad_items = sum(count for verdict, count in report.item_verdicts.items() if verdict != "authentic")
    missing = sum(session.missing for session in report.sessions)
    audit = "" if report.audit_break_at is None else ", the audit log altered"
    print(
        f"verify: FAILED ({_count(len(report.page_errors), 'page error')}, "
        f"{_count(missing, 'item')} missing, {_count(bad_items, 'item')} not authentic{audit}"
        f"{', ' + _count(len(report.findings), 'other finding') if report.findings else ''}). "
        "Restore the file and its companion files together from a backup.",
        file=sys.stderr,
    )


def _count(number: int, noun: str, plural: str | None = None) -> str:
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def _utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _shown_id(session_id: str) -> str:
    """An id as typed, unless control characters would garble the table."""
    return session_id if session_id.isprintable() else repr(session_id)
