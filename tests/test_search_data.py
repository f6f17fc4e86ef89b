"""Search data: one copy per live item, erased with it, rebuilt when lost, read only for its session.

Search ranks a session's items from its search blocks (storage/search_blocks.py), so
these tests read the blocks the file holds with citadeldb itself, after the store has
closed: every live item has exactly one entry, no entry outlives its item, and the
block that held an erased item's entry is gone from Citadel ("missing"), not hidden.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import citadeldb
import pytest
from test_compaction import SDK_HAS_THE_HOOK
from test_erasure import verdicts_after_recreating

from citadeldb_openai_agents import CitadelSessionStore, reembed
from citadeldb_openai_agents.serving import operations as ops
from citadeldb_openai_agents.storage import reads, writes
from citadeldb_openai_agents.storage.search_blocks import read_block

from conftest import KEY
from stub_embedders import StubEmbedder

MOCK_DIM = 128  # citadeldb's mock embedder, the store's default


def turn(session_id: str, n: int) -> dict[str, Any]:
    return {"role": "user" if n % 2 == 0 else "assistant", "content": f"{session_id} fact number {n}"}


def write(store: CitadelSessionStore, session_id: str, count: int, batch: int = 4) -> None:
    for start in range(0, count, batch):
        asyncio.run(
            store.session(session_id).add_items([turn(session_id, n) for n in range(start, start + batch)])
        )


@contextmanager
def maintenance(path: Path) -> Iterator[Any]:
    """The closed file opened with citadeldb itself: its maintenance API."""
    db = citadeldb.connect(str(path), key=KEY, region_keys=True)
    try:
        yield db.memory_maintenance()
    finally:
        db.close()
        gc.collect()


def _readback(path: Path, atoms: dict[int, str]) -> tuple[set[str], dict[str, list[int]]]:
    """Citadel's verdicts on the atoms whose region exists; the others, by region. (A function
    of its own: the maintenance handle must be gone before the store opens the file.)"""
    found: set[str] = set()
    dropped: dict[str, list[int]] = {}
    with maintenance(path) as citadel:
        present = {entry.region.name for entry in citadel.inventory()}
        for atom, name in atoms.items():
            if name in present:
                found.update(v.verdict for v in citadel.verify(name, [atom]))
            else:
                dropped.setdefault(name, []).append(atom)
    return found, dropped


class FileContents:
    """A closed file read with citadeldb: each session segment's items and search entries."""

    def __init__(self, path: Path, prefix: str, dim: int = MOCK_DIM) -> None:
        self.items: dict[int, str] = {}
        self.entries: list[int] = []  # item ids, once per entry found in a block
        self.blocks: dict[int, str] = {}  # block id -> its region
        self.block_of: dict[int, int] = {}  # item id -> the block holding its entry
        with maintenance(path) as citadel:
            names = [e.region.name for e in citadel.inventory() if e.region.name.startswith(prefix)]
            for name in names:
                for hit in citadel.fetch(name, None, limit=2**62):
                    if hit.kind == "item":
                        self.items[hit.id] = name
                    elif hit.kind == "search":
                        self.blocks[hit.id] = name
                        ids = [int(i) for i in read_block(hit.id, hit.payload, dim).ids]
                        self.entries.extend(ids)
                        self.block_of.update(dict.fromkeys(ids, hit.id))

    def holding(self, *items: int) -> dict[int, str]:
        """The blocks (and their regions) that hold these items' entries."""
        return {self.block_of[item]: self.blocks[self.block_of[item]] for item in items}

    def assert_one_entry_per_live_item(self) -> None:
        assert sorted(self.entries) == sorted(self.items), "each live item once, and no entry of a gone item"

    @staticmethod
    def verdicts(path: Path, atoms: dict[int, str]) -> set[str]:
        """Citadel's readback of these atoms. A dropped region is created again, empty, for it
        (as tests/test_erasure.py does): its old key is gone, so its atoms read back "missing"."""
        found, dropped = _readback(path, atoms)
        if dropped:
            with CitadelSessionStore(path, KEY) as store:
                found |= verdicts_after_recreating(store, dropped)
        return found


