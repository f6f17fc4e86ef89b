"""One process owns a file: another gets a clear error at once, and the file as soon as it is closed."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore

from conftest import KEY
from stub_embedders import StubEmbedder

# A second process: tries to open the file each time the parent says so, and reports.
OPENER = textwrap.dedent(
    """
    import asyncio, sys, time
    from citadeldb_openai_agents import CitadelSessionError, CitadelSessionStore

    print("ready", flush=True)
    for _ in sys.stdin:
        start = time.monotonic()
        try:
            with CitadelSessionStore(sys.argv[1], sys.argv[2]) as store:
                items = asyncio.run(store.session("s").get_items())
            print("opened", len(items), flush=True)
        except CitadelSessionError as error:
            took = time.monotonic() - start
            print("refused", type(error).__name__, f"{took:.3f}", str(error).replace("\\n", " "), flush=True)
    """
)


@pytest.fixture
def other_process(db_path: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", OPENER, str(db_path), KEY],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    yield process
    process.communicate(timeout=60)


def try_to_open(process: subprocess.Popen[str]) -> list[str]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("open\n")
    process.stdin.flush()
    return process.stdout.readline().split(" ", 3)


async def test_a_second_process_is_refused_at_once_then_opens_after_close(make_store, db_path: Path, other_process) -> None:
    store = make_store()
    await store.session("s").add_items([{"content": "written by the first process"}])

    outcome, error, took, message = try_to_open(other_process)
    assert (outcome, error) == ("refused", "DatabaseLockedError")
    assert float(took) < 2.0, "the second process must be refused at once, not wait"
    assert str(db_path) in message and "another process" in message and KEY not in message

    store.close()
    assert try_to_open(other_process) == ["opened", "1\n"]


async def test_closing_after_a_failed_call_frees_the_file_at_once(db_path: Path, other_process) -> None:
    """The failed call's traceback (kept in a reference cycle by asyncio) must not keep the lock.

    Citadel holds a file until its last `Memory` object is collected; before the fix, the
    frames of the failed call held it until the next gc pass, so a process that closed its
    store after an error still blocked the next owner.
    """
    embedder = StubEmbedder()
    gc.disable()  # no collection may rescue the close: it must free the file by itself
    try:
        with pytest.raises(Exception, match="embedding service unavailable"):
            with CitadelSessionStore(db_path, KEY, embedder=embedder, argon2_profile="iot") as store:
                await store.session("s").add_items([{"content": "stored"}])
                embedder.failure = ConnectionError("embedding service unavailable")
                await store.session("s").add_items([{"content": "never stored"}])
        assert try_to_open(other_process) == ["opened", "1\n"]
    finally:
        gc.enable()
