"""Changing a fleet's ring while it runs: the ring file, the fence, `rebalance` and `ring --finish`.

Shards read their ``shards`` from one ring file. ``ring --begin`` records the new ring with the
old one as ``previous``: a session the two place on different shards is refused on every shard
(`ShardMovingError`, naming where it goes) but to the move; ``rebalance`` copies, compares and
erases each at its old shard; ``ring --finish`` checks that no old shard still holds one. These
tests drive the commands as an operator does, on files that no server holds; tests/test_fleet.py
adds a shard to a fleet under load behind nginx.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from citadeldb_openai_agents import (
    CitadelSessionStore,
    ConfigurationError,
    ShardMovingError,
    WrongShardError,
    from_config,
    read_ring_file,
    shard_for,
)
from citadeldb_openai_agents.shards import RingFile

KEY = "a passphrase for the ring"
OLD, NEW = ["a", "b", "c"], ["a", "b", "c", "d"]
IDS = [f"user-{n}" for n in range(40)]
PEOPLE = ["ann", "ben", "cat"]  # session i is about PEOPLE[i % 3]
# How long one command may run before the test fails instead of hanging: the slowest (a whole
# `rebalance` or `ring --complete`) took 3.3 s under load (benchmarks/suite_under_load.py, 2026-12-08).
COMMAND_SECONDS = 120


def configure(tmp_path: Path, name: str) -> Path:
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'path = "{tmp_path / name}.cdl"\nshard = "{name}"\nring_file = "{tmp_path / "ring.toml"}"\n'
        'argon2_profile = "iot"\n'
    )
    return config


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "CITADEL_KEY": KEY}
    return subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_SECONDS,
    )


def items(n: int, session_id: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{session_id} says {i}"} for i in range(n)]


async def held(config: Path) -> dict[str, int]:
    """Every session the shard's file holds, with its item count (read past the guard's ring)."""
    with CitadelSessionStore(Path(str(config).removesuffix(".toml") + ".cdl"), KEY, create=False) as store:
        return {summary.session_id: summary.items for summary in store.sessions()}


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Shards a, b and c, each holding the sessions the old ring gives it (i+1 items each, about
    PEOPLE[i % 3], labelled {"n": i}), and d, empty."""
    monkeypatch.setenv("CITADEL_KEY", KEY)
    (tmp_path / "ring.toml").write_text('shards = ["a", "b", "c"]\n')
    configs = {name: configure(tmp_path, name) for name in OLD}

    async def fill() -> None:
        for name, config in configs.items():
            with from_config(config) as store:
                for i, session_id in enumerate(IDS):
                    if shard_for(session_id, OLD) == name:
                        session = store.session(session_id, owner=PEOPLE[i % 3], labels={"n": i})
                        await session.add_items(items(i + 1, session_id))

    asyncio.run(fill())
    configs["d"] = configure(tmp_path, "d")
    return configs


def test_a_new_shard_gets_exactly_its_sessions_each_whole_and_each_in_one_file(
    fleet: dict[str, Path],
) -> None:
    moving = [sid for sid in IDS if shard_for(sid, NEW) != shard_for(sid, OLD)]
    staying = [sid for sid in IDS if sid not in moving]
    assert moving and all(shard_for(sid, NEW) == "d" for sid in moving)
    # d is not in the ring yet: its configuration is refused, and `ring --finish` has nothing to end.
    assert "shard 'd' is not in the ring file" in cli("init", "--config", fleet["d"]).stderr
    assert cli("ring", "--finish", "--config", fleet["a"]).returncode == 1

    begun = cli("ring", "--begin", ",".join(NEW), "--config", fleet["a"])
    assert begun.returncode == 0, begun.stderr
    assert "from a, b, c to a, b, c, d" in begun.stdout
    assert cli("init", "--config", fleet["d"]).returncode == 0

    async def during_the_change() -> None:
        for name in NEW:
            with from_config(fleet[name]) as store:
                for sid in moving:  # refused on every shard, the old and the new, naming both
                    with pytest.raises(
                        ShardMovingError, match=f"moving from shard '{shard_for(sid, OLD)}' to 'd'"
                    ):
                        store.session(sid)
                for sid in staying:
                    if shard_for(sid, OLD) == name:  # the others' sessions are untouched
                        await store.session(sid).add_items([{"role": "user", "content": "still here"}])

    asyncio.run(during_the_change())
    # Finishing now would leave the moving sessions where the new ring no longer looks: refused.
    shards = [arg for name in OLD for arg in ("--shard-config", f"{name}={fleet[name]}")]
    early = cli("ring", "--finish", "--config", fleet["a"], *shards)
    assert (
        early.returncode == 1
        and "still holds" in early.stderr
        and "run `rebalance` there first" in early.stderr
    )
    assert "previous" in (fleet["a"].parent / "ring.toml").read_text()

    for name in OLD:
        done = cli("rebalance", "--config", fleet[name], "--shard-config", f"d={fleet['d']}")
        assert done.returncode == 0, done.stderr
        expected = sum(shard_for(sid, OLD) == name for sid in moving)
        assert (
            done.stdout.splitlines()[-1]
            == f"moved {expected} session{'s' * (expected != 1)} from shard {name}"
        )
    finished = cli("ring", "--finish", "--config", fleet["a"], *shards)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip().endswith("shards a, b, c, d")

    # Each session in exactly one file, the one the new ring names, with every item it had.
    homes = {name: asyncio.run(held(fleet[name])) for name in NEW}
    for i, sid in enumerate(IDS):
        where = [name for name in NEW if sid in homes[name]]
        assert where == [shard_for(sid, NEW)], (sid, where)
        assert homes[where[0]][sid] == i + 1 + (sid in staying)

    async def after() -> None:
        with from_config(fleet["a"]) as a, from_config(fleet["d"]) as d:
            sid = moving[0]
            with pytest.raises(WrongShardError, match="belongs to shard 'd'") as refused:
                a.session(sid)
            assert not isinstance(refused.value, ShardMovingError)
            assert await d.session(sid).get_items() == items(IDS.index(sid) + 1, sid)

    asyncio.run(after())


