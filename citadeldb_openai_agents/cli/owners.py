"""The privacy requests' commands, by person: `erase --owner` (one receipt for the person) and
`owner set` (the explicit change of who sessions are about). `sessions --owner` lists."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any

from .. import CitadelSessionStore, read_ring_file
from ..config import CitadelSettings
from ..errors import CitadelSessionError, OwnerNotFoundError
from ..people import check_owner
from ..results import OwnerErasure, SessionSummary
from . import receipts, render
from .moving import shard_configs
from .opening import Refused, open_store, settings_of, usage


def add_owner_command(add: Any, as_json: Any) -> None:
    """owner set and owner apply-pattern: record the person sessions are about."""
    owner = add(
        "owner",
        "record who sessions are about: the person a privacy request names",
        "store.set_owner(session_ids, owner); store.apply_owner_pattern(dry_run=...)",
        "owner set SESSION_ID... --owner X records X as each session's owner, whatever it had; "
        "every id is checked first, and if one is unknown nothing changes (exit 1). owner "
        "apply-pattern records, for each session that has none, the owner owner_pattern finds in "
        "its id, and prints how many it changed (--dry-run: would change, changing nothing).",
        as_json,
    )
    owner.add_argument("action", choices=["set", "apply-pattern"])
    owner.add_argument("session_ids", metavar="SESSION_ID", nargs="*")
    owner.add_argument("--owner", help="set: the person (a stable id, at most 256 bytes)")
    owner.add_argument("--dry-run", action="store_true", help="apply-pattern: count, change nothing")
    owner.set_defaults(run=owner_command)


def owner_command(args: argparse.Namespace) -> int:
    if args.action == "apply-pattern":
        if args.session_ids or args.owner is not None:
            usage("owner apply-pattern takes no session ids and no --owner: the pattern names the owners")
        return _apply_pattern(args)
    if not args.session_ids or args.owner is None or args.dry_run:
        usage("owner set SESSION_ID... --owner X: name the sessions and the owner (no --dry-run)")
    check_owner(args.owner, "--owner")
    with open_store(args) as store:
        changed = store.set_owner(args.session_ids, args.owner)
    ids = list(dict.fromkeys(args.session_ids))
    if args.json:
        render.print_json({"changed": changed, "unchanged": [sid for sid in ids if sid not in changed]})
        return 0
    kept = len(ids) - len(changed)
    print(
        f"recorded the owner of {render.count(len(changed), 'session')}"
        + (f"; {render.count(kept, 'session')} already had it" if kept else "")
    )
    return 0


def _apply_pattern(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if store.owner_pattern is None:
            raise Refused("no owner_pattern is configured (set owner_pattern or CITADEL_OWNER_PATTERN)")
        changes = store.apply_owner_pattern(dry_run=args.dry_run)
        left = len(store.sessions(owned=False))
        path = store.path
    if args.json:
        render.print_json({"database": path, "dry_run": args.dry_run, "changes": changes, "unowned": left})
        return 0
    verb = "would record" if args.dry_run else "recorded"
    print(
        f"{verb} an owner for {render.count(len(changes), 'session')} by owner_pattern in {path}; "
        f"{render.count(left, 'session')} without an owner now"
    )
    return 0


def add_shard_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shard-config",
        metavar="NAME=PATH",
        action="append",
        help="with --owner on a fleet: another shard's name and TOML file (repeat for each)",
    )


def fleet(args: argparse.Namespace) -> dict[str, CitadelSettings] | None:
    """Every shard's settings when the configuration names a fleet (one person's sessions may be
    on any shard), this one's and each --shard-config's; None for one file. Refused, before
    anything is read, if a shard of the ring is left out."""
    settings = settings_of(args)
    if settings.ring_file is not None:
        shards, previous = read_ring_file(str(settings.ring_file))
        names = list(dict.fromkeys([*shards, *(previous or ())]))
    elif settings.shards:
        names = list(settings.shards)
    else:
        return None
    given = {**({settings.shard: settings} if settings.shard else {}), **shard_configs(args)}
    missing = [name for name in names if name not in given]
    if missing:
        raise Refused(
            f"one person's sessions may be on any shard of the fleet: pass --shard-config NAME=PATH "
            f"for {', '.join(missing)}; nothing was erased or listed"
        )
    return {name: given[name] for name in names}


def fleet_sessions(args: argparse.Namespace, shards: dict[str, CitadelSettings]) -> int:
    """`sessions --owner X` on a fleet: each shard's sessions of the person, with its shard."""
    found: list[tuple[str, SessionSummary]] = []
    with ExitStack() as stack:
        for name, store in _reached(args, shards, stack, "nothing was listed").items():
            found += [(name, summary) for summary in store.sessions(owner=args.owner)]
    if args.json:
        render.print_json([{**render.summary_dict(summary), "shard": name} for name, summary in found])
    else:
        for name, summary in found:
            print(
                f"shard {name}: {render.shown_id(summary.session_id)} ({render.count(summary.items, 'item')})"
            )
        print(f"{render.count(len(found), 'session')} of this owner on {render.count(len(shards), 'shard')}")
    return 0


def _reached(
    args: argparse.Namespace, shards: dict[str, CitadelSettings], stack: ExitStack, nothing: str
) -> dict[str, CitadelSessionStore]:
    """Each shard's store, every one opened before any is used: one that cannot be reached fails
    the request before it changes anything."""
    stores = {}
    for name, settings in shards.items():
        try:
            stores[name] = stack.enter_context(open_store(args, settings))
        except (CitadelSessionError, OSError) as exc:
            raise Refused(f"shard {name} cannot be reached ({exc}); {nothing} on any shard") from None
    return stores


