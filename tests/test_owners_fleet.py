"""A person's sessions on a fleet (issue 44): one person may have sessions on several shards, so
`sessions --owner` and `erase --owner` visit every shard of the ring, each reached as `ring`
reaches it (`--shard-config NAME=PATH`); the receipt names each session's shard, and a shard
that cannot be reached fails the command before anything is erased.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, OwnerNotFoundError, export_fleet, shard_for

KEY = "a passphrase for the fleet"
SHARDS = ["a", "b", "c"]


def configure(tmp_path: Path, name: str) -> Path:
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'path = "{tmp_path / name}.cdl"\nshard = "{name}"\nshards = {json.dumps(SHARDS)}\n'
        'argon2_profile = "iot"\ncreate = false\n'
    )
    return config


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "CITADEL_KEY": KEY}
    return subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard: 1.9 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
    )


@pytest.fixture
def fleet(tmp_path: Path) -> dict[str, Path]:
    """Three shards; alice's twelve conversations and bob's twelve spread over them as the ring places them."""
    configs = {name: configure(tmp_path, name) for name in SHARDS}
    for name in SHARDS:
        with CitadelSessionStore(
            tmp_path / f"{name}.cdl", KEY, argon2_profile="iot", shards=SHARDS, shard=name
        ) as store:
            for person in ("alice", "bob"):
                for number in range(12):
                    session_id = f"{person}:{number}"
                    if shard_for(session_id, SHARDS) == name:
                        session = store.session(session_id, owner=person)
                        asyncio.run(session.add_items([{"role": "user", "content": f"{session_id} said"}]))
    return configs


def others(fleet: dict[str, Path], *names: str) -> list[str]:
    return [arg for name in names for arg in ("--shard-config", f"{name}={fleet[name]}")]


def held(tmp_path: Path, name: str) -> list[tuple[str, str | None]]:
    with CitadelSessionStore(tmp_path / f"{name}.cdl", KEY, create=False) as store:
        return [(summary.session_id, summary.owner) for summary in store.sessions()]


def test_the_fleets_shards_each_hold_some_of_one_persons_sessions(
    fleet: dict[str, Path], tmp_path: Path
) -> None:
    assert all(any(owner == "alice" for _, owner in held(tmp_path, name)) for name in SHARDS)


def test_sessions_and_erase_by_owner_visit_every_shard_and_name_each_sessions_shard(
    fleet: dict[str, Path], tmp_path: Path
) -> None:
    listed = cli("sessions", "--owner", "alice", "--json", "--config", fleet["a"], *others(fleet, "b", "c"))
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(row["session_id"] for row in rows) == [f"alice:{n}" for n in sorted(range(12), key=str)]
    assert all(row["shard"] == shard_for(row["session_id"], SHARDS) for row in rows)
    erased = cli(
        "erase", "--owner", "alice", "--yes", "--json", "--config", fleet["a"], *others(fleet, "b", "c")
    )
    assert erased.returncode == 0, erased.stderr
    receipt = json.loads(erased.stdout)
    sessions = [(s["shard"], s["session_id"]) for s in receipt["sessions"]]
    assert sorted(sid for _, sid in sessions) == sorted(f"alice:{n}" for n in range(12))
    assert all(shard == shard_for(sid, SHARDS) for shard, sid in sessions)
    assert receipt["items_erased"] == 12 and receipt["readback_confirmed"]
    for name in SHARDS:
        assert held(tmp_path, name) and all(owner == "bob" for _, owner in held(tmp_path, name))
    again = cli("erase", "--owner", "alice", "--yes", "--config", fleet["b"], *others(fleet, "a", "c"))
    assert again.returncode == 0 and "complete" in again.stdout


def test_a_shard_left_out_or_unreachable_fails_the_request_before_anything_is_erased(
    fleet: dict[str, Path], tmp_path: Path
) -> None:
    missing = cli("erase", "--owner", "alice", "--yes", "--config", fleet["a"], *others(fleet, "b"))
    assert missing.returncode == 1
    assert "pass --shard-config NAME=PATH for c" in missing.stderr and "nothing was erased" in missing.stderr
    (tmp_path / "c.cdl").rename(tmp_path / "c-elsewhere.cdl")  # the shard's machine is down
    down = cli("erase", "--owner", "alice", "--yes", "--config", fleet["a"], *others(fleet, "b", "c"))
    assert down.returncode == 1
    assert "shard c cannot be reached" in down.stderr and "nothing was erased on any shard" in down.stderr
    (tmp_path / "c-elsewhere.cdl").rename(tmp_path / "c.cdl")
    assert sum(owner == "alice" for name in SHARDS for _, owner in held(tmp_path, name)) == 12


def test_an_owner_no_shard_holds_exits_1(fleet: dict[str, Path]) -> None:
    nobody = cli("erase", "--owner", "carol", "--yes", "--config", fleet["a"], *others(fleet, "b", "c"))
    assert nobody.returncode == 1 and "no shard of the fleet holds a session of this owner" in nobody.stderr


def test_an_access_request_on_a_fleet_exports_every_shards_sessions_of_the_person(
    fleet: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "request"
    missing = cli("export", "--owner", "alice", "--out", out, "--config", fleet["a"], *others(fleet, "b"))
    assert missing.returncode == 1 and "pass --shard-config NAME=PATH for c" in missing.stderr
    assert not out.exists()
    done = cli("export", "--owner", "alice", "--out", out, "--config", fleet["a"], *others(fleet, "b", "c"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("exported 12 sessions, 12 items from the fleet (shards a, b, c) to ")
    index = json.loads((out / "index.json").read_text())
    assert sorted(entry["session_id"] for entry in index) == sorted(f"alice:{n}" for n in range(12))
    assert all(entry["shard"] == shard_for(entry["session_id"], SHARDS) for entry in index)
    assert {entry["owner"] for entry in index} == {"alice"}
    assert all((out / entry["file"]).stat().st_mode & 0o777 == 0o600 for entry in index)
    texts = "".join((out / entry["file"]).read_text() for entry in index)
    assert "alice:3 said" in texts and "bob" not in texts
    nobody = cli(
        "export",
        "--owner",
        "carol",
        "--out",
        tmp_path / "none",
        "--config",
        fleet["a"],
        *others(fleet, "b", "c"),
    )
    assert nobody.returncode == 1 and "no shard of the fleet" in nobody.stderr
    assert not (tmp_path / "none").exists()


def test_export_fleet_reads_every_shard_it_is_given(fleet: dict[str, Path], tmp_path: Path) -> None:
    stores = {name: CitadelSessionStore(tmp_path / f"{name}.cdl", KEY, create=False) for name in SHARDS}
    try:
        summary = export_fleet(stores, tmp_path / "bob", owner="bob")
        assert sorted(summary.sessions) == sorted(f"bob:{n}" for n in range(12))
        with pytest.raises(OwnerNotFoundError):
            export_fleet(stores, tmp_path / "carol", owner="carol")
        assert not (tmp_path / "carol").exists()
    finally:
        for store in stores.values():
            store.close()


def test_a_shard_that_fails_midway_is_named_with_what_was_erased_and_a_rerun_finishes(
    fleet: dict[str, Path], tmp_path: Path
) -> None:
    # Shard c records its erasures in a ledger it cannot write (a directory): its erasure fails.
    (tmp_path / "not-a-ledger").mkdir()
    healthy = fleet["c"].read_text()
    fleet["c"].write_text(healthy + f'erasure_ledger = "{tmp_path / "not-a-ledger"}"\n')
    failed = cli("erase", "--owner", "alice", "--yes", "--config", fleet["a"], *others(fleet, "b", "c"))
    assert failed.returncode == 1
    assert "shard c failed" in failed.stderr
    assert "erased on the shards before it (a, b) and not on c; run the command again" in failed.stderr
    alice = {name: [sid for sid, owner in held(tmp_path, name) if owner == "alice"] for name in SHARDS}
    assert alice["a"] == alice["b"] == [] and len(alice["c"]) == sum(
        shard_for(f"alice:{n}", SHARDS) == "c" for n in range(12)
    )
    fleet["c"].write_text(healthy)
    again = cli(
        "erase", "--owner", "alice", "--yes", "--json", "--config", fleet["a"], *others(fleet, "b", "c")
    )
    assert again.returncode == 0, again.stderr
    assert sorted(s["session_id"] for s in json.loads(again.stdout)["sessions"]) == sorted(alice["c"])
    assert not any(owner == "alice" for name in SHARDS for _, owner in held(tmp_path, name))
