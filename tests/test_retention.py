"""Retention as users of the SDK's sessions think of it (issue 29): the TTL of a whole session,
pushed forward by every write; sessions idle too long erased with receipts, by `purge` or by the
owner on its own schedule; a session's own settings in place of the store's.

Durations are seconds: the clock is the one Citadel stamps every atom with, which cannot be
injected. Each step waits until a moment counted from the write it depends on: a check that a
session or item is gone waits past its deadline counted from a moment after the write returned
(its deadline cannot be later, however slow the write), and a check that one is still there ends
well before its deadline counted from a moment before the write began. That margin is at least
10x what the steps inside it took under load, each named with its figure below: the figures are
from benchmarks/suite_under_load.py --runs 1 --command -- python -m pytest -q -s
tests/test_retention.py, 2026-12-08, two busy loops beside it (the slowest of five runs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from test_erasure import stored_ids, verdicts_after_recreating
from test_serving import owner_running

from citadeldb_openai_agents import CitadelSessionStore, ConfigurationError, from_config
from citadeldb_openai_agents.cli.main import main
from citadeldb_openai_agents.storage import retention

from conftest import KEY


def said(*words: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": word} for word in words]


def contents(items: list[Any]) -> list[str]:
    return [item["content"] for item in items]


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's own sweep held off, so that what `purge` finds is left for it to find."""
    monkeypatch.setattr(retention, "sweep_period", lambda layout, states: 3600.0)


async def test_in_session_mode_every_write_pushes_the_whole_sessions_expiry(make_store: Any) -> None:
    by_session = make_store(ttl=3.3, ttl_mode="session")
    by_item = make_store(Path(str(by_session.path) + ".items.cdl"), ttl=3.3)
    for store in (by_session, by_item):
        await store.session("s").add_items(said("one"))
    one = time.monotonic()
    wait_until(one + 0.5)
    # Written to again before its deadline (3.3 s after the first write began): the four writes
    # and the wait's overshoot took 0.25 s beside the 0.5 s wait; the margin is 2.8 s.
    for store in (by_session, by_item):
        await store.session("s").add_items(said("two"))
    two = time.monotonic()
    wait_until(one + 3.4)  # "one" is older than the ttl; "two" is about 2.9 s old
    # Both "two"s live until one + 3.8 at least: these reads took 0.033 s; the margin is 0.4 s.
    assert contents(await by_session.session("s").get_items()) == ["one", "two"]
    assert contents(await by_item.session("s").get_items()) == ["two"], "item mode: each item ages alone"
    written = stored_ids(by_session, "s")
    wait_until(two + 3.5)  # past the ttl after the last write
    assert await by_session.session("s").get_items() == []
    assert by_session.sessions() == []
    assert verdicts_after_recreating(by_session, written) == {"missing"}, "erased, not hidden"


async def test_a_pop_is_a_write_and_pushes_the_sessions_expiry_too(make_store: Any) -> None:
    store = make_store(ttl=2.0, ttl_mode="session")
    session = store.session("s")
    await session.add_items(said("one", "two", "three"))
    written = time.monotonic()
    wait_until(written + 0.3)
    # The pop comes before the deadline (2 s after the write began): the write, the pop and the
    # wait's overshoot took 0.14 s beside the 0.3 s wait; the margin is 1.7 s.
    assert contents([await session.pop_item()]) == ["three"]
    wait_until(written + 2.1)  # past the ttl after the items were written, about 1.8 s after the pop
    # The pop pushed the deadline to written + 2.3 at least: the read took 0.005 s; the margin is 0.2 s.
    assert contents(await session.get_items()) == ["one", "two"]


