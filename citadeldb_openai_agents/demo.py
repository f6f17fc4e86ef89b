"""`python -m citadeldb_openai_agents demo`: memory that survives a restart, then erasure.

No API key and no download: the agent's model is a `ScriptedModel` whose
replies are computed only from the input the Runner gives it, i.e. from the
history the session fed it. If the stored transcript did not reach the model,
it could not answer.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.memory import SessionSettings
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.testing.model import ModelCall

from .session import CitadelSession, CitadelSessionStore
from .storage.codec import search_text

DEMO_KEY = "demo passphrase (not a secret; use CITADEL_KEY for real files)"
SESSION_ID = "user-123"
_DOG = re.compile(r"my dog is called (\w+)", re.IGNORECASE)
_LOCKER = re.compile(r"locker code is (\d+)")
LONG_SESSION_ID = "user-456"


def _texts(call_input: Any) -> list[str]:
    if isinstance(call_input, str):
        return [call_input]
    return [search_text(item) for item in call_input]


def recall_reply(call: ModelCall) -> list[Any]:
    """A tiny deterministic 'model': it knows only what is in its input."""
    texts = _texts(call.input)
    question = texts[-1] if texts else ""
    if "what is my dog called" in question.lower():
        names = [m.group(1) for text in texts[:-1] for m in _DOG.finditer(text)]
        answer = f"Your dog is called {names[-1]}." if names else "I don't know your dog's name."
    else:
        answer = "Noted."
    return [assistant_message(answer)]


def _agent() -> Agent[Any]:
    model = ScriptedModel([ModelStep.respond(recall_reply)])
    return Agent(name="assistant", instructions="Be brief.", model=model)


async def _turn(path: Path, text: str) -> None:
    session = CitadelSession(SESSION_ID, path, key=DEMO_KEY)
    try:
        agent = _agent()
        result = await Runner.run(agent, text, session=session)
        fed = agent.model.last_call.input  # type: ignore[union-attr]
        print(f"  history fed to the model: {len(fed)} item(s): {_texts(fed)}")
        print(f"  user: {text}\n  assistant: {result.final_output}")
    finally:
        session.close()


async def _search_and_erase(path: Path) -> None:
    with CitadelSessionStore(path, DEMO_KEY) as store:
        session = store.session(SESSION_ID)
        hits = await session.search("dog name", limit=2)
        print(f"  search('dog name') -> {_texts(hits)}")
        erasure = store.erase_session(SESSION_ID)
        print(
            f"  erased {erasure.items_erased} item(s): keys destroyed ({erasure.algorithm}), "
            f"readback confirmed: {erasure.readback_confirmed}"
        )
        print(f"  items left: {len(await session.get_items())}; sessions in the file: {store.session_ids()}")


def _search_then_answer() -> ScriptedModel:
    """A 'model' that, not seeing the answer in its input, calls the search tool, then answers from its output."""

    def search(call: ModelCall) -> list[Any]:
        return [function_call("search_history", {"query": "locker code"}, call_id="call-1")]

    def answer(call: ModelCall) -> list[Any]:
        outputs = [
            i["output"] for i in call.input if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        found = _LOCKER.search(str(outputs[-1]) if outputs else "")
        return [
            assistant_message(f"Your locker code is {found.group(1)}." if found else "I could not find it.")
        ]

    return ScriptedModel([ModelStep.respond(search), ModelStep.respond(answer)])


async def _search_as_a_tool(path: Path) -> None:
    with CitadelSessionStore(path, DEMO_KEY) as store:
        session = store.session(LONG_SESSION_ID, session_settings=SessionSettings(limit=6))
        history: list[Any] = []
        for n in range(1, 41):
            said = "My locker code is 4711." if n == 3 else f"Tell me about topic {n}."
            history += [{"role": "user", "content": said}, {"role": "assistant", "content": f"Noted ({n})."}]
        await session.add_items(history)
        model = _search_then_answer()
        agent = Agent(name="assistant", model=model, tools=[session.search_tool()])
        result = await Runner.run(agent, "What is my locker code?", session=session)
        first, second = model.calls
        print(f"  history fed to the model: {len(first.input)} item(s), the newest 6 of 80 and the question")
        print("  the model calls search_history('locker code'), which returns:")
        output = next(
            i["output"]
            for i in second.input
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        )
        print("\n".join(f"    {line}" for line in str(output).splitlines()[:3]))
        print(f"  assistant: {result.final_output}")


def run_step(step: str, path: Path) -> None:
    """One step of the demo, in this process."""
    set_tracing_disabled(True)  # no API key: nothing to export traces to
    if step == "remember":
        asyncio.run(_turn(path, "Remember: my dog is called Mochi."))
    elif step == "ask":
        asyncio.run(_turn(path, "What is my dog called?"))
    elif step == "erase":
        asyncio.run(_search_and_erase(path))
    elif step == "tool":
        asyncio.run(_search_as_a_tool(path))


def main(directory: str | None = None) -> int:
    """Run each step in a fresh process, so only the encrypted file carries memory."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(directory or scratch) / "demo.cdl"
        steps = [
            ("remember", "process 1: tell the agent a fact"),
            ("ask", "process 2: a new process asks; the answer can only come from the stored transcript"),
            ("erase", "process 3: search the session, then erase it"),
            ("ask", "process 4: ask again after the erasure"),
            ("tool", "process 5: a long conversation; the model sees its newest items and searches the rest"),
        ]
        print(f"Encrypted session file: {path}")
        for step, title in steps:
            print(f"\n[{title}]", flush=True)
            command = [
                sys.executable,
                "-m",
                "citadeldb_openai_agents",
                "demo",
                "--step",
                step,
                "--file",
                str(path),
            ]
            completed = subprocess.run(command, check=False)
            if completed.returncode != 0:
                return completed.returncode
        for word in (b"Mochi", b"locker"):
            leaked = [p.name for p in path.parent.iterdir() if word in p.read_bytes()]
            print(f"\nFiles on disk containing the word {word.decode()!r}: {leaked or 'none'}", end="")
        print()
    return 0
