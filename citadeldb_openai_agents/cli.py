"""`python -m citadeldb_openai_agents`: commands over the store (each a thin shell)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
    return parser


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
    parser.print_help(sys.stderr)
    return 2
