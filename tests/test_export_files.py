"""Migration out: a file the SDK's SQLiteSession reads as its own, and one JSON Lines file per session."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from agents import SQLiteSession
from test_operator_cli import PASSPHRASE, environment, run, run_here
from test_serving import Service

from citadeldb_openai_agents import (
    CitadelSessionStore,
    ExportExistsError,
    SessionNotFoundError,
    export_all,
    export_sqlite,
)

from sdk_sources import as_text, session_items

# Ids a file name cannot simply be: a slash, a dot-dot, a long one, case twins, unicode, a newline.
AWKWARD_IDS = ["a/b", "..", "x" * 3000, "Bob", "bob", "ünï ✓ 会话", "line\nbreak", ".hidden"]


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot", sync_mode="off") as store:
        for number, session_id in enumerate(AWKWARD_IDS):
            asyncio.run(store.session(session_id).add_items(session_items(number, 12 + number)))
    return path


async def read_with_the_sdk(path: Path, session_id: str) -> list[Any]:
    session = SQLiteSession(session_id, path)
    try:
        return list(await session.get_items())
    finally:
        session.close()


def schema(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
        )
        return [(name, " ".join(sql.split())) for name, sql in rows]


async def test_export_sqlite_writes_a_file_the_sdk_reads_as_its_own(database: Path, tmp_path: Path) -> None:
    destination = tmp_path / "out" / "sessions.db"
    destination.parent.mkdir()
    done = run("export", "--format", "sqlite", "--all", "--out", str(destination), env=environment(database))
    assert done.returncode == 0, done.stderr
    assert f"exported {len(AWKWARD_IDS)} sessions" in done.stdout
    assert stat.S_IMODE(destination.stat().st_mode) == 0o600
    assert sorted(p.name for p in destination.parent.iterdir()) == ["sessions.db"], "nothing left aside"
    for number, session_id in enumerate(AWKWARD_IDS):
        assert as_text(await read_with_the_sdk(destination, session_id)) == as_text(
            session_items(number, 12 + number)
        )
    reference = tmp_path / "sdk.db"
    SQLiteSession("any", reference).close()
    assert schema(destination) == schema(reference), "the SDK's own schema"


async def test_export_sqlite_never_overwrites_and_can_name_sessions(database: Path, tmp_path: Path) -> None:
    destination = tmp_path / "sessions.db"
    destination.write_bytes(b"mine")
    refused = run(
        "export", "--format", "sqlite", "--all", "--out", str(destination), env=environment(database)
    )
    assert refused.returncode == 1 and "refusing to overwrite" in refused.stderr
    assert destination.read_bytes() == b"mine"
    named = tmp_path / "named.db"
    done = run("export", "--format", "sqlite", "--out", str(named), "Bob", "a/b", env=environment(database))
    assert done.returncode == 0, done.stderr
    assert await read_with_the_sdk(named, "Bob") == session_items(3, 15)
    assert await read_with_the_sdk(named, "bob") == []
    unknown = run(
        "export",
        "--format",
        "sqlite",
        "--out",
        str(tmp_path / "none.db"),
        "nobody",
        env=environment(database),
    )
    assert unknown.returncode == 1 and "no session 'nobody'" in unknown.stderr
    assert not (tmp_path / "none.db").exists()


def usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, database: Path, *args: str
) -> str:
    """Run `export ARGS` in this process, in an empty working directory; its usage error's message."""
    work = database.parent / "work"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit) as exited:
        run_here(capsys, monkeypatch, database, "export", *args)
    assert exited.value.code == 2
    assert list(work.iterdir()) == [], "a usage error writes nothing"
    return capsys.readouterr().err


