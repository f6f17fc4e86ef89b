"""What the SDK's network sessions offer besides the protocol: `ping`, an async close, `async with`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSession, CitadelSessionStore, SessionClosedError, StorageError

KEY = "conveniences passphrase 3f1b"


async def test_ping_says_whether_the_file_answers_and_raises_once_closed(
    make_store: Callable[..., CitadelSessionStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    session = store.session("s")
    assert await session.ping() is True  # nothing written yet: the file still answers
    await session.add_items([{"role": "user", "content": "hello"}])
    assert await session.ping() is True

    def unreachable(session_id: str) -> None:
        raise StorageError("the owner stopped answering")

    monkeypatch.setattr(store, "summary", unreachable)
    assert await session.ping() is False
    monkeypatch.undo()
    session.close()
    with pytest.raises(SessionClosedError):
        await session.ping()


async def test_async_with_closes_the_session_and_the_store_it_opened(tmp_path: Path) -> None:
    async with CitadelSession("s", tmp_path / "agent.cdl", key=KEY) as session:
        await session.add_items([{"role": "user", "content": "kept"}])
        store = session.store
    assert store.closed
    with pytest.raises(SessionClosedError):
        await session.get_items()
    with CitadelSession("s", tmp_path / "agent.cdl", key=KEY) as again:
        assert await again.get_items() == [{"role": "user", "content": "kept"}]
    assert again.store.closed


async def test_async_with_on_a_minted_session_leaves_the_store_open(
    make_store: Callable[..., CitadelSessionStore],
) -> None:
    store = make_store()
    async with store.session("s") as session:
        await session.add_items([{"role": "user", "content": "hi"}])
    assert not store.closed
    assert await store.session("s").get_items() == [{"role": "user", "content": "hi"}]
    await session.aclose()  # idempotent
