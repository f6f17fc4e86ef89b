"""The privacy requests' commands, by person: `erase --owner` (one receipt for the person) and
`owner set` (the explicit change of who sessions are about), and on a fleet `sessions --owner`
and `export --owner` (every shard visited)."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .. import CitadelSessionStore, export_fleet, read_ring_file
from ..config import CitadelSettings
from ..errors import CitadelSessionError, OwnerNotFoundError
from ..people import check_owner
from ..results import Erasure, OwnerErasure, SessionSummary
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


def fleet(args: argparse.Namespace) -> dict[str | None, CitadelSettings] | None:
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
    ring: dict[str | None, CitadelSettings] = {name: given[name] for name in names}
    return ring


def fleet_sessions(args: argparse.Namespace, shards: dict[str | None, CitadelSettings]) -> int:
    """`sessions --owner X` on a fleet: each shard's sessions of the person, with its shard."""
    found: list[tuple[str | None, SessionSummary]] = []
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


def fleet_export(args: argparse.Namespace, shards: dict[str | None, CitadelSettings]) -> int:
    """`export --owner X --out DIR` on a fleet: every shard's sessions of the person in one
    directory, each index entry naming its shard (`export_fleet`). Every shard is opened before
    anything is written: one that cannot be reached fails the request with nothing written."""
    with ExitStack() as stack, render.progress_bar("exporting", enabled=not args.json) as progress:
        stores = _reached(args, shards, stack, "nothing was exported")
        try:
            summary = export_fleet(
                {str(name): store for name, store in stores.items()},
                args.out,
                owner=args.owner,
                progress=progress,
            )
        except OwnerNotFoundError as exc:
            raise Refused(str(exc)) from None
    where = f"the fleet (shards {', '.join(map(str, shards))})"
    render.print_json(render.export_dict(where, summary)) if args.json else render.print_export(
        where, summary
    )
    return 0


def _reached(
    args: argparse.Namespace, files: dict[str | None, CitadelSettings], stack: ExitStack, nothing: str
) -> dict[str | None, CitadelSessionStore]:
    """Each file's store (by shard; None: the one file), every one opened before any is used: a
    shard that cannot be reached fails the request before it changes anything."""
    stores = {}
    for name, settings in files.items():
        try:
            stores[name] = stack.enter_context(open_store(args, settings))
        except (CitadelSessionError, OSError) as exc:
            if name is None:
                raise
            raise Refused(f"shard {name} cannot be reached ({exc}); {nothing} on any shard") from None
    return stores


def erase_owner(args: argparse.Namespace) -> int:
    """`erase --owner X`: every session of one person, in one file or on every shard of a fleet,
    with one receipt for the person naming each session's file (and shard)."""
    if args.session_ids:
        usage("erase takes session ids or --owner, not both; nothing was erased")
    check_owner(args.owner, "--owner")
    shards = fleet(args)
    files: dict[str | None, CitadelSettings] = {None: settings_of(args)} if shards is None else shards
    with ExitStack() as stack:
        stores = _reached(args, files, stack, "nothing was erased")
        paths = {name: store.path for name, store in stores.items()}
        if not args.yes:
            held = {
                s.session_id: s.items for store in stores.values() for s in store.sessions(owner=args.owner)
            }
            if held:
                receipts.confirm_erasure(paths[None] if shards is None else "the fleet")(held)
        erased_at = datetime.now(timezone.utc)
        erased = {name: _erased_on(name, store, args.owner, list(files)) for name, store in stores.items()}
    if shards is not None and not any(erased.values()):
        raise Refused(
            "no shard of the fleet holds a session of this owner, or ever erased one; nothing was erased"
        )
    person = _Erased(args.owner, erased_at, paths, {name: found for name, found in erased.items() if found})
    render.print_json(person.as_dict()) if args.json else person.print()
    receipts.refuse_unconfirmed(
        [sid for _, sid, erasure in person.sessions() if not erasure.readback_confirmed]
    )
    return 0


def _erased_on(
    name: str | None, store: CitadelSessionStore, owner: str, names: list[str | None]
) -> OwnerErasure | None:
    """One file's part of the request; None on a shard that never held the person."""
    try:
        return store.erase_owner(owner)
    except OwnerNotFoundError:
        if name is None:
            raise  # one file: the library's own message
        return None
    except (CitadelSessionError, OSError) as exc:
        if name is None:
            raise
        done, rest = names[: names.index(name)], names[names.index(name) :]
        raise Refused(
            f"shard {name} failed ({exc}): this person's sessions were erased on the shards before it "
            f"({', '.join(map(str, done)) or 'none'}) and not on {', '.join(map(str, rest))}; run the "
            "command again to finish"
        ) from None


@dataclass(frozen=True)
class _Erased:
    """A person's erasure over one file (shard None) or a fleet, as the receipt tells it."""

    owner: str
    at: datetime
    paths: dict[str | None, str]
    parts: dict[str | None, OwnerErasure]

    def sessions(self) -> list[tuple[str | None, str, Erasure]]:
        return [(name, sid, erasure) for name, part in self.parts.items() for sid, erasure in part.sessions]

    def where(self, name: str | None) -> str:
        return self.paths[name] if name is None else f"{self.paths[name]} (shard {name})"

    def as_dict(self) -> dict[str, Any]:
        sessions = self.sessions()
        single = list(self.paths) == [None]
        return {
            "owner": self.owner,
            **({"database": self.paths[None]} if single else {}),
            "erased_at": self.at.isoformat(),
            "already_complete": not sessions,
            "items_erased": sum(erasure.items_erased for _, _, erasure in sessions),
            "readback_confirmed": all(erasure.readback_confirmed for _, _, erasure in sessions),
            "sessions": [
                {
                    **({} if name is None else {"shard": name}),
                    **receipts.receipt_dict(sid, erasure, self.paths[name], self.at),
                }
                for name, sid, erasure in sessions
            ],
        }

    def print(self) -> None:
        sessions = self.sessions()
        single = list(self.paths) == [None]
        if not sessions:
            left = f"{self.paths[None]} holds" if single else "no shard of the fleet holds"
            print(f"the erasure of owner {self.owner!r} is complete: {left} none of their sessions")
            return
        items = sum(erasure.items_erased for _, _, erasure in sessions)
        where = f"from {self.paths[None]}" if single else "on the fleet"
        print(
            f"erased owner {self.owner!r}: {render.count(len(sessions), 'session')}, "
            f"{render.count(items, 'item')}, {where} at {render.utc(self.at)} UTC"
        )
        for name, sid, erasure in sessions:
            receipts.print_receipt(sid, erasure, self.where(name), self.at)
