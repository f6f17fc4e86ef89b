"""max_items: a capped session keeps its newest items and erases the rest for real (issue 29)."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_erasure import stored_ids, verdicts_after_recreating
from test_serving import owner_running

from citadeldb_openai_agents import CitadelSessionStore, ConfigurationError, from_config, restore_backup
from citadeldb_openai_agents.cli.main import main
from citadeldb_openai_agents.serving.operations import ProtocolError, batch
from citadeldb_openai_agents.storage import writes
from citadeldb_openai_agents.storage.codec import encode_batch

from conftest import KEY


def said(*numbers: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"message {n}"} for n in numbers]


def contents(items: list[Any]) -> list[str]:
    return [item["content"] for item in items]


async def test_a_capped_session_keeps_its_newest_items_and_the_older_ones_keys_are_destroyed(
    make_store: Any,
) -> None:
    store = make_store()
    capped, other = store.session("capped", max_items=300), store.session("other")
    await other.add_items(said(1, 2))
    await capped.add_items(said(*range(0, 50)))
    first = stored_ids(store, "capped")  # erased later: the cut falls in another segment
    for start in range(50, 700, 50):  # 700 items, three segments: whole ones go, one is cut
        await capped.add_items(said(*range(start, start + 50)))

    assert contents(await capped.get_items()) == [f"message {n}" for n in range(400, 700)]
    assert contents(await other.get_items()) == ["message 1", "message 2"]
    assert verdicts_after_recreating(store, first) == {"missing"}
    kept = {i for ids in stored_ids(store, "capped").values() for i in ids}
    assert len(kept) == 300

    await capped.add_items(said(700))  # at the cap, each write erases as many as it adds
    assert contents(await capped.get_items(limit=2)) == ["message 699", "message 700"]
    assert len(await capped.get_items()) == 300
    assert store.verify().ok
    summary = store.summary("capped")
    assert summary is not None and summary.items == 300


async def test_a_cap_given_to_a_long_session_erases_every_older_segment_in_one_write(make_store: Any) -> None:
    store = make_store()
    for start in range(0, 700, 50):  # three segments, uncapped
        await store.session("s").add_items(said(*range(start, start + 50)))
    before = stored_ids(store, "s")
    await store.session("s", max_items=100).add_items(said(700))

    assert contents(await store.session("s").get_items()) == [f"message {n}" for n in range(601, 701)]
    after = stored_ids(store, "s")
    gone = {region: ids for region, ids in before.items() if region not in after}
    assert len(gone) == 2  # the two older segments, dropped whole
    assert verdicts_after_recreating(store, gone) == {"missing"}
    assert store.verify().ok


async def test_the_stores_cap_is_every_sessions_unless_a_session_sets_its_own(make_store: Any) -> None:
    store = make_store(max_items=3)
    assert store.max_items == 3
    await store.session("a").add_items(said(1, 2, 3, 4, 5))
    await store.session("b", max_items=10).add_items(said(1, 2, 3, 4, 5))
    await store.session("c").add_items(said(1))

    assert contents(await store.session("a").get_items()) == ["message 3", "message 4", "message 5"]
    assert len(await store.session("b").get_items()) == 5
    assert contents(await store.session("c").get_items()) == ["message 1"]
    # An uncapped session of the same file keeps what a capped one would erase.
    await make_store().session("d").add_items(said(1, 2, 3, 4, 5))
    assert len(await store.session("d").get_items()) == 5


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
async def test_a_cap_that_is_not_a_positive_whole_number_is_refused_and_nothing_is_written(
    make_store: Any, bad: Any
) -> None:
    store = make_store()
    await store.session("s").add_items(said(1, 2))
    with pytest.raises(ValueError, match="max_items must be a positive whole number"):
        store.session("s", max_items=bad)
    with pytest.raises(ValueError, match="max_items must be a positive whole number"):
        make_store(max_items=bad)
    assert len(await store.session("s").get_items()) == 2


def test_a_batch_from_the_socket_with_a_cap_below_one_is_a_protocol_error() -> None:
    wire = {**encode_batch(said(1)).__dict__, "max_items": 0}
    with pytest.raises(ProtocolError, match="max_items"):
        batch(wire)
    assert batch({**wire, "max_items": 2}).max_items == 2


# Owns the file without any cap of its own: the cap must travel with each client's write.
OWNER = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot")
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def test_a_clients_cap_is_applied_by_the_owner_and_holds_after_a_restart(db_path: Path) -> None:
    with owner_running(OWNER, db_path) as owner, CitadelSessionStore(db_path, KEY, max_items=2) as client:
        assert client.served_by == owner.pid
        session = client.session("s")
        for n in range(4):
            asyncio.run(session.add_items(said(n)))
        assert contents(asyncio.run(session.get_items())) == ["message 2", "message 3"]
    with CitadelSessionStore(db_path, KEY) as reopened:  # the owner gone: this process opens the file
        assert reopened.served_by is None
        assert contents(asyncio.run(reopened.session("s").get_items())) == ["message 2", "message 3"]


def test_a_batch_sent_again_after_its_owner_died_before_trimming_is_trimmed(make_store: Any) -> None:
    store = make_store()
    local = store._file._local  # the owner's side: what a resend reaches after a takeover
    # Written, then the owner died; then sent again to the next owner.
    local.on_session("s", writes.append, encode_batch(said(1, 2, 3)), "batch-1", False)
    local.on_session("s", writes.append, encode_batch(said(1, 2, 3), max_items=2), "batch-1", True)
    assert contents(asyncio.run(store.session("s").get_items())) == ["message 2", "message 3"]


def test_what_a_cap_erased_after_a_backup_is_erased_again_by_a_restore(tmp_path: Path) -> None:
    database, ledger, backup = tmp_path / "agent.cdl", tmp_path / "erasures.jsonl", tmp_path / "backup.cdl"
    with CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger) as store:
        asyncio.run(store.session("s").add_items(said(1, 2, 3)))
        store.backup(backup)
        asyncio.run(store.session("s", max_items=2).add_items(said(4)))
    restore_backup(backup, database, KEY, erasure_ledger=ledger, replace=True)
    with CitadelSessionStore(database, KEY, argon2_profile="iot", erasure_ledger=ledger) as store:
        # message 4 was written after the backup (a restore loses it); 1 and 2 were erased after it.
        assert contents(asyncio.run(store.session("s").get_items())) == ["message 3"]


def test_max_items_comes_from_toml_or_the_environment_and_check_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "citadel.toml"
    config.write_text(f'path = "{tmp_path / "agent.cdl"}"\nargon2_profile = "iot"\nmax_items = 2\n')
    monkeypatch.setenv("CITADEL_KEY", KEY)
    with from_config(config) as store:
        assert store.max_items == 2
        asyncio.run(store.session("s").add_items(said(1, 2, 3)))
        assert contents(asyncio.run(store.session("s").get_items())) == ["message 2", "message 3"]
    assert main(["check", "--config", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["max_items"]["value"] == 2
    monkeypatch.setenv("CITADEL_MAX_ITEMS", "5")
    with from_config(config) as store:
        assert store.max_items == 5
    monkeypatch.setenv("CITADEL_MAX_ITEMS", "0")
    with pytest.raises(ConfigurationError, match=r"(?i)max_items"):
        from_config(config)


async def test_a_run_on_a_capped_session_sends_no_tool_output_whose_call_was_erased(make_store: Any) -> None:
    from agents import Runner
    from test_runner import weather_agent  # its import disables tracing

    agent, model = weather_agent("You asked about the weather.")
    session = make_store().session("s", max_items=2)
    await Runner.run(agent, "weather in Oslo?", session=session)
    # The newest 2 would be the tool's output and the reply; the output's call is erased, so it goes too.
    kept = await session.get_items()
    assert [(item.get("type"), item.get("role")) for item in kept] == [("message", "assistant")]

    result = await Runner.run(agent, "what did I ask?", session=session)
    assert result.final_output == "You asked about the weather."
    sent = [item.get("type") for item in model.last_call.input if isinstance(item, dict)]
    assert "function_call_output" not in sent  # the Responses API refuses an output without its call
    assert len(await session.get_items()) == 2


async def test_a_cap_never_erases_the_newest_item_even_if_it_is_a_tool_output(make_store: Any) -> None:
    session = make_store().session("s", max_items=1)
    await session.add_items([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    await session.add_items([{"type": "function_call_output", "call_id": "c", "output": "done"}])
    assert await session.get_items() == [{"type": "function_call_output", "call_id": "c", "output": "done"}]
