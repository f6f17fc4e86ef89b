"""`python -m citadeldb_openai_agents`: commands over the store (each a thin shell)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from .config import CheckReport, check_configuration
from .settings import CitadelSettings


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
    return parser


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
            print("  not created yet (created on first use)")
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


def _text(name: str, value: Any) -> str:
    if value is None:
        return "unset (keep forever)" if name == "ttl" else "unset"
    if isinstance(value, list):
        return ", ".join(value) if value else "none"
    if name == "ttl":
        return f"{value:g} s"
    return str(value)


def _human(size: float) -> str:
    if size < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"
