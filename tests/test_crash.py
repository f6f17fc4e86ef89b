"""Crash safety: a writer killed with SIGKILL at random moments loses no acknowledged turn.

A child process appends turns to several sessions, clears and refills one more, and
adds two items to another then pops one, and prints an acknowledgement after each
call returns. The parent kills it at a
random moment, opens the file, and checks that every acknowledged batch is there,
whole and in order, that no batch is half written, and that Citadel's own
integrity check passes. A kill in the middle of a pop or a clear leaves what Citadel
cannot read: the file must still open, with nothing reported as damage.

The default run kills 8 writers; ``python -m pytest -m slow tests/test_crash.py``
kills 300, and both run again with writers that open the file with ``sync_mode="off"``,
whose commits flush none of the file's pages (only its key file), and the 300-kill one
with "normal" too (the pages once): a killed process leaves its writes with the kernel,
so what it acknowledged survives in every mode; what "full" adds is survival of a
power cut or a kernel crash, which no test here can make. ``CRASH_SEED=<n>`` replays the kill delays (the seed is in the failure message; where a kill lands also depends on timing).
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from citadeldb_openai_agents import CitadelSessionStore

from conftest import KEY

APPENDED = ["alice", "bob", "carol", "dave"]
CHURNED = "churn"  # cleared, then refilled, every round
POPPED = "popped"  # two items added, then the second popped, every round

# Imports the package once, then forks a writer per run: a fork starts in milliseconds
# where an interpreter takes seconds, so the kills, not the start-ups, fill the time.
# (Nothing has opened the file or started a thread when it forks.)
WRITERS = textwrap.dedent(
    """
    import asyncio, os, sys
    from citadeldb_openai_agents import CitadelSession, CitadelSessionStore  # the SDK too

    path, key = sys.argv[1], sys.argv[2]
    appended, churned, popped = sys.argv[3].split(","), sys.argv[4], sys.argv[5]

    def turn(session_id, run, batch):
        size = 1 + (run * 31 + batch * 7 + len(session_id)) % 6
        return [
            {"role": "user", "content": f"{session_id} turn {batch}.{i}",
             "at": {"run": run, "batch": batch, "i": i, "of": size}}
            for i in range(size)
        ]

    async def write_forever(run):
        store = CitadelSessionStore(path, key, sync_mode=os.environ.get("CRASH_SYNC_MODE") or None)
        sessions = {sid: store.session(sid) for sid in appended + [churned, popped]}
        for batch in range(10**9):
            for sid in appended:
                await sessions[sid].add_items(turn(sid, run, batch))
                print(f"ack {sid} {batch}", flush=True)
            await sessions[churned].clear_session()
            await sessions[churned].add_items(turn(churned, run, batch))
            print(f"ack {churned} {batch}", flush=True)
            await sessions[popped].add_items([{"run": run, "batch": batch, "i": i} for i in (0, 1)])
            print(f"ack {popped} {batch}", flush=True)
            assert await sessions[popped].pop_item() == {"run": run, "batch": batch, "i": 1}
            print(f"ack {popped}-pop {batch}", flush=True)

    print("imported", flush=True)
    for line in iter(sys.stdin.readline, ""):
        command, argument = line.split()
        if command == "start":
            pid = os.fork()
            if pid == 0:
                try:
                    asyncio.run(write_forever(int(argument)))
                except BaseException as error:
                    print("error", repr(error).replace("\\n", " "), flush=True)
                os._exit(1)
            print(f"pid {pid}", flush=True)
        elif command == "reap":
            os.waitpid(int(argument), 0)
            print("reaped", flush=True)
    """
)


class Writers:
    """The process that forks writers; each writer appends until it is killed."""

    def __init__(
        self, path: Path, log: Path, script: str = WRITERS, args: tuple[str, ...] | None = None
    ) -> None:
        """`script` (default: the writers above) gets the file, the passphrase and `args`."""
        self._log = open(log, "w")  # noqa: SIM115 - closed in `close`
        args = (",".join(APPENDED), CHURNED, POPPED) if args is None else args
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, str(path), KEY, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_lines, daemon=True).start()
        assert self._line() == "imported\n"
        self.running: int | None = None

    def _read_lines(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, ""):
            self._lines.put(line)
        self._lines.put("")

    def _line(self) -> str:
        # A hang must fail the test, not stall CI: wait at most a minute for a line.
        try:
            line = self._lines.get(timeout=60)
        except queue.Empty:
            raise AssertionError(
                f"no line from the writers' process in 60 s:\n{Path(self._log.name).read_text()}"
            ) from None
        assert line.endswith("\n"), f"the writers' process died:\n{Path(self._log.name).read_text()}"
        assert not line.startswith("error "), line
        return line

    def _send(self, command: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            # The helper itself is gone (it only forks and reaps): say how it ended.
            raise AssertionError(
                f"the writers' process ended (exit status {self.process.wait(timeout=10)}) before "
                f"{command!r}:\n{Path(self._log.name).read_text()}"
            ) from None

    def start_and_wait_for_first_ack(self, run: int) -> list[str]:
        self._send(f"start {run}")
        lines = []
        while self.running is None or not any(line.startswith("ack ") for line in lines):
            line = self._line()
            if line.startswith("pid "):
                self.running = int(line.split()[1])
            else:
                lines.append(line)
        return lines

    def kill(self) -> list[str]:
        """SIGKILL the running writer; return every line it printed before it died."""
        assert self.running is not None
        os.kill(self.running, signal.SIGKILL)
        self._send(f"reap {self.running}")
        self.running = None
        lines = []
        # The writer is dead before "reaped" is written: all it printed comes first. A
        # line the kill cut short would run into "reaped" on the shared pipe.
        while not (line := self._line()).endswith("reaped\n"):
            lines.append(line)
        if line != "reaped\n":
            lines.append(line[: -len("reaped\n")])
        return lines

    def close(self) -> None:
        if self.running is not None:
            os.kill(self.running, signal.SIGKILL)
        self.process.kill()
        self.process.wait()
        self._log.close()


def acknowledgements(lines: list[str], run: int) -> dict[str, set[tuple[int, int]]]:
    acked: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for line in lines:
        # A line cut short by the kill acknowledges nothing (the batch may still be there).
        if line.startswith("ack ") and line.endswith("\n") and len(line.split()) == 3:
            _, session_id, batch = line.split()
            acked[session_id].add((run, int(batch)))
    return acked


def whole_batches(items: list[dict[str, Any]], session_id: str) -> list[tuple[int, int]]:
    """The batches the items form, in order; fails on a half-written or interleaved batch."""
    batches = []
    position = 0
    while position < len(items):
        at = items[position]["at"]
        batch = items[position : position + at["of"]]
        expected = [
            {
                "role": "user",
                "content": f"{session_id} turn {at['batch']}.{i}",
                "at": {"run": at["run"], "batch": at["batch"], "i": i, "of": at["of"]},
            }
            for i in range(at["of"])
        ]
        assert batch == expected, f"{session_id}: batch {at} is not whole at position {position}"
        batches.append((at["run"], at["batch"]))
        position += at["of"]
    return batches


def check_file(path: Path, acked: dict[str, set[tuple[int, int]]], context: str) -> int:
    """Open the file as a user would and check every promise; return the items it holds."""
    held = 0
    with CitadelSessionStore(path, KEY) as store:
        for session_id in APPENDED:
            items = asyncio.run(store.session(session_id).get_items())
            held += len(items)
            batches = whole_batches(items, session_id)
            assert batches == sorted(set(batches)), f"{context}: {session_id} out of order or doubled"
            # A writer starts batch n+1 only after batch n returned: no gap within a run.
            by_run: dict[int, list[int]] = defaultdict(list)
            for run, number in batches:
                by_run[run].append(number)
            for run, numbers in by_run.items():
                assert numbers == list(range(len(numbers))), f"{context}: {session_id} run {run} has a gap"
            missing = acked[session_id] - set(batches)
            assert not missing, f"{context}: {session_id} lost acknowledged batches {sorted(missing)}"
        churned = asyncio.run(store.session(CHURNED).get_items())
        held += len(churned)
        batches = whole_batches(churned, CHURNED)
        assert len(batches) <= 1, f"{context}: a clear left {batches} behind"
        last_acked = max(acked[CHURNED], default=None)
        if batches and last_acked is not None:
            assert batches[0] >= last_acked, f"{context}: {CHURNED} went back to {batches[0]}"
        popped = asyncio.run(store.session(POPPED).get_items())
        held += len(popped)
        check_popped(popped, acked, context)
        assert set(store.session_ids()) <= {*APPENDED, CHURNED, POPPED}
        report = store.verify()  # Citadel's page check plus its verdict on every live item
        assert report.ok, f"{context}: {report}"
    return held


def check_popped(items: list[dict[str, Any]], acked: dict[str, set[tuple[int, int]]], context: str) -> None:
    """Each round added (i=0, i=1) and popped i=1: an acknowledged pop's item is gone, nothing else is."""
    firsts = [(item["run"], item["batch"]) for item in items if item["i"] == 0]
    assert firsts == sorted(set(firsts)), f"{context}: {POPPED} out of order or doubled: {items}"
    missing = acked[POPPED] - set(firsts)
    assert not missing, f"{context}: {POPPED} lost acknowledged items {sorted(missing)}"
    for position, item in enumerate(items):
        if item["i"] == 1:
            at = (item["run"], item["batch"])
            assert at not in acked[f"{POPPED}-pop"], f"{context}: an acknowledged pop came back: {item}"
            assert position > 0 and items[position - 1] == {**item, "i": 0}, f"{context}: {items}"


