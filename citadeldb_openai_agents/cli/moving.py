"""The commands that move sessions between files: ``move``, and a change of the fleet's ring.

``ring`` shows, begins or finishes a change of the fleet's ring file; ``rebalance`` moves
the sessions a change sends to other shards (docs/deployment.md, "Changing the ring"). The
rules are the library's: `shard_for`, the guard that refuses a moving session to everyone
but the move, and `move_sessions`.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any

from .. import (
    CitadelSessionStore,
    MoveSummary,
    read_ring_file,
    shard_for,
    write_ring_file,
)
from ..config import CitadelSettings, load_settings
from . import receipts, render
from .opening import Refused, open_new_or_existing, open_store, settings_of, warnings_printed


def move(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    target = _target_settings(args, settings)
    with (
        open_store(args, settings) as store,
        open_new_or_existing(args, target) as other,
        render.progress_bar("moving", enabled=not args.json, unit="item") as progress,
    ):
        moved_at = datetime.now(timezone.utc)
        moved = store.move_sessions(args.session_ids, other, progress=progress)
    if args.json:
        render.print_json([receipts.move_dict(summary, moved_at) for summary in moved])
    else:
        for summary in moved:
            receipts.print_move(summary, moved_at)
    unconfirmed = [m.session_id for m in moved if m.erasure is not None and not m.erasure.readback_confirmed]
    receipts.refuse_unconfirmed(unconfirmed, " at the source")
    return 0


def _target_settings(args: argparse.Namespace, source: CitadelSettings) -> CitadelSettings:
    """The settings of `--to-config`, refused when they name the source's own file."""
    with warnings_printed():
        target = load_settings(args.to_config, **({"create": True} if args.create else {}))
    if os.path.realpath(source.path) == os.path.realpath(target.path):
        raise Refused(
            f"--to-config {args.to_config} names the source's own file, {os.path.realpath(target.path)} "
            f"(path from {target.provenance('path').origin}); nothing was moved. CITADEL_* variables "
            "apply to both configurations: set each file's path in its own TOML file, not in CITADEL_PATH."
        )
    return target