def test_rebalance_without_a_change_under_way_or_without_a_target_moves_nothing(
    fleet: dict[str, Path],
) -> None:
    outside = cli("rebalance", "--config", fleet["a"], "--shard-config", f"d={fleet['d']}")
    assert outside.returncode == 1 and "no ring change is under way" in outside.stderr
    assert cli("ring", "--begin", ",".join(NEW), "--config", fleet["b"]).returncode == 0
    again = cli("ring", "--begin", "a,b,c,d,e", "--config", fleet["b"])
    assert again.returncode == 1 and "under way" in again.stderr
    before = asyncio.run(held(fleet["a"]))
    missing = cli("rebalance", "--config", fleet["a"])
    assert missing.returncode == 1 and "sessions of shard a go to d: pass --shard-config" in missing.stderr
    assert asyncio.run(held(fleet["a"])) == before
    shown = cli("ring", "--config", fleet["c"])
    assert "shards:   a, b, c, d" in shown.stdout and "from a, b, c (sessions moving)" in shown.stdout


async def test_a_ring_file_that_cannot_be_used_refuses_every_session_until_it_is_mended(
    fleet: dict[str, Path],
) -> None:
    ring = fleet["a"].parent / "ring.toml"
    with from_config(fleet["a"]) as store:
        ours = next(sid for sid in IDS if shard_for(sid, OLD) == "a")
        session = store.session(ours)
        for broken in ['shards = "a"\n', "shards = [\n", 'shards = ["a"]\nowner = "me"\n']:
            ring.write_text(broken)
            os.utime(ring, ns=(0, len(broken)))  # a rewrite within the clock's tick is still seen
            with pytest.raises(ConfigurationError, match=r"the ring file .* is not usable"):
                await session.get_items()
        ring.unlink()
        with pytest.raises(ConfigurationError, match="cannot be read"):
            await session.add_items([{"role": "user", "content": "lost?"}])
        ring.write_text('shards = ["a", "b", "c"]\n')
        assert len(await session.get_items()) == IDS.index(ours) + 1  # nothing was written meanwhile


def test_a_shard_removed_hands_each_of_its_sessions_to_the_shard_the_smaller_ring_names(
    fleet: dict[str, Path],
) -> None:
    smaller = ["a", "b"]
    leaving = [sid for sid in IDS if shard_for(sid, OLD) == "c"]
    assert cli("ring", "--begin", ",".join(smaller), "--config", fleet["c"]).returncode == 0
    targets = [arg for name in smaller for arg in ("--shard-config", f"{name}={fleet[name]}")]
    done = cli("rebalance", "--config", fleet["c"], *targets)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"moved {len(leaving)} sessions from shard c"
    running_at_c = RingFile(fleet["c"].parent / "ring.toml", "c")  # the ring a process of c started with
    finished = cli(
        "ring", "--finish", "--config", fleet["a"], *targets[2:], "--shard-config", f"c={fleet['c']}"
    )
    assert finished.returncode == 0, finished.stderr
    homes = {name: asyncio.run(held(fleet[name])) for name in OLD}
    assert homes["c"] == {}
    for i, sid in enumerate(IDS):
        assert [name for name in OLD if sid in homes[name]] == [shard_for(sid, smaller)], sid
        assert homes[shard_for(sid, smaller)][sid] == i + 1

    # A process of c still running sends every session on; a new one is refused its start.
    with pytest.raises(WrongShardError, match=f"belongs to shard '{shard_for(leaving[0], smaller)}'"):
        running_at_c.check(leaving[0])
    with pytest.raises(ConfigurationError, match="shard 'c' is not in the ring file"):
        from_config(fleet["c"])