@pytest.fixture
def twelve(tmp_path: Path) -> tuple[Path, str, FileContents]:
    """A closed file holding session "s": 12 items in three add_items calls (three blocks)."""
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        write(store, "s", 12)
        prefix = prefix_of(store, "s")
    return path, prefix, FileContents(path, prefix)


def indexed(store: CitadelSessionStore, session_id: str) -> set[int]:
    """The item ids the store's in-memory search index holds for the session (its scan)."""
    state = store._file._local._layout.state(session_id)
    return {atom for kept in state.cache.values() if kept.search is not None for atom in kept.search.ids}


def prefix_of(store: CitadelSessionStore, session_id: str) -> str:
    return f"coa.s.{store._file._local._layout.hid(session_id)}."


def test_a_pop_erases_the_block_of_its_item_and_the_rest_stay_searchable(
    twelve: tuple[Path, str, FileContents],
) -> None:
    path, prefix, before = twelve
    before.assert_one_entry_per_live_item()
    newest = max(before.items)
    held_by = before.holding(newest)
    with CitadelSessionStore(path, KEY) as store:
        session = store.session("s")
        assert asyncio.run(session.search("s fact number 11", limit=1)) == [turn("s", 11)]
        assert newest in indexed(store, "s")
        assert asyncio.run(session.pop_item()) == turn("s", 11)
        assert newest not in indexed(store, "s") and len(indexed(store, "s")) == 11
        assert turn("s", 11) not in asyncio.run(session.search("s fact number 11", limit=12))
        # The popped item's block went with it; its three other entries wait for the next write.
        assert asyncio.run(session.search("s fact number 9", limit=1)) == [turn("s", 9)]
    after = FileContents(path, prefix)
    after.assert_one_entry_per_live_item()
    assert newest not in after.items
    assert FileContents.verdicts(path, held_by) == {"missing"}, "the block is erased, not hidden"


def test_clearing_through_an_item_erases_its_search_data(twelve: tuple[Path, str, FileContents]) -> None:
    """What a client's clear sends to the owner: items up to an id go, later ones stay."""
    path, prefix, before = twelve
    through = sorted(before.items)[5]  # items 0..5 go, in the middle of the second block
    blocks = before.holding(sorted(before.items)[0], through)
    with CitadelSessionStore(path, KEY) as store:
        asyncio.run(store.session("s").search("s fact number 1"))
        store._file._local.on_session("s", writes.clear_through, through)
        assert indexed(store, "s") == set(sorted(before.items)[6:])
        assert asyncio.run(store.session("s").get_items()) == [turn("s", n) for n in range(6, 12)]
        assert asyncio.run(store.session("s").search("s fact number 7", limit=1)) == [turn("s", 7)]
    after = FileContents(path, prefix)
    after.assert_one_entry_per_live_item()
    assert len(after.items) == 6
    assert FileContents.verdicts(path, blocks) == {"missing"}