def ring(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    path = _ring_file(settings)
    shards, previous = read_ring_file(path)
    if args.begin is not None:
        new = [name.strip() for name in args.begin.split(",")]
        if previous is not None:
            raise Refused(
                f"a ring change is under way in {path} already (from {_names(previous)} to "
                f"{_names(shards)}): rebalance every shard, then `ring --finish`, before another"
            )
        write_ring_file(path, new, previous=shards)
        if args.json:
            return _print_ring(path, "begun", new, shards)
        print(f"ring change begun in {path}: from {_names(shards)} to {_names(new)}")
        print("the sessions that move are refused on every shard until `ring --finish`; next, run")
        print("`rebalance` on each shard that loses sessions")
    elif args.finish or args.complete or args.abort:
        if previous is None:
            raise Refused(
                f"no ring change is under way in {path} (shards {_names(shards)}); nothing to finish"
            )
        if args.complete or args.abort:
            return _carry_out(args, settings, path, shards, previous)
        _check_nothing_left(args, settings, shards, previous)
        write_ring_file(path, shards, previous=None)
        if args.json:
            return _print_ring(path, "finished", shards, None)
        print(f"ring change finished in {path}: shards {_names(shards)}")
    elif args.json:
        return _print_ring(path, "shown", shards, previous)
    else:
        print(f"ring file {path}")
        print(f"  shards:   {_names(shards)}")
        under_way = "none" if previous is None else f"from {_names(previous)} (sessions moving)"
        print(f"  change:   {under_way}")
    return 0


def _carry_out(
    args: argparse.Namespace,
    settings: CitadelSettings,
    path: str,
    shards: tuple[str, ...],
    previous: tuple[str, ...],
) -> int:
    """`ring --complete` (every shard rebalanced to the new ring, then finished) or `--abort` (the
    sessions moved so far go back to the old ring's shards, which it ends with). One command,
    run again if interrupted: each move resumes."""
    configs = {**({settings.shard: settings} if settings.shard else {}), **shard_configs(args)}
    missing = sorted((set(shards) | set(previous)) - set(configs))
    if missing:
        raise Refused(
            f"every shard of both rings takes part: pass --shard-config NAME=PATH for {', '.join(missing)}; "
            "nothing was moved and the ring file was not changed"
        )
    if args.abort:
        # The guard lets a moving session move either way between its two shards: going back
        # needs no other ring file, so an interrupted --abort (or --complete) is simply run again,
        # or the other one run instead.
        shards, previous = previous, shards
    moved: list[tuple[str, MoveSummary]] = []
    for name in dict.fromkeys([*previous, *shards]):
        moved += _move_away(args, name, configs, shards)
    _check_nothing_left(args, settings, shards, previous)
    write_ring_file(path, shards, previous=None)
    if args.json:
        return _print_ring(path, "finished", shards, None)
    for target, summary in moved:
        print(
            f"moved {summary.session_id!r} to shard {target}: {render.count(summary.items, 'item')} compared"
        )
    done = "rolled back" if args.abort else "finished"
    print(
        f"ring change {done} in {path}: shards {_names(shards)} ({render.count(len(moved), 'session')} moved now)"
    )
    return 0


def _move_away(
    args: argparse.Namespace, name: str, configs: dict[str, CitadelSettings], shards: Sequence[str]
) -> list[tuple[str, MoveSummary]]:
    """Move every session shard `name` holds that `shards` places elsewhere to its shard (`rebalance`,
    and each shard of `ring --complete`/`--abort`); refused, moving nothing, if a target is not in `configs`."""
    with open_store(args, configs[name]) as store, ExitStack() as stack:
        plan: dict[str, list[str]] = defaultdict(list)
        for session_id in store.session_ids():
            if (home := shard_for(session_id, shards)) != name:
                plan[home].append(session_id)
        missing = sorted(set(plan) - set(configs))
        if missing:
            raise Refused(
                f"sessions of shard {name} go to {', '.join(missing)}: pass --shard-config NAME=PATH for "
                "each; nothing was moved"
            )
        moved: list[tuple[str, MoveSummary]] = []
        for home, session_ids in sorted(plan.items()):
            other: CitadelSessionStore = stack.enter_context(open_store(args, configs[home]))
            moved += [(home, summary) for summary in store.move_sessions(session_ids, other)]
    return moved


def _print_ring(path: str, change: str, shards: Sequence[str], previous: Sequence[str] | None) -> int:
    """ring --json: the ring file's shards after the command, and the change under way (or None)."""
    before = None if previous is None else list(previous)
    render.print_json({"ring_file": path, "change": change, "shards": list(shards), "previous": before})
    return 0


def rebalance(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    shards, previous = read_ring_file(_ring_file(settings))
    if previous is None:
        raise Refused(
            "no ring change is under way, so no session is moving; begin one with "
            "`ring --begin NEW,SHARDS` (docs/deployment.md, 'Changing the ring')"
        )
    assert settings.shard is not None  # a ring file names this process's shard (settings' check)
    moved = _move_away(args, settings.shard, {settings.shard: settings, **shard_configs(args)}, shards)
    moved_at = datetime.now(timezone.utc)
    for owner, summary in moved:
        if args.json:
            render.print_json({"shard": owner, **receipts.move_dict(summary, moved_at)})
        else:
            confirmed = "no" if summary.erasure is None else summary.erasure.readback_confirmed
            print(
                f"moved {summary.session_id!r} to shard {owner}: {render.count(summary.items, 'item')} "
                f"compared, erased here (readback confirmed: {confirmed})"
            )
    if not args.json:
        print(f"moved {render.count(len(moved), 'session')} from shard {settings.shard}")
    return 0


def _check_nothing_left(
    args: argparse.Namespace, settings: CitadelSettings, shards: tuple[str, ...], previous: tuple[str, ...]
) -> None:
    """Refuse to finish while any shard still holds a session the new ring places elsewhere."""
    configs = {settings.shard or "": settings, **shard_configs(args)}
    unknown = sorted(set(previous) - set(configs))
    if unknown:
        raise Refused(
            f"`ring --finish` checks that no shard still holds a session that moves: pass "
            f"--shard-config NAME=PATH for {', '.join(unknown)}; the ring file was not changed"
        )
    for name in sorted(set(previous)):
        with open_store(args, configs[name]) as store:
            left = [sid for sid in store.session_ids() if shard_for(sid, shards) != name]
        if left:
            raise Refused(
                f"shard {name} still holds {render.count(len(left), 'session')} that move "
                f"(e.g. {left[0]!r}): run `rebalance` there first; the ring file was not changed"
            )


def shard_configs(args: argparse.Namespace) -> dict[str, CitadelSettings]:
    """The other shards' settings, from each --shard-config NAME=PATH (checked: PATH is shard NAME)."""
    configs: dict[str, CitadelSettings] = {}
    for given in args.shard_config or []:
        name, sep, path = given.partition("=")
        if not sep or not name or not path:
            raise Refused(f"--shard-config takes NAME=PATH (a shard's name and its TOML file), not {given!r}")
        with warnings_printed():
            configs[name] = load_settings(path)
        if configs[name].shard != name:
            raise Refused(
                f"--shard-config {given}: that configuration is shard {configs[name].shard!r}, not {name!r}"
            )
    return configs


def _ring_file(settings: CitadelSettings) -> str:
    if settings.ring_file is None:
        raise Refused(
            "the configuration has no ring_file: a ring changes live only when every shard reads its "
            "shards from one (docs/deployment.md, 'Changing the ring')"
        )
    return str(settings.ring_file)


def _names(shards: tuple[str, ...] | list[str]) -> str:
    return ", ".join(shards)


def add_shard_config(parser: argparse.ArgumentParser, help: str) -> None:
    """--shard-config NAME=PATH, repeated: another shard's configuration (ring, rebalance, --owner)."""
    parser.add_argument("--shard-config", metavar="NAME=PATH", action="append", help=help)


def add_ring_parsers(add: Any, as_json: Any) -> None:
    """ring and rebalance: a change of the fleet's shards while it runs."""
    shard_config = argparse.ArgumentParser(add_help=False)
    add_shard_config(shard_config, "another shard's name and TOML file (repeat for each)")
    parser = add(
        "ring",
        "show the fleet's ring file, or begin or finish a change of its shards",
        "read_ring_file / write_ring_file",
        "--begin NEW records the new shards and the old ones as previous: every shard then refuses "
        "the sessions that move (ShardMovingError) until --finish, which first checks that no shard "
        "of the old ring still holds one (give each with --shard-config). --complete rebalances "
        "every shard and finishes; --abort moves back what moved and ends with the old ring; both "
        "resume when run again. docs/deployment.md, 'Changing the ring'.",
        shard_config,
        as_json,
    )
    change = parser.add_mutually_exclusive_group()
    change.add_argument("--begin", metavar="A,B,C", help="the fleet's new shards, comma-separated")
    change.add_argument("--finish", action="store_true", help="end the change under way")
    change.add_argument("--complete", action="store_true", help="rebalance every shard, then finish")
    change.add_argument("--abort", action="store_true", help="move back what moved; end with the old ring")
    parser.set_defaults(run=ring)
    add(
        "rebalance",
        "move this shard's sessions that a ring change sends elsewhere to their new shards",
        "store.move_sessions(session_ids, other_store)",
        "Each session the ring file's new shards place on another shard is copied there, compared "
        "item by item, and erased here with a receipt (as move does); run it again if interrupted.",
        shard_config,
        as_json,
    ).set_defaults(run=rebalance)
