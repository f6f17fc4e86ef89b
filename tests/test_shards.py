"""A fleet of shards: `shard_for` places each session on one, and a store refuses the others'.

`shard_for` is checked against the specification docs/deployment.md gives (written out
again here with hashlib, so a change to either is caught), for its spread and for how
few sessions move when the ring changes. The guard is checked through the public API:
every operation on another shard's session raises `WrongShardError` naming its owner,
and the file is left as it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from citadeldb_openai_agents import (
    CitadelSessionStore,
    CitadelSettings,
    ConfigurationError,
    WrongShardError,
    from_config,
    shard_for,
)

SHARDS = ["a", "b", "c"]
IDS = [f"user-{n}" for n in range(3000)]


def by_the_docs(session_id: str, shards: list[str]) -> str:
    """docs/deployment.md's definition: the highest SHA-256(name, NUL, id) as a big-endian integer."""
    scores = {
        name: int.from_bytes(hashlib.sha256(name.encode() + b"\0" + session_id.encode()).digest(), "big")
        for name in shards
    }
    return max(scores, key=scores.__getitem__)


def test_shard_for_is_the_documented_function_and_ignores_the_order_of_the_names() -> None:
    for session_id in [*IDS[:500], "", "ünïcode ✓", "a" * 1000]:
        assert shard_for(session_id, SHARDS) == by_the_docs(session_id, SHARDS)
        assert shard_for(session_id, ["c", "a", "b"]) == shard_for(session_id, SHARDS)
    # Fixed values a router's implementation can be checked against (also in the docs).
    assert [shard_for(f"user-{n}", SHARDS) for n in range(6)] == ["c", "c", "b", "c", "a", "c"]