def test_the_old_sqlite_form_writes_nothing_and_names_the_new_one(
    database: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An access request for one person once wrote every session to a file named after them.
    for old in (
        ["Bob", "--format", "sqlite"],
        ["--format", "sqlite", "out.db"],
        ["--format", "sqlite", "out.db", "Bob"],
    ):
        message = usage_error(capsys, monkeypatch, database, *old)
        assert (
            "export --format sqlite --out DEST.db SESSION_ID..." in message
            and "Nothing was written" in message
        )


def test_every_session_is_exported_only_with_the_word_all(
    database: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "export --all --out DIR" in usage_error(capsys, monkeypatch, database, "--all", "dump")
    assert "or --all for every session" in usage_error(
        capsys, monkeypatch, database, "--format", "sqlite", "--out", "x.db"
    )
    assert "or --all for every session" in usage_error(capsys, monkeypatch, database, "--out", "dump")
    assert "--out DIR" in usage_error(capsys, monkeypatch, database, "Bob", "bob")
    assert "--out DIR" in usage_error(capsys, monkeypatch, database, "--all")


async def test_export_sqlite_out_one_session_writes_exactly_that_session(
    database: Path, tmp_path: Path
) -> None:
    destination = tmp_path / "one.db"
    done = run("export", "--format", "sqlite", "--out", str(destination), "Bob", env=environment(database))
    assert done.returncode == 0, done.stderr
    assert "exported 1 session, 15 items" in done.stdout
    with sqlite3.connect(destination) as connection:
        held = connection.execute("SELECT DISTINCT session_id FROM agent_messages").fetchall()
        listed = connection.execute("SELECT session_id FROM agent_sessions").fetchall()
    assert held == listed == [("Bob",)]
    assert await read_with_the_sdk(destination, "Bob") == session_items(3, 15)


def test_several_sessions_go_one_file_each_into_the_directory_out_names(
    database: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "two"
    code, out, _ = run_here(
        capsys, monkeypatch, database, "export", "Bob", "a/b", "--out", str(directory), "--json"
    )
    report = json.loads(out)
    assert code == 0 and report["sessions"] == {"Bob": 15, "a/b": 12} and report["items"] == 27
    index = json.loads((directory / "index.json").read_text())
    assert sorted(entry["session_id"] for entry in index) == ["Bob", "a/b"]


def test_export_all_writes_one_file_per_session_with_safe_names_and_an_index(
    database: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "dump"
    done = run("export", "--all", "--out", str(directory), env=environment(database))
    assert done.returncode == 0, done.stderr
    index = json.loads((directory / "index.json").read_text())
    assert sorted(entry["session_id"] for entry in index) == sorted(AWKWARD_IDS)
    names = {entry["file"] for entry in index}
    assert len(names) == len(AWKWARD_IDS) and all(len(name) < 100 and "/" not in name for name in names)
    assert sorted(p.name for p in directory.iterdir()) == sorted([*names, "index.json"])
    for entry in index:
        file = directory / entry["file"]
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        number = AWKWARD_IDS.index(entry["session_id"])
        lines = file.read_text(encoding="utf-8").splitlines()
        assert lines == as_text(session_items(number, 12 + number)) and entry["items"] == len(lines)


def test_export_all_refuses_before_writing_anything_if_a_target_exists(
    database: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "dump"
    assert run("export", "Bob", "a/b", "--out", str(directory), env=environment(database)).returncode == 0
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    again = run("export", "--all", "--out", str(directory), env=environment(database))
    assert (
        again.returncode == 1
        and "refusing to overwrite" in again.stderr
        and "nothing was written" in again.stderr
    )
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_exports_work_from_a_client_process(database: Path, tmp_path: Path) -> None:
    owner = Service(database, key=PASSPHRASE)
    try:
        with CitadelSessionStore(database, PASSPHRASE) as client:
            assert client.served_by == owner.pid
            written = export_all(client, tmp_path / "dump", ["a/b", ".."])
            assert written.sessions == {"a/b": 12, "..": 13}
            summary = export_sqlite(client, tmp_path / "out.db")
            assert summary.items == sum(12 + n for n in range(len(AWKWARD_IDS)))
            with pytest.raises(ExportExistsError):
                export_sqlite(client, tmp_path / "out.db")
            with pytest.raises(SessionNotFoundError):
                export_all(client, tmp_path / "other", ["nobody"])
        assert asyncio.run(read_with_the_sdk(tmp_path / "out.db", "..")) == session_items(1, 13)
    finally:
        owner.stop()
