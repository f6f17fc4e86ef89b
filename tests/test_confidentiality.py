"""Confidentiality on disk: nothing a user wrote can be read from the files, and erasure is proven by Citadel.

The files are searched byte by byte for markers in every encoding an engine might
use; erasure is checked by asking Citadel itself (`verify` calls an erased atom
``missing``: no row, no key), as tests/test_erasure.py does.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from pathlib import Path

import citadeldb
from test_erasure import memory_of, stored_ids, verdicts_after_recreating

from citadeldb_openai_agents import CitadelSessionStore

from conftest import KEY


def encodings(secret: str) -> set[bytes]:
    """Every form of `secret` an engine could write: UTF-8, UTF-16 both ways, JSON-escaped."""
    escaped = json.dumps(secret)[1:-1]
    return {form.encode(codec) for form in {secret, escaped} for codec in ("utf-8", "utf-16-le", "utf-16-be")}


def files_holding(directory: Path, secrets_: list[str]) -> dict[str, list[str]]:
    """For each file under `directory`, the secrets found in its bytes."""
    found: dict[str, list[str]] = {}
    for file in sorted(directory.rglob("*")):
        if not file.is_file():
            continue
        data = file.read_bytes()
        hits = [secret for secret in secrets_ if any(form in data for form in encodings(secret))]
        if hits:
            found[file.name] = hits
    return found


def unsalted_digests(session_id: str) -> list[str]:
    """What a careless layout would name a session's regions after."""
    digest = hashlib.sha256(session_id.encode()).hexdigest()
    return [digest, digest[:32], digest[:16], hashlib.md5(session_id.encode()).hexdigest()]


async def test_no_file_holds_a_marker_or_a_session_id(make_store, db_path: Path) -> None:
    marker = f"MARKER-{secrets.token_hex(8)}"
    accented = f"Zürich-Straße-{secrets.token_hex(4)}-🔑"
    session_ids = [f"patient-{secrets.token_hex(6)}", f"ünïcödé-{secrets.token_hex(6)}"]
    store = make_store()
    for sid in session_ids:
        session = store.session(sid)
        await session.add_items(
            [
                {"role": "user", "content": f"my diagnosis is {marker}"},
                {"role": "assistant", "content": [{"type": "output_text", "text": f"noted, {accented}"}]},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "lookup",
                    "arguments": json.dumps({"q": marker}),
                },
                {"type": "function_call_output", "call_id": "c1", "output": f"record {marker}"},
                {marker: accented, "nested": {"key": [marker]}},
            ]
        )
        for start in range(0, 300, 20):  # a second segment, and enough writes to flush pages
            await session.add_items(
                [{"role": "user", "content": f"turn {n} about {marker}"} for n in range(start, start + 20)]
            )
        assert await session.search(marker, limit=3)
        await session.pop_item()
    store.backup(db_path.parent / "backup.cdl")
    store.close()
    reopened = make_store()
    assert sorted(reopened.session_ids()) == sorted(session_ids)
    reopened.close()

    looked_for = [marker, accented, *session_ids, *(d for sid in session_ids for d in unsalted_digests(sid))]
    assert len(list(db_path.parent.iterdir())) >= 8, "the database, its companions and the backup"
    assert files_holding(db_path.parent, looked_for) == {}
    # The search itself finds what is there, in any of the encodings.
    (db_path.parent / "control.txt").write_text(f"x{accented}x", encoding="utf-16")
    assert files_holding(db_path.parent, looked_for) == {"control.txt": [accented]}


def region_names(path: Path) -> set[str]:
    """The file's region names as Citadel lists them to anyone holding the passphrase."""
    db = citadeldb.connect(str(path), key=KEY, region_keys=True)
    try:
        memory = db.memory()
        names = {region.name for region in memory.regions()}
        del memory  # Citadel holds the file's lock while a Memory object lives
    finally:
        db.close()
    return names


def revealing_forms(session_id: str) -> list[str]:
    """What a region name must not contain: the id, or the shortest prefix (16 hex digits,
    so every longer one too) of its unsalted SHA-256 or MD5 digest."""
    data = session_id.encode("utf-8", "surrogatepass")
    return [
        session_id.lower(),  # Citadel folds ASCII case in region names
        hashlib.sha256(data).hexdigest()[:16],
        hashlib.md5(data).hexdigest()[:16],
    ]