def _erase_on_fleet(args: argparse.Namespace, shards: dict[str, CitadelSettings]) -> int:
    """`erase --owner X` on a fleet: every shard's sessions of the person, one receipt naming each's shard."""
    erased: dict[str, OwnerErasure | None] = {}
    with ExitStack() as stack:
        stores = _reached(args, shards, stack, "nothing was erased")
        paths = {name: store.path for name, store in stores.items()}
        held = {name: store.sessions(owner=args.owner) for name, store in stores.items()}
        if any(held.values()) and not args.yes:
            _confirm("the fleet", {s.session_id: s.items for found in held.values() for s in found})
        erased_at = datetime.now(timezone.utc)
        for name, store in stores.items():
            try:
                erased[name] = store.erase_owner(args.owner)
            except OwnerNotFoundError:
                erased[name] = None
            except (CitadelSessionError, OSError) as exc:
                done = [shard for shard in erased if erased[shard] is not None] or ["none"]
                raise Refused(
                    f"shard {name} failed ({exc}): this person's sessions were erased on {', '.join(done)} "
                    f"and not on {', '.join(n for n in shards if n not in erased)}; run the command again "
                    "to finish"
                ) from None
    if all(result is None for result in erased.values()):
        raise Refused(
            "no shard of the fleet holds a session of this owner, or ever erased one; nothing was erased"
        )
    _print_fleet_erasure(args, erased, erased_at, paths)
    return 0


def _print_fleet_erasure(
    args: argparse.Namespace,
    erased: dict[str, OwnerErasure | None],
    erased_at: datetime,
    paths: dict[str, str],
) -> None:
    sessions = [
        (name, sid, erasure) for name, found in erased.items() if found for sid, erasure in found.sessions
    ]
    if args.json:
        render.print_json(
            {
                "owner": args.owner,
                "erased_at": erased_at.isoformat(),
                "already_complete": not sessions,
                "items_erased": sum(erasure.items_erased for _, _, erasure in sessions),
                "readback_confirmed": all(erasure.readback_confirmed for _, _, erasure in sessions),
                "sessions": [
                    {
                        "shard": name,
                        **receipts.receipt_dict(sid, erasure, paths[name], erased_at),
                    }
                    for name, sid, erasure in sessions
                ],
            }
        )
    elif not sessions:
        print(
            f"the erasure of owner {args.owner!r} is complete: no shard of the fleet holds one of their sessions"
        )
    else:
        print(f"erased owner {args.owner!r}: {render.count(len(sessions), 'session')} on the fleet")
        for name, sid, erasure in sessions:
            receipts.print_receipt(sid, erasure, f"{paths[name]} (shard {name})", erased_at)
    receipts.refuse_unconfirmed([sid for _, sid, erasure in sessions if not erasure.readback_confirmed])


def erase_owner(args: argparse.Namespace) -> int:
    """`erase --owner X`: every session of one person, one receipt for the person."""
    if args.session_ids:
        usage("erase takes session ids or --owner, not both; nothing was erased")
    check_owner(args.owner, "--owner")
    shards = fleet(args)
    if shards is not None:
        return _erase_on_fleet(args, shards)
    with open_store(args) as store:
        path = store.path
        held = store.sessions(owner=args.owner)
        if held and not args.yes:
            _confirm(path, {summary.session_id: summary.items for summary in held})
        erased_at = datetime.now(timezone.utc)
        erased = store.erase_owner(args.owner)
    if args.json:
        render.print_json(_erasure_dict(erased, path, erased_at))
    else:
        _print_erasure(erased, path, erased_at)
    receipts.refuse_unconfirmed([sid for sid, erasure in erased.sessions if not erasure.readback_confirmed])
    return 0


def _confirm(where: str, counts: dict[str, int]) -> None:
    if not sys.stdin.isatty():
        raise Refused("not erasing without a confirmation: stdin is not a terminal; pass --yes")
    print(
        f"Erase this person's {render.count(len(counts), 'session')} "
        f"({render.count(sum(counts.values()), 'item')}) from {where}?\n"
        "Their keys are destroyed; this cannot be undone. [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise Refused("not confirmed; nothing was erased")


def _erasure_dict(erased: OwnerErasure, path: str, erased_at: datetime) -> dict[str, Any]:
    return {
        "owner": erased.owner,
        "database": path,
        "erased_at": erased_at.isoformat(),
        "already_complete": erased.already_complete,
        "items_erased": erased.items_erased,
        "readback_confirmed": erased.readback_confirmed,
        "sessions": [
            receipts.receipt_dict(sid, erasure, path, erased_at) for sid, erasure in erased.sessions
        ],
    }


def _print_erasure(erased: OwnerErasure, path: str, erased_at: datetime) -> None:
    if erased.already_complete:
        print(f"the erasure of owner {erased.owner!r} is complete: {path} holds none of their sessions")
        return
    print(
        f"erased owner {erased.owner!r}: {render.count(len(erased.sessions), 'session')}, "
        f"{render.count(erased.items_erased, 'item')}, from {path} at {render.utc(erased_at)} UTC"
    )
    for session_id, erasure in erased.sessions:
        receipts.print_receipt(session_id, erasure, path, erased_at)
