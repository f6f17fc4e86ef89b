"""Damage to any file is reported, never silent: no read returns a shortened history.

Citadel 2.7.0 skips an atom whose key it cannot read, and deletes its row when the
file next opens. So the store inventories a file before Citadel's memory engine runs,
and refuses a damaged one, naming each damaged session, before anything is changed.
Every read also checks that it returned every item the file's pages hold.

The sweep (tests/damage_sweep.py) damages each of the five files at 40 evenly spaced
offsets and truncates each; the slow variant uses 200 offsets. The other tests damage
one chosen key each, to check the report and that a restore brings everything back.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import citadeldb
import pytest

from citadeldb_openai_agents import (
    CitadelSessionError,
    CitadelSessionStore,
    CorruptDatabaseError,
    WrongPassphraseError,
    verify_file,
)
from citadeldb_openai_agents.cli import main

from damage_sweep import sweep

KEY = "correct horse battery staple"
# citadeldb 2.7.0's -atomkeys and -regions (measured): a 1 KiB header, then a 1 KiB slot per key,
# whose live copy starts half-way: 16 bytes flipped there make exactly that one key unreadable.
SLOT = 1024
LIVE_COPY = 512
SESSIONS = {name: 40 for name in ("alice", "bob", "carol")}


def items(session_id: str, count: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"{session_id} {n}"} for n in range(count)
    ]


@pytest.fixture
def original(tmp_path: Path) -> tuple[Path, Path]:
    """A closed store of three sessions, and a backup of it."""
    path = tmp_path / "live" / "agent.cdl"
    path.parent.mkdir()
    (tmp_path / "backup").mkdir()
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        for session_id, count in SESSIONS.items():
            written = items(session_id, count)
            for start in range(0, count, 4):
                asyncio.run(store.session(session_id).add_items(written[start : start + 4]))
        store.backup(tmp_path / "backup" / "agent.cdl")
    return path, tmp_path / "backup" / "agent.cdl"


def files(directory: Path) -> dict[str, str]:
    """Every file's digest but the audit log's (opening a file appends an entry to it)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if not p.name.endswith(".citadel-audit")
    }


def restore(backup: Path, path: Path) -> None:
    for file in backup.parent.iterdir():
        shutil.copy(file, path.parent / file.name.replace(backup.name, path.name, 1))


def read_all(path: Path) -> dict[str, list[Any]]:
    async def read() -> dict[str, list[Any]]:
        with CitadelSessionStore(path, KEY) as store:
            assert store.verify().ok
            return {sid: await store.session(sid).get_items() for sid in store.session_ids()}

    return asyncio.run(read())


class Citadel:
    """The file opened with citadeldb itself (not through the store), to pick keys to damage."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        db = citadeldb.connect(str(self.path), key=KEY, region_keys=True)
        try:
            tables = [t for t in db.tables() if t.startswith("memory_atoms_")]
            return [tuple(r) for t in tables for r in db.query(sql.format(table=t)).rows]
        finally:
            db.close()
            gc.collect()

    def atom_slots(self, region_prefix: str, kind: str | None = None) -> list[tuple[int, int]]:
        """(atom id, key slot) of the atoms of the regions named so (of one kind), in id order."""
        only = f" AND a.kind = '{kind}'" if kind else ""
        rows = self._rows(
            "SELECT a.id, a.key_slot FROM {table} a JOIN memory_regions r ON a.region_id = r.id "
            f"WHERE r.name LIKE '{region_prefix}%'{only} ORDER BY a.id"
        )
        return [(int(atom), int(slot)) for atom, slot in rows]

    def region_slot(self, region_prefix: str) -> int:
        db = citadeldb.connect(str(self.path), key=KEY, region_keys=True)
        try:
            rows = db.query(f"SELECT rsk_slot FROM memory_regions WHERE name LIKE '{region_prefix}%'").rows
            return int(rows[0][0])
        finally:
            db.close()
            gc.collect()

    def segments_of(self, session_id: str) -> str:
        """The region-name prefix of a session's segments (its salted HMAC, read as the store does)."""
        with CitadelSessionStore(self.path, KEY) as store:
            return f"coa.s.{store._file._local._layout.hid(session_id)}."

    def readable(self) -> int:
        return sum(self.inventory().values())

    def inventory(self) -> dict[str, int]:
        """Atoms Citadel can read, per region (0 for a region whose key it cannot read)."""
        db = citadeldb.connect(str(self.path), key=KEY, region_keys=True)
        try:
            return {entry.region.name: entry.live_atoms or 0 for entry in db.memory_maintenance().inventory()}
        finally:
            db.close()
            gc.collect()