REGION_NAME_IDS = ["user-123", "Patient-Zoë-Ünïcødé-🔑", "a" * 4_000, "x" * 100_000, "\ud800-lone"]


async def write_sessions(path: Path, session_ids: list[str]) -> None:
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        for session_id in session_ids:
            await store.session(session_id).add_items([{"role": "user", "content": "hello"}])


async def test_region_names_do_not_reveal_session_ids_to_a_holder_of_the_passphrase(tmp_path: Path) -> None:
    empty, written = tmp_path / "empty.cdl", tmp_path / "agent.cdl"
    await write_sessions(empty, [])
    await write_sessions(written, REGION_NAME_IDS)
    session_regions = region_names(written) - region_names(empty)
    assert len(session_regions) == len(REGION_NAME_IDS), "one segment per session"
    for name in region_names(written):
        for session_id in REGION_NAME_IDS:
            for form in revealing_forms(session_id):
                assert form not in name.lower(), (name, session_id[:40], form)


async def test_each_file_names_the_same_session_differently(tmp_path: Path) -> None:
    """The HMAC's salt is the file's own: names cannot be matched across files."""
    first, second, empty = tmp_path / "first.cdl", tmp_path / "second.cdl", tmp_path / "empty.cdl"
    await write_sessions(empty, [])
    for path in (first, second):
        await write_sessions(path, REGION_NAME_IDS)
    in_first = region_names(first) - region_names(empty)
    in_second = region_names(second) - region_names(empty)
    assert len(in_first) == len(in_second) == len(REGION_NAME_IDS)
    assert in_first.isdisjoint(in_second)


async def test_what_clear_session_erased_is_missing_for_citadel_and_from_the_files(
    make_store, db_path: Path
) -> None:
    marker = f"ERASE-ME-{secrets.token_hex(8)}"
    store = make_store()
    session = store.session("to-erase")
    for start in range(0, 400, 100):
        await session.add_items(
            [{"role": "user", "content": f"{marker} {n}"} for n in range(start, start + 100)]
        )
    await store.session("kept").add_items([{"role": "user", "content": "unrelated"}])
    regions = stored_ids(store, "to-erase")
    catalog_id = store._file._local._layout.state("to-erase").catalog_id
    assert sum(map(len, regions.values())) == 400 and catalog_id is not None
    assert {a.verdict for a in memory_of(store).verify("coa.catalog", [catalog_id])} == {"authentic"}

    await session.clear_session()

    # Citadel's own verdict: no row and no key, for every item and for the session's catalog entry.
    assert verdicts_after_recreating(store, regions) == {"missing"}
    assert [a.verdict for a in memory_of(store).verify("coa.catalog", [catalog_id])] == ["missing"]
    assert await session.get_items() == [] and store.session_ids() == ["kept"]
    store.close()
    assert files_holding(db_path.parent, [marker, "to-erase"]) == {}


async def test_pop_item_and_erase_session_leave_citadel_nothing_to_verify(store: CitadelSessionStore) -> None:
    session = store.session("s")
    await session.add_items([{"content": f"secret {n}"} for n in range(5)])
    [(region, ids)] = stored_ids(store, "s").items()
    await session.pop_item()
    await session.pop_item()
    assert [a.verdict for a in memory_of(store).verify(region, ids)] == ["authentic"] * 3 + ["missing"] * 2
    erasure = store.erase_session("s")
    assert (erasure.items_erased, erasure.readback_confirmed) == (3, True)
    assert verdicts_after_recreating(store, {region: ids}) == {"missing"}


async def test_a_backup_taken_before_an_erasure_keeps_its_own_keys(
    make_store, db_path: Path, tmp_path: Path
) -> None:
    """The scope of erasure the README documents: copies made before it are not reached."""
    store = make_store()
    await store.session("s").add_items([{"role": "user", "content": "in the backup"}])
    (tmp_path / "backup").mkdir()
    backup = tmp_path / "backup" / "agent.cdl"
    store.backup(backup)
    raw_copy = tmp_path / "copy"
    raw_copy.mkdir()
    for file in db_path.parent.glob(f"{db_path.name}*"):
        shutil.copy(file, raw_copy / file.name)
    await store.session("s").clear_session()
    assert await store.session("s").get_items() == []
    store.close()
    for copy in (backup, raw_copy / db_path.name):
        with CitadelSessionStore(copy, KEY) as old:
            assert await old.session("s").get_items() == [{"role": "user", "content": "in the backup"}]
