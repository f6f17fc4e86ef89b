"""Medians, ratios and the issue's targets from a sessions.py run; its markdown."""

from __future__ import annotations

import statistics
from typing import Any

REFERENCE = "sqlite"
COLUMNS = ("sqlite", "encrypted", "peer", "raw", "ours", "raw-sync", "ours-sync")
LABELS = {
    "sqlite": "SQLiteSession",
    "encrypted": "EncryptedSession",
    "peer": "peer 2.7.0",
    "raw": "raw citadeldb",
    "ours": "ours",
    "raw-sync": "raw (sync)",
    "ours-sync": "ours (sync)",
}
RATIO_LIMIT = 2.0
OVERHEAD_LIMIT = 1.15
RATIO_TARGET_OPS = ("get_items(limit=20)", "pop_item", "add_items (1 turn)")
BIG_TARGET_OPS = ("clear_session", "get_items() full")
TIMED_OPS = (
    "add_items (1 turn)",
    "get_items(limit=20)",
    "get_items() full",
    "pop_item",
    "clear_session",
    "open new file",
    "reopen + get_items(limit=20)",
)
FOOTNOTES = {
    "open new file": "create the file and mint a session (Citadel: the passphrase KDF)",
    "fill": "one sample per round: N items in add_items calls of 100 (many sessions: 25 per call, interleaved)",
    "reopen + get_items(limit=20)": "close, open the existing file, read the newest 20 of one session",
    "clear_session": "one sample per round (the session is gone afterwards)",
}


