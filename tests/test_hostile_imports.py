"""A hostile or unusual source file: imported whole, or refused by name with nothing written (issue 59).

The retest's files: a BLOB session id imported as "1 session, 0 items" with exit 0 (a silent
loss); bad UTF-8 and JSON nested 100,000 deep ended in raw tracebacks; a recursive view made an
import run on after its parent was killed; a 200 MB item took 2.7 GB. Each is refused here,
naming the row and the limit, and the store holds nothing of the file afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agents import SQLiteSession

from citadeldb_openai_agents import CitadelSessionStore, ImportSourceError, import_file
from citadeldb_openai_agents.migration import sdk_source

from conftest import KEY

GOOD = [{"role": "user", "content": "a good turn"}, {"role": "assistant", "content": "its answer"}]


def sdk_file(path: Path) -> Path:
    """An SDK SQLiteSession file with one good session, to which each test adds a bad row."""
    session = SQLiteSession("good", path)
    import asyncio

    asyncio.run(session.add_items(GOOD))
    session.close()
    return path


def add_row(path: Path, session_id: object, data: object) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("INSERT INTO agent_sessions (session_id) VALUES (?)", (str(session_id),))
        connection.execute(
            "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)", (session_id, data)
        )


def refused(tmp_path: Path, source: Path, *needles: str) -> None:
    with CitadelSessionStore(tmp_path / "agent.cdl", KEY, argon2_profile="iot") as store:
        with pytest.raises(ImportSourceError) as caught:
            import_file(store, source)
        message = str(caught.value)
        for needle in needles:
            assert needle in message, message
        assert "nothing was imported" in message
        assert store.session_ids() == [], "whole or nothing: the good session must not be imported either"


def test_a_session_id_that_is_not_text_is_refused_not_lost(tmp_path: Path) -> None:
    source = sdk_file(tmp_path / "blob.db")
    add_row(source, b"\x00\x01 a blob id", json.dumps({"role": "user", "content": "kept?"}))
    refused(tmp_path, source, "1 rows whose session id is not UTF-8 text")


@pytest.mark.parametrize("stored_as", ["text", "blob"])
def test_an_item_that_is_not_utf8_is_refused_by_row(tmp_path: Path, stored_as: str) -> None:
    source = sdk_file(tmp_path / "bytes.db")
    raw = b'{"content": "\xff\xfe"}'
    with sqlite3.connect(source) as connection:
        value = "CAST(? AS TEXT)" if stored_as == "text" else "?"
        connection.execute(
            f"INSERT INTO agent_messages (session_id, message_data) VALUES ('good', {value})", (raw,)
        )
    refused(tmp_path, source, "row 3 of session 'good' is not UTF-8 text")


def test_an_item_nested_100000_deep_is_refused_by_row(tmp_path: Path) -> None:
    source = sdk_file(tmp_path / "deep.db")
    add_row(source, "deep", "[" * 100_000 + "]" * 100_000)
    refused(tmp_path, source, "row 3 of session 'deep' nests deeper than its JSON can be read")


def test_an_item_over_the_size_limit_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk_source, "ITEM_BYTES", 1024 * 1024)  # 16 MiB in use; 1 MiB keeps the test small
    source = sdk_file(tmp_path / "big.db")
    add_row(source, "big", json.dumps({"content": "x" * (1024 * 1024 + 1)}))
    refused(tmp_path, source, "row 3 of session 'big' is larger than 1 MiB", "(ITEM_BYTES)")


RECURSIVE_VIEW = """
    CREATE VIEW endless (id, session_id, message_data) AS
    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
    SELECT i, 'loop', '{}' FROM n
"""


def test_a_view_that_never_ends_is_stopped_naming_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk_source, "QUERY_SECONDS", 0.5)
    source = sdk_file(tmp_path / "view.db")
    with sqlite3.connect(source) as connection:
        connection.execute(RECURSIVE_VIEW)
    with CitadelSessionStore(tmp_path / "agent.cdl", KEY, argon2_profile="iot") as store:
        with pytest.raises(ImportSourceError, match=r"one query ran past 0\.5 s \(QUERY_SECONDS\)"):
            import_file(store, source, messages_table="endless")
        assert store.session_ids() == []


# An importer whose parent exits while it reads a view that never ends: it must stop then.
ORPHANED = textwrap.dedent(
    """
    import os, subprocess, sys
    child = subprocess.Popen([sys.executable, "-m", "citadeldb_openai_agents", "import", sys.argv[1],
                              "--messages-table", "endless"], stderr=open(sys.argv[2], "w"))
    print(child.pid, flush=True)
    sys.stdin.readline()  # the test says when; then this parent exits, leaving the import behind
    os._exit(0)
    """
)


def test_an_import_whose_parent_exits_stops(tmp_path: Path) -> None:
    source = sdk_file(tmp_path / "view.db")
    with sqlite3.connect(source) as connection:
        connection.execute(RECURSIVE_VIEW)
    CitadelSessionStore(tmp_path / "agent.cdl", KEY, argon2_profile="iot").close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    env.update(CITADEL_PATH=str(tmp_path / "agent.cdl"), CITADEL_KEY=KEY)
    errors = tmp_path / "import.err"
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHANED, str(source), str(errors)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert parent.stdout is not None and parent.stdin is not None
    importer = int(parent.stdout.readline())
    try:
        # Until the import reads the view: its query runs, which only the parent's exit ends now.
        deadline = time.monotonic() + 60  # it starts in about 3 s under load (the SDK's import)
        while "view" not in _open_files_hint(importer) and time.monotonic() < deadline:
            time.sleep(0.05)
        parent.stdin.write("exit\n")
        parent.stdin.flush()
        parent.wait(timeout=30)
        gone = time.monotonic() + 60  # the handler looks every 10,000 steps: milliseconds
        while _alive(importer) and time.monotonic() < gone:
            time.sleep(0.05)
        assert not _alive(importer), "the import went on after its parent exited"
        assert "the process that started this import has exited" in errors.read_text()
    finally:
        if _alive(importer):
            os.kill(importer, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _open_files_hint(pid: int) -> str:
    """The names of the files `pid` holds open (the source shows once the import reads it)."""
    try:
        return " ".join(os.readlink(entry) for entry in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return ""


def test_json_lines_that_are_not_utf8_or_too_deep_are_refused_by_line(tmp_path: Path) -> None:
    for name, line in (("bytes", b'{"content": "\xff"}'), ("deep", b"[" * 100_000 + b"]" * 100_000)):
        source = tmp_path / f"{name}.jsonl"
        source.write_bytes(b'{"role": "user", "content": "fine"}\n' + line + b"\n")
        with CitadelSessionStore(tmp_path / "agent.cdl", KEY, argon2_profile="iot") as store:
            with pytest.raises(ImportSourceError, match=f"{name}.jsonl, line 2, (is not UTF-8|nests deeper)"):
                import_file(store, source, session_id="s")
            assert store.session_ids() == []
