"""Deletes destroy keys: checked through Citadel's own verification, not only by reading back."""

from __future__ import annotations

from pathlib import Path

from citadeldb.memory import Memory

from citadeldb_openai_agents import CitadelSessionStore
from citadeldb_openai_agents.storage.codec import ITEM_KIND


def memory_of(store: CitadelSessionStore) -> Memory:
    return store._file._local._database.memory  # Citadel's handle, to ask Citadel itself


def stored_ids(store: CitadelSessionStore, session_id: str) -> dict[str, list[int]]:
    layout, memory = store._file._local._layout, memory_of(store)
    state = layout.state(session_id)
    return {
        region: [hit.id for hit in memory.fetch(region, ITEM_KIND, limit=10_000)]
        for region in layout.segment_regions(state)
    }


def verdicts_after_recreating(store: CitadelSessionStore, regions: dict[str, list[int]]) -> set[str]:
    memory = memory_of(store)
    found = set()
    for region, ids in regions.items():
        memory.create_encrypted_region(region, store._file._local._layout.embedder)
        found |= {attestation.verdict for attestation in memory.verify(region, ids)}
        memory.drop_region(region)
    return found


async def test_pop_item_destroys_the_popped_items_key(store: CitadelSessionStore) -> None:
    session = store.session("s")
    await session.add_items([{"n": 1}, {"n": 2}])
    [(region, ids)] = stored_ids(store, "s").items()
    assert {a.verdict for a in memory_of(store).verify(region, ids)} == {"authentic"}
    assert await session.pop_item() == {"n": 2}
    verdicts = memory_of(store).verify(region, ids)
    assert [a.verdict for a in verdicts] == ["authentic", "missing"]


async def test_clear_session_destroys_every_key(store: CitadelSessionStore, db_path: Path) -> None:
    session = store.session("s")
    for start in range(0, 600, 100):
        await session.add_items([{"n": n} for n in range(start, start + 100)])
    regions = stored_ids(store, "s")
    assert len(regions) >= 2 and sum(map(len, regions.values())) == 600
    keys_file = Path(f"{db_path}.citadel-atomkeys")
    before = keys_file.read_bytes()
    await session.clear_session()
    after = keys_file.read_bytes()
    changed = sum(a != b for a, b in zip(before, after, strict=False))  # the file may grow
    assert changed >= 600 * 16, "each erased atom's wrapped key slot must be overwritten"
    assert verdicts_after_recreating(store, regions) == {"missing"}
    assert await session.get_items() == []


async def test_erase_session_returns_citadels_evidence(store: CitadelSessionStore) -> None:
    session = store.session("s")
    for start in range(0, 450, 150):
        await session.add_items([{"n": n} for n in range(start, start + 150)])
    await store.session("other").add_items([{"keep": True}])
    regions = stored_ids(store, "s")
    erasure = store.erase_session("s")
    assert erasure.items_erased == 450
    assert erasure.regions_dropped == len(regions) == 2
    assert erasure.readback_confirmed is True
    assert erasure.algorithm == "AES-256-KW(RFC3394)"
    assert verdicts_after_recreating(store, regions) == {"missing"}
    assert store.session_ids() == ["other"]
    assert await store.session("other").get_items() == [{"keep": True}]


async def test_a_clear_interrupted_by_a_crash_finishes_on_reopen(make_store, db_path: Path) -> None:
    store = make_store()
    session = store.session("s")
    for start in range(0, 400, 100):
        await session.add_items([{"n": n} for n in range(start, start + 100)])
    await store.session("kept").add_items([{"n": "kept"}])
    regions = stored_ids(store, "s")
    state = store._file._local._layout.state("s")
    # The commit point of a clear, as if the process died right after it and one segment's
    # drop: the record says "clearing", one segment is gone, the rest still stored.
    state.record.clearing = True
    memory_of(store).update_atom_payload("coa.catalog", state.catalog_id, state.record.to_payload())
    memory_of(store).drop_region(next(iter(regions)))
    store.close()
    reopened = make_store()
    names = {region.name for region in memory_of(reopened).regions()}
    assert not names & set(regions)
    assert reopened.session_ids() == ["kept"]
    assert await reopened.session("s").get_items() == []
    assert await reopened.session("kept").get_items() == [{"n": "kept"}]
    assert verdicts_after_recreating(reopened, regions) == {"missing"}
    assert reopened.verify().ok


async def test_erase_session_reports_a_readback_that_still_finds_an_erased_item(
    store: CitadelSessionStore, readback_still_finds
) -> None:
    session = store.session("s")
    await session.add_items([{"n": n} for n in range(3)])
    [(_, ids)] = stored_ids(store, "s").items()
    readback_still_finds(ids[1])
    erasure = store.erase_session("s")
    assert erasure.readback_confirmed is False
    assert (erasure.items_erased, erasure.regions_dropped) == (3, 1)
    assert await session.get_items() == []
