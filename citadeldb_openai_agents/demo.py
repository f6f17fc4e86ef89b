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
from agents.testing import ModelStep, ScriptedModel, assistant_message
from agents.testing.model import ModelCall

from .session import CitadelSession
from .storage.codec import search_text
from .store import CitadelSessionStore

DEMO_KEY = "demo passphrase (not a secret; use CITADEL_KEY for real files)"
SESSION_ID = "user-123"
_DOG = re.compile(r"my dog is called (\w+)", re.IGNORECASE)


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


def run_step(step: str, path: Path) -> None:
    """One step of the demo, in this process."""
    set_tracing_disabled(True)  # no API key: nothing to export traces to
    if step == "remember":
        asyncio.run(_turn(path, "Remember: my dog is called Mochi."))
    elif step == "ask":
        asyncio.run(_turn(path, "What is my dog called?"))
    elif step == "erase":
        asyncio.run(_search_and_erase(path))


def main(directory: str | None = None) -> int:
    """Run each step in a fresh process, so only the encrypted file carries memory."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(directory or scratch) / "demo.cdl"
        steps = [
            ("remember", "process 1: tell the agent a fact"),
            ("ask", "process 2: a new process asks; the answer can only come from the stored transcript"),
            ("erase", "process 3: search the session, then erase it"),
            ("ask", "process 4: ask again after the erasure"),
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
        leaked = [p.name for p in path.parent.iterdir() if b"Mochi" in p.read_bytes()]
        print(f"\nFiles on disk containing the word 'Mochi': {leaked or 'none'}")
    return 0
