"""What the library writes to disk only its owner reads, and it never writes through a symlink.

Each test runs with umask 022, the common default, under which Citadel alone would
make every file 0644: any local user could copy it and guess the passphrase offline.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_operator_cli import PASSPHRASE, environment, run

from citadeldb_openai_agents import BackupExistsError, CitadelSessionStore, StorageError
from citadeldb_openai_agents.storage.files import database_files

from conftest import KEY

SURROGATE_ID = "half \udc80 a pair"  # a lone surrogate: a str the store accepts as an id


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def modes(paths: list[str]) -> dict[str, int]:
    return {os.path.basename(path): stat.S_IMODE(os.stat(path).st_mode) for path in paths}


def items(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_a_new_database_its_companions_and_its_backups_are_0600(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        asyncio.run(store.session("s").add_items(items("private")))
        written = store.backup(tmp_path / "backup.cdl")
    files = database_files(str(path))
    assert len(files) == len(written) == 5
    assert set(modes(files).values()) == {0o600}, modes(files)
    assert set(modes(written).values()) == {0o600}, modes(written)


def test_the_serve_false_mark_is_0600_and_never_written_through_a_link(tmp_path: Path) -> None:
    """Issue 59's retest: `.agent.cdl.exclusive` was 0644. A link planted there is refused, not followed."""
    path = tmp_path / "agent.cdl"
    mark = tmp_path / ".agent.cdl.exclusive"
    with CitadelSessionStore(path, KEY, argon2_profile="iot", serve=False):
        assert stat.S_IMODE(mark.stat().st_mode) == 0o600
    elsewhere = tmp_path / "elsewhere"
    mark.symlink_to(elsewhere)
    with pytest.raises(StorageError, match="a link is never written through"):
        CitadelSessionStore(path, KEY, argon2_profile="iot", serve=False)
    assert not elsewhere.exists()
    mark.unlink()
    with CitadelSessionStore(path, KEY, argon2_profile="iot", serve=False):  # the refusal released the file
        pass


def test_move_and_import_targets_and_exports_are_0600(tmp_path: Path) -> None:
    source, target = tmp_path / "source.cdl", tmp_path / "target.cdl"
    with CitadelSessionStore(source, PASSPHRASE, argon2_profile="iot") as store:
        for session_id in ("a", "b"):
            asyncio.run(store.session(session_id).add_items(items(session_id)))
    env = environment(source)
    with (
        CitadelSessionStore(source, PASSPHRASE) as store,
        CitadelSessionStore(target, PASSPHRASE, argon2_profile="iot", create=True) as other,
    ):
        assert store.move_session("a", other).items == 1
    assert set(modes(database_files(str(target))).values()) == {0o600}
    exported = tmp_path / "b.jsonl"
    assert run("export", "b", "--out", str(exported), env=env).returncode == 0
    imported = tmp_path / "imported.cdl"
    done = run("import", str(exported), "--session-id", "b", "--create", env=environment(imported))
    assert done.returncode == 0, done.stderr
    assert set(modes(database_files(str(imported))).values()) == {0o600}
    assert (
        run("export", "--format", "sqlite", "--all", "--out", str(tmp_path / "all.db"), env=env).returncode
        == 0
    )
    assert run("export", "--all", "--out", str(tmp_path / "dump"), env=env).returncode == 0
    written = [str(exported), str(tmp_path / "all.db"), *(str(p) for p in (tmp_path / "dump").iterdir())]
    assert set(modes(written).values()) == {0o600}, modes(written)


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "to-a-file"])
def test_no_output_is_written_through_a_symlink(tmp_path: Path, dangling: bool) -> None:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot") as store:
        asyncio.run(store.session("s").add_items(items("private")))
    aim = tmp_path / "elsewhere"
    if not dangling:
        aim.write_bytes(b"theirs")

    def link(name: str) -> Path:
        placed = tmp_path / name
        placed.symlink_to(aim)
        return placed

    with CitadelSessionStore(path, PASSPHRASE) as store, pytest.raises(BackupExistsError):
        store.backup(link("backup.cdl"))
    env = environment(path)
    for args in (
        ["export", "s", "--out", str(link("s.jsonl"))],
        ["export", "--format", "sqlite", "--all", "--out", str(link("all.db"))],
    ):
        refused = run(*args, env=env)
        assert refused.returncode == 1 and "refusing to overwrite" in refused.stderr, refused
        assert "Traceback" not in refused.stderr
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "index.json").symlink_to(aim)
    refused = run("export", "--all", "--out", str(dump), env=env)
    assert refused.returncode == 1 and "refusing to overwrite" in refused.stderr, refused
    assert [p.name for p in dump.iterdir()] == ["index.json"], "an export wrote beside a refused target"
    # Nothing was written where the links point.
    assert aim.exists() is not dangling and (dangling or aim.read_bytes() == b"theirs")


def test_export_all_handles_every_id_the_store_accepts(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot") as store:
        asyncio.run(store.session(SURROGATE_ID).add_items(items("odd id")))
    done = run("export", "--all", "--out", str(tmp_path / "dump"), env=environment(path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    [entry] = json.loads((tmp_path / "dump" / "index.json").read_text(encoding="utf-8"))
    assert entry["session_id"] == SURROGATE_ID and entry["items"] == 1
    line = (tmp_path / "dump" / entry["file"]).read_text(encoding="utf-8")
    assert json.loads(line) == items("odd id")[0]
    # SQLite's text cannot hold it: refused by name, nothing written, no traceback.
    refused = run(
        "export", "--format", "sqlite", "--all", "--out", str(tmp_path / "all.db"), env=environment(path)
    )
    assert (
        refused.returncode == 1 and "lone surrogate" in refused.stderr and "Traceback" not in refused.stderr
    )
    assert not (tmp_path / "all.db").exists() and not list(tmp_path.glob(".all.db.*"))


def test_a_socket_bound_while_another_thread_creates_a_file_leaves_the_umask_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The umask is the process's: two threads that each set it and put back what they found
    would, interleaved (bind starts, a creation starts, bind ends, the creation ends), leave it
    at the socket's 0177, and every directory made later unusable (0600)."""
    from citadeldb_openai_agents.serving import server
    from citadeldb_openai_agents.storage.files import private_files

    creating, bound = threading.Event(), threading.Event()

    class SlowToBind(socket.socket):
        def bind(self, address: Any) -> None:
            creating.wait(timeout=2)  # the creation starts while the socket's umask is set, if it can
            super().bind(address)

    def create() -> None:
        with private_files():
            creating.set()
            bound.wait(timeout=2)

    monkeypatch.setattr(server.socket, "socket", SlowToBind)
    creator = threading.Thread(target=create)
    binder = threading.Thread(target=lambda: (server._listen(str(tmp_path / "s.sock")).close(), bound.set()))
    binder.start()
    time.sleep(0.2)  # the binder is in bind, with its umask set
    creator.start()
    binder.join(timeout=10)
    creator.join(timeout=10)
    assert os.umask(0o022) == 0o022
