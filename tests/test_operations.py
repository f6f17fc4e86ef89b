"""The operator methods of the store: sessions, export, erase, rotate_key, backup, verify."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, WrongPassphraseError
from citadeldb_openai_agents.errors import BackupExistsError, SessionNotFoundError


async def test_sessions_lists_counts_and_write_times(store: CitadelSessionStore) -> None:
    before = datetime.now(timezone.utc)
    await store.session("b").add_items([{"n": 1}])
    await store.session("a").add_items([{"n": 1}, {"n": 2}])
    await store.session("a").add_items([{"n": 3}])
    await store.session("gone").add_items([{"n": 1}])
    await store.session("gone").clear_session()
    summaries = store.sessions()
    assert [(s.session_id, s.items) for s in summaries] == [("a", 3), ("b", 1)]
    a = summaries[0]
    assert before <= a.first_write <= a.last_write <= datetime.now(timezone.utc)
    assert store.summary("a") == a
    assert store.summary("gone") is None and store.summary("never written") is None


async def test_export_then_erase_then_export_shows_nothing(store: CitadelSessionStore) -> None:
    items = [{"role": "user", "content": "my address is 1 Main St", "z": 0, "a": 1}]
    await store.session("subject").add_items(items)
    exported = store.export("subject")
    assert exported == items and list(exported[0]) == list(items[0])
    erasure = store.erase_session("subject")
    assert (erasure.items_erased, erasure.readback_confirmed) == (1, True)
    with pytest.raises(SessionNotFoundError, match="subject"):
        store.export("subject")
    with pytest.raises(SessionNotFoundError):
        store.erase_session("subject")


async def test_rotate_key_then_reopen_with_each_passphrase(make_store, db_path: Path, key: str) -> None:
    store = make_store()
    for sid in ("a", "b"):
        await store.session(sid).add_items([{"owner": sid}])
    with pytest.raises(WrongPassphraseError, match="nothing was changed"):
        store.rotate_key("not it", "new passphrase")
    store._file._socket_key.mac(b"derived")  # derived when a client first comes: derive it now
    held = (store._file._opening.passphrase.value, store._file._socket_key._key.value)
    assert all(any(value) for value in held)
    store.rotate_key(key, "new passphrase")
    # The old passphrase (and the socket key derived from it) are zeroed, not left to the gc.
    assert all(not any(value) for value in held), "the old passphrase is still in memory"
    store.close()
    with pytest.raises(WrongPassphraseError):
        CitadelSessionStore(db_path, key)
    reopened = make_store(key="new passphrase")
    for sid in ("a", "b"):
        assert await reopened.session(sid).get_items() == [{"owner": sid}]


async def test_backup_restores_and_refuses_to_overwrite(
    store: CitadelSessionStore, tmp_path: Path, key: str
) -> None:
    await store.session("s").add_items([{"n": 1}])
    (tmp_path / "backups").mkdir()
    written = store.backup(tmp_path / "backups" / "copy.cdl")
    assert str(tmp_path / "backups" / "copy.cdl") in written and len(written) >= 3
    with pytest.raises(BackupExistsError):
        store.backup(tmp_path / "backups" / "copy.cdl")
    await store.session("s").clear_session()
    with CitadelSessionStore(tmp_path / "backups" / "copy.cdl", key) as restored:
        assert await restored.session("s").get_items() == [{"n": 1}]


@pytest.mark.parametrize("sync_mode", ["off", "full"])
@pytest.mark.parametrize("sessions, items", [(1, 1), (3, 40)])
async def test_a_file_written_in_any_sync_mode_backs_up_whole(
    make_store, db_path: Path, tmp_path: Path, key: str, sync_mode: str, sessions: int, items: int
) -> None:
    # citadeldb 2.7.0's backup refused a healthy file of one session of one item written with
    # "off" ("invalid page type 4"), which the store reported as damage; the other shape passes.
    written = make_store(sync_mode=sync_mode)
    held = {f"s{s}": [{"role": "user", "content": f"{s} {n}"} for n in range(items)] for s in range(sessions)}
    for sid, items in held.items():
        await written.session(sid).add_items(items)
    written.close()
    with CitadelSessionStore(db_path, key) as store:
        assert store.verify().ok
        store.backup(tmp_path / "copy.cdl")
    with CitadelSessionStore(tmp_path / "copy.cdl", key) as restored:
        assert {sid: await restored.session(sid).get_items() for sid in held} == held
        assert restored.verify().ok


async def test_a_backup_keeps_the_audit_log(
    store: CitadelSessionStore, db_path: Path, tmp_path: Path, key: str
) -> None:
    await store.session("gone").add_items([{"n": 1}])
    await store.session("kept").add_items([{"n": 2}])
    store.erase_session("gone")  # Citadel's audit log records the erasure
    before = Path(f"{db_path}.citadel-audit").read_bytes()
    written = store.backup(tmp_path / "copy.cdl")
    audit = Path(f"{db_path}.citadel-audit").read_bytes()  # the backup is logged too
    copied = tmp_path / "copy.cdl.citadel-audit"
    assert str(copied) in written and copied.read_bytes() == audit and len(audit) > len(before) > 0
    store.close()
    with CitadelSessionStore(tmp_path / "copy.cdl", key) as restored:
        assert restored.session_ids() == ["kept"] and restored.verify().ok
        await restored.session("kept").clear_session()
    assert len(copied.read_bytes()) > len(audit)  # the copy goes on as the backup's own log


async def test_a_backup_runs_while_no_write_is_under_way(
    make_store, tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from citadeldb_openai_agents.storage import local_file as storage_module

    from stub_embedders import StubEmbedder

    embedder = StubEmbedder()
    embed = embedder.embed_with_cancel

    def slow_embed(texts: list[str], cancel_token: object = None) -> list[list[float]]:
        time.sleep(0.02)  # each write stays under way for a while
        return embed(texts, cancel_token)

    embedder.embed_with_cancel = slow_embed  # type: ignore[method-assign]
    store = make_store(embedder=embedder)
    in_flight_at_backup = []
    backup = storage_module.backup_with_audit

    def watched(db: object, path: str, target: str) -> None:
        in_flight_at_backup.append(store._file._local._database._in_flight)
        backup(db, path, target)  # type: ignore[arg-type]

    monkeypatch.setattr(storage_module, "backup_with_audit", watched)
    session = store.session("busy")

    async def writer() -> None:
        for n in range(40):
            await session.add_items([{"n": n}])

    task = asyncio.create_task(writer())
    for number in range(3):
        await asyncio.sleep(0.1)
        await asyncio.to_thread(store.backup, tmp_path / f"copy{number}.cdl")
    await task
    assert in_flight_at_backup == [0, 0, 0]  # the audit log is copied with the data it describes
    assert await session.get_items() == [{"n": n} for n in range(40)]
    store.close()
    for number in range(3):
        with CitadelSessionStore(tmp_path / f"copy{number}.cdl", key) as restored:
            items = await restored.session("busy").get_items()
            assert 0 < len(items) < 40 and items == [{"n": n} for n in range(len(items))]


async def test_verify_reports_a_healthy_file(store: CitadelSessionStore) -> None:
    await store.session("s").add_items([{"n": n} for n in range(5)])
    report = store.verify()
    assert report.ok and report.page_errors == [] and report.item_verdicts == {"authentic": 5}
    assert report.pages_checked > 0
