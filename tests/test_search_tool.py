"""The session's search as an agent tool: the model finds an old turn its prompt's limit left out."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, FunctionTool, Runner, set_tracing_disabled
from agents.memory import SessionSettings
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.testing.model import ModelCall
from agents.tool_context import ToolContext
from test_serving import Service

from citadeldb_openai_agents import CitadelSession, CitadelSessionStore

from conftest import KEY

set_tracing_disabled(True)
_CODE = re.compile(r"locker code is (\d+)")


def conversation(turns: int, code: str) -> list[dict[str, Any]]:
    """`turns` user/assistant turns; turn 3 (items 5 and 6) states the fact."""
    items: list[dict[str, Any]] = []
    for turn in range(1, turns + 1):
        said = f"My locker code is {code}." if turn == 3 else f"Tell me about topic number {turn}."
        items.append({"role": "user", "content": said})
        items.append({"role": "assistant", "content": f"Here is a note on topic {turn}."})
    return items


def texts(call_input: Any) -> str:
    return "\n".join(str(item) for item in call_input) if isinstance(call_input, list) else str(call_input)


def tool_output(call: ModelCall) -> str | None:
    outputs = [i for i in call.input if isinstance(i, dict) and i.get("type") == "function_call_output"]
    return str(outputs[-1]["output"]) if outputs else None


def searching_model() -> ScriptedModel:
    """Step 1 asks the tool; step 2 answers from what the tool returned, and only from that."""

    def ask(call: ModelCall) -> list[Any]:
        return [function_call("search_history", {"query": "locker code"}, call_id="call-search")]

    def answer(call: ModelCall) -> list[Any]:
        found = _CODE.search(tool_output(call) or "")
        return [
            assistant_message(f"Your locker code is {found.group(1)}." if found else "I could not find it.")
        ]

    return ScriptedModel([ModelStep.respond(ask), ModelStep.respond(answer)])


async def run_agent(session: CitadelSession) -> tuple[str, ModelCall, ModelCall]:
    """The agent asks about the fact; returns its answer and the model's two calls."""
    model = searching_model()
    agent = Agent(name="assistant", instructions="Be brief.", model=model, tools=[session.search_tool()])
    result = await Runner.run(agent, "What is my locker code?", session=session)
    first, second = model.calls
    return str(result.final_output), first, second


async def test_the_agent_finds_a_fact_from_turn_3_of_300_that_its_prompt_left_out(
    store: CitadelSessionStore,
) -> None:
    code = str(secrets.randbelow(10**8))
    session = store.session("user-1", session_settings=SessionSettings(limit=20))
    await session.add_items(conversation(300, code))
    final, first, second = await run_agent(session)
    assert len(first.input) == 21 and code not in texts(first.input), "the prompt left turn 3 out"
    output = tool_output(second)
    assert output is not None
    lines = output.splitlines()
    assert "the conversation holds 601" in lines[0]
    assert lines[1] == f"- #5, user: My locker code is {code}.", output
    assert final == f"Your locker code is {code}."


async def test_the_tool_is_an_sdk_function_tool_with_the_given_name(store: CitadelSessionStore) -> None:
    tool = store.session("s").search_tool(name="recall", limit=3)
    assert isinstance(tool, FunctionTool)
    assert tool.name == "recall"
    assert list(tool.params_json_schema["properties"]) == ["query"]
    with pytest.raises(ValueError, match="limit"):
        store.session("s").search_tool(limit=0)


async def test_the_tool_never_returns_another_sessions_items(store: CitadelSessionStore) -> None:
    await store.session("other").add_items([{"role": "user", "content": "My locker code is 99999."}])
    mine = store.session("mine")
    await mine.add_items(conversation(4, "12345"))
    output = await call_tool(mine, "locker code")
    assert "12345" in output and "99999" not in output


async def test_the_tool_never_returns_expired_items(make_store) -> None:
    store = make_store(ttl=0.4)
    session = store.session("s")
    await session.add_items([{"role": "user", "content": "My locker code is 31337."}])
    # Citadel's clock cannot be injected: this waits past the item's expiry, which its write
    # counted from a moment before `written` (history.py, `expires_at`), however slow the write.
    written = time.time()
    time.sleep(max(0.0, written + 0.45 - time.time()))
    # The next item never expires (a store on the file without a TTL writes it), so the tool
    # finds it however long the write and the search take.
    await make_store().session("s").add_items([{"role": "user", "content": "Where is the locker room?"}])
    output = await call_tool(session, "locker code")
    assert "31337" not in output and "#1, user: Where is the locker room?" in output


async def call_tool(session: CitadelSession, query: str) -> str:
    tool = session.search_tool()
    context = ToolContext(context=None, tool_name=tool.name, tool_call_id="call", tool_arguments="{}")
    return str(await tool.on_invoke_tool(context, f'{{"query": "{query}"}}'))


async def test_the_tool_works_from_a_client_process(db_path: Path) -> None:
    service = Service(db_path)
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            assert client.served_by == service.pid
            code = str(secrets.randbelow(10**8))
            session = client.session("user-1", session_settings=SessionSettings(limit=20))
            await session.add_items(conversation(30, code))
            final, _, second = await run_agent(session)
            assert f"#5, user: My locker code is {code}." in (tool_output(second) or "")
            assert final == f"Your locker code is {code}."
    finally:
        service.stop()
