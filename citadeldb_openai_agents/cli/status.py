"""``status``: what the configured file and its owner are doing now (`status_from_config`), as
text for people and JSON for scripts. It never becomes the file's owner (see the library call)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from datetime import datetime, timezone
from typing import Any

from ..config import status_from_config
from ..results import StatusReport
from .opening import settings_of, warnings_printed
from .render import count, print_json, utc


def status(args: argparse.Namespace) -> int:
    with warnings_printed():
        report = status_from_config(settings_of(args))
    if args.json:
        print_json(status_dict(report))
    else:
        print_status(report)
    return 0


def status_dict(report: StatusReport) -> dict[str, Any]:
    """The report as JSON data, its times as ISO 8601 in UTC."""
    found = dataclasses.asdict(report)
    if report.owner is not None:
        found["owner"]["serving_since"] = _iso(report.owner.serving_since)
        found["owner"]["uptime_seconds"] = round(time.time() - report.owner.serving_since, 3)
    if report.last_erasure is not None:
        found["last_erasure"]["at"] = _iso(report.last_erasure.at)
    if report.last_verify is not None:
        found["last_verify"] = {"at": _iso(report.last_verify[0]), "ok": report.last_verify[1]}
    return found


def print_status(report: StatusReport) -> None:
    print(f"status of {report.path}")
    owner = report.owner
    if owner is None:
        print("  owner:           none: no process serves the file (read without opening it for use)")
    else:
        up = _duration(time.time() - owner.serving_since)
        print(
            f"  owner:           PID {owner.pid}, serving for {up} (since {_utc(owner.serving_since)} UTC), "
            f"{count(owner.clients, 'client process', 'client processes')} connected"
        )
        print(f"  socket:          {owner.socket}")
    print(f"  sessions:        {report.sessions} ({count(report.items, 'item')})")
    print(f"  last erasure:    {_last_erasure(report)}")
    head = "no entry yet" if report.ledger_head is None else f"head #{report.ledger_head}"
    ledger = "not configured" if report.ledger is None else f"{report.ledger}, {head}"
    print(f"  erasure ledger:  {ledger}")
    if report.shard is not None and report.ring is not None:
        moving = (
            ""
            if report.moving_from is None
            else f"; a ring change is under way, from {', '.join(report.moving_from)}"
        )
        print(f"  shard:           {report.shard} of {', '.join(report.ring)}{moving}")
    verified = report.last_verify
    shown = (
        "never recorded"
        if verified is None
        else f"{_utc(verified[0])} UTC, {'ok' if verified[1] else 'FAILED'}"
    )
    print(f"  last verify:     {shown}")
    print(
        f"  retention:       {count(report.expired_items, 'expired item')} and "
        f"{count(report.ended_sessions, 'ended session')} waiting to be erased"
        + (
            ""
            if report.retention_erased is None
            else f"; {report.retention_erased} erased by retention "
            f"since the owner started, {report.swept_waiting} receipts kept for the next purge"
        )
    )


def _last_erasure(report: StatusReport) -> str:
    if report.owner is None:
        return "unknown: only an owner keeps it (the erasure ledger holds every erasure when configured)"
    last = report.last_erasure
    if last is None:
        return "none since the owner started"
    readback = "readback confirmed" if last.receipt.readback_confirmed else "readback NOT confirmed"
    return (
        f"{_utc(last.at)} UTC ({last.cause}): {count(last.receipt.items_erased, 'item')}, "
        f"{readback}, receipt {last.receipt.receipt_id}"
    )


def _utc(seconds: float) -> str:
    return utc(datetime.fromtimestamp(seconds, timezone.utc))


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


def _duration(seconds: float) -> str:
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}h {minute:02d}m" if hours else f"{minute}m {second:02d}s"