def test_a_rebalanced_session_keeps_its_owner_and_labels_and_the_persons_erasure_finds_it(
    fleet: dict[str, Path],
) -> None:
    assert cli("ring", "--begin", ",".join(NEW), "--config", fleet["a"]).returncode == 0
    assert cli("init", "--config", fleet["d"]).returncode == 0
    for name in OLD:
        assert cli("rebalance", "--config", fleet[name], "--shard-config", f"d={fleet['d']}").returncode == 0
    shards = [arg for name in NEW[1:] for arg in ("--shard-config", f"{name}={fleet[name]}")]
    assert cli("ring", "--finish", "--config", fleet["a"], *shards).returncode == 0
    with CitadelSessionStore(fleet["d"].with_suffix(".cdl"), KEY, create=False) as d:
        arrived = {(s.session_id, s.owner, json.dumps(s.labels)) for s in d.sessions()}
    assert arrived and arrived == {
        (sid, PEOPLE[IDS.index(sid) % 3], json.dumps({"n": IDS.index(sid)}))
        for sid in IDS
        if shard_for(sid, NEW) == "d"
    }
    ann = [sid for i, sid in enumerate(IDS) if PEOPLE[i % 3] == "ann"]
    assert any(shard_for(sid, NEW) == "d" for sid in ann)
    erased = cli("erase", "--owner", "ann", "--yes", "--json", "--config", fleet["a"], *shards)
    assert erased.returncode == 0, erased.stderr
    receipt = json.loads(erased.stdout)
    assert sorted((s["session_id"], s["shard"]) for s in receipt["sessions"]) == sorted(
        (sid, shard_for(sid, NEW)) for sid in ann
    )
    left = {name: asyncio.run(held(fleet[name])) for name in NEW}
    assert not any(sid in left[name] for name in NEW for sid in ann)
    assert sum(len(found) for found in left.values()) == len(IDS) - len(ann)


def homes(fleet: dict[str, Path], names: list[str]) -> dict[str, list[tuple[str, int]]]:
    """Each session with the shards holding it and its item count there."""
    found: dict[str, list[tuple[str, int]]] = {}
    for name in names:
        for sid, count in asyncio.run(held(fleet[name])).items():
            found.setdefault(sid, []).append((name, count))
    return found


def every_shard(fleet: dict[str, Path], *names: str) -> list[str]:
    return [arg for name in names for arg in ("--shard-config", f"{name}={fleet[name]}")]


def test_one_command_completes_a_change_or_rolls_it_back(fleet: dict[str, Path]) -> None:
    assert cli("ring", "--begin", ",".join(NEW), "--config", fleet["a"]).returncode == 0
    assert cli("init", "--config", fleet["d"]).returncode == 0
    partly = cli("rebalance", "--config", fleet["a"], "--shard-config", f"d={fleet['d']}")  # a only
    assert partly.returncode == 0, partly.stderr
    missing = cli("ring", "--abort", "--config", fleet["a"], *every_shard(fleet, "b", "c"))
    assert missing.returncode == 1 and "pass --shard-config NAME=PATH for d" in missing.stderr
    assert "previous" in (fleet["a"].parent / "ring.toml").read_text()  # nothing changed
    back = cli("ring", "--abort", "--config", fleet["a"], *every_shard(fleet, "b", "c", "d"))
    assert back.returncode == 0, back.stderr
    assert (
        back.stdout.splitlines()[-1].startswith("ring change rolled back in ")
        and "shards a, b, c" in back.stdout
    )
    assert (fleet["a"].parent / "ring.toml").read_text() == 'shards = ["a", "b", "c"]\n'
    where = homes(fleet, NEW)
    assert {sid: [shard for shard, _ in found] for sid, found in where.items()} == {
        sid: [shard_for(sid, OLD)] for sid in IDS
    }
    assert all(found[0][1] == IDS.index(sid) + 1 for sid, found in where.items())  # every item home
    # The same change again, this time carried out by one command.
    assert cli("ring", "--begin", ",".join(NEW), "--config", fleet["a"]).returncode == 0
    done = cli("ring", "--complete", "--config", fleet["a"], *every_shard(fleet, "b", "c", "d"))
    assert done.returncode == 0, done.stderr
    where = homes(fleet, NEW)
    assert {sid: [shard for shard, _ in found] for sid, found in where.items()} == {
        sid: [shard_for(sid, NEW)] for sid in IDS
    }
    assert (fleet["a"].parent / "ring.toml").read_text() == 'shards = ["a", "b", "c", "d"]\n'


