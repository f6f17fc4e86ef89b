"""With serving off, one process owns a file: another gets a clear error at once, and the file
as soon as it is closed. (With serving on, the default, the other becomes a client:
tests/test_serving.py.)"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from citadeldb_openai_agents import CitadelSessionStore, DatabaseLockedError
from citadeldb_openai_agents.storage import engine
from citadeldb_openai_agents.storage import lockholder as lock_holder
from citadeldb_openai_agents.storage.files import locked_by_this_process

from conftest import KEY
from stub_embedders import StubEmbedder

# What a process that finds the file held, and not kept to itself (serve = false), waits for
# its holder to serve it before it fails: a minute in the OPENER (the package's is 10 s), so
# that "refused at once" is "refused well within the wait it would have made".
HANDOVER_SECONDS = 60.0

# A second process: tries to open the file each time the parent says so, and reports.
OPENER = textwrap.dedent(
    f"""
    import asyncio, sys, time
    from citadeldb_openai_agents import CitadelSessionError, CitadelSessionStore
    from citadeldb_openai_agents.serving import handover, shared_file

    handover.HANDOVER_SECONDS = shared_file.HANDOVER_SECONDS = {HANDOVER_SECONDS}
    print("ready", flush=True)
    for _ in sys.stdin:
        start = time.monotonic()
        try:
            with CitadelSessionStore(sys.argv[1], sys.argv[2]) as store:
                items = asyncio.run(store.session("s").get_items())
            print("opened", len(items), flush=True)
        except CitadelSessionError as error:
            took = time.monotonic() - start
            print("refused", type(error).__name__, f"{{took:.3f}}", str(error).replace("\\n", " "), flush=True)
    """
)


@pytest.fixture
def other_process(db_path: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", OPENER, str(db_path), KEY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    yield process
    process.communicate(timeout=60)


@pytest.fixture
def holder(db_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that opens the file and keeps it until told to stop."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sys
            from citadeldb_openai_agents import CitadelSessionStore
            store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot", serve=False)
            print("holding", flush=True)
            sys.stdin.readline()
        """),
            str(db_path),
            KEY,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "holding\n"
    yield process
    process.communicate("\n", timeout=60)


def try_to_open(process: subprocess.Popen[str]) -> list[str]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("open\n")
    process.stdin.flush()
    return process.stdout.readline().split(" ", 3)


async def test_a_second_process_is_refused_at_once_then_opens_after_close(
    make_store, db_path: Path, other_process
) -> None:
    store = make_store(serve=False)
    await store.session("s").add_items([{"content": "written by the first process"}])

    outcome, error, took, message = try_to_open(other_process)
    assert (outcome, error) == ("refused", "DatabaseLockedError")
    # Refused in 0.021 s at most under load (benchmarks/suite_under_load.py, 2026-12-08): half the
    # wait it would have made is 1000x that.
    assert float(took) < HANDOVER_SECONDS / 2, "the second process must be refused at once, not wait"
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
        with (
            pytest.raises(Exception, match="embedding service unavailable"),
            CitadelSessionStore(db_path, KEY, embedder=embedder, argon2_profile="iot", serve=False) as store,
        ):
            await store.session("s").add_items([{"content": "stored"}])
            embedder.failure = ConnectionError("embedding service unavailable")
            await store.session("s").add_items([{"content": "never stored"}])
        assert try_to_open(other_process) == ["opened", "1\n"]
    finally:
        gc.enable()


@pytest.mark.parametrize("probe", ["reads /proc/locks", "sees no lock at all"])
async def test_a_memory_only_a_garbage_cycle_holds_is_collected_at_close(
    db_path: Path, other_process, probe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close collects garbage only when this process still holds the lock (a full collection
    costs 0.1-0.3 s in a big process, so it does not run on every close): then a `Memory` that
    only a reference cycle holds is collected, and the file is free at once all the same. On a
    system whose lock the probe cannot see, every close collects, as before."""
    if probe == "sees no lock at all":
        monkeypatch.setattr(engine, "locked_by_this_process", lambda path: False)
    gc.disable()  # no automatic collection may rescue the close
    try:
        store = CitadelSessionStore(db_path, KEY, argon2_profile="iot", serve=False)
        await store.session("s").add_items([{"content": "stored"}])
        assert locked_by_this_process(str(db_path.resolve())), "the real probe sees the lock"
        cycle: list[Any] = [store._file._local._database.memory._memory]  # Citadel's own object
        cycle.append(cycle)
        del cycle
        store.close()
        assert not locked_by_this_process(str(db_path.resolve()))
        assert try_to_open(other_process) == ["opened", "1\n"]
    finally:
        gc.enable()


async def test_the_refusal_names_the_holders_pid_and_says_what_to_do(make_store, other_process) -> None:
    make_store(serve=False)  # this process keeps the file to itself; the other one is refused

    outcome, error, _, message = try_to_open(other_process)

    assert (outcome, error) == ("refused", "DatabaseLockedError")
    assert f"another process, PID {os.getpid()} (" in message
    assert "keeps the file to itself (serve = false there)" in message
    assert "leave serve on (the default) in every process on the file" in message


def test_the_holder_is_named_with_its_program_but_never_its_arguments(db_path: Path, holder) -> None:
    with pytest.raises(DatabaseLockedError) as caught:
        CitadelSessionStore(db_path, KEY, serve=False)

    assert caught.value.holder is not None
    assert caught.value.holder.pid == holder.pid
    program = os.path.basename(sys.executable)
    assert caught.value.holder.command == f"{program} -c …"  # the code and argv[1:] are left out
    assert f"held by another process, PID {holder.pid} ({program} -c …)" in str(caught.value)
    assert KEY not in str(caught.value)


def test_a_holder_that_cannot_be_known_is_just_another_process(
    db_path: Path, holder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lock_holder, "PROC", tmp_path / "no-proc")  # as on macOS, or without /proc

    with pytest.raises(DatabaseLockedError) as caught:
        CitadelSessionStore(db_path, KEY, serve=False)

    assert caught.value.holder is None
    assert f"{db_path} is held by another process: one process owns" in str(caught.value)
    assert "This process has serve = false" in str(caught.value)
