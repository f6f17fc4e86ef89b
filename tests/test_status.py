"""`status` (issue 48): what a file and its owner are doing, asked of a real owner process or read
from a file nobody serves, which it must not change (but for Citadel's audit entry)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, DatabaseLockedError, file_status
from citadeldb_openai_agents.cli import main
from citadeldb_openai_agents.options import StoreOptions

from conftest import KEY

pytestmark = pytest.mark.usefixtures("clean_environment")


def items(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text} for text in texts]


def digests(path: Path) -> dict[str, str]:
    """Every file of the database but its audit log (Citadel appends an entry to it on open)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.parent.iterdir())
        if p.name.startswith(path.name) and not p.name.endswith("-audit")
    }


def configured(tmp_path: Path, *lines: str) -> Path:
    (tmp_path / "citadel.key").write_text(KEY + "\n")
    (tmp_path / "citadel.key").chmod(0o600)
    body = ['path = "agent.cdl"', 'key_file = "citadel.key"', 'argon2_profile = "iot"', *lines]
    (tmp_path / "citadel.toml").write_text("\n".join(body) + "\n")
    return tmp_path / "agent.cdl"


def test_a_file_nobody_serves_is_read_at_rest_and_nothing_but_the_audit_log_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = configured(tmp_path, 'idle_ttl = "1s"')
    with CitadelSessionStore(path, KEY, argon2_profile="iot", ttl=1) as store:
        asyncio.run(store.session("short").add_items(items("gone in a second")))
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:  # no TTL: kept
        asyncio.run(store.session("kept").add_items(items("one", "two")))
        assert store.verify().ok  # recorded for status
    time.sleep(1.3)  # "short"'s item expires; both sessions are idle past 1 s
    before = digests(path)
    assert main(["status"]) == 0
    shown = capsys.readouterr().out
    assert digests(path) == before, "status changed the file"
    assert "owner:           none: no process serves the file" in shown
    assert "last verify:" in shown and ", ok" in shown
    report = file_status(path, KEY, options=StoreOptions.of(idle_ttl=1))
    assert report.owner is None and report.last_erasure is None
    # "kept" is idle past idle_ttl: ended, no longer listed; "short" holds only an expired item.
    assert (report.sessions, report.items) == (0, 0)
    assert report.ended_sessions == 1 and report.expired_items == 1
    assert report.last_verify is not None and report.last_verify[1] is True
    kept = file_status(path, KEY)  # without idle_ttl nothing ends: "kept" is listed
    assert (kept.sessions, kept.items, kept.ended_sessions) == (1, 2, 0)
    assert digests(path) == before


OWNER = textwrap.dedent(
    """
    import asyncio, sys
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot", erasure_ledger=sys.argv[3])
    asyncio.run(store.session("alice").add_items([{"role": "user", "content": "hi"}] * 3))
    asyncio.run(store.session("bob").add_items([{"role": "user", "content": "hi"}]))
    erasure = store.erase_session("bob")
    print("ready", erasure.receipt_id, flush=True)
    sys.stdin.read()
    """
)


def test_a_served_file_is_asked_of_its_owner_which_stays_its_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = configured(tmp_path, 'erasure_ledger = "erasures.ledger"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path), KEY, str(tmp_path / "erasures.ledger")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert owner.stdout is not None
        ready, receipt = owner.stdout.readline().split()
        assert ready == "ready"
        assert main(["status", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["owner"]["pid"] == owner.pid and report["owner"]["clients"] == 0
        assert report["owner"]["socket"].endswith(".sock") and report["owner"]["uptime_seconds"] >= 0
        assert (report["sessions"], report["items"]) == (1, 3)
        last = report["last_erasure"]
        assert last["cause"] == "erase" and last["receipt"]["receipt_id"] == receipt
        assert last["receipt"]["readback_confirmed"] and last["receipt"]["items_erased"] == 1
        assert report["ledger"].endswith("erasures.ledger") and report["ledger_head"] == 1
        assert report["retention_erased"] == 0 and report["swept_waiting"] == 0
        assert main(["status"]) == 0
        shown = capsys.readouterr().out
        assert f"PID {owner.pid}, serving for" in shown and f"receipt {receipt}" in shown
        # It asked, and took nothing: the owner still serves, and a new client finds it.
        with CitadelSessionStore(path, KEY, adopt=["erasure_ledger"]) as client:
            assert client.served_by == owner.pid
    finally:
        # 0.5 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
        owner.communicate("", timeout=60)


def test_a_file_held_by_a_process_that_does_not_serve_it_is_named(tmp_path: Path) -> None:
    path = configured(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from citadeldb_openai_agents import CitadelSessionStore as S; "
            "s = S(sys.argv[1], sys.argv[2], argon2_profile='iot', serve=False); print('ready', flush=True); "
            "sys.stdin.read()",
            str(path),
            KEY,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(DatabaseLockedError, match=str(holder.pid)):
            file_status(path, KEY)
    finally:
        # 0.51 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
        holder.communicate("", timeout=60)


def test_status_shows_the_shard_and_a_ring_change_under_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ring.toml").write_text('shards = ["a", "b", "c"]\nprevious = ["a", "b"]\n')
    path = configured(tmp_path, 'ring_file = "ring.toml"', 'shard = "a"')
    CitadelSessionStore(path, KEY, argon2_profile="iot").close()
    assert main(["status"]) == 0
    assert "shard:           a of a, b, c; a ring change is under way, from a, b" in capsys.readouterr().out
