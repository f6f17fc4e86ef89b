"""The four Session methods behave exactly as agents.SQLiteSession's do."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import SQLiteSession
from agents.memory import Session, SessionSettings

from citadeldb_openai_agents import CitadelSession, CitadelSessionStore, InvalidItemError, SessionClosedError

SDK_ITEMS: list[Any] = [
    {"role": "user", "content": "plain text"},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "multi"},
            {"type": "input_image", "image_url": "data:,", "detail": "auto"},
        ],
    },
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}],
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "lookup",
        "arguments": '{"q": 1}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": '{"ok": true}'},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "thinking"}],
        "encrypted_content": "gAAA",
    },
    {
        "zeta": 1,
        "alpha": {"b": 2, "a": [1, 2.5, None, True]},
        "unknown_extra": "kept",
        "role": "user",
        "content": "",
    },
]


def test_is_an_agents_session(store: CitadelSessionStore) -> None:
    assert isinstance(store.session("s"), Session)


async def test_items_round_trip_verbatim_with_key_order(store: CitadelSessionStore) -> None:
    session = store.session("s")
    await session.add_items(SDK_ITEMS)
    got = await session.get_items()
    assert got == SDK_ITEMS
    assert [list(item) for item in got] == [list(item) for item in SDK_ITEMS]
    assert list(got[-1]["alpha"]) == ["b", "a"]


async def scenario(session: Any) -> list[Any]:
    """A run of every protocol method; the transcript of what each returned."""
    out: list[Any] = [await session.get_items(), await session.pop_item()]
    await session.add_items([{"n": 1}, {"n": 2}])
    await session.add_items([])
    await session.add_items([{"n": 3}])
    out += [
        await session.get_items(),
        await session.get_items(limit=2),
        await session.get_items(limit=0),
        await session.get_items(limit=10),
        await session.get_items(limit=-1),
    ]
    session.session_settings = SessionSettings(limit=1)
    out += [await session.get_items(), await session.get_items(limit=3)]
    session.session_settings = SessionSettings()
    out += [await session.pop_item(), await session.get_items()]
    await session.clear_session()
    out += [await session.get_items(), await session.pop_item()]
    await session.add_items([{"n": 4}])
    out.append(await session.get_items())
    return out


async def test_same_answers_as_sqlite_session(store: CitadelSessionStore, tmp_path: Path) -> None:
    sqlite = SQLiteSession("s", tmp_path / "ref.db")
    try:
        expected = await scenario(sqlite)
    finally:
        sqlite.close()
    assert await scenario(store.session("s")) == expected


async def test_limit_spans_segments_and_batches_stay_whole(store: CitadelSessionStore) -> None:
    session = store.session("long")
    for start in range(0, 700, 50):
        await session.add_items([{"i": i} for i in range(start, start + 50)])
    await session.add_items([{"i": i} for i in range(700, 1000)])  # one batch larger than a segment
    assert [x["i"] for x in await session.get_items(limit=400)] == list(range(600, 1000))
    assert [x["i"] for x in await session.get_items()] == list(range(1000))
    for expected in range(999, 989, -1):
        assert (await session.pop_item()) == {"i": expected}
    assert [x["i"] for x in await session.get_items(limit=3)] == [987, 988, 989]


async def test_session_settings_from_store(make_store: Any) -> None:
    store = make_store(session_settings=SessionSettings(limit=2))
    session = store.session("s")
    await session.add_items([{"n": n} for n in range(5)])
    assert await session.get_items() == [{"n": 3}, {"n": 4}]
    other = store.session("s", session_settings=SessionSettings(limit=4))
    assert len(await other.get_items()) == 4


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({1, 2}, "set"),
        (b"raw", "bytes"),
        (__import__("datetime").datetime(2026, 1, 1), "datetime"),
        (float("nan"), "nan"),
    ],
)
async def test_non_json_item_names_its_position_and_writes_nothing(
    store: CitadelSessionStore, bad: Any, words: str
) -> None:
    session = store.session("s")
    await session.add_items([{"n": 0}])
    with pytest.raises(InvalidItemError, match="item 1 of the batch") as caught:
        await session.add_items([{"n": 1}, {"payload": bad}, {"n": 2}])
    assert isinstance(caught.value, (TypeError, ValueError))
    assert words in str(caught.value).lower()
    assert await session.get_items() == [{"n": 0}]


async def test_lone_surrogates_and_astral_text_round_trip(store: CitadelSessionStore) -> None:
    items = [{"content": "lone \ud800 surrogate"}, {"content": "astral 𝄞😀 ok"}]
    session = store.session("s")
    await session.add_items(items)
    assert await session.get_items() == items


async def test_operations_after_close_raise_runtime_error(
    store: CitadelSessionStore, db_path: Path, key: str
) -> None:
    session = CitadelSession("s", db_path, key)
    session.close()
    session.close()
    for call in (
        session.get_items(),
        session.add_items([{"a": 1}]),
        session.pop_item(),
        session.clear_session(),
        session.search("x"),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            await call
    minted = store.session("t")
    store.close()
    with pytest.raises(SessionClosedError, match="closed"):
        await minted.get_items()
    with pytest.raises(RuntimeError):
        store.session_ids()
    with pytest.raises(RuntimeError):
        store.session("u")


async def test_mutation_completes_when_the_caller_is_cancelled(store: CitadelSessionStore) -> None:
    session = store.session("s")
    task = asyncio.ensure_future(session.add_items([{"n": n} for n in range(200)]))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(await session.get_items()) == 200