async def test_idle_sessions_are_erased_by_purge_with_receipts_across_a_restart(
    make_store: Any, db_path: Path, no_sweep: None
) -> None:
    first = make_store(idle_ttl=3.6)
    await first.session("alice").add_items(said("alice's only message"))
    alice_wrote = time.monotonic()
    alice = stored_ids(first, "alice")
    await first.session("bob").add_items(said("bob's first"))
    first.close()  # the file closes: what follows reads it again
    second = make_store(idle_ttl=3.6)
    wait_until(alice_wrote + 2.3)
    # Bob is written to again before his deadline (alice_wrote + 3.6): bob's first write, the
    # reopen, this write and the wait's overshoot took 0.044 s beside the 2.3 s wait; the margin
    # is 1.3 s.
    await second.session("bob").add_items(said("bob's second"))
    wait_until(alice_wrote + 3.7)  # alice: past 3.6 s without a write; bob: about 1.4 s
    # Bob lives until alice_wrote + 5.9 at least: the purges and the export took 0.16 s; the
    # margin is 2.2 s.
    report = second.purge()
    assert report.expired_items == 0
    [ended] = report.ended
    assert (ended.session_id, ended.rule, ended.erasure.items_erased) == ("alice", "idle_ttl", 1)
    assert contents(second.export("bob")) == ["bob's first", "bob's second"]
    assert second.purge().ended == [], "erased once"
    assert ended.erasure.readback_confirmed
    assert verdicts_after_recreating(second, alice) == {"missing"}


async def test_an_idle_session_is_hidden_before_any_purge_and_erased_when_used(
    make_store: Any, no_sweep: None
) -> None:
    store = make_store(idle_ttl=3.0)
    await store.session("s").add_items(said("old news"))
    written = stored_ids(store, "s")
    time.sleep(3.1)  # from after the write: past its deadline
    assert store.sessions() == [] and store.session_ids() == []
    # The new conversation is read back before its deadline (3 s after its write began): the
    # write and the read took 0.26 s; the margin is 3 s.
    await store.session("s").add_items(said("a new conversation"))
    assert contents(await store.session("s").get_items()) == ["a new conversation"]
    assert verdicts_after_recreating(store, written) == {"missing"}


async def test_a_sessions_own_settings_replace_the_stores_and_are_kept_with_it(
    make_store: Any, no_sweep: None
) -> None:
    store = make_store(ttl=8.0, idle_ttl=0.5)
    vip = store.session("vip", ttl_mode="session", idle_ttl=math.inf)  # lives 8 s after its last write
    plain = store.session("plain")  # each item 8 s; the session 0.5 s after its last write
    kept = store.session("kept", idle_ttl=math.inf)  # each item 8 s; never ended for idleness
    for session in (vip, plain, kept):
        await session.add_items(said("first"))
    first = time.monotonic()
    wait_until(first + 0.7)
    await vip.add_items(said("second"))
    second = time.monotonic()
    store.close()
    reopened = make_store(ttl=8.0, idle_ttl=0.5)  # the settings came with the writes, not the objects
    # Kept's item is still there for this purge (its expiry: 8 s after the writes began, at
    # least): the writes, the reopen and the purge took 0.71 s beside the 0.7 s wait; the margin
    # is 7.3 s.
    assert [(s.session_id, s.rule) for s in reopened.purge().ended] == [("plain", "idle_ttl")]
    wait_until(first + 8.1)  # "first" is older than the ttl; vip's last write is 7.4 s old
    # Vip lives until first + 8.7 at least: these reads took 0.032 s; the margin is 0.6 s.
    assert contents(await reopened.session("vip").get_items()) == ["first", "second"], "session mode"
    assert await reopened.session("kept").get_items() == [], "item mode: its only item expired"
    wait_until(second + 8.1)  # vip 8.1 s after its last write
    report = reopened.purge()
    assert [(s.session_id, s.rule, s.erasure.items_erased) for s in report.ended] == [("vip", "ttl", 2)]
    assert report.expired_items == 1  # kept's


def wait_until(moment: float) -> None:
    """Sleep until `time.monotonic()` reaches `moment` (not at all if it has)."""
    time.sleep(max(0.0, moment - time.monotonic()))


