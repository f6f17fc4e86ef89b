"""Migration in: the SDK's own session files and our exports, imported verbatim, refused, resumed."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
from pathlib import Path

import pytest
from agents import SQLiteSession
from test_operator_cli import PASSPHRASE, command, environment, run
from test_serving import Service

from citadeldb_openai_agents import (
    CitadelSessionStore,
    ImportSourceError,
    SessionNotEmptyError,
    copy_session,
    import_file,
)

from sdk_sources import as_text, read_sqlite_source, session_id, session_items, write_sqlite_source

SESSIONS, ITEMS = 50, 200


@pytest.fixture(scope="module")
def sdk_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """50 sessions x 200 items (questions, reasoning, function calls and outputs, replies), by the SDK."""
    path = tmp_path_factory.mktemp("source") / "agent_sessions.db"
    write_sqlite_source(path, SESSIONS, ITEMS)
    return path


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """An empty database, as the import commands expect one (they never create a file)."""
    path = tmp_path / "agent.cdl"
    CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot", sync_mode="off").close()
    return path


def assert_same_sessions(database: Path, source: Path, sessions: range, *, advanced: bool = False) -> None:
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.session_ids() == sorted(session_id(n) for n in sessions)
        for number in sessions:
            expected = read_sqlite_source(source, number, advanced=advanced)
            assert as_text(store.export(session_id(number))) == as_text(expected), session_id(number)


def test_an_sdk_file_is_imported_item_by_item_key_order_included(sdk_file: Path, database: Path) -> None:
    before = sdk_file.read_bytes()
    done = run("import", str(sdk_file), env=environment(database))
    assert done.returncode == 0, done.stderr
    assert (
        f"imported {SESSIONS} sessions, {SESSIONS * ITEMS} items from {sdk_file} (SQLiteSession file)"
        in done.stdout
    )
    assert "the plaintext source still exists" in done.stdout and f"shred -u {sdk_file}" in done.stdout
    assert sdk_file.read_bytes() == before, "an import never changes its source"
    assert not Path(f"{sdk_file}-wal").exists() and not Path(f"{sdk_file}-shm").exists()
    assert_same_sessions(database, sdk_file, range(SESSIONS))
    again = run("import", str(sdk_file), "--json", env=environment(database))
    report = json.loads(again.stdout)
    assert report["items_written"] == 0, "a rerun of a complete import writes nothing"
    assert {s["already_held"] for s in report["sessions"]} == {ITEMS}
    assert_same_sessions(database, sdk_file, range(SESSIONS))


def test_a_session_holding_other_items_is_refused_unless_append_or_replace(
    sdk_file: Path, database: Path
) -> None:
    mine = [{"role": "user", "content": "held before the import"}]
    with CitadelSessionStore(database, PASSPHRASE) as store:
        asyncio.run(store.session(session_id(7)).add_items(mine))
    refused = run("import", str(sdk_file), env=environment(database))
    assert refused.returncode == 1
    assert "1 session in" in refused.stderr and repr(session_id(7)) in refused.stderr
    assert "nothing was written" in refused.stderr and "--append" in refused.stderr
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.session_ids() == [session_id(7)], "nothing was written, in any session"
    appended = run(
        "import", str(sdk_file), "--session-id", session_id(7), "--append", env=environment(database)
    )
    assert appended.returncode == 0, appended.stderr
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.export(session_id(7)) == mine + read_sqlite_source(sdk_file, 7)
    replaced = run(
        "import", str(sdk_file), "--session-id", session_id(7), "--replace", env=environment(database)
    )
    assert replaced.returncode == 0, replaced.stderr
    assert "1 session replaced" in replaced.stdout
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert as_text(store.export(session_id(7))) == as_text(read_sqlite_source(sdk_file, 7))


def importer_killed_part_way(database: Path, source: Path, at_least: int) -> None:
    """Run the import command with its progress bar on a terminal; SIGKILL it once the bar shows
    `at_least` items written (each is reported once its chunk is committed)."""
    terminal, command_end = pty.openpty()
    fcntl.ioctl(command_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # tqdm needs a size
    importer = subprocess.Popen(
        command("import", str(source)),
        env=environment(database),
        stdout=subprocess.DEVNULL,
        stderr=command_end,
        stdin=subprocess.DEVNULL,
    )
    os.close(command_end)
    shown = b""
    try:
        while not any(int(done) >= at_least for done in re.findall(rb"(\d+)/\d+ \[", shown)):
            # 2.8 s at most between outputs under load (benchmarks/suite_under_load.py, 2026-12-08)
            ready, _, _ = select.select([terminal], [], [], 60)
            assert ready, f"no progress for 60 s: {shown[-300:]!r}"
            shown += os.read(terminal, 4096)
        assert importer.poll() is None, "the import ended before it could be interrupted"
    finally:
        importer.send_signal(signal.SIGKILL)
        # killed: 0.034 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
        importer.wait(timeout=30)
        os.close(terminal)
    assert importer.returncode == -signal.SIGKILL
    assert b"importing" in shown, "the bar shows on a terminal"


def test_a_rerun_after_sigkill_neither_duplicates_nor_loses_an_item(sdk_file: Path, database: Path) -> None:
    importer_killed_part_way(database, sdk_file, at_least=SESSIONS * ITEMS // 4)
    with CitadelSessionStore(database, PASSPHRASE) as store:
        written = sum(s.items for s in store.sessions())
    assert 0 < written < SESSIONS * ITEMS
    rerun = run("import", str(sdk_file), "--json", env=environment(database))
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    assert report["items_written"] == SESSIONS * ITEMS - written, "the rerun wrote exactly what was missing"
    assert_same_sessions(database, sdk_file, range(SESSIONS))


def test_an_import_through_a_client_killed_part_way_resumes_on_rerun(sdk_file: Path, database: Path) -> None:
    owner = Service(database, key=PASSPHRASE)
    try:
        importer_killed_part_way(database, sdk_file, at_least=SESSIONS * ITEMS // 3)
        rerun = run("import", str(sdk_file), env=environment(database))
        assert rerun.returncode == 0, rerun.stderr
        with CitadelSessionStore(database, PASSPHRASE) as client:
            assert client.served_by == owner.pid
            for number in range(SESSIONS):
                assert as_text(client.export(session_id(number))) == as_text(session_items(number, ITEMS))
    finally:
        owner.stop()


def test_an_exported_json_lines_file_imports_as_it_was(tmp_path: Path, database: Path) -> None:
    original = session_items(3, 40)
    with CitadelSessionStore(tmp_path / "old.cdl", PASSPHRASE, argon2_profile="iot") as old:
        asyncio.run(old.session("ünï/cødé").add_items(original))
    exported = tmp_path / "session.jsonl"
    done = run("export", "ünï/cødé", "--out", str(exported), env=environment(tmp_path / "old.cdl"))
    assert done.returncode == 0, done.stderr
    missing_id = run("import", str(exported), env=environment(database))
    assert missing_id.returncode == 1 and "--session-id" in missing_id.stderr
    done = run("import", str(exported), "--session-id", "ünï/cødé", env=environment(database))
    assert done.returncode == 0, done.stderr
    assert "imported 1 session, 40 items" in done.stdout and "(JSON Lines file)" in done.stdout
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert as_text(store.export("ünï/cødé")) == as_text(original)


def test_an_advanced_sqlite_session_file_imports_its_messages(tmp_path: Path, database: Path) -> None:
    source = tmp_path / "advanced.db"
    write_sqlite_source(source, 3, 30, advanced=True)
    done = run("import", str(source), env=environment(database))
    assert done.returncode == 0, done.stderr
    assert "(AdvancedSQLiteSession file)" in done.stdout
    assert_same_sessions(database, source, range(3), advanced=True)


def test_what_is_not_a_session_file_is_refused_with_the_reason(tmp_path: Path, database: Path) -> None:
    other = tmp_path / "other.db"
    SQLiteSession("s", other, sessions_table="s", messages_table="m").close()
    with CitadelSessionStore(database, PASSPHRASE) as store:
        with pytest.raises(ImportSourceError, match=r"no table 'agent_messages'.*--messages-table"):
            import_file(store, other)
        assert import_file(store, other, sessions_table="s", messages_table="m").sessions == []
        with pytest.raises(ImportSourceError, match="there is no file"):
            import_file(store, tmp_path / "missing.db")
        broken = tmp_path / "broken.jsonl"
        broken.write_text('{"role": "user"}\nnot json\n')
        with pytest.raises(ImportSourceError, match="line 2, is not JSON"):
            import_file(store, broken, session_id="s")
        assert store.session_ids() == []


# -- the library ------------------------------------------------------------------------------


async def test_import_items_refuses_appends_replaces_and_resumes(store: CitadelSessionStore) -> None:
    items = session_items(1, 600)
    partial = store.import_items("s", items[:256])  # as an interrupted run leaves it: whole chunks
    assert (partial.written, partial.already_held) == (256, 0)
    resumed = store.import_items("s", items)
    assert (resumed.written, resumed.already_held) == (344, 256)
    assert as_text(store.export("s")) == as_text(items)
    with pytest.raises(SessionNotEmptyError, match="nothing was written"):
        store.import_items("s", items[:10])
    assert store.import_items("s", items[:10], mode="append").written == 10
    assert store.export("s") == items + items[:10]
    replaced = store.import_items("s", items[:5], mode="replace")
    assert replaced.replaced and store.export("s") == items[:5]


async def test_copy_session_between_sdk_sessions_resumes_and_refuses(
    tmp_path: Path, store: CitadelSessionStore
) -> None:
    items = session_items(2, 300)
    plain = SQLiteSession("plain", tmp_path / "plain.db")
    await plain.add_items(items)
    ours = store.session("ours")
    assert (await copy_session(plain, ours)).written == 300
    assert as_text(await ours.get_items()) == as_text(items)
    back = SQLiteSession("back", tmp_path / "back.db")
    await back.add_items(items[:256])  # an interrupted copy: its first chunk is there
    copied = await copy_session(ours, back)
    assert (copied.written, copied.already_held) == (44, 256)
    assert as_text(await back.get_items()) == as_text(items)
    other = SQLiteSession("other", tmp_path / "back.db")
    await other.add_items([{"role": "user", "content": "mine"}])
    with pytest.raises(SessionNotEmptyError, match="already holds items"):
        await copy_session(plain, other)
    assert (await copy_session(plain, other, mode="replace")).replaced
    assert await other.get_items() == items
    for session in (plain, back, other):
        session.close()


async def test_import_items_works_from_a_client_process(db_path: Path) -> None:
    owner = Service(db_path)
    try:
        with CitadelSessionStore(db_path, "correct horse battery staple") as client:
            assert client.served_by == owner.pid
            items = session_items(4, 300)
            assert client.import_items("s", items[:256]).written == 256
            assert client.import_items("s", items).written == 44
            assert owner.ask("count s") == "300"
            assert as_text(client.export("s")) == as_text(items)
    finally:
        owner.stop()


def test_import_progress_counts_items(sdk_file: Path, database: Path) -> None:
    seen: list[tuple[int, int]] = []
    with CitadelSessionStore(database, PASSPHRASE) as store:
        import_file(
            store, sdk_file, session_id=session_id(0), progress=lambda done, total: seen.append((done, total))
        )
    assert seen[-1] == (ITEMS, ITEMS) and all(total == ITEMS for _, total in seen)


def test_import_into_a_missing_file_is_refused_unless_create(sdk_file: Path, tmp_path: Path) -> None:
    """A typo in the path must not start a new file; --create starts one on purpose."""
    path = tmp_path / "new.cdl"
    refused = run("import", str(sdk_file), "--session-id", session_id(3), env=environment(path))
    assert refused.returncode == 1 and "pass --create" in refused.stderr
    assert not path.exists()
    done = run("import", str(sdk_file), "--session-id", session_id(3), "--create", env=environment(path))
    assert done.returncode == 0, done.stderr
    assert f"imported 1 session, {ITEMS} items" in done.stdout
    with CitadelSessionStore(path, PASSPHRASE) as store:
        assert store.session_ids() == [session_id(3)]


def test_rows_that_are_not_json_are_counted_once_on_a_rerun(tmp_path: Path) -> None:
    """A rerun reads an occupied session twice (the refusal check, then the import)."""
    import sqlite3

    source = tmp_path / "old.db"
    write_sqlite_source(source, 1, 4)
    with sqlite3.connect(source) as connection:
        connection.execute(
            "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)", (session_id(0), "not json")
        )
    path = tmp_path / "agent.cdl"
    for _ in range(2):
        done = run("import", str(source), "--json", "--create", env=environment(path))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["rows_skipped"] == 1
