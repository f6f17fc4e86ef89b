"""The package modules one call enters, and how often it checks for a fork, from a real trace.

    python benchmarks/call_path.py            # add_items (one turn), get_items(limit=20), pop_item
    python benchmarks/call_path.py --list     # and each module's name
    python benchmarks/call_path.py --order    # and the order get_items(limit=20) enters them, with
                                              # the first function of each (docs/design.md's walk)

One process owns a new file (a session of 300 items among 20 others); each call runs once
to warm up, then once under `sys.setprofile` and `threading.setprofile` (the owner's threads
included). A module counts once however often it is entered; a fork check is an evaluation of
the open file's `forked` (storage/engine.py), which every check goes through. Measures; asserts
nothing. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import citadeldb_openai_agents
from citadeldb_openai_agents import CitadelSessionStore

PACKAGE = Path(citadeldb_openai_agents.__file__).resolve().parent
KEY = "call path benchmark passphrase, not a secret"


class Trace:
    """The package files entered and the fork checks made while it is active."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.fork_checks = 0
        # (module, its first function entered, the thread): in the order first entered.
        self.order: list[tuple[str, str, str]] = []

    def __call__(self, frame: FrameType, event: str, _: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        path = Path(code.co_filename)
        if path.is_relative_to(PACKAGE):
            module = str(path.relative_to(PACKAGE))
            if module not in self.modules:
                self.order.append(
                    (module, getattr(code, "co_qualname", code.co_name), threading.current_thread().name)
                )
            self.modules.add(module)
            if code.co_name == "forked" and path.name == "engine.py":
                self.fork_checks += 1

    def run(self, call: Callable[[], Awaitable[Any]]) -> None:
        threading.setprofile(self)
        sys.setprofile(self)
        try:
            asyncio.run(call())  # type: ignore[arg-type]
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--list", action="store_true", help="name each module entered")
    parser.add_argument(
        "--order", action="store_true", help="get_items(limit=20)'s modules in the order entered"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = CitadelSessionStore(Path(scratch) / "agent.cdl", KEY, argon2_profile="iot")
        try:
            for n in range(20):
                asyncio.run(store.session(f"other-{n}").add_items([{"role": "user", "content": "hi"}]))
            session = store.session("timed")
            asyncio.run(session.add_items([{"role": "user", "content": f"message {n}"} for n in range(300)]))
            turn = [{"role": "user", "content": "a question"}, {"role": "assistant", "content": "an answer"}]
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "add_items (one turn)": lambda: session.add_items(turn),
                "get_items(limit=20)": lambda: session.get_items(limit=20),
                "pop_item": session.pop_item,
            }
            print("| call | package modules entered | fork checks |\n|---|---:|---:|")
            listed = []
            for name, call in calls.items():
                asyncio.run(call())  # type: ignore[arg-type]
                trace = Trace()
                trace.run(call)
                print(f"| `{name}` | {len(trace.modules)} | {trace.fork_checks} |")
                listed.append((name, sorted(trace.modules)))
                if name.startswith("get_items"):
                    order = trace.order
        finally:
            store.close()
    if args.list:
        for name, modules in listed:
            print(f"\n`{name}`: {', '.join(modules)}")
    if args.order:
        print("\n| # | module | first function entered | thread |\n|---:|---|---|---|")
        for number, (module, function, thread) in enumerate(order, 1):
            print(f"| {number} | {module} | `{function}` | {thread} |")


if __name__ == "__main__":
    main()