def wreck_slot(key_file: Path, slot: int) -> None:
    """Flip 16 bytes of one key slot's live copy."""
    data = bytearray(key_file.read_bytes())
    start = SLOT * (slot + 1) + LIVE_COPY
    data[start : start + 16] = bytes(b ^ 0xFF for b in data[start : start + 16])
    key_file.write_bytes(bytes(data))


def damage_atom(path: Path, region_prefix: str, which: int, kind: str | None = None) -> None:
    citadel = Citadel(path)
    before = citadel.readable()
    _, slot = citadel.atom_slots(region_prefix, kind)[which]
    wreck_slot(Path(f"{path}.citadel-atomkeys"), slot)
    assert citadel.readable() == before - 1, "the damage must make exactly one atom unreadable to Citadel"


def refused(path: Path) -> CorruptDatabaseError:
    with pytest.raises(CorruptDatabaseError) as caught:
        CitadelSessionStore(path, KEY)
    message = str(caught.value)
    assert str(path) in message and "verify" in message and "backup" in message
    assert KEY not in message
    return caught.value


def run_verify(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[int, str]:
    for name in list(os.environ):
        if name.upper().startswith("CITADEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CITADEL_PATH", str(path))
    monkeypatch.setenv("CITADEL_KEY", KEY)
    code = main(["verify", *flags])
    out, err = capsys.readouterr()
    return code, out + err


# -- the sweep -------------------------------------------------------------------------


def test_no_damage_to_any_file_is_silent_or_raw(tmp_path: Path) -> None:
    result = asyncio.run(sweep(tmp_path, offsets=12))
    bad = [case for case in result.cases if case.outcome in ("silent", "raw")]
    assert not bad, f"{result.table()}\n{bad}"
    for name, counts in result.counts().items():
        assert counts["reported"] > 0, f"no damage to {name} was even seen:\n{result.table()}"


@pytest.mark.slow
def test_no_damage_to_any_file_is_silent_or_raw_at_200_offsets(tmp_path: Path) -> None:
    result = asyncio.run(sweep(tmp_path, offsets=200))
    bad = [case for case in result.cases if case.outcome in ("silent", "raw")]
    assert not bad, f"{result.table()}\n{bad}"


# -- each kind of damage, by name ------------------------------------------------------


@pytest.mark.parametrize("which", [0, 17, -1], ids=["oldest", "middle", "newest"])
def test_an_unreadable_item_is_reported_at_open_and_nothing_is_changed(
    original, which: int, monkeypatch, capsys
) -> None:
    path, backup = original
    damage_atom(path, Citadel(path).segments_of("bob"), which, "item")
    before = files(path.parent)

    error = refused(path)
    assert "1 of 40 items of session 'bob' cannot be read" in str(error)
    assert ".citadel-atomkeys" in str(error)
    assert files(path.parent) == before, "a refused open must change nothing: a restore then loses nothing"

    report = verify_file(path, KEY)
    assert not report.ok
    by_id = {session.session_id: session for session in report.sessions}
    assert (by_id["bob"].expected, by_id["bob"].readable, by_id["bob"].missing) == (40, 39, 1)
    assert all(by_id[sid].ok for sid in ("alice", "carol"))
    assert files(path.parent) == before

    code, output = run_verify(path, monkeypatch, capsys)
    assert code == 1
    assert "'bob': 39 of 40 items readable, 1 missing" in output and "FAILED" in output
    code, output = run_verify(path, monkeypatch, capsys, "--json")
    assert code == 1
    sessions = {s["session_id"]: s for s in json.loads(output)["sessions"]}
    assert (sessions["bob"]["expected"], sessions["bob"]["readable"], sessions["bob"]["missing"]) == (
        40,
        39,
        1,
    )

    restore(backup, path)
    assert read_all(path) == {sid: items(sid, count) for sid, count in SESSIONS.items()}


def test_unreadable_search_data_is_rebuilt_from_the_items(original, caplog) -> None:
    """Search data is derived from the items: its damage loses nothing, so the file opens (with
    a warning) and the next search embeds the items it covered again, finding them as before."""
    path, _ = original
    bob = Citadel(path).segments_of("bob")
    blocks = Citadel(path).atom_slots(bob, "search")
    assert len(blocks) == 10, "one search block per add_items call of 4 items"
    damage_atom(path, bob, 0, "search")  # the block of bob 0..3

    async def use() -> tuple[list[Any], list[str], int]:
        with caplog.at_level("WARNING", logger="citadeldb_openai_agents"):
            store = CitadelSessionStore(path, KEY)
        with store:
            session = store.session("bob")
            stored = await session.get_items()
            hits = [item["content"] for item in await session.search("bob 2", limit=3)]
            return stored, hits, store.verify().ok

    stored, hits, ok = asyncio.run(use())
    assert stored == items("bob", 40)
    assert hits[0] == "bob 2", "an item of the damaged block is found after its rebuild"
    assert ok
    hid = bob.split(".")[2]  # coa.s.HID.: a log line names a session by its hash only (issue 59)
    assert (
        f"1 search data atoms of the session hashed {hid}" in caplog.text and "no item is lost" in caplog.text
    )
    assert "'bob'" not in caplog.text
    rebuilt = {atom for atom, _ in Citadel(path).atom_slots(bob, "search")}
    old = {atom for atom, _ in blocks}
    assert blocks[0][0] not in rebuilt, "the damaged block's row went when the file opened"
    assert len(rebuilt - old) == 1 and len(rebuilt) == 10, "its items' entries are in one new block"
    assert read_all(path) == {sid: items(sid, count) for sid, count in SESSIONS.items()}


def test_a_truncated_atom_key_file_is_reported(original) -> None:
    path, backup = original
    keys = Path(f"{path}.citadel-atomkeys")
    # Cut half-way through the slots in use (the file is allocated ahead, in 256-slot steps).
    last = max(slot for _, slot in Citadel(path).atom_slots("coa."))
    keys.write_bytes(keys.read_bytes()[: SLOT * (last // 2 + 1)])
    error = refused(path)
    # The keys of the newest atoms are cut off: the catalog records (rewritten by every
    # session's writes) and the later sessions' items.
    assert "catalog cannot be read" in str(error) and "out of bounds" in str(error)
    restore(backup, path)
    assert read_all(path) == {sid: items(sid, count) for sid, count in SESSIONS.items()}


def test_a_damaged_segment_key_is_reported_not_dropped(original, caplog: pytest.LogCaptureFixture) -> None:
    path, backup = original
    citadel = Citadel(path)
    segment = citadel.segments_of("carol")
    wreck_slot(Path(f"{path}.citadel-regions"), citadel.region_slot(segment))
    assert [n for name, n in citadel.inventory().items() if name.startswith(segment)] == [0]
    before = files(path.parent)
    with caplog.at_level("ERROR", logger="citadeldb_openai_agents"):
        error = refused(path)
    assert "40 of 40 items of session 'carol' cannot be read (a segment's key cannot be read" in str(error)
    # The log line names the session by its hash only (issue 59); the error, for its caller, by id.
    hid = segment.split(".")[2]
    assert f"40 of 40 items of the session hashed {hid} cannot be read" in caplog.text
    assert "carol" not in caplog.text
    assert files(path.parent) == before
    restore(backup, path)
    assert read_all(path)["carol"] == items("carol", 40)


def test_an_unreadable_catalog_record_is_reported_and_its_session_kept(original) -> None:
    """Before: a session whose record was unreadable looked cleared, and its items were dropped."""
    path, backup = original
    damage_atom(path, "coa.catalog", 1)  # bob's record: the second session written
    before = files(path.parent)
    error = refused(path)
    assert "40 of 40 items of an unknown session cannot be read" in str(error)
    assert files(path.parent) == before
    restore(backup, path)
    assert read_all(path)["bob"] == items("bob", 40)


def test_an_unreadable_layout_record_is_reported(original) -> None:
    path, _ = original
    damage_atom(path, "coa.meta", 0)
    error = refused(path)
    assert "layout record" in str(error)


# -- reads that come back short ---------------------------------------------------------


@pytest.fixture
def fetch_loses_one_atom(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Citadel's `fetch` silently skips the atoms listed (as it skips one whose key is damaged)."""
    from citadeldb_openai_agents.storage.memory_handle import MemoryHandle

    lost: list[int] = []
    original_getattr = MemoryHandle.__getattr__

    def getattr_(self: Any, name: str) -> Any:
        found = original_getattr(self, name)
        if name != "fetch":
            return found

        def fetch(*args: Any, **kwargs: Any) -> Any:
            return [hit for hit in found(*args, **kwargs) if hit.id not in lost]

        return fetch

    monkeypatch.setattr(MemoryHandle, "__getattr__", getattr_)
    yield lost


async def test_a_read_that_comes_back_short_raises(make_store, fetch_loses_one_atom: list[int]) -> None:
    store = make_store()
    session = store.session("s")
    for start in range(0, 600, 100):  # three segments
        await session.add_items(items("s", 600)[start : start + 100])
    await store.session("other").add_items(items("other", 3))
    ids = [
        hit.id
        for name in store._file._local._layout.segment_regions(store._file._local._layout.state("s"))
        for hit in store._file._local._database.memory.fetch(name, "item", limit=1000)
    ]
    store.close()
    store = make_store()
    session = store.session("s")
    fetch_loses_one_atom.append(ids[10])  # in the first of the session's two segments

    with pytest.raises(CorruptDatabaseError, match=r"1 of 600 items of session 's' cannot be read") as caught:
        await session.get_items()
    assert "verify" in str(caught.value) and "backup" in str(caught.value)
    assert await session.get_items(limit=20) == items("s", 600)[-20:]  # the newest segment is whole
    assert await store.session("other").get_items() == items("other", 3)

    fetch_loses_one_atom.append(ids[-1])
    with pytest.raises(CorruptDatabaseError, match="session 's'"):
        await session.get_items(limit=5)

    report = store.verify()
    assert not report.ok
    [damaged] = report.damaged_sessions
    assert (damaged.session_id, damaged.expected, damaged.readable) == ("s", 600, 598)


async def test_a_fresh_process_finds_the_newest_items_missing_too(
    make_store, fetch_loses_one_atom: list[int]
) -> None:
    """A fresh process seeks the newest items from the tail's ids as the pages list them (no
    full read of the tail): a seek that comes back short is checked, and the loss raises."""
    store = make_store()
    await store.session("s").add_items(items("s", 10))
    tail = store._file._local._layout.segment_regions(store._file._local._layout.state("s"))[-1]
    newest = store._file._local._database.memory.fetch(tail, "item", limit=100)[-1].id
    store.close()
    store = make_store()
    fetch_loses_one_atom.append(newest)
    with pytest.raises(CorruptDatabaseError, match="1 of 3 items"):
        await store.session("s").get_items(limit=3)


async def test_reads_check_against_rows_kept_by_this_processs_writes(
    make_store, fetch_loses_one_atom: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read is checked against the rows the pages hold, looked up once per segment and then
    kept by this process's appends and pops: not queried again after every write (such a
    query scans the file's whole atom table), and still catching an item that goes missing."""
    store = make_store()
    session = store.session("s")
    await session.add_items(items("s", 10))
    await session.get_items()  # the segment's rows, looked up once
    layout = store._file._local._layout
    queries: list[list[str]] = []
    real = layout.completeness.rows
    monkeypatch.setattr(
        layout.completeness, "rows", lambda names, *rest: queries.append(names) or real(names, *rest)
    )
    extra = items("s", 11)[10]
    for _ in range(5):
        await session.add_items([extra])
        assert await session.get_items() == [*items("s", 10), extra]
        assert await session.pop_item() == extra
    assert await session.get_items() == items("s", 10)
    assert queries == [], "a read after a write queried the pages"

    await session.add_items(items("s", 12)[10:])
    tail = layout.segment_regions(layout.state("s"))[-1]
    newest = store._file._local._database.memory.fetch(tail, "item", limit=100)[-1].id
    fetch_loses_one_atom.append(newest)  # the item just appended, unreadable
    # Answered from the payloads this process wrote and read since (nothing else wrote the
    # region): every item, none lost.
    assert await session.get_items() == items("s", 12)
    # Once they are not held (the budget, a restart), the read goes to the file: the loss raises.
    layout.caches.drop_held()
    with pytest.raises(CorruptDatabaseError, match="1 of 12 items"):
        await session.get_items()


async def test_a_write_by_a_path_that_does_not_keep_the_rows_makes_the_next_read_look_again(
    make_store,
) -> None:
    """Kept rows are right only until something else writes their region: recovery of a
    replacement at open, a purge, or any path written later. Such a write is counted where
    Citadel is called, so the next read looks at the pages instead of reporting the item it
    erased as damage (CI once saw "12 of 315 items cannot be read" after a recovery)."""
    store = make_store()
    session = store.session("s")
    await session.add_items(items("s", 10))
    assert await session.get_items() == items("s", 10)  # the segment's rows, kept
    layout = store._file._local._layout
    tail = layout.segment_regions(layout.state("s"))[-1]
    memory = store._file._local._database.memory
    fifth = memory.fetch(tail, "item", limit=100)[4].id
    memory.forget(tail, [fifth])  # a write that does not tell the kept rows
    assert await session.get_items() == [*items("s", 4), *items("s", 10)[5:]]


async def test_a_sessions_first_read_looks_up_its_rows_through_the_index(
    make_store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows a read is checked against are looked up by the (region, kind) index: a session's
    first read after an open must not scan the file's whole atom table (measured at 72,000 atoms:
    2 ms against 120-260 ms for `region_id IN (...)`, which scans, growing with the file)."""
    from citadeldb_openai_agents.storage import inventory

    store = make_store()
    for name in ("a", "b", "c"):
        await store.session(name).add_items(items(name, 3))
    store.close()
    store = make_store()  # the open-time audit reads every row, once: not a read's
    issued: list[tuple[str, list[Any] | None]] = []
    real = inventory._query
    monkeypatch.setattr(
        inventory,
        "_query",
        lambda db, sql, params=None: issued.append((sql, params)) or real(db, sql, params),
    )
    for name in ("a", "b"):
        assert await store.session(name).get_items() == items(name, 3)
    assert await store.session("c").get_items(limit=2) == items("c", 3)[1:]
    lookups = [(sql, params) for sql, params in issued if inventory.ATOM_TABLE_PREFIX in sql]
    assert lookups, "no read was checked against the pages"
    plans = store._file._local._database.on_owner_thread(
        lambda db: [str(db.query(f"EXPLAIN {sql}", params).rows) for sql, params in lookups]
    )
    assert all("USING INDEX" in plan and "SCAN TABLE" not in plan for plan in plans), plans


# -- the key file and the audit log ----------------------------------------------------


def test_a_damaged_key_file_is_named_and_a_wrong_passphrase_names_both_causes(original) -> None:
    path, backup = original
    keys = Path(f"{path}.citadel-keys")
    size = keys.stat().st_size
    outcomes = set()
    for offset in range(0, size, 4):
        restore(backup, path)
        data = bytearray(keys.read_bytes())
        data[offset] ^= 0xFF
        keys.write_bytes(bytes(data))
        with pytest.raises(CitadelSessionError) as caught:
            CitadelSessionStore(path, KEY)
        message = str(caught.value)
        assert str(keys) in message and "backup" in message and KEY not in message, message
        if isinstance(caught.value, WrongPassphraseError):
            assert "wrong passphrase" in message and "damaged" in message, message
        else:
            assert isinstance(caught.value, CorruptDatabaseError) and "not the cause" in message, message
        outcomes.add(type(caught.value).__name__)
    assert outcomes == {"WrongPassphraseError", "CorruptDatabaseError"}


def test_a_damaged_audit_log_is_named(original) -> None:
    path, _ = original
    audit = Path(f"{path}.citadel-audit")
    data = bytearray(audit.read_bytes())
    data[0] ^= 0xFF
    audit.write_bytes(bytes(data))
    with pytest.raises(CorruptDatabaseError, match="audit log") as caught:
        CitadelSessionStore(path, KEY)
    assert str(audit) in str(caught.value)


# -- files written before format 2 ------------------------------------------------------


def as_format_1(path: Path, forget_record_of: str | None = None) -> None:
    """Rewrite a closed file's records as format 1 did: the catalog holds each session's id only.

    With `forget_record_of`, also forget that session's record, as format 1's clear did first
    (a crash then left its segments behind).
    """
    db = citadeldb.connect(str(path), key=KEY, region_keys=True)
    memory = db.memory()
    embedder = citadeldb.MockEmbedder(dim=128)
    for region in ("coa.meta", "coa.catalog"):
        memory.create_encrypted_region(region, embedder)
    [meta] = memory.fetch("coa.meta", "layout", limit=1)
    memory.update_atom_payload("coa.meta", meta.id, {**meta.payload, "format": 1})
    for hit in memory.fetch("coa.catalog", "session", limit=100):
        if hit.payload["session"] == forget_record_of:
            memory.forget("coa.catalog", [hit.id])
        else:
            memory.update_atom_payload("coa.catalog", hit.id, hit.payload["session"])
    del memory
    db.close()
    gc.collect()


def layout_records(path: Path) -> tuple[int, list[Any]]:
    db = citadeldb.connect(str(path), key=KEY, region_keys=True)
    try:
        maintenance = db.memory_maintenance()
        [meta] = maintenance.fetch("coa.meta", "layout")
        return meta.payload["format"], [hit.payload for hit in maintenance.fetch("coa.catalog", "session")]
    finally:
        db.close()
        gc.collect()


def test_a_format_1_file_is_upgraded_when_opened(original) -> None:
    path, _ = original
    as_format_1(path)
    assert layout_records(path)[0] == 1
    assert read_all(path) == {sid: items(sid, count) for sid, count in SESSIONS.items()}
    layout_format, records = layout_records(path)
    assert layout_format == 2
    assert sorted(record["session"] for record in records) == sorted(SESSIONS)
    assert all(record["segments"] == [0] and record["next"] == 1 for record in records)


def test_a_format_1_clear_interrupted_by_a_crash_still_finishes(original) -> None:
    """Format 1 forgot the record first: segments without a record are what a crash left then."""
    path, _ = original
    as_format_1(path, forget_record_of="bob")
    assert read_all(path) == {sid: items(sid, SESSIONS[sid]) for sid in ("alice", "carol")}