def run_kills(tmp_path: Path, kills: int) -> None:
    seed = int(os.environ.get("CRASH_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    path = tmp_path / "crash.cdl"
    CitadelSessionStore(path, KEY, argon2_profile="iot").close()
    acked: dict[str, set[tuple[int, int]]] = defaultdict(set)
    writers = Writers(path, tmp_path / "writers.log")
    try:
        for run in range(kills):
            lines = writers.start_and_wait_for_first_ack(run)
            time.sleep(rng.uniform(0.0, 0.4))
            lines += writers.kill()
            for session_id, batches in acknowledgements(lines, run).items():
                acked[session_id] |= batches
            check_file(path, acked, f"kill {run + 1}/{kills} (CRASH_SEED={seed})")
    finally:
        writers.close()
    assert sum(len(batches) for batches in acked.values()) > kills, "the writers barely wrote"


# Citadel applies the sync mode at each open: the writers open the file with it.
@pytest.mark.parametrize(
    "sync_mode", ["", pytest.param("off", marks=pytest.mark.slow)], ids=["default", "off"]
)
def test_acknowledged_turns_survive_8_sigkills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_mode: str
) -> None:
    monkeypatch.setenv("CRASH_SYNC_MODE", sync_mode)
    run_kills(tmp_path, kills=8)


@pytest.mark.slow
@pytest.mark.parametrize("sync_mode", ["", "normal", "off"], ids=["default", "normal", "off"])
def test_acknowledged_turns_survive_300_sigkills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_mode: str
) -> None:
    monkeypatch.setenv("CRASH_SYNC_MODE", sync_mode)
    run_kills(tmp_path, kills=300)
