"""Operator calls on a live file never hurt the service: each beside 8 writers, in one process and
through the owner, returns its correct report, and every write succeeds and is stored."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from test_serving import Service

from citadeldb_openai_agents import CitadelSessionStore

from conftest import KEY

WRITERS = 8


class Writers:
    """Eight threads appending one item at a time to a session each, counting what was acknowledged."""

    def __init__(self, store: CitadelSessionStore) -> None:
        self.store = store
        self.acknowledged = {f"w{n}": 0 for n in range(WRITERS)}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write, args=(name,)) for name in self.acknowledged]

    def _write(self, name: str) -> None:
        session = self.store.session(name)
        while not self._stop.is_set():
            try:
                asyncio.run(
                    session.add_items([{"role": "user", "content": f"{name} {self.acknowledged[name]}"}])
                )
            except Exception as exc:  # every failure is the test's finding
                self.errors.append(f"{name}: {exc!r}")
                return
            self.acknowledged[name] += 1

    def __enter__(self) -> Writers:
        for thread in self._threads:
            thread.start()
        deadline = time.monotonic() + 60
        while sum(self.acknowledged.values()) < 4 * WRITERS:  # all of them under way
            assert time.monotonic() < deadline and not self.errors, self.errors
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


def operate_while_writing(store: CitadelSessionStore, tmp_path: Path) -> None:
    with Writers(store) as writers:
        for round_ in range(3):
            report = store.verify()
            assert report.ok, report
            before = writers.acknowledged["w0"]
            exported = store.export("w0")
            assert len(exported) >= before and exported == [
                {"role": "user", "content": f"w0 {n}"} for n in range(len(exported))
            ]
            assert store.purge_expired() == 0
            assert {summary.session_id for summary in store.sessions()} >= {"w0", "w7"}
            written = store.backup(tmp_path / f"backup-{round_}.cdl")
            assert written
        assert not writers.errors, writers.errors
    assert not writers.errors, writers.errors
    for name, count in writers.acknowledged.items():
        items = asyncio.run(store.session(name).get_items())
        assert items == [{"role": "user", "content": f"{name} {n}"} for n in range(count)], name
    for round_ in range(3):
        with CitadelSessionStore(tmp_path / f"backup-{round_}.cdl", KEY, create=False) as copy:
            assert copy.verify().ok


def test_operator_calls_beside_eight_writers_in_one_process(tmp_path: Path) -> None:
    # Citadel's default sync mode, the service's default. With sync_mode="off", backup beside
    # these writers failed in 2 of 3 runs with Citadel's "invalid page type" (a known issue,
    # docs/operations.md); not reproduced outside this test in 8 tries.
    with CitadelSessionStore(tmp_path / "agent.cdl", KEY, argon2_profile="iot") as store:
        operate_while_writing(store, tmp_path)


def test_operator_calls_beside_eight_writers_through_the_owner(tmp_path: Path) -> None:
    owner = Service(tmp_path / "agent.cdl")
    try:
        with CitadelSessionStore(tmp_path / "agent.cdl", KEY) as client:
            assert client.served_by == owner.pid
            operate_while_writing(client, tmp_path)
    finally:
        log = owner.stop()
    assert "Traceback" not in log, log
