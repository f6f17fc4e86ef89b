"""Secrets: the passphrase never shows, whatever happens.

Not in an exception (its message, repr, or any error it was raised from), not in a
repr, not in a log record at DEBUG from any logger, not in anything written to the
process's stdout or stderr (the engine's included), and not in any CLI output:
on the success path and on every failure path a user can reach.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import citadeldb
import pytest

from citadeldb_openai_agents import (
    CitadelSession,
    CitadelSessionError,
    CitadelSessionStore,
    DatabaseLockedError,
    EmptyPassphraseError,
    WrongPassphraseError,
    cli,
    from_config,
)

# The short fragments are not hex: a socket's name is 32 hex characters of a hash of the path,
# and a 4-character hex fragment turned up in one by chance (about 1% of runs, CI 2026-12-01).
PASSPHRASE = "horse-7c1f9e2a-battery-d84q"
WRONG = "horse-7c1f9e2a-battery-d84r"  # a typo of the real one: as secret
NEW = "quartz-51aa03be-lantern-9f0e"
SECRETS = [PASSPHRASE, WRONG, NEW, "7c1f9e2a", "d84q", "d84r", "51aa03be", "lantern-9f0e"]


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def secrets_in_frames(error: BaseException, holds: Callable[[object], bool] | None = None) -> list[str]:
    """Secrets held by the locals of any frame an error (or one in its chain) carries (`holds`
    says what is one; by default this module's secrets and the keys derived from them).

    Error trackers (Sentry and the like) record these locals; a frame of the test itself
    (the first: it calls with the secret in hand) is not the library's.
    """
    holds = holds or _holds_secret
    found, seen = [], set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        pending += [current.__cause__, current.__context__]
        tb = current.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_filename != __file__:
                for name, value in frame.f_locals.items():
                    values = value if isinstance(value, (list, tuple)) else [value]
                    found += [f"{frame.f_code.co_name}:{name}" for v in values if holds(v)]
            tb = tb.tb_next
    return found


# Key material derived from the secrets (the socket keys), which no frame may hold either.
DERIVED: list[bytes] = []


def _holds_secret(value: object) -> bool:
    if isinstance(value, str):
        return bool(leaked(value))
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        return any(secret.encode() in raw for secret in SECRETS) or any(key in raw for key in DERIVED)
    return False


def described(error: BaseException) -> str:
    """Everything an error shows: message, repr, args, and the whole chain with tracebacks."""
    return "\n".join([str(error), repr(error), repr(error.args), *traceback.format_exception(error)])


@pytest.fixture
def every_log_record() -> Iterator[list[logging.LogRecord]]:
    """Every record at DEBUG from every logger, those that do not propagate included."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.DEBUG)
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    saved = [(logger, logger.level, logger.disabled) for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.disabled = False
        logger.addHandler(handler)
    yield records
    for logger, level, disabled in saved:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled


def assert_nothing_leaked(records: list[logging.LogRecord], capfd: pytest.CaptureFixture[str]) -> None:
    out, err = capfd.readouterr()
    for record in records:
        text = f"{record.getMessage()} {record.args!r} {record.exc_text or ''}"
        assert not leaked(text), f"log record {record.name}: {text}"
    assert not leaked(out) and not leaked(err)


def held_by_another_process(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sys
            from citadeldb_openai_agents import CitadelSessionStore
            store = CitadelSessionStore(sys.argv[1], sys.argv[2], serve=False)
            print("holding", flush=True)
            sys.stdin.readline()
        """),
            str(path),
            PASSPHRASE,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    return holder


@pytest.fixture
async def original(tmp_path: Path) -> Path:
    path = tmp_path / "original" / "agent.cdl"
    path.parent.mkdir()
    with CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot") as store:
        await store.session("user-1").add_items([{"role": "user", "content": "hello"}])
    return path


def copy_of(path: Path, directory: Path) -> Path:
    directory.mkdir(parents=True)
    for file in path.parent.iterdir():
        shutil.copy(file, directory / file.name)
    return directory / path.name


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:64] = bytes(b ^ 0xFF for b in data[:64])
    path.write_bytes(bytes(data))


# -- the library --------------------------------------------------------------------------


async def test_success_path_shows_the_passphrase_nowhere(
    original: Path, tmp_path: Path, every_log_record, capfd
) -> None:
    store = CitadelSessionStore(original, PASSPHRASE)
    session = store.session("user-1")
    own = CitadelSession("user-2", original, PASSPHRASE)
    await session.add_items([{"role": "assistant", "content": "hi"}])
    await own.add_items([{"role": "user", "content": "other"}])
    shown = [
        store,
        session,
        own,
        store._file._local._database,
        store._file._local._layout,
        await session.get_items(),
        await session.search("hello"),
        await session.pop_item(),
        store.session_ids(),
        store.sessions(),
        store.export("user-1"),
        store.verify(),
        store.backup(tmp_path / "backup.cdl"),
        store.erase_session("user-2"),
        vars(store),
        vars(store._file),
        vars(session),
        vars(own),
    ]
    store.rotate_key(PASSPHRASE, NEW)
    shown += [store, vars(store), store._file._local._database]
    CitadelSessionStore(tmp_path / "new.cdl", PASSPHRASE, argon2_profile="iot").close()
    assert any(record.name == "citadeldb_openai_agents" for record in every_log_record)  # "created ..."
    own.close()
    store.close()
    shown += [store, own, repr(store), str(store)]
    for thing in shown:
        assert not leaked(repr(thing)), repr(thing)
    assert not leaked(" ".join(thread.name for thread in threading.enumerate()))
    assert_nothing_leaked(every_log_record, capfd)
    for file in tmp_path.rglob("*"):
        if file.is_file():
            assert not leaked(file.read_bytes().decode("latin-1")), file


def failures(path: Path, tmp_path: Path) -> Iterator[tuple[str, type[BaseException], object]]:
    """Every failure a user can reach with a passphrase in hand: (name, expected error, call)."""
    yield "wrong passphrase", WrongPassphraseError, lambda: CitadelSessionStore(path, WRONG)
    yield "wrong passphrase, session", WrongPassphraseError, lambda: CitadelSession("s", path, WRONG)

    damaged = copy_of(path, tmp_path / "damaged")
    damage(damaged)
    yield "damaged file", CitadelSessionError, lambda: CitadelSessionStore(damaged, PASSPHRASE)

    keyless = copy_of(path, tmp_path / "keyless")
    Path(f"{keyless}.citadel-keys").unlink()
    yield "missing key file", CitadelSessionError, lambda: CitadelSessionStore(keyless, PASSPHRASE)
    yield (
        "missing key file, wrong passphrase",
        CitadelSessionError,
        lambda: CitadelSessionStore(keyless, WRONG),
    )

    # The hint on how a key file was read looks at the passphrase's first and last characters.
    key_file = tmp_path / "wrong.key"
    key_file.write_text(f" {WRONG}\n\n")
    key_file.chmod(0o600)
    yield (
        "wrong passphrase from a key file",
        WrongPassphraseError,
        lambda: from_config(path=path, key_file=key_file),
    )

    yield "empty passphrase", EmptyPassphraseError, lambda: CitadelSessionStore(path, "")
    yield "bytes passphrase", TypeError, lambda: CitadelSessionStore(path, PASSPHRASE.encode())
    yield (
        "other embedder",
        CitadelSessionError,
        lambda: CitadelSessionStore(path, PASSPHRASE, embedder=citadeldb.MockEmbedder(dim=64)),
    )

    store = CitadelSessionStore(path, PASSPHRASE)
    yield "same file, other passphrase", WrongPassphraseError, lambda: CitadelSessionStore(path, WRONG)
    yield "rotate with a wrong current key", WrongPassphraseError, lambda: store.rotate_key(WRONG, NEW)
    yield "rotate to an empty key", EmptyPassphraseError, lambda: store.rotate_key(PASSPHRASE, "")
    store.close()
    yield "closed store", CitadelSessionError, lambda: asyncio.run(store.session("s").get_items())


async def test_no_failure_shows_the_passphrase(
    original: Path, tmp_path: Path, clean_environment: None, every_log_record, capfd
) -> None:
    seen = []
    for name, expected, call in failures(original, tmp_path):
        with pytest.raises(expected) as caught:
            await asyncio.to_thread(call)  # type: ignore[arg-type]
        assert not leaked(described(caught.value)), f"{name}: {described(caught.value)}"
        assert not secrets_in_frames(caught.value), f"{name}: {secrets_in_frames(caught.value)}"
        seen.append(name)
    assert len(seen) == 13
    assert_nothing_leaked(every_log_record, capfd)


# -- the CLI --------------------------------------------------------------------------------

COMMANDS = {
    "check": ["check"],
    "check --json": ["check", "--json"],
    "sessions": ["sessions", "--json"],
    "verify": ["verify"],
    "export": ["export", "user-1"],
    "backup": ["backup", "{dir}/backup.cdl"],
    "purge": ["purge"],
    "erase": ["erase", "--yes", "user-1"],
    "rotate-key": ["rotate-key"],
}
STATES = ("healthy", "wrong passphrase", "damaged", "missing key file")
# What each command must exit with, per state of the file: 0 done, 1 failure (2, a usage
# error, is never right here: a command broken down to one must fail this test).
EXIT_CODES: dict[str, tuple[int, int, int, int]] = {
    #               healthy  wrong passphrase  damaged  missing key file
    "check": (0, 1, 1, 1),
    "check --json": (0, 1, 1, 1),
    "sessions": (0, 1, 1, 1),
    "verify": (0, 1, 1, 1),
    "export": (0, 1, 1, 1),
    "backup": (0, 1, 1, 1),
    "purge": (0, 1, 1, 1),
    "erase": (0, 1, 1, 1),
    "rotate-key": (0, 1, 1, 1),
}


def run_cli(argv: list[str], directory: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """`python -m citadeldb_openai_agents ...` in this process: env and cwd as an operator sets them."""
    with monkeypatch.context() as patch:
        for name in list(os.environ):
            if name.upper().startswith("CITADEL_"):
                patch.delenv(name)
        patch.chdir(directory)
        patch.setenv("CITADEL_PATH", str(directory / "agent.cdl"))
        patch.setenv("CITADEL_KEY", key)
        patch.setenv("CITADEL_NEW_KEY", NEW)
        try:
            return cli.main([part.format(dir=directory) for part in argv])
        except SystemExit as exit_:  # argparse exits 2 on a usage error: returned for the caller to judge
            return int(exit_.code or 0)


def cli_states(original: Path, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """(state, passphrase given, a fresh copy of the file in that state) for each command."""
    for command in COMMANDS:  # in the order of STATES
        yield "healthy", PASSPHRASE, copy_of(original, tmp_path / f"healthy-{command}").parent
        yield "wrong passphrase", WRONG, copy_of(original, tmp_path / f"wrong-{command}").parent
        damaged = copy_of(original, tmp_path / f"damaged-{command}")
        damage(damaged)
        yield "damaged", PASSPHRASE, damaged.parent
        keyless = copy_of(original, tmp_path / f"keyless-{command}")
        Path(f"{keyless}.citadel-keys").unlink()
        yield "missing key file", PASSPHRASE, keyless.parent


def test_no_cli_output_shows_the_passphrase(
    original: Path, tmp_path: Path, monkeypatch, every_log_record, capfd
) -> None:
    outcomes: dict[str, list[int]] = {command: [] for command in COMMANDS}
    states = cli_states(original, tmp_path)
    for command, argv in COMMANDS.items():
        for expected_state in STATES:
            state, key, directory = next(states)
            assert state == expected_state
            code = run_cli(argv, directory, key, monkeypatch)
            out, err = capfd.readouterr()
            assert not leaked(out + err), f"{command} on a {state} file:\n{out}\n{err}"
            assert "Traceback" not in err, f"{command} on a {state} file:\n{err}"
            outcomes[command].append(code)
    assert {command: tuple(codes) for command, codes in outcomes.items()} == EXIT_CODES
    assert_nothing_leaked(every_log_record, capfd)


def test_a_locked_file_shows_no_passphrase_in_errors_or_cli_output(
    original: Path, monkeypatch, every_log_record, capfd
) -> None:
    holder = held_by_another_process(original)
    try:
        for key in (PASSPHRASE, WRONG):
            with pytest.raises(DatabaseLockedError) as caught:
                CitadelSessionStore(original, key)
            assert not leaked(described(caught.value))
            assert not secrets_in_frames(caught.value), secrets_in_frames(caught.value)
            for command, argv in COMMANDS.items():
                code = run_cli(argv, original.parent, key, monkeypatch)
                out, err = capfd.readouterr()
                assert not leaked(out + err), f"{command}, locked:\n{out}\n{err}"
                assert "Traceback" not in err and code == 1, (command, code, err)
    finally:
        holder.communicate("\n", timeout=60)
    assert_nothing_leaked(every_log_record, capfd)


# Holds the file with the real passphrase and serves it, until its stdin closes.
OWNER = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot")
    print("ready", flush=True)
    sys.stdin.read()
    store.close()
    """
)


def test_a_client_refused_by_the_owner_keeps_no_secret_or_socket_key_in_its_frames(
    original: Path, clean_environment: None, every_log_record, capfd
) -> None:
    from citadeldb_openai_agents.serving.address import Secret, SocketKey

    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(original), PASSPHRASE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        for candidate in (WRONG, PASSPHRASE):
            key = SocketKey(Secret(candidate.encode()), str(original.resolve()))
            key.mac(b"x")
            DERIVED.append(bytes(key._key.value))
            key.forget()
        with pytest.raises(WrongPassphraseError, match="does not accept it") as caught:
            CitadelSessionStore(original, WRONG)
        assert not leaked(described(caught.value))
        assert not secrets_in_frames(caught.value), secrets_in_frames(caught.value)
    finally:
        DERIVED.clear()
        assert owner.stdin is not None
        owner.stdin.close()
        owner.wait(timeout=60)
    assert_nothing_leaked(every_log_record, capfd)


def test_no_refusal_on_a_clients_way_keeps_a_secret_or_socket_key_in_its_frames(
    original: Path, clean_environment: None, monkeypatch: pytest.MonkeyPatch, every_log_record, capfd
) -> None:
    """Settings that differ, an owner that stops answering a call or a handshake, a relay posing as
    the owner: each error a client raises, and every frame it carries, holds no secret."""
    from test_socket_security import Attacker, stop_every_thread

    from citadeldb_openai_agents import ConfigurationError, StorageError
    from citadeldb_openai_agents.serving import client as client_module
    from citadeldb_openai_agents.serving.address import Secret, SocketKey, socket_path

    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(original), PASSPHRASE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    errors: dict[str, BaseException] = {}
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        key = SocketKey(Secret(PASSPHRASE.encode()), str(original.resolve()))
        key.mac(b"x")
        DERIVED.append(bytes(key._key.value))
        key.forget()
        with pytest.raises(ConfigurationError) as caught:
            CitadelSessionStore(original, PASSPHRASE, ttl=3600)
        errors["settings differ"] = caught.value
        with CitadelSessionStore(original, PASSPHRASE) as client:
            session = client.session("s")
            asyncio.run(session.add_items([{"role": "user", "content": "hello"}]))
            monkeypatch.setattr(client_module, "SILENCE_SECONDS", 1.0)
            monkeypatch.setattr(client_module, "CONNECT_SECONDS", 1.0)
            stop_every_thread(owner.pid)
            try:
                with pytest.raises(StorageError, match="has not answered") as caught:
                    asyncio.run(session.get_items())
                errors["a call unanswered"] = caught.value
                with pytest.raises(StorageError, match="did not complete the handshake") as caught:
                    CitadelSessionStore(original, PASSPHRASE)
                errors["a handshake unanswered"] = caught.value
            finally:
                os.kill(owner.pid, signal.SIGCONT)
        relay = Attacker("relay", socket_path(str(original.resolve())), str(original.parent / "relay.bin"))
        try:
            with pytest.raises(CitadelSessionError, match="posing") as caught:
                CitadelSessionStore(original, PASSPHRASE)
            errors["a relay"] = caught.value
        finally:
            relay.stop()
        for case, error in errors.items():  # while DERIVED holds the socket's key
            assert not leaked(described(error)), case
            assert not secrets_in_frames(error), (case, secrets_in_frames(error))
    finally:
        DERIVED.clear()
        assert owner.stdin is not None
        owner.stdin.close()
        owner.wait(timeout=60)
    assert len(errors) == 4
    assert_nothing_leaked(every_log_record, capfd)