# Owns the file with the settings given as JSON in argv[3]; the owner's own sweep runs. Each
# session retention erases is a line in the file's path + ".erased", naming who found it.
OWNER = textwrap.dedent(
    """
    import json, logging, sys
    from citadeldb_openai_agents import CitadelSessionStore
    erased = open(sys.argv[1] + ".erased", "a", buffering=1)
    class Erased(logging.Handler):
        def emit(self, record):
            if getattr(record, "citadel_cause", None) == "retention":
                erased.write(f"{record.citadel_trigger}\\n")
    logger = logging.getLogger("citadeldb_openai_agents")
    logger.addHandler(Erased())
    logger.setLevel(logging.INFO)
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot", **json.loads(sys.argv[3]))
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def erased_by_the_owner(db_path: Path, sessions: int) -> list[str]:
    """Who found each of the first `sessions` sessions the owner erased (OWNER's lines), once
    it has erased that many. Under load both were erased 2.6 s at most after the client's write
    (the rule: 2 s, a sweep every 0.5 s); a minute is far above that."""
    log, deadline = Path(str(db_path) + ".erased"), time.monotonic() + 60
    while len(found := log.read_text().split() if log.exists() else []) < sessions:
        assert time.monotonic() < deadline, f"the owner erased {found} in a minute, not {sessions} sessions"
        time.sleep(0.05)
    return found[:sessions]


@pytest.mark.parametrize("rule", [{"ttl": 2.0, "ttl_mode": "session"}, {"idle_ttl": 2.0}])
async def test_the_owner_erases_ended_sessions_on_its_own_schedule_a_clients_and_older_ones_too(
    db_path: Path, rule: dict[str, Any]
) -> None:
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot", **rule) as earlier:
        await earlier.session("written before the owner opened the file").add_items(said("old"))
    with (
        owner_running(OWNER, db_path, json.dumps(rule)) as owner,
        CitadelSessionStore(db_path, KEY, **rule) as client,
    ):
        assert client.served_by == owner.pid
        await client.session("a client's").add_items(said("through the owner"))
        assert erased_by_the_owner(db_path, 2) == ["sweep", "sweep"]  # past the rule, found by its sweep
        # Active is not ended by the time the owner is killed (its deadline: 2 s after its
        # write): the write and the client's close took 0.14 s; the margin is 2 s.
        await client.session("active").add_items(said("just now"))
    # The owner gone, the file is opened with no rule at all: only its sweep can have erased them.
    with CitadelSessionStore(db_path, KEY) as plain:
        assert plain.session_ids() == ["active"]
        assert stored_ids(plain, "a client's") == {}
        assert stored_ids(plain, "written before the owner opened the file") == {}


def test_a_client_must_end_sessions_by_the_owners_rules_or_adopt_them(db_path: Path) -> None:
    with owner_running(OWNER, db_path, json.dumps({"ttl": 60, "ttl_mode": "session", "idle_ttl": 3600})):
        with pytest.raises(ConfigurationError) as refused:
            CitadelSessionStore(db_path, KEY, ttl=60)
        problems = "\n".join(refused.value.problems)
        assert "ttl_mode: this process has 'item', the owner has 'session'" in problems
        assert "idle_ttl: this process has none (never for idleness), the owner has 1h" in problems
        with CitadelSessionStore(db_path, KEY, ttl=60, adopt=("ttl_mode", "idle_ttl")) as adopter:
            assert (adopter.ttl_mode, adopter.idle_ttl) == ("session", 3600)
            assert adopter.adopted == {"ttl_mode": "session", "idle_ttl": 3600}
            # The one options value the store holds is the adopted one, and nothing can change it.
            options = adopter.options
            assert (options.ttl, options.ttl_mode, options.idle_ttl) == (60, "session", 3600)
            with pytest.raises(dataclasses.FrozenInstanceError):
                options.idle_ttl = None  # type: ignore[misc]


def test_two_stores_of_one_process_on_one_file_end_sessions_by_the_same_rules(make_store: Any) -> None:
    make_store(ttl=60, ttl_mode="session")
    with pytest.raises(ConfigurationError, match=r"ttl_mode 'session', ttl 60\.0s and no idle_ttl"):
        make_store(ttl=60)
    make_store(ttl=60, ttl_mode="session")  # the same rules: shared


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"ttl_mode": "sessions"}, "ttl_mode must be one of item, session"),
        ({"idle_ttl": 0}, "idle_ttl must be a positive number of seconds or None"),
        ({"idle_ttl": math.inf}, "idle_ttl must be a positive number"),
    ],
)
def test_retention_settings_are_checked(make_store: Any, arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_store(**arguments)


def test_a_sessions_own_idle_ttl_may_be_never_but_not_zero(store: CitadelSessionStore) -> None:
    assert store.session("s", idle_ttl=math.inf) is not None
    with pytest.raises(ValueError, match=r"math.inf \(never\)"):
        store.session("s", idle_ttl=0)


def test_the_settings_come_from_toml_or_variables_and_purge_prints_what_each_rule_erased(
    tmp_path: Path, clean_environment: None, monkeypatch: pytest.MonkeyPatch, capsys: Any, no_sweep: None
) -> None:
    (tmp_path / "citadel.toml").write_text(
        'path = "agent.cdl"\nttl_mode = "session"\nttl = "1s"\nargon2_profile = "iot"\n', encoding="utf-8"
    )
    monkeypatch.setenv("CITADEL_KEY", KEY)
    monkeypatch.setenv("CITADEL_IDLE_TTL", "30d")
    with from_config() as store:
        assert (store.ttl, store.ttl_mode, store.idle_ttl) == (1.0, "session", 30 * 86400)
        asyncio.run(store.session("alice").add_items(said("hello", "there")))
    assert main(["check", "--no-open"]) == 0
    shown = capsys.readouterr().out
    # A row per setting: its name, then its value (the columns are as wide as the longest name).
    assert re.search(r"^  ttl_mode +session ", shown, re.M) and re.search(r"^  idle_ttl +30d ", shown, re.M)
    time.sleep(1.2)
    assert main(["purge"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("erased 0 expired items from ")
    assert printed[1] == "erased 1 session that ended:"
    assert printed[2].startswith("erased session 'alice' from ") and printed[2].endswith(
        ": its ttl ran out (ttl_mode session)"
    )
    assert printed[3] == "  items erased:       2"
    assert main(["purge", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ended_sessions"] == []
    # Rules that end sessions are in force: a purge that ended none says so.
    assert main(["purge"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["erased 0 sessions that ended"]


def test_purge_exits_1_when_the_readback_of_an_ended_session_finds_an_item(
    tmp_path: Path,
    clean_environment: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    no_sweep: None,
    readback_still_finds: Any,
) -> None:
    (tmp_path / "citadel.toml").write_text('path = "agent.cdl"\nidle_ttl = "1s"\nargon2_profile = "iot"\n')
    monkeypatch.setenv("CITADEL_KEY", KEY)
    with from_config() as store:
        asyncio.run(store.session("alice").add_items(said("hello")))
        [ids] = stored_ids(store, "alice").values()
    readback_still_finds(*ids)
    time.sleep(1.2)
    assert main(["purge"]) == 1
    out, err = capsys.readouterr()
    assert "erased session 'alice'" in out and "readback confirmed: NO" in out
    assert "the readback did not confirm the erasure of 'alice'" in err


async def test_each_branch_ends_by_its_own_writes(make_store: Any, no_sweep: None) -> None:
    store = make_store(idle_ttl=8.0)
    session = store.session("s")
    await session.add_items(said("one", "two"))
    await session.create_branch_from_turn(2, "alt")  # written now: "one"
    await session.switch_to_branch("main")
    branched = time.monotonic()
    wait_until(branched + 5.0)
    # Main is written to again before its deadline (8 s after its first write began): that
    # write, the branch and the wait's overshoot took 0.26 s beside the 5 s wait; the margin is 3 s.
    await session.add_items(said("three"))  # main stays active
    wait_until(branched + 8.1)  # alt: past 8 s without a write; main: about 3.1 s
    # Main lives until branched + 13 at least: the purge and the reads below took 0.45 s; the
    # margin is 4.9 s.
    report = store.purge()
    assert [(s.session_id, s.branch, s.rule, s.erasure.items_erased) for s in report.ended] == [
        ("s", "alt", "idle_ttl", 1)
    ]
    assert contents(await session.get_items()) == ["one", "two", "three"]
    assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
