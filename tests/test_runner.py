"""The Agents SDK Runner end to end, with a scripted model and no network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from citadeldb_openai_agents import CitadelSessionStore
from citadeldb_openai_agents.demo import recall_reply

set_tracing_disabled(True)


def user_texts(call_input: Any) -> list[str]:
    return [item["content"] for item in call_input if isinstance(item, dict) and item.get("role") == "user"]


async def test_multi_turn_history_reaches_the_model(store: CitadelSessionStore) -> None:
    session = store.session("user-123")
    model = ScriptedModel([ModelStep.respond(recall_reply), ModelStep.respond(recall_reply)])
    agent = Agent(name="assistant", instructions="Be brief.", model=model)
    await Runner.run(agent, "remember my dog is called Mochi", session=session)
    result = await Runner.run(agent, "what is my dog called?", session=session)
    assert result.final_output == "Your dog is called Mochi."
    assert user_texts(model.last_call.input) == ["remember my dog is called Mochi", "what is my dog called?"]
    assert len(await session.get_items()) == 4


def weather_agent(second_reply: str) -> tuple[Agent[Any], ScriptedModel]:
    """An agent whose first run calls a weather tool once, and whose second run replies `second_reply`."""

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Oslo"}, call_id="call_1")],
            [assistant_message("It is sunny in Oslo.")],
            [assistant_message(second_reply)],
        ]
    )
    return Agent(name="assistant", model=model, tools=[weather]), model


async def test_tool_calls_are_stored_and_replayed(store: CitadelSessionStore) -> None:
    agent, model = weather_agent("You asked about Oslo.")
    session = store.session("tools")
    await Runner.run(agent, "weather in Oslo?", session=session)
    items = await session.get_items()
    assert [item.get("type") for item in items] == [None, "function_call", "function_call_output", "message"]
    assert items[2]["output"] == "sunny in Oslo"
    await Runner.run(agent, "what did I ask?", session=session)
    replayed = model.last_call.input
    assert any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in replayed)


async def test_streamed_run_persists_its_items(store: CitadelSessionStore) -> None:
    model = ScriptedModel([[assistant_message("streamed answer")]])
    agent = Agent(name="assistant", model=model)
    session = store.session("stream")
    result = Runner.run_streamed(agent, "hello", session=session)
    async for _ in result.stream_events():
        pass
    items = await session.get_items()
    assert items[0] == {"content": "hello", "role": "user"}
    assert items[-1]["content"][0]["text"] == "streamed answer"


def test_run_sync_in_worker_threads(store: CitadelSessionStore) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one_user(i: int) -> str:
        model = ScriptedModel([[assistant_message(f"reply {i}")]])
        agent = Agent(name="assistant", model=model)
        return Runner.run_sync(agent, f"hi {i}", session=store.session(f"user-{i}")).final_output

    with ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(one_user, range(8))) == sorted(f"reply {i}" for i in range(8))
    assert store.session_ids() == sorted(f"user-{i}" for i in range(8))


async def test_the_run_context_reaches_the_sessions_hook_and_can_refuse_a_run(
    store: CitadelSessionStore,
) -> None:
    """The session opts in to the SDK's run context: a hook sees each run's context before the
    session reads or writes, and an exception it raises stops the run with nothing stored."""

    @dataclass
    class Tenant:
        name: str

    seen: list[str] = []

    def only_acme(session: Any, wrapper: Any) -> None:
        seen.append(wrapper.context.name)
        if wrapper.context.name != "acme":
            raise PermissionError(f"{wrapper.context.name} may not use {session.session_id}")

    session = store.session("acme:user-1", on_run_context=only_acme)
    model = ScriptedModel([[assistant_message("hello, acme")], [assistant_message("never sent")]])
    agent = Agent(name="assistant", model=model)
    await Runner.run(agent, "hi", session=session, context=Tenant("acme"))
    assert len(seen) >= 2 and set(seen) == {"acme"}  # the history read, then the turn's write
    assert len(await session.get_items()) == 2  # called without a context: the hook is not called
    with pytest.raises(PermissionError, match="globex may not use acme:user-1"):
        await Runner.run(agent, "hi", session=session, context=Tenant("globex"))
    assert [item["role"] for item in await session.get_items()] == ["user", "assistant"]
