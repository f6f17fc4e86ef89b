"""Many sessions in one file never see each other's items."""

from __future__ import annotations

import os
from pathlib import Path

from citadeldb_openai_agents import CitadelSession, CitadelSessionStore

IDS = [
    "Bob",
    "bob",
    "BOB",
    "user-1",
    "user-1 ",
    "",
    "\u00f1and\u00fa",
    "n\u0303andu\u0301",
    "𝔘𝔰𝔢𝔯",
    "a" * 1500,
    "a" * 1499,
    "id/with/../slashes",
    "nul\x00byte",
]


async def test_each_id_is_its_own_session(store: CitadelSessionStore) -> None:
    for sid in IDS:
        await store.session(sid).add_items([{"owner": sid}])
    for sid in IDS:
        assert await store.session(sid).get_items() == [{"owner": sid}]
        assert [hit["owner"] for hit in await store.session(sid).search("owner", limit=50)] == [sid]
    assert store.session_ids() == sorted(IDS)
    await store.session("bob").clear_session()
    assert await store.session("Bob").get_items() == [{"owner": "Bob"}]
    assert "bob" not in store.session_ids()


async def test_search_never_returns_another_sessions_items(store: CitadelSessionStore) -> None:
    await store.session("alice").add_items([{"role": "user", "content": "my secret pin is 4321"}])
    await store.session("mallory").add_items([{"role": "user", "content": "what is the secret pin"}])
    hits = await store.session("mallory").search("secret pin 4321", limit=10)
    assert hits == [{"role": "user", "content": "what is the secret pin"}]


async def test_session_ids_are_not_written_in_clear(store: CitadelSessionStore, db_path: Path) -> None:
    await store.session("patient-jane.doe@example.org").add_items([{"content": "x"}])
    store.close()
    for name in os.listdir(db_path.parent):
        data = (db_path.parent / name).read_bytes()
        assert b"jane.doe" not in data
        assert "jane.doe".encode("utf-16-le") not in data


async def test_sessions_on_one_path_share_one_database(tmp_path: Path, key: str) -> None:
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "agent.cdl", tmp_path / "link.cdl")
    first = CitadelSession("u", tmp_path / "agent.cdl", key)
    second = CitadelSession("u", tmp_path / "sub" / ".." / "agent.cdl", key)
    third = CitadelSession("u", tmp_path / "link.cdl", key)
    try:
        await first.add_items([{"n": 1}])
        assert await second.get_items() == [{"n": 1}]
        assert await third.pop_item() == {"n": 1}
        assert await first.get_items() == []
        assert first.store.path == second.store.path == third.store.path
    finally:
        for session in (first, second, third):
            session.close()