def kill_at_phase(argv: list[str], env: dict[str, str], directory: Path, phase: int) -> None:
    """Run `argv` and SIGKILL it once it begins its `phase`-th phase of writes, unless it ends first.

    A phase is a run of writes to one shard's file: a session's move writes its target (the copy),
    then its source (the erase), so once the third phase begins the first session moved is
    settled and the second is under way. The kill is placed by what the command did (the files'
    modification times, polled), not by a clock: on a slower or busier machine, it lands at the
    same point of the change."""
    running = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    files = sorted(directory.glob("*.cdl"))
    last = {path: path.stat().st_mtime_ns for path in files}
    writing, begun = None, 0
    deadline = time.monotonic() + COMMAND_SECONDS
    while running.poll() is None and begun < phase:
        assert time.monotonic() < deadline, f"{argv} still runs after {COMMAND_SECONDS} s"
        for path in files:
            modified = path.stat().st_mtime_ns
            if modified != last[path] and path != writing:
                writing, begun = path, begun + 1
            last[path] = modified
        time.sleep(0.002)
    running.kill()
    running.wait(COMMAND_SECONDS)


# The long tier: SIGKILLs at several moments of one command, each followed by the same command.
@pytest.mark.slow
@pytest.mark.parametrize("command", ["--complete", "--abort"])
def test_a_change_cut_by_sigkill_is_finished_by_running_the_command_again(
    fleet: dict[str, Path], command: str
) -> None:
    # The moving sessions made long (400 items more each), so each move takes a while to cut into.
    moving = [sid for sid in IDS if shard_for(sid, NEW) != shard_for(sid, OLD)]
    count = {sid: IDS.index(sid) + 1 + 400 * (sid in moving) for sid in IDS}
    for sid in moving:
        with from_config(fleet[shard_for(sid, OLD)]) as store:
            store.import_items(sid, items(400, sid + " more"), mode="append")
    assert cli("ring", "--begin", ",".join(NEW), "--config", fleet["a"]).returncode == 0
    assert cli("init", "--config", fleet["d"]).returncode == 0
    shards = every_shard(fleet, "b", "c", "d")
    env = {"PATH": os.environ["PATH"], "CITADEL_KEY": KEY}
    ring_file = fleet["a"].parent / "ring.toml"

    def next_command() -> str | None:
        """The same command while the change is under way; None once it has ended."""
        return None if read_ring_file(ring_file)[1] is None else command

    target = NEW if command == "--complete" else OLD

    def settled() -> int:
        """The sessions in the one file the target ring names (a session in two files: not yet)."""
        where = homes(fleet, NEW)
        return sum(found == [(shard_for(sid, target), count[sid])] for sid, found in where.items())

    if command == "--abort":  # some sessions have moved: the rollback has something to bring back
        assert cli("rebalance", "--config", fleet["a"], *shards[-2:]).returncode == 0
        assert cli("rebalance", "--config", fleet["b"], *shards[-2:]).returncode == 0
    before = settled()
    cut: list[int] = []  # after each kill, settled()
    # Each kill once the command has begun its writes to a file that many times (see kill_at_phase):
    # in the next session's copy (3, 5) or in the erase of the one it copied (4).
    for phase in (3, 4, 3, 5, 3):
        step = next_command()
        if step is None:
            break
        argv = [
            sys.executable,
            "-m",
            "citadeldb_openai_agents",
            "ring",
            step,
            "--config",
            str(fleet["a"]),
            *shards,
        ]
        kill_at_phase(argv, env, fleet["a"].parent, phase)
        cut.append(settled())
    step = next_command()
    if step is not None:
        done = cli("ring", step, "--config", fleet["a"], *shards)
        assert done.returncode == 0, done.stderr
    assert read_ring_file(ring_file) == (tuple(NEW if command == "--complete" else OLD), None)
    print(f"\n{command}: sessions settled before: {before}, after each SIGKILL: {cut} (of {len(IDS)})")
    assert any(before < settled_then < len(IDS) for settled_then in cut), f"no kill landed mid-change: {cut}"
    ring = NEW if command == "--complete" else OLD
    where = homes(fleet, NEW)
    assert {sid: found for sid, found in where.items()} == {
        sid: [(shard_for(sid, ring), count[sid])] for sid in IDS
    }