def test_erase_reads_back_the_search_data_too(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        write(store, "s", 12)
        write(store, "other", 4)
        prefix = prefix_of(store, "s")
    blocks = FileContents(path, prefix).blocks
    assert len(blocks) == 3
    with CitadelSessionStore(path, KEY) as store:
        asyncio.run(store.session("s").search("s fact number 3"))
        assert len(indexed(store, "s")) == 12
        receipt = store.erase_session("s")
        assert indexed(store, "s") == set()
        assert receipt.readback_confirmed and receipt.items_erased == 12
    assert FileContents(path, prefix).blocks == {}
    assert FileContents.verdicts(path, blocks) == {"missing"}


def test_expired_items_take_their_search_data_with_them(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    # Four items that expire at 3 s, four at 4.6 s: the checks between have 1.2 s to run.
    with CitadelSessionStore(path, KEY, argon2_profile="iot", ttl=3.0) as store:
        write(store, "s", 4)
        time.sleep(1.6)
        session = store.session("s")
        asyncio.run(session.add_items([turn("s", n) for n in range(4, 8)]))
        prefix = prefix_of(store, "s")
        assert asyncio.run(session.search("s fact number 3", limit=8))
        assert len(indexed(store, "s")) == 8  # held in memory, read before expiry
        time.sleep(1.8)  # the first four have expired, the last four not
        assert turn("s", 3) not in asyncio.run(session.search("s fact number 3", limit=8))
        assert store.purge_expired() == 4, "items counted, not items and their blocks"
        assert len(indexed(store, "s")) == 4, "expired entries leave the in-memory index too"
    left = FileContents(path, prefix)
    left.assert_one_entry_per_live_item()
    assert len(left.items) == 4 and len(left.blocks) == 1


def test_search_data_a_crash_left_behind_is_rebuilt(twelve: tuple[Path, str, FileContents]) -> None:
    """Killed after a pop, before the popped block's other entries were stored again: the
    next search embeds those items anew, and finds them."""
    path, prefix, _ = twelve
    program = (
        "import asyncio, os, sys\n"
        "from citadeldb_openai_agents import CitadelSessionStore\n"
        "store = CitadelSessionStore(sys.argv[1], sys.argv[2])\n"
        "asyncio.run(store.session('s').pop_item())\n"
        "os._exit(0)\n"  # no close: the entries waiting in memory are lost with the process
    )
    subprocess.run([sys.executable, "-c", program, str(path), KEY], check=True, env={**os.environ})
    lost = FileContents(path, prefix)
    assert len(lost.entries) == 8 and len(lost.items) == 11, "the crash left 3 items without search data"
    with CitadelSessionStore(path, KEY) as store:
        assert asyncio.run(store.session("s").search("s fact number 9", limit=1)) == [turn("s", 9)]
    FileContents(path, prefix).assert_one_entry_per_live_item()


def test_reembed_rebuilds_the_search_data_with_the_new_model(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        write(store, "s", 300, batch=3)
        prefix = prefix_of(store, "s")
    old = FileContents(path, prefix).blocks
    assert len(old) == 100
    embedder = StubEmbedder(dim=16)
    assert reembed(path, KEY, embedder).items == 300
    rebuilt = FileContents(path, prefix, dim=16)
    rebuilt.assert_one_entry_per_live_item()
    # Segments of 258 and 42 items (batches of 3 until 256), blocks of up to 256 items.
    assert len(rebuilt.blocks) == 3
    assert FileContents.verdicts(path, old) == {"missing"}
    with CitadelSessionStore(path, KEY, embedder=embedder) as store:
        assert asyncio.run(store.session("s").search("s fact number 200", limit=1)) == [turn("s", 200)]


def test_a_search_reads_only_its_session_and_then_only_the_hits(tmp_path: Path, monkeypatch) -> None:
    """Cost independent of the file: the first search reads this session's segments, later ones
    read nothing but the items they return."""
    path = tmp_path / "agent.cdl"
    calls: list[tuple[str, Any, Any]] = []

    class Recorder:
        def __init__(self, memory: Any) -> None:
            self._memory = memory

        def __getattr__(self, name: str) -> Any:
            method = getattr(self._memory, name)

            def recorded(*args: Any, **kwargs: Any) -> Any:
                calls.append((name, args, kwargs))
                return method(*args, **kwargs)

            return recorded

    real = reads.search_placed
    recorded = dataclasses.replace(
        ops.SEARCH_PLACED, run=lambda layout, memory, *rest: real(layout, Recorder(memory), *rest)
    )
    monkeypatch.setattr(ops, "SEARCH_PLACED", recorded)
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        for n in range(40):
            write(store, f"other-{n}", 40, batch=20)
        write(store, "s", 600, batch=6)
        prefix = prefix_of(store, "s")
        session = store.session("s")
        found = asyncio.run(session.search("s fact number 17", limit=5))
        assert len(found) == 5 and all(item["content"].startswith("s fact") for item in found)
        touched = {args[0] for name, args, _ in calls if name in {"fetch", "fetch_by_ids", "recall"}}
        assert touched and all(region.startswith(prefix) for region in touched)
        calls.clear()
        assert len(asyncio.run(session.search("s fact number 401", limit=5))) == 5
        reads_made = [
            (name, kwargs) for name, _, kwargs in calls if name in {"fetch", "fetch_by_ids", "recall"}
        ]
        assert len(reads_made) == 5, "only the five items returned, each read alone"
        assert all(name == "fetch" and kwargs["limit"] == 1 for name, kwargs in reads_made)


@pytest.mark.parametrize("limit", [1, 7])
def test_search_through_a_client_matches_the_owner(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as owner:
        write(owner, "s", 40)
        expected = asyncio.run(owner.session("s").search("s fact number 23", limit=limit))
        program = (
            "import asyncio, json, sys\n"
            "from citadeldb_openai_agents import CitadelSessionStore\n"
            "with CitadelSessionStore(sys.argv[1], sys.argv[2]) as store:\n"
            "    assert store.served_by is not None\n"
            "    found = asyncio.run(store.session('s').search('s fact number 23', limit=int(sys.argv[3])))\n"
            "    print(json.dumps(found))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", program, str(path), KEY, str(limit)],
            capture_output=True,
            text=True,
            check=True,
        )
    assert json.loads(done.stdout) == expected and expected[0] == turn("s", 23)


@pytest.mark.skipif(not SDK_HAS_THE_HOOK, reason="this SDK has no compaction hook")
def test_a_compaction_erases_the_search_data_of_what_it_replaces(
    twelve: tuple[Path, str, FileContents],
) -> None:
    path, prefix, before = twelve
    replaced = sorted(before.items)[8:]  # the last block's four items
    blocks = before.holding(replaced[0])

    async def compact() -> list[Any]:
        with CitadelSessionStore(path, KEY) as store:
            session = store.session("s")
            snapshot = await session._get_compaction_snapshot(4)
            assert await snapshot.replace_suffix(0, [{"role": "assistant", "content": "summary of 8 to 11"}])
            assert indexed(store, "s").isdisjoint(replaced)
            return await session.search("summary", limit=1)

    assert asyncio.run(compact()) == [{"role": "assistant", "content": "summary of 8 to 11"}]
    after = FileContents(path, prefix)
    after.assert_one_entry_per_live_item()
    assert len(after.items) == 9
    assert FileContents.verdicts(path, blocks) == {"missing"}


def test_pops_across_batches_after_a_reopen_erase_every_block(tmp_path: Path) -> None:
    """Pops with no index loaded find each item's block beside it; the entries a pop leaves
    waiting must not hide the block of the next batch popped (nor of one written since)."""
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        write(store, "s", 6, batch=2)
        prefix = prefix_of(store, "s")
    with CitadelSessionStore(path, KEY) as store:
        session = store.session("s")
        assert asyncio.run(session.pop_item()) == turn("s", 5)
        asyncio.run(session.add_items([turn("s", 6), turn("s", 7)]))
        popped = [asyncio.run(session.pop_item()) for _ in range(4)]
        assert popped == [turn("s", n) for n in (7, 6, 4, 3)]
    after = FileContents(path, prefix)
    after.assert_one_entry_per_live_item()
    assert len(after.items) == 3


def test_the_search_tool_numbers_hits_from_the_search_data(tmp_path: Path) -> None:
    """Positions (1: the oldest) and the item count come from the in-memory index, and must
    match the session as get_items reads it, across segments, after pops and expiry-free gaps."""
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        write(store, "s", 600, batch=6)  # three segments
        session = store.session("s")
        for _ in range(3):
            asyncio.run(session.pop_item())
        held = asyncio.run(session.get_items())
        hits, count = store._history("s", None).search_with_positions("s fact number 301", 7)
        assert count == len(held) == 597
        assert len(hits) == 7
        for hit in hits:
            assert [held[position - 1] for position in hit.positions] == [hit.item] * len(hit.positions)
