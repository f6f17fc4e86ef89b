"""TTL: expired items vanish from every method at once, and are erased for real."""

from __future__ import annotations

import time

import pytest
from test_erasure import memory_of, stored_ids

# Citadel compares expiry with its own wall clock, which cannot be injected, so the times are real.
# An item must still be there for the reads right after its write: the slowest write-then-reads
# here (from the write's start to the end of the reads that must still find it) took 0.16 s
# with two busy loops beside it (benchmarks/suite_under_load.py --runs 1 --command -- python -m
# pytest -q -s tests/test_ttl.py, 2026-12-08): the TTL is over 10x that.
TTL = 2.0


def wait_until_expired(written_by: float) -> None:
    """Sleep until every item written before `written_by` (`time.time()` taken once the writes
    returned) has expired: an item's expiry is the TTL from a moment inside its write (history.py,
    `expires_at`), so it is before the one this sleeps until, however slow the write was."""
    time.sleep(max(0.0, written_by + TTL + 0.05 - time.time()))


async def test_expired_items_disappear_from_every_method(make_store) -> None:
    store = make_store(ttl=TTL)
    session = store.session("s")
    await session.add_items([{"role": "user", "content": "ephemeral fact about llamas"}])
    written = time.time()
    assert store.session_ids() == ["s"]
    wait_until_expired(written)
    assert await session.get_items() == []
    assert await session.get_items(limit=5) == []
    assert await session.search("llamas") == []
    assert store.session_ids() == []
    assert await session.pop_item() is None


async def test_purge_expired_erases_and_counts(make_store) -> None:
    store = make_store(ttl=TTL)
    for sid in ("a", "b"):
        await store.session(sid).add_items([{"n": 1}, {"n": 2}, {"n": 3}])
    written = time.time()
    regions = stored_ids(store, "a")
    assert [len(ids) for ids in regions.values()] == [3], "still there: the ids of what purge erases"
    wait_until_expired(written)
    assert store.purge_expired() == 6
    assert store.purge_expired() == 0
    for region, ids in regions.items():
        memory_of(store).create_encrypted_region(region, store._file._local._layout.embedder)
        assert {a.verdict for a in memory_of(store).verify(region, ids)} == {"missing"}


async def test_next_write_erases_the_sessions_expired_items(make_store) -> None:
    store = make_store(ttl=TTL)
    session = store.session("s")
    await session.add_items([{"old": 1}])
    written = time.time()
    [(region, old_ids)] = stored_ids(store, "s").items()
    assert len(old_ids) == 1, "still there: the id of what the next write erases"
    wait_until_expired(written)
    await session.add_items([{"new": 1}])
    assert [a.verdict for a in memory_of(store).verify(region, old_ids)] == ["missing"]
    assert await session.get_items() == [{"new": 1}]


async def test_live_items_survive_beside_expired_ones(make_store) -> None:
    forever = make_store()
    await forever.session("s").add_items([{"keep": 1}])
    expiring = make_store(ttl=TTL)
    await expiring.session("s").add_items([{"drop": 1}])
    written = time.time()
    wait_until_expired(written)
    assert await forever.session("s").get_items() == [{"keep": 1}]
    assert await expiring.session("s").get_items(limit=1) == [{"keep": 1}]


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), "10", True])
def test_bad_ttl_is_refused(make_store, bad) -> None:
    with pytest.raises(ValueError, match="ttl"):
        make_store(ttl=bad)
