"""How the commands that erase print their receipts: `erase`, `move` (the source's erasure) and
`purge` (each session that ended), as text for people and JSON for scripts."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from ..options import ENDED_BY
from ..results import EndedSession, Erasure, MoveSummary, PurgeReport
from .opening import Refused
from .render import count, utc


def receipt_dict(session_id: str, erasure: Erasure, path: str, erased_at: datetime) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "database": path,
        "erased_at": erased_at.isoformat(),
        "items_erased": erasure.items_erased,
        "regions_dropped": erasure.regions_dropped,
        "algorithm": erasure.algorithm,
        "readback_confirmed": erasure.readback_confirmed,
        "erasure_ledger": erasure.ledger,
        "ledger_entries": list(erasure.ledger_entries),
        "receipt_id": erasure.receipt_id,
    }


def purge_dict(report: PurgeReport, path: str, purged_at: datetime) -> dict[str, Any]:
    ended = [
        {
            **receipt_dict(s.session_id, s.erasure, path, _when(s, purged_at)),
            "rule": s.rule,
            "branch": s.branch,
        }
        for s in report.ended
    ]
    swept = [
        {
            **receipt_dict(s.session_id, s.erasure, path, _when(s, purged_at)),
            "rule": s.rule,
            "branch": s.branch,
        }
        for s in report.swept
    ]
    return {
        "database": path,
        "expired_items": report.expired_items,
        "ended_sessions": ended,
        "erased_by_retention_since_last_purge": swept,
    }


def print_purge(report: PurgeReport, path: str, purged_at: datetime, ttl: float | None, ends: bool) -> None:
    note = "" if ttl is not None else " (ttl is unset: items written with this configuration never expire)"
    print(f"erased {count(report.expired_items, 'expired item')} from {path}{note}")
    if report.ended or ends:
        print(f"erased {count(len(report.ended), 'session')} that ended" + (":" if report.ended else ""))
    for session in report.ended:
        _print_ended(session, path, purged_at)
    if report.swept:
        # Retention erased these by itself before this purge; their receipts were kept for it.
        print(f"retention erased {count(len(report.swept), 'session')} by itself since the last purge:")
        for session in report.swept:
            _print_ended(session, path, purged_at)


def _print_ended(session: EndedSession, path: str, purged_at: datetime) -> None:
    # A branch ends by its own writes: its receipt says which.
    branch = "" if session.branch == "main" else f" (branch {session.branch!r})"
    print_receipt(
        session.session_id, session.erasure, path, _when(session, purged_at), why=session.rule, branch=branch
    )


def _when(session: EndedSession, purged_at: datetime) -> datetime:
    """When the session was erased: by retention before the purge, or by the purge."""
    return purged_at if session.at is None else datetime.fromtimestamp(session.at, timezone.utc)


def print_receipt(
    session_id: str, erasure: Erasure, path: str, erased_at: datetime, why: str = "", branch: str = ""
) -> None:
    because = f": {ENDED_BY.get(why, why)}" if why else ""
    print(f"erased session {session_id!r}{branch} from {path} at {utc(erased_at)} UTC{because}")
    _print_erasure(erasure)


def _print_erasure(erasure: Erasure) -> None:
    readback = "yes (every erased item reads back as missing)" if erasure.readback_confirmed else "NO"
    print(f"  items erased:       {erasure.items_erased}")
    print(f"  regions dropped:    {erasure.regions_dropped}")
    print(f"  algorithm:          {erasure.algorithm} (keys destroyed)")
    print(f"  readback confirmed: {readback}")
    if erasure.ledger is None:
        print("  erasure ledger:     not configured (erasure_ledger is unset)")
    else:
        entries = ", ".join(f"#{number}" for number in erasure.ledger_entries) or "none (nothing was stored)"
        print(f"  erasure ledger:     {entries} in {erasure.ledger}")
    if erasure.receipt_id:  # the id its log line carries (citadel_receipt)
        print(f"  receipt:            {erasure.receipt_id}")


def move_dict(summary: MoveSummary, moved_at: datetime) -> dict[str, Any]:
    erasure = summary.erasure
    return {
        "session_id": summary.session_id,
        "source": summary.source,
        "target": summary.target,
        "items": summary.items,
        "copied": summary.copied,
        "already_in_target": summary.already_in_target,
        "finished_before": summary.finished_before,
        "erasure": None
        if erasure is None
        else {
            k: v
            for k, v in receipt_dict(summary.session_id, erasure, summary.source, moved_at).items()
            if k not in ("session_id", "database")
        },
    }


def print_move(summary: MoveSummary, moved_at: datetime) -> None:
    if summary.erasure is None:
        print(
            f"session {summary.session_id!r} was already moved: {summary.target} holds its "
            f"{count(summary.items, 'item')}, {summary.source} none (an earlier run copied and erased it)"
        )
        return
    earlier = (
        f" ({summary.already_in_target} were already there from an earlier run)"
        if summary.already_in_target
        else ""
    )
    print(
        f"moved session {summary.session_id!r} from {summary.source} to {summary.target}: "
        f"{count(summary.items, 'item')}, compared item by item"
    )
    print(f"  items copied now:   {summary.copied}{earlier}")
    print(f"  erased at the source at {utc(moved_at)} UTC:")
    _print_erasure(summary.erasure)


def refuse_unconfirmed(session_ids: list[str], where: str = "") -> None:
    """Exit 1 after printing receipts whose readback did not confirm the erasure."""
    if session_ids:
        raise Refused(
            f"the readback did not confirm the erasure of {', '.join(map(repr, session_ids))}{where}: "
            "the keys were destroyed, but Citadel did not read every item back as missing. "
            "Keep this receipt and run `python -m citadeldb_openai_agents verify`."
        )


def confirm_erasure(where: str) -> Callable[[dict[str, int]], None]:
    """Asks on a terminal before an erasure (`Refused` without one, or without a yes): the ids
    and their item counts, and where they are."""

    def ask(counts: dict[str, int]) -> None:
        if not sys.stdin.isatty():
            raise Refused("not erasing without a confirmation: stdin is not a terminal; pass --yes")
        listed = ", ".join(f"{sid!r} ({count(n, 'item')})" for sid, n in counts.items())
        print(
            f"Erase {count(len(counts), 'session')} from {where}: {listed}?\n"
            "Their keys are destroyed; this cannot be undone. [y/N] ",
            end="",
            file=sys.stderr,
            flush=True,
        )
        try:
            answer = sys.stdin.readline()
        except KeyboardInterrupt:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            raise Refused("not confirmed; nothing was erased")

    return ask