def summarise(data: dict[str, Any]) -> dict[str, Any]:
    """Pool every round's samples per (scenario, backend, operation) and take medians."""
    scenarios: list[str] = []
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    resources: dict[str, dict[str, dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    errors: list[str] = []
    pooled: dict[tuple[str, str, str], list[list[float]]] = {}
    measures: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run in data["runs"]:
        scenario, backend = run["scenario"], run["backend"]
        if scenario not in scenarios:
            scenarios.append(scenario)
        if "skipped" in run:
            skipped[backend] = run["skipped"]
            continue
        if "error" in run:
            errors.append(f"{backend} {scenario} round {run['round'] + 1}: {run['error']}")
            continue
        for op, samples in run["ops"].items():
            if samples:
                pooled.setdefault((scenario, backend, op), []).append(samples)
        measured = measures.setdefault((scenario, backend), {})
        for key in ("rss_baseline_kib", "rss_peak_kib"):
            measured.setdefault(key, []).append(run[key])
        for key in ("disk_after_close", "disk_after_clear", "disk_after_refill_clear"):
            files = run[key]
            measured.setdefault(key, []).append(sum(files.values()))
            audit = sum(size for name, size in files.items() if name.endswith("-audit"))
            measured.setdefault(key + "_audit", []).append(audit)
    for (scenario, backend, op), rounds in pooled.items():
        every = [sample for samples in rounds for sample in samples]
        cells.setdefault(scenario, {}).setdefault(backend, {})[op] = {
            "median_ms": statistics.median(every),
            "n": len(every),
            "round_medians_ms": [statistics.median(samples) for samples in rounds],
        }
    for (scenario, backend), measured in measures.items():
        resources.setdefault(scenario, {})[backend] = {
            "rss_baseline_mib": statistics.median(measured["rss_baseline_kib"]) / 1024,
            "rss_peak_mib": statistics.median(measured["rss_peak_kib"]) / 1024,
            "disk_after_close_bytes": statistics.median(measured["disk_after_close"]),
            "disk_after_clear_bytes": statistics.median(measured["disk_after_clear"]),
            "audit_after_close_bytes": statistics.median(measured["disk_after_close_audit"]),
            "audit_after_clear_bytes": statistics.median(measured["disk_after_clear_audit"]),
            "disk_after_refill_clear_bytes": statistics.median(measured["disk_after_refill_clear"]),
            "audit_after_refill_clear_bytes": statistics.median(measured["disk_after_refill_clear_audit"]),
        }
    cut = sorted(
        {
            f"{run['backend']} {run['scenario']} {op} ({n} in a round)"
            for run in data["runs"]
            for op, n in run.get("cut_by_budget", {}).items()
        }
    )
    summary = {
        "scenarios": scenarios,
        "cells": cells,
        "resources": resources,
        "skipped": skipped,
        "errors": errors,
        "cut_by_budget": cut,
    }
    summary["targets"] = targets(summary)
    return summary


def median(summary: dict[str, Any], scenario: str, backend: str, op: str) -> float | None:
    cell = summary["cells"].get(scenario, {}).get(backend, {}).get(op)
    return None if cell is None else cell["median_ms"]


def ratio(summary: dict[str, Any], scenario: str, backend: str, op: str, to: str = REFERENCE) -> float | None:
    value, base = median(summary, scenario, backend, op), median(summary, scenario, to, op)
    if value is None or not base:
        return None
    return value / base


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with ours, the raw floor beside it, and a verdict."""
    singles = [s for s in summary["scenarios"] if s.startswith("N=")]
    many = [s for s in summary["scenarios"] if not s.startswith("N=")]
    largest = max(singles, key=lambda s: int(s[2:].replace(",", ""))) if singles else None
    checks: list[dict[str, Any]] = []

    def against_sqlite(scenario: str, op: str) -> None:
        ours, raw = ratio(summary, scenario, "ours", op), ratio(summary, scenario, "raw", op)
        if ours is None:
            return
        verdict = (
            "met"
            if ours <= RATIO_LIMIT
            else (
                "missed: engine floor (raw citadeldb alone is over the limit)"
                if raw is not None and raw > RATIO_LIMIT
                else "missed: our adapter's overhead"
            )
        )
        checks.append(
            {
                "target": f"ours <= {RATIO_LIMIT:g}x SQLiteSession",
                "scenario": scenario,
                "op": op,
                "ours_ratio": ours,
                "raw_ratio": raw,
                "met": ours <= RATIO_LIMIT,
                "verdict": verdict,
            }
        )

    for scenario in [largest, *many]:
        if scenario:
            for op in RATIO_TARGET_OPS:
                against_sqlite(scenario, op)
    if largest:
        for op in BIG_TARGET_OPS:
            against_sqlite(largest, op)
    for scenario in [largest, *many]:
        if not scenario:
            continue
        for op in TIMED_OPS:
            over = ratio(summary, scenario, "ours", op, to="raw")
            if over is None:
                continue
            delta = median(summary, scenario, "ours", op) - median(summary, scenario, "raw", op)
            checks.append(
                {
                    "target": f"ours <= raw citadeldb + {OVERHEAD_LIMIT - 1:.0%}",
                    "scenario": scenario,
                    "op": op,
                    "ours_over_raw": over,
                    "delta_ms": delta,
                    "met": over <= OVERHEAD_LIMIT,
                    "sync_over_raw_sync": ratio(summary, scenario, "ours-sync", op, to="raw-sync"),
                    "verdict": "met" if over <= OVERHEAD_LIMIT else "missed: our adapter's overhead",
                }
            )
    for scenario, backends in summary["resources"].items():
        if "ours" in backends:
            checks.append(_disk_check(scenario, backends["ours"], backends.get("raw")))
    order = {op: i for i, op in enumerate((*TIMED_OPS, "disk"))}
    checks.sort(
        key=lambda c: (c["target"], summary["scenarios"].index(c["scenario"]), order.get(c["op"], 99))
    )
    return checks


def _data_growth(got: dict[str, Any], after: str) -> float:
    """Bytes the data files grew by from close to `after` (the audit log left out)."""
    audit = got[after.replace("disk", "audit")] - got["audit_after_close_bytes"]
    return got[after] - got["disk_after_close_bytes"] - audit


def _disk_check(scenario: str, ours: dict[str, Any], raw: dict[str, Any] | None) -> dict[str, Any]:
    growth = _data_growth(ours, "disk_after_clear_bytes")
    audit = ours["audit_after_clear_bytes"] - ours["audit_after_close_bytes"]
    if growth <= 0:
        verdict = "met" + (
            f" for the data files; the audit log grew {audit:+,.0f} B (Citadel's record of the erasure)"
            if audit > 0
            else ""
        )
    else:
        engine = raw is not None and _data_growth(raw, "disk_after_clear_bytes") >= growth
        reused = ours["disk_after_refill_clear_bytes"] - ours["audit_after_refill_clear_bytes"] <= (
            ours["disk_after_clear_bytes"] - ours["audit_after_clear_bytes"]
        )
        verdict = (
            "missed: engine floor (raw citadeldb grows as much: drop_region writes before it frees)"
            if engine
            else "missed: our adapter"
        ) + (
            "; the space is reused (writing as much again and clearing it does not grow the file)"
            if reused
            else "; the space is NOT reused"
        )
    return {
        "target": "disk after clear_session <= before it",
        "scenario": scenario,
        "op": "disk",
        "before_bytes": ours["disk_after_close_bytes"],
        "after_bytes": ours["disk_after_clear_bytes"],
        "after_refill_clear_bytes": ours["disk_after_refill_clear_bytes"],
        "data_growth_bytes": growth,
        "audit_growth_bytes": audit,
        "met": growth <= 0,
        "verdict": verdict,
    }


# -- markdown ---------------------------------------------------------------------------


def _ms(value: float) -> str:
    if value < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _x(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:,.0f}x" if value >= 100 else f"{value:.1f}x"


def _size(count: float) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 1024:.0f} KiB"


def markdown(data: dict[str, Any], summary: dict[str, Any]) -> str:
    machine = data["machine"]
    present = [b for b in COLUMNS if any(b in by for by in summary["cells"].values())]
    lines = [
        f"Machine: {machine.get('nproc')} cores ({machine.get('cpu', '?')}), {machine.get('memory_gib', '?')} GiB, "
        f"{machine.get('platform')}; Python {machine.get('python')}, citadeldb {machine.get('citadeldb')}, "
        f"openai-agents {machine.get('openai-agents')}, cryptography {machine.get('cryptography')}.",
        f"Command: `{data['command']}` ({data['duration_s'] / 60:.0f} min, started {data['started']}).",
        "",
        "Medians in milliseconds; in brackets the ratio to SQLiteSession in the same run. "
        '"ours / raw" is what our adapter adds to raw citadeldb calls doing the same work in the same layout '
        '(both through asyncio.to_thread, as every backend here; the "(sync)" columns call them without it).',
    ]
    for scenario in summary["scenarios"]:
        cells = summary["cells"].get(scenario, {})
        columns = [b for b in present if b in cells]
        what = (
            "one session" if scenario.startswith("N=") else "sessions x items, one file; timed on one session"
        )
        lines += ["", f"**{scenario}** ({what})", ""]
        lines.append("| operation | " + " | ".join(LABELS[b] for b in columns) + " | ours / raw |")
        lines.append("|---|" + "---:|" * (len(columns) + 1))
        for op in _ops(cells):
            row = [op + ("" if op not in FOOTNOTES else " *")]
            for backend in columns:
                value = median(summary, scenario, backend, op)
                if value is None:
                    row.append("-")
                elif backend == REFERENCE:
                    row.append(_ms(value))
                else:
                    r = ratio(summary, scenario, backend, op)
                    row.append(_ms(value) + (f" ({_x(r)})" if r is not None else ""))
            over = ratio(summary, scenario, "ours", op, to="raw")
            row.append("-" if over is None else f"{over - 1:+.0%}")
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "\\* " + "; ".join(f"{op}: {what}" for op, what in FOOTNOTES.items()) + "."]
    lines += _resources(summary, present)
    lines += _targets(summary)
    notes = (
        data["notes"]
        + [f"skipped {b}: {why}" for b, why in summary["skipped"].items()]
        + [f"error: {e}" for e in summary["errors"]]
    )
    loads = [load for run in data["runs"] for load in run.get("loadavg_1min", [])]
    if loads:
        notes.append(
            f"the machine's 1-minute load average during the workers: {min(loads):.1f} to {max(loads):.1f} "
            f"(median {statistics.median(loads):.1f}) on {machine.get('nproc')} cores; other work shared it"
        )
    if summary["cut_by_budget"]:
        notes.append("series stopped early by the budget: " + "; ".join(summary["cut_by_budget"]))
    if notes:
        lines += ["", "Notes:", *[f"- {note}" for note in notes]]
    return "\n".join(lines)


def _ops(cells: dict[str, dict[str, Any]]) -> list[str]:
    seen = {op for by_op in cells.values() for op in by_op}
    order = [
        "open new file",
        "fill",
        "add_items (1 turn)",
        "get_items(limit=20)",
        "get_items() full",
        "pop_item",
        "reopen + get_items(limit=20)",
        "clear_session",
    ]
    return [op for op in order if op in seen]


def _resources(summary: dict[str, Any], present: list[str]) -> list[str]:
    scenarios = [s for s in summary["scenarios"] if s in summary["resources"]]
    lines = [
        "",
        "Peak RSS of the worker process (MiB; in brackets: after importing the SDK and the backend, "
        "before any work), and disk (the file and its companion files) after close -> after reopening "
        "and clear_session -> after writing as much again into another session and clearing it:",
        "",
    ]
    lines.append(
        "| backend | "
        + " | ".join(f"{s} RSS" for s in scenarios)
        + " | "
        + " | ".join(f"{s} disk" for s in scenarios)
        + " |"
    )
    lines.append("|---|" + "---:|" * (2 * len(scenarios)))
    for backend in present:
        row = [LABELS[backend]]
        for scenario in scenarios:
            got = summary["resources"][scenario].get(backend)
            row.append("-" if got is None else f"{got['rss_peak_mib']:.0f} ({got['rss_baseline_mib']:.0f})")
        for scenario in scenarios:
            got = summary["resources"][scenario].get(backend)
            row.append(
                "-"
                if got is None
                else f"{_size(got['disk_after_close_bytes'])} -> {_size(got['disk_after_clear_bytes'])}"
                f" -> {_size(got['disk_after_refill_clear_bytes'])}"
            )
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _targets(summary: dict[str, Any]) -> list[str]:
    lines = ["", "Targets (the issue's; medians of this run):", ""]
    lines.append("| target | scenario | operation | measured | raw citadeldb floor | verdict |")
    lines.append("|---|---|---|---:|---:|---|")
    for check in summary["targets"]:
        if "ours_ratio" in check:
            measured = _x(check["ours_ratio"])
            floor = "-" if check["raw_ratio"] is None else _x(check["raw_ratio"])
        elif "ours_over_raw" in check:
            measured = f"{check['ours_over_raw'] - 1:+.0%} ({check['delta_ms']:+.2f} ms)"
            if check["sync_over_raw_sync"] is not None:
                measured += f"; sync {check['sync_over_raw_sync'] - 1:+.0%}"
            floor = "-"
        else:
            measured = (
                f"{_size(check['before_bytes'])} -> {_size(check['after_bytes'])} "
                f"-> {_size(check['after_refill_clear_bytes'])}"
            )
            floor = "-"
        cells = (check["target"], check["scenario"], check["op"], measured, floor, check["verdict"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines
