"""The operator methods of the store: sessions, export, erase, rotate_key, backup, verify."""

from __future__ import annotations

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
    store.rotate_key(key, "new passphrase")
    store.close()
    with pytest.raises(WrongPassphraseError):
        CitadelSessionStore(db_path, key)
    reopened = make_store(key="new passphrase")
    for sid in ("a", "b"):
        assert await reopened.session(sid).get_items() == [{"owner": sid}]


async def test_backup_restores_and_refuses_to_overwrite(store: CitadelSessionStore, tmp_path: Path, key: str) -> None:
    await store.session("s").add_items([{"n": 1}])
    (tmp_path / "backups").mkdir()
    written = store.backup(tmp_path / "backups" / "copy.cdl")
    assert str(tmp_path / "backups" / "copy.cdl") in written and len(written) >= 3
    with pytest.raises(BackupExistsError):
        store.backup(tmp_path / "backups" / "copy.cdl")
    await store.session("s").clear_session()
    with CitadelSessionStore(tmp_path / "backups" / "copy.cdl", key) as restored:
        assert await restored.session("s").get_items() == [{"n": 1}]


async def test_verify_reports_a_healthy_file(store: CitadelSessionStore) -> None:
    await store.session("s").add_items([{"n": n} for n in range(5)])
    report = store.verify()
    assert report.ok and report.page_errors == [] and report.item_verdicts == {"authentic": 5}
    assert report.pages_checked > 0
