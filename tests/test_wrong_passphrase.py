"""A wrong passphrase: the error names where the passphrase came from, and its traceback is the caller's.

Each source (the ``key=`` argument, ``CITADEL_KEY``, a key file named by ``CITADEL_KEY_FILE`` or by
``key_file`` in the TOML file, the secrets directory's ``citadel_key``) is named in the message,
which keeps the cause and the fix and never a character run of the passphrase. The traceback holds
the caller's line and the package's one raise at its public boundary, and no chained internals.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import citadeldb_openai_agents
from citadeldb_openai_agents import (
    CitadelSession,
    CitadelSessionStore,
    WrongPassphraseError,
    from_config,
    verify_file,
)

RIGHT = "Kd8$wN3^bH6*jF1@"
WRONG = "Xq7#vT2!pL9zR4&m"  # no run of 4 of its characters occurs in any message by chance

PACKAGE = Path(citadeldb_openai_agents.__file__).parent


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def runs_of(secret: str, length: int = 4) -> list[str]:
    return [secret[i : i + length] for i in range(len(secret) - length + 1)]


def leaks(text: str) -> list[str]:
    """Any run of 4 characters of the wrong passphrase (or of the right one) that `text` holds."""
    return [run for run in runs_of(WRONG) + runs_of(RIGHT) if run in text]


@pytest.fixture
def database(tmp_path: Path, clean_environment: None) -> Path:
    """A file made with RIGHT, in the working directory (no CITADEL_* variable set)."""
    CitadelSessionStore(tmp_path / "app.cdl", RIGHT, argon2_profile="iot").close()
    return tmp_path / "app.cdl"


def set_up(source: str, database: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[[], Any], str]:
    """The call that opens `database` with WRONG from `source`, and how its message names the source."""
    directory = database.parent
    if source == "key= argument":
        return lambda: CitadelSessionStore(database, key=WRONG), "the key= argument"
    if source == "key= argument, CitadelSession":
        return lambda: CitadelSession("s", database, key=WRONG), "the key= argument"
    if source == "key= argument, verify_file":
        return lambda: verify_file(database, key=WRONG), "the key= argument"
    if source == "key= argument, from_config":
        return lambda: from_config(path=database, key=WRONG), "the key= argument"
    if source == "CITADEL_KEY":
        monkeypatch.setenv("CITADEL_KEY", WRONG)
        return lambda: from_config(path=database), "the environment variable CITADEL_KEY"
    if source == "CITADEL_KEY_FILE":
        key_file = write(directory / "wrong.key", WRONG + "\n")
        monkeypatch.setenv("CITADEL_KEY_FILE", str(key_file))
        named = f"the key file {key_file}, named by the environment variable CITADEL_KEY_FILE"
        return lambda: from_config(path=database), named
    if source == "key_file in the TOML file":
        key_file = write(directory / "wrong.key", WRONG + "\n")
        toml = write(directory / "citadel.toml", f'path = "{database.name}"\nkey_file = "wrong.key"\n')
        return lambda: from_config(
            toml
        ), f"the key file {key_file}, named by key_file in the TOML file {toml}"
    if source == "secrets directory":
        (directory / "secrets").mkdir()
        key_file = write(directory / "secrets" / "citadel_key", WRONG + "\n")
        monkeypatch.setenv("CITADEL_SECRETS_DIR", str(directory / "secrets"))
        return lambda: from_config(path=database), f"the file {key_file} in the secrets directory"
    raise AssertionError(source)


SOURCES = [
    "key= argument",
    "key= argument, CitadelSession",
    "key= argument, verify_file",
    "key= argument, from_config",
    "CITADEL_KEY",
    "CITADEL_KEY_FILE",
    "key_file in the TOML file",
    "secrets directory",
]


@pytest.mark.parametrize("source", SOURCES)
def test_a_wrong_passphrase_names_where_the_passphrase_came_from(
    database: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    call, named = set_up(source, database, monkeypatch)

    with pytest.raises(WrongPassphraseError) as caught:
        call()

    message = str(caught.value)
    keys = f"{database}.citadel-keys"
    # The cause (both of them), where the passphrase came from, and the fix.
    assert message.startswith(f"wrong passphrase for {database}, or its key file {keys} is damaged"), message
    assert f"Check the passphrase (it came from {named}); if it is right, restore {keys}" in message, message
    assert caught.value.source == named
    if source != "CITADEL_KEY":
        assert "CITADEL_KEY " not in message and "CITADEL_KEY)" not in message, message
    assert not leaks(message) and not leaks(repr(caught.value)), message


def test_a_passphrase_other_than_the_open_files_names_where_it_came_from(database: Path) -> None:
    with CitadelSessionStore(database, RIGHT), pytest.raises(WrongPassphraseError) as caught:
        CitadelSessionStore(database, key=WRONG)
    message = str(caught.value)
    assert message.startswith(f"{database} is already open in this process with a different passphrase")
    assert "Check the passphrase (it came from the key= argument): use the same passphrase" in message
    assert not leaks(message)


def frames_of(error: BaseException) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(error.__traceback__))


def package_frames(error: BaseException) -> list[str]:
    """The files of the frames an error's traceback shows besides this test's, relative to the package
    ("store.py"), or their full path when outside it (a frame of Python's own, of citadeldb)."""
    files = [Path(frame.filename) for frame in frames_of(error) if Path(frame.filename) != Path(__file__)]
    return [
        file.relative_to(PACKAGE).as_posix() if file.is_relative_to(PACKAGE) else str(file) for file in files
    ]


def locals_shown(error: BaseException) -> Iterator[str]:
    """What an error tracker would record of each frame's locals (the test's own frame aside)."""
    tb = error.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename) != Path(__file__):
            for name, value in tb.tb_frame.f_locals.items():
                try:
                    yield f"{name}={value!r}"
                except Exception:  # a half-built object's repr: a tracker records its failure
                    yield f"{name}={type(value).__name__}"
        tb = tb.tb_next