def test_sessions_spread_evenly_and_a_new_shard_takes_only_its_share() -> None:
    before = {session_id: shard_for(session_id, SHARDS) for session_id in IDS}
    counts = Counter(before.values())
    assert all(900 <= counts[name] <= 1100 for name in SHARDS), counts
    after = {session_id: shard_for(session_id, [*SHARDS, "d"]) for session_id in IDS}
    moved = [session_id for session_id in IDS if after[session_id] != before[session_id]]
    assert all(after[session_id] == "d" for session_id in moved), "a session moved between old shards"
    assert 600 <= len(moved) <= 900, len(moved)  # about a quarter
    # Removing a shard moves only its own sessions.
    without_b = {session_id: shard_for(session_id, ["a", "c"]) for session_id in IDS}
    assert all(without_b[s] == before[s] for s in IDS if before[s] != "b")


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        ([], "shards is empty"),
        (["a", "a"], "'a' more than once"),
        (["a", "b c"], "not 'b c'"),
        ("a,b", "not one string"),
    ],
)
def test_shard_for_refuses_a_ring_that_is_not_one(shards: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shard_for("user-1", shards)


async def test_a_store_refuses_every_operation_on_another_shards_session_and_leaves_the_file_as_it_was(
    make_store: Callable[..., CitadelSessionStore],
) -> None:
    mine = next(session_id for session_id in IDS if shard_for(session_id, SHARDS) == "a")
    theirs = next(session_id for session_id in IDS if shard_for(session_id, SHARDS) == "b")
    unguarded = make_store()
    await unguarded.session(theirs).add_items([{"role": "user", "content": "misplaced before the ring"}])
    unguarded.close()
    store = make_store(shards=SHARDS, shard="a")
    await store.session(mine).add_items([{"role": "user", "content": "hello"}])
    assert await store.session(mine).get_items() == [{"role": "user", "content": "hello"}]
    with pytest.raises(
        WrongShardError, match=rf"session '{theirs}' belongs to shard 'b', not to this one \('a'\)"
    ) as caught:
        store.session(theirs)
    assert (caught.value.session_id, caught.value.owner, caught.value.shard) == (theirs, "b", "a")
    refused = {
        "erase_session": lambda: store.erase_session(theirs),
        "erase_sessions": lambda: store.erase_sessions([mine, theirs]),
        "export": lambda: store.export(theirs),
        "summary": lambda: store.summary(theirs),
        "import_items": lambda: store.import_items(theirs, [{"role": "user", "content": "x"}], mode="append"),
    }
    for call in refused.values():
        with pytest.raises(WrongShardError, match="belongs to shard 'b'"):
            call()
    store.close()
    with make_store() as unguarded:  # nothing was read or written: the misplaced session is whole
        assert await unguarded.session(theirs).get_items() == [
            {"role": "user", "content": "misplaced before the ring"}
        ]
        assert await unguarded.session(mine).get_items() == [{"role": "user", "content": "hello"}]


def test_a_store_given_half_a_ring_is_refused(tmp_path: Path) -> None:
    for kwargs, message in (
        ({"shards": SHARDS}, "set shard"),
        ({"shard": "a"}, "set shards"),
        ({"shards": SHARDS, "shard": "d"}, "'d' is not one of the shards a, b, c"),
    ):
        with pytest.raises(ValueError, match=message):
            CitadelSessionStore(
                tmp_path / "agent.cdl", "a passphrase for the ring", argon2_profile="iot", **kwargs
            )
    assert not (tmp_path / "agent.cdl").exists()


def test_the_ring_comes_from_toml_or_variables_and_from_config_guards_with_it(
    clean_environment: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "citadel.toml").write_text('path = "agent.cdl"\nshards = ["a", "b", "c"]\nshard = "a"\n')
    monkeypatch.setenv("CITADEL_KEY", "a passphrase for the ring")
    monkeypatch.setenv("CITADEL_ARGON2_PROFILE", "iot")
    settings = CitadelSettings()
    assert (settings.shards, settings.shard) == (SHARDS, "a")
    monkeypatch.setenv("CITADEL_SHARDS", "a, b,c")
    monkeypatch.setenv("CITADEL_SHARD", "b")
    settings = CitadelSettings()
    assert (settings.shards, settings.shard, str(settings.provenance("shards").origin)) == (
        SHARDS,
        "b",
        "environment variable CITADEL_SHARDS",
    )
    with from_config() as store:
        theirs = next(session_id for session_id in IDS if shard_for(session_id, SHARDS) == "c")
        with pytest.raises(WrongShardError, match="belongs to shard 'c'"):
            store.session(theirs)
    monkeypatch.setenv("CITADEL_SHARD", "d")
    with pytest.raises(ConfigurationError, match="shard 'd' is not one of the shards a, b, c"):
        CitadelSettings()


def test_an_operator_command_for_another_shards_session_says_where_it_is(
    clean_environment: None, tmp_path: Path
) -> None:
    theirs = next(session_id for session_id in IDS if shard_for(session_id, SHARDS) == "c")
    env = {
        "PATH": "/usr/bin:/bin",
        "CITADEL_PATH": str(tmp_path / "agent.cdl"),
        "CITADEL_KEY": "a passphrase for the ring",
        "CITADEL_ARGON2_PROFILE": "iot",
        "CITADEL_SHARDS": "a,b,c",
        "CITADEL_SHARD": "a",
    }
    asyncio.run(_create(tmp_path / "agent.cdl"))
    done = subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", "erase", theirs, "--yes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # a hang guard: the CLI took 2 s at most under load (suite_under_load.py, 2026-12-08)
    )
    assert done.returncode == 1, done
    assert done.stderr.startswith(f"error: session '{theirs}' belongs to shard 'c', not to this one ('a')"), (
        done.stderr
    )
    assert "Traceback" not in done.stderr


async def _create(path: Path) -> None:
    with CitadelSessionStore(path, "a passphrase for the ring", argon2_profile="iot") as store:
        await store.session("someone").add_items([{"role": "user", "content": "hi"}])
