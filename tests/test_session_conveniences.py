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


# -- what the SDK's own sessions take (found by running the SDK's session tests on ours) -----------


@pytest.mark.parametrize("sdk_coerces", [True, False], ids=["sdk-coercion", "before-0.25"])
async def test_session_settings_given_as_a_dict_are_made_session_settings_at_construction(
    make_store: Callable[..., CitadelSessionStore], monkeypatch: pytest.MonkeyPatch, sdk_coerces: bool
) -> None:
    """As SQLiteSession: `{"limit": 1}` becomes a `SessionSettings` (its `.limit` works) and an
    unknown key raises `TypeError` when the session is made, not at its first `get_items()`."""
    from agents import memory

    if not sdk_coerces:  # openai-agents before 0.25 has no coerce_session_settings
        monkeypatch.delattr(memory, "coerce_session_settings", raising=False)
    store = make_store()
    session = store.session("s", session_settings={"limit": 1})
    assert isinstance(session.session_settings, memory.SessionSettings)
    assert session.session_settings.limit == 1
    await session.add_items([{"role": "user", "content": "first"}, {"role": "user", "content": "second"}])
    assert await session.get_items() == [{"role": "user", "content": "second"}]
    session.session_settings = {"limit": 2}
    assert session.session_settings.limit == 2
    with pytest.raises(TypeError, match="limitt"):
        store.session("t", session_settings={"limitt": 1})
    with pytest.raises(TypeError, match="limitt"):
        CitadelSession("t", store=store, session_settings={"limitt": 1})
    with pytest.raises(TypeError, match="limitt"):
        session.session_settings = {"limitt": 1}
    assert session.session_settings.limit == 2  # a refused value changes nothing


def test_a_store_given_session_settings_as_a_dict_mints_sessions_with_them(tmp_path: Path) -> None:
    with CitadelSessionStore(tmp_path / "agent.cdl", KEY, session_settings={"limit": 3}) as store:
        assert store.session("s").session_settings.limit == 3
    with pytest.raises(TypeError, match="limitt"):
        CitadelSessionStore(tmp_path / "agent.cdl", KEY, session_settings={"limitt": 3})


async def test_a_session_logs_to_the_logger_it_is_given(
    make_store: Callable[..., CitadelSessionStore], caplog: pytest.LogCaptureFixture
) -> None:
    """As AdvancedSQLiteSession(logger=...): the session's own log lines go to that logger. The
    line names the failure's type only: an exception's text can name the session."""
    import logging

    mine = logging.getLogger("my-app.sessions")
    session = make_store().session("alice-private-id", logger=mine)

    class NoContext:  # a run result without a context: storing its usage fails, and is logged
        pass

    with caplog.at_level(logging.ERROR):
        await session.store_run_usage(NoContext())
    [record] = [record for record in caplog.records if "usage" in record.getMessage()]
    assert record.name == "my-app.sessions"
    assert "AttributeError" in record.getMessage() and "alice-private-id" not in record.getMessage()