@pytest.mark.parametrize(
    ("source", "public"),
    [
        ("key= argument", ["store.py"]),
        ("key= argument, CitadelSession", ["session.py", "store.py"]),  # the store it opens raises
        ("key= argument, verify_file", ["offline.py"]),
        ("CITADEL_KEY", ["config/load.py", "config/load.py"]),  # from_config, and the open it calls
    ],
)
def test_a_wrong_passphrase_shows_the_callers_line_and_one_raise_not_the_internals(
    database: Path, monkeypatch: pytest.MonkeyPatch, source: str, public: list[str]
) -> None:
    call, _ = set_up(source, database, monkeypatch)

    with pytest.raises(WrongPassphraseError) as caught:
        call()

    error = caught.value
    shown = "".join(traceback.format_list(frames_of(error)))
    assert package_frames(error) == public, shown
    # Nothing chained: no citadeldb error, no frame of the layers below to walk into.
    assert error.__cause__ is None and error.__suppress_context__ is True
    assert error.__context__ is None
    assert not [shown for shown in locals_shown(error) if leaks(shown)]


OWNER = """
import sys
from citadeldb_openai_agents import CitadelSessionStore

store = CitadelSessionStore(sys.argv[1], sys.stdin.readline().rstrip("\\n"), argon2_profile="iot")
print("ready", flush=True)
sys.stdin.read()
store.close()
"""


def test_a_wrong_passphrase_refused_by_the_owner_names_where_the_passphrase_came_from(
    database: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process owns the file and serves it: its refusal names this process's source too."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CITADEL_")}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(database)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert owner.stdin is not None and owner.stdout is not None
        owner.stdin.write(RIGHT + "\n")
        owner.stdin.flush()
        assert owner.stdout.readline().strip() == "ready", owner.stderr
        key_file = write(tmp_path / "wrong.key", WRONG + "\n")
        monkeypatch.setenv("CITADEL_KEY_FILE", str(key_file))
        for call, named, public in [
            (lambda: CitadelSessionStore(database, key=WRONG), "the key= argument", ["store.py"]),
            (
                lambda: from_config(path=database),
                f"the key file {key_file}, named by the environment variable CITADEL_KEY_FILE",
                ["config/load.py", "config/load.py"],
            ),
        ]:
            with pytest.raises(WrongPassphraseError) as caught:
                call()
            message = str(caught.value)
            assert message.startswith(f"wrong passphrase for {database}: process {owner.pid}, which holds")
            assert f"Check the passphrase (it came from {named}): every process on one file" in message
            assert "CITADEL_KEY / CITADEL_KEY_FILE" not in message and not leaks(message), message
            assert package_frames(caught.value) == public and caught.value.__context__ is None
    finally:
        owner.communicate("", timeout=60)


def test_a_wrong_passphrase_keeps_its_source_across_processes() -> None:
    """multiprocessing pickles a worker's error back to the parent: the source must survive."""
    error = WrongPassphraseError("wrong passphrase for /x.", "; then fix it.").came_from("the key= argument")
    again = pickle.loads(pickle.dumps(error))
    assert (
        str(again)
        == str(error)
        == ("wrong passphrase for /x. Check the passphrase (it came from the key= argument); then fix it.")
    )
    assert again.source == "the key= argument"


def test_a_restore_names_the_backup_the_passphrase_does_not_open_and_changes_nothing(
    database: Path, tmp_path: Path
) -> None:
    from citadeldb_openai_agents import restore_backup

    backup, target = tmp_path / "backup.cdl", tmp_path / "restored.cdl"
    with CitadelSessionStore(database, RIGHT) as store:
        asyncio.run(store.session("kept").add_items([{"role": "user", "content": "in the backup"}]))
        held = store.session_ids()
        store.backup(backup)
        store.rotate_key(RIGHT, WRONG)  # the backup still opens with the passphrase of then
    with pytest.raises(WrongPassphraseError) as caught:
        restore_backup(backup, target, WRONG, erasure_ledger=None)
    message = str(caught.value)
    assert f"wrong passphrase for the backup {backup}" in message and ".restoring-" not in message
    assert "it came from the key= argument" in message and "a later rotate-key does not change" in message
    assert f"{target} was not changed" in message and not list(tmp_path.glob("restored.cdl*"))
    assert restore_backup(backup, target, RIGHT, erasure_ledger=None).sessions == len(held)
    with CitadelSessionStore(target, RIGHT) as restored:
        assert held == ["kept"] and restored.session_ids() == held
