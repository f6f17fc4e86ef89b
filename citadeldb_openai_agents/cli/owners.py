"""The privacy requests' commands, by person: `erase --owner` (one receipt for the person) and
`owner set` (the explicit change of who sessions are about). `sessions --owner` lists."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any

from ..people import check_owner
from ..results import OwnerErasure
from . import receipts, render
from .opening import Refused, open_store, usage


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


def erase_owner(args: argparse.Namespace) -> int:
    """`erase --owner X`: every session of one person, one receipt for the person."""
    if args.session_ids:
        usage("erase takes session ids or --owner, not both; nothing was erased")
    check_owner(args.owner, "--owner")
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


def _confirm(path: str, counts: dict[str, int]) -> None:
    if not sys.stdin.isatty():
        raise Refused("not erasing without a confirmation: stdin is not a terminal; pass --yes")
    print(
        f"Erase this person's {render.count(len(counts), 'session')} "
        f"({render.count(sum(counts.values()), 'item')}) from {path}?\n"
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
