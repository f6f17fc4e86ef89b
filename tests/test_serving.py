"""Many processes, one file: the owner serves it, the others are its clients, and a dying owner hands over.

Each test runs real processes on one machine; sockets are Unix sockets in a directory
of this user's. The owner is either this test's process or a service process
(`Service`) that opens the file and then does what the test tells it on stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import citadeldb
import pytest

from citadeldb_openai_agents import (
    CitadelSession,
    CitadelSessionStore,
    ConfigurationError,
    DatabaseLockedError,
    EmbedderMismatchError,
    InvalidItemError,
    SessionNotFoundError,
    StorageError,
    WrongPassphraseError,
)
from citadeldb_openai_agents.options import StoreOptions
from citadeldb_openai_agents.serving import client as client_module
from citadeldb_openai_agents.serving import handover, shared_file
from citadeldb_openai_agents.serving.address import Secret, socket_path
from citadeldb_openai_agents.serving.channel import Channel
from citadeldb_openai_agents.serving.handover import Opening
from citadeldb_openai_agents.serving.operations import Operation, nothing
from citadeldb_openai_agents.serving.protocol import OwnerHello
from citadeldb_openai_agents.storage.lockholder import find_lock_holder

from conftest import KEY
from socket_peers import authenticated_peer

# A service: owns the file (it opens it first), then runs what the test sends, one line each:
# `add <session> <text>`, `count <session>`, `die-<when> <operation>`, `exit`, where <when> is
# `before` (it dies as the call arrives), `at-note` (right after it notes what it will erase,
# before erasing) or `after-next` (once the call is committed, before it answers).
SERVICE = textwrap.dedent(
    """
    import asyncio, dataclasses, json, logging, os, signal, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    from citadeldb_openai_agents import CitadelSessionStore
    from citadeldb_openai_agents.serving import operations

    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot", serve=sys.argv[3] == "serve")

    def die(when, name):
        # The owner dies at a point of a client's call the client cannot see: it only loses the owner.
        operation = operations.OPERATIONS[name]
        def kill():
            os.kill(os.getpid(), signal.SIGKILL)
        def dying(*args):
            if when == "before":
                kill()
            if when == "at-note":
                note = args[-1]  # a noting operation's last argument
                args = (*args[:-1], lambda value: (note(value), kill()))
            result = operation.run(*args)
            kill()
            return result
        operations.OPERATIONS[name] = dataclasses.replace(operation, run=dying)

    print("ready", os.getpid(), flush=True)
    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "add":
            session_id, _, text = rest.partition(" ")
            asyncio.run(store.session(session_id).add_items([{"role": "user", "content": text}]))
            print("added", flush=True)
        elif command == "count":
            print(len(asyncio.run(store.session(rest).get_items())), flush=True)
        elif command.startswith("die-"):
            die(command[len("die-"):], rest)
            print("armed", flush=True)
        elif command == "exit":
            store.close()
            print("closed", flush=True)
            break
    """
)


class Service:
    """A process that owns the file and serves it (or not), driven line by line."""

    def __init__(self, path: Path, *, serve: bool = True, key: str = KEY) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVICE, str(path), key, "serve" if serve else "alone"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        # Its log, read as it comes: a test can wait for a line the owner writes after answering.
        self._log: list[str] = []
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        line = self.ask_nothing()
        assert line.startswith("ready "), line + self.log()
        self.pid = int(line.split()[1])

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._log.append(line)

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        """Until the owner's log holds `text` (it logs some things after it has answered)."""
        deadline = time.monotonic() + timeout
        while text not in "".join(self._log) and time.monotonic() < deadline:
            time.sleep(0.05)

    def ask_nothing(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.ask_nothing()

    def log(self) -> str:
        if self.process.poll() is None:
            return ""
        self._reader.join(timeout=30)
        return "".join(self._log)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> str:
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self.ask("exit")
            self.process.wait(timeout=30)
        self._reader.join(timeout=30)
        return "".join(self._log)


@pytest.fixture
def service(db_path: Path) -> Iterator[Service]:
    running = Service(db_path)
    yield running
    if running.process.poll() is None:
        running.kill()


def items(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text} for text in texts]


def set_handover_wait(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The wait for an owner to serve the file (`handover.HANDOVER_SECONDS`), in this process, as
    both its readers take it: a store's first deadline (shared_file.py) and its extension (handover.py)."""
    for module in (handover, shared_file):
        monkeypatch.setattr(module, "HANDOVER_SECONDS", seconds)


# -- a client works as the owner does -------------------------------------------------------


async def test_a_second_process_is_a_client_of_the_owner_and_sees_the_same_file(
    service: Service, db_path: Path, tmp_path: Path
) -> None:
    assert service.ask("add alice hello from the owner") == "added"
    with CitadelSessionStore(db_path, KEY) as client:
        assert client.served_by == service.pid
        alice = client.session("alice")
        assert await alice.get_items() == items("hello from the owner")
        await alice.add_items(items("hello from the client", "and again"))
        assert service.ask("count alice") == "3"
        assert await alice.get_items(limit=2) == items("hello from the client", "and again")
        assert await alice.search("again", limit=1) == items("and again")
        assert await alice.pop_item() == items("and again")[0]
        assert [s.session_id for s in client.sessions()] == ["alice"]
        assert client.export("alice") == items("hello from the owner", "hello from the client")
        report = client.verify()
        assert report.ok and [(s.session_id, s.expected) for s in report.sessions] == [("alice", 2)]
        written = client.backup(tmp_path / "copy.cdl")
        assert Path(written[0]).exists()
        await client.session("bob").add_items(items("to be erased"))
        erasure = client.erase_session("bob")
        assert (erasure.items_erased, erasure.readback_confirmed) == (1, True)
        await alice.clear_session()
        assert await alice.get_items() == [] and service.ask("count alice") == "0"
    # A session opened by path alone finds the owner the same way.
    session = CitadelSession("carol", db_path, KEY)
    try:
        await session.add_items(items("by path"))
        assert service.ask("count carol") == "1"
    finally:
        session.close()


async def test_the_owners_errors_reach_the_client_unchanged(service: Service, db_path: Path) -> None:
    with CitadelSessionStore(db_path, KEY) as client:
        with pytest.raises(SessionNotFoundError, match="no session 'nobody'"):
            client.export("nobody")
        with pytest.raises(InvalidItemError, match="item 1 of the batch"):
            await client.session("s").add_items([{"ok": 1}, {"bad": {1, 2}}])
        with pytest.raises(WrongPassphraseError, match=r"current passphrase given for .* is wrong; nothing"):
            client.rotate_key("not the passphrase", "a new passphrase")


# Opens the file at the given time, says who serves it, keeps it until told (stdin closed).
STARTING_AT_ONCE = textwrap.dedent(
    """
    import sys, time
    from citadeldb_openai_agents import CitadelSessionStore
    start = float(sys.argv[3])
    time.sleep(max(0.0, start - time.time()))
    with CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot") as store:
        print(store.served_by or "owner", flush=True)
        sys.stdin.read()
    """
)


@pytest.mark.parametrize("attempt", [0, *(pytest.param(n, marks=pytest.mark.slow) for n in (1, 2, 3))])
def test_four_processes_starting_at_once_on_a_new_file_share_it(tmp_path: Path, attempt: int) -> None:
    # As `uvicorn --workers 4` starts on a new file: Citadel's creation is not locked
    # between processes, and 6 starts of 8 had a worker fail ("File exists", or the key
    # file missing) before opens were guarded (storage/files.py `opening`).
    path = tmp_path / "new.cdl"
    start = time.time() + 1.0
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", STARTING_AT_ONCE, str(path), KEY, str(start)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    # Every process keeps its store until all four have said who serves them: the owner may
    # not leave early. (Held for a fixed 2 s, a loaded machine's clients, each deriving the
    # socket's key in 1.3 s, reached the owner as it closed; the next owner was then a
    # second "owner" line, in turn, never at once.)
    first_lines = [process.stdout.readline() for process in processes]  # type: ignore[union-attr]
    said = []
    for process, line in zip(processes, first_lines, strict=True):
        out, err = process.communicate(input="", timeout=60)
        assert process.returncode == 0, err
        said.append((process.pid, (line + out).strip()))
    owners = [pid for pid, line in said if line == "owner"]
    assert len(owners) == 1, said
    assert all(line == str(owners[0]) for pid, line in said if pid != owners[0]), said


def test_a_wrong_passphrase_is_refused_by_the_owner(service: Service, db_path: Path) -> None:
    with pytest.raises(WrongPassphraseError, match="does not accept it") as caught:
        CitadelSessionStore(db_path, "not the passphrase")
    assert KEY not in str(caught.value) and "not the passphrase" not in str(caught.value)
    address = socket_path(str(db_path.resolve()))
    assert stat.S_IMODE(os.stat(address).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(address)).st_mode) == 0o700
    service.wait_for_log("refused a peer")  # logged once the client has left, after its error
    log = service.stop()
    assert "refused a peer" in log and "not the passphrase" not in log and KEY not in log


def test_settings_fixed_per_file_must_agree_with_the_owners(service: Service, db_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        CitadelSessionStore(db_path, KEY, ttl=3600)
    assert "ttl: this process has ttl 1h, the owner has no ttl (keep forever)" in str(caught.value)
    assert f"process {service.pid}" in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        CitadelSessionStore(db_path, KEY, embedder=citadeldb.MockEmbedder(dim=64))
    assert "embedder: this process has 'mock-fnv1a-bow-v1' (dim 64, cosine)" in str(caught.value)
    assert "(dim 128, cosine)" in str(caught.value)
    # Citadel applies the sync mode at every open: the owner's would silently apply instead.
    with pytest.raises(ConfigurationError) as caught:
        CitadelSessionStore(db_path, KEY, sync_mode="off")
    assert "sync_mode: this process has 'off', the owner has 'full'" in str(caught.value)
    # Unset is Citadel's default, "full": it agrees with an owner that left it unset too.
    with CitadelSessionStore(db_path, KEY, sync_mode="full") as store:
        assert store.served_by == service.pid


def test_an_owner_that_does_not_serve_refuses_others_at_once(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = Service(db_path, serve=False)
    # "At once" is "without the wait for an owner to serve the file", raised to 60 s here: the
    # refusal took 0.027 s at most under load (benchmarks/suite_under_load.py --runs 2 --command --
    # python -m pytest -q -s tests/test_serving.py -k ..., 2026-12-08), the bound is 30 s.
    set_handover_wait(monkeypatch, 60.0)
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseLockedError, match="serve = false") as caught:
            CitadelSessionStore(db_path, KEY)
        assert time.monotonic() - started < handover.HANDOVER_SECONDS / 2
        assert f"PID {alone.pid}" in str(caught.value)
    finally:
        alone.stop()


# Owns the file after an open that takes argv[3] seconds longer than it would (its open-time
# audit sleeps first), as a big file's does; then serves it until stdin closes.
SLOW_OPENER = textwrap.dedent(
    """
    import sys, time
    from citadeldb_openai_agents import CitadelSessionStore
    from citadeldb_openai_agents.storage import local_file as local

    audit = local.check_before_memory
    local.check_before_memory = lambda *args: (time.sleep(float(sys.argv[3])), audit(*args))[1]
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot")
    print("serving", flush=True)
    sys.stdin.read()
    store.close()
    """
)


@contextlib.contextmanager
def slow_opener(path: Path, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """A process opening `path` for `seconds` more than it takes; yielded once it holds the lock."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    opener = subprocess.Popen(
        [sys.executable, "-c", SLOW_OPENER, str(path), KEY, str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # 2.8 s at most under load (benchmarks/suite_under_load.py --runs 2 --command -- python -m
        # pytest -q -s tests/test_serving.py -k still_opening, 2026-12-08): 20x.
        deadline = time.monotonic() + 60
        while (holder := find_lock_holder(path)) is None or holder.pid != opener.pid:
            assert time.monotonic() < deadline and opener.poll() is None, "the opener never took the lock"
            time.sleep(0.01)
        yield opener
    finally:
        opener.kill()
        opener.wait(timeout=30)


def test_a_process_that_finds_the_file_held_by_one_still_opening_it_waits_for_it(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big file takes seconds to open (its audit reads every row: 1.6-1.8 s at 70,000 items),
    while its opener holds the lock and serves no one yet. Another process (a worker starting
    beside it, a client after a handover) waits for it instead of calling it stuck after the
    fixed wait, and gives up with a message that says why once the opener takes too long."""
    CitadelSessionStore(db_path, KEY, argon2_profile="iot").close()
    # The fixed wait, 1 s, for both its readers (handover.py's alone left the first deadline at
    # 10 s, past the opener's 2.5 s: the client was served even where it did not wait for openers).
    set_handover_wait(monkeypatch, 1.0)
    with slow_opener(db_path, 2.5) as opener:
        started = time.monotonic()
        with CitadelSessionStore(db_path, KEY) as store:
            assert store.served_by == opener.pid
            # It waited past the fixed wait (a lower bound: a loaded machine only makes it longer).
            assert time.monotonic() - started > handover.HANDOVER_SECONDS
    # The client gives up 2 s after it began (OPENING_SECONDS), in 2.04 s at most under load
    # (benchmarks/suite_under_load.py --runs 2 --command -- python -m pytest -q -s
    # tests/test_serving.py -k ..., 2026-12-08): the opener is still opening for 60 s, 10x+ that.
    monkeypatch.setattr(handover, "OPENING_SECONDS", 2.0)
    with slow_opener(db_path, 60.0) as opener:
        with pytest.raises(
            DatabaseLockedError, match="has been opening the file for more than 2 s"
        ) as caught:
            CitadelSessionStore(db_path, KEY)
        assert f"PID {opener.pid}" in str(caught.value)


# -- the socket ------------------------------------------------------------------------------


def test_a_call_the_owner_refuses_fails_at_once_instead_of_being_resent_for_ever(
    service: Service, db_path: Path
) -> None:
    """An owner drops a client that sends what it does not know (another version's operation, a
    bug). The client, finding the same owner still there, must not send the call again and again."""
    unknown = Operation[None](
        "not_an_operation_of_this_owner", lambda *args: None, (), nothing, resend=True, session=False
    )
    with CitadelSessionStore(db_path, KEY) as client:
        assert client.served_by == service.pid
        raised: list[BaseException] = []

        def call() -> None:
            try:
                client._file._call(unknown)
            except BaseException as exc:
                raised.append(exc)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(30)
        assert not caller.is_alive(), "the call was sent again and again"
        assert len(raised) == 1 and isinstance(raised[0], StorageError), raised
        assert f"process {service.pid}" in str(raised[0]) and "same version" in str(raised[0])
        assert asyncio.run(client.session("alice").get_items()) == []  # the client still works
    assert service.ask("add alice still serving") == "added"


def test_garbage_on_the_socket_does_not_stop_the_owner(service: Service, db_path: Path) -> None:
    address = socket_path(str(db_path.resolve()))
    for garbage in (os.urandom(64), b"\x00\x00\x00\x10truncated", b"\xff\xff\xff\xff"):
        with socket.socket(socket.AF_UNIX) as peer:
            peer.connect(address)
            peer.sendall(garbage)
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(address)  # says nothing: dropped after the handshake's timeout
    try:
        assert service.ask("add alice still serving") == "added"
        with CitadelSessionStore(db_path, KEY) as client:
            assert asyncio.run(client.session("alice").get_items()) == items("still serving")
    finally:
        silent.close()
    log = service.stop()
    assert log.count("refused a peer") >= 3


def _replies(channel: Channel) -> list[str]:
    tags = [channel.receive()[0]]
    while tags[-1] not in ("ok", "error"):
        tags.append(channel.receive()[0])
    return tags


def test_the_owner_reports_progress_only_to_a_caller_that_asks_for_it(
    service: Service, db_path: Path
) -> None:
    # Every full read of a session (the SDK's, each turn) may report progress: a message
    # each way that a caller with no progress callback only throws away.
    assert service.ask("add alice one") == "added"
    with contextlib.closing(authenticated_peer(db_path, KEY)) as peer:
        peer.send(["call", "all_items", ["alice"], False, {}])
        assert _replies(peer) == ["ok"]
        peer.send(["call", "all_items", ["alice"], True, {}])
        assert _replies(peer) == ["progress", "ok"]


def test_an_authenticated_peer_that_sends_no_call_is_dropped_and_the_owner_goes_on(
    service: Service, db_path: Path
) -> None:
    with contextlib.closing(authenticated_peer(db_path, KEY)) as peer:
        peer.send(["call", "all_items", ["alice"], False])  # a call as protocol 15 framed it
        with pytest.raises(EOFError):
            peer.receive()
    assert service.ask("add alice still serving") == "added"
    with CitadelSessionStore(db_path, KEY) as client:
        assert asyncio.run(client.session("alice").get_items()) == items("still serving")
    log = service.stop()
    assert "it sent a message that is not a call" in log
    assert "Traceback" not in log


def test_a_batch_whose_lists_disagree_is_refused_and_writes_nothing(service: Service, db_path: Path) -> None:
    """A batch crosses as one record; its lists must be of one length (else items and their texts would pair wrong)."""
    assert service.ask("add alice one") == "added"
    uneven = {
        "payloads": ['"a"', '"b"'],
        "texts": ["a"],
        "from_user": [True, True],
        "expires_at": None,
        "max_items": None,
        "retention": None,
        "owner": None,
        "labels": None,
    }
    not_a_batch = ['"a"']
    for shape in (uneven, not_a_batch):
        with contextlib.closing(authenticated_peer(db_path, KEY)) as peer:
            peer.send(["call", "append", ["alice", shape, "b" * 32, False], False, {}])
            with pytest.raises(EOFError):
                peer.receive()
    assert service.ask("count alice") == "1"
    log = service.stop()
    assert "differ in length" in log and "expected a Batch" in log
    assert "Traceback" not in log


def test_an_app_logging_at_info_gets_no_line_per_client_connection(service: Service, db_path: Path) -> None:
    """Workers open connections by the dozen: those lines are DEBUG (the serve command shows them)."""
    for _ in range(3):
        with CitadelSessionStore(db_path, KEY) as client:
            asyncio.run(client.session("alice").add_items(items("hello")))
    log = service.stop()
    assert "serving" in log and "client connected" not in log and "client left" not in log


def test_a_long_database_path_still_serves(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120) / ("e" * 120)
    deep.mkdir(parents=True)
    path = deep / "agent.cdl"
    owner = Service(path)
    try:
        with CitadelSessionStore(path, KEY) as client:
            assert client.served_by == owner.pid
    finally:
        owner.stop()


def test_a_long_runtime_directory_gives_way_to_a_short_one(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / ("r" * 120)  # too long for a socket's name (AF_UNIX: 107 bytes)
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot") as store:
        assert store.served_by is None
        address = socket_path(str(db_path.resolve()))
        assert len(os.fsencode(address)) <= 107 and not address.startswith(str(runtime))
        assert stat.S_ISSOCK(os.stat(address).st_mode)


def test_a_stale_socket_left_by_a_killed_owner_is_replaced(db_path: Path) -> None:
    first = Service(db_path)
    first.kill()  # SIGKILL: its socket file stays behind
    address = socket_path(str(db_path.resolve()))
    assert os.path.exists(address)
    second = Service(db_path)
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            assert client.served_by == second.pid
    finally:
        second.stop()
    assert not os.path.exists(address), "a clean close removes the socket"


def test_sockets_that_killed_owners_left_are_removed_by_the_next_owner(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="citadeldb_openai_agents")
    runtime = Path(tempfile.mkdtemp(prefix="run-", dir="/tmp"))  # short enough for a socket's name
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    directory = Path(socket_path(str(db_path.resolve()))).parent
    assert directory.parent == runtime
    an_hour_ago = time.time() - 3600

    def bound(name: str, *, listening: bool, old: bool) -> socket.socket:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(str(directory / name))
        unix.listen()
        if old:
            os.utime(directory / name, (an_hour_ago, an_hour_ago))
        if not listening:
            unix.close()  # as a SIGKILL leaves it: the file stays, nobody listens
        return unix

    bound("1" * 32 + ".sock", listening=False, old=True)  # a killed owner's, long ago
    bound("2" * 32 + ".sock", listening=False, old=False)  # maybe an owner between bind and listen
    live = bound("3" * 32 + ".sock", listening=True, old=True)  # another file's owner, serving
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    # The marks of processes killed while opening a file, and of one still opening (this one).
    for mark in (f"{'6' * 32}.opening.{int(dead.stdout)}", f"{'7' * 32}.opening.{os.getpid()}"):
        (directory / mark).touch()
        os.utime(directory / mark, (an_hour_ago, an_hour_ago))
    try:
        with CitadelSessionStore(db_path, KEY, argon2_profile="iot") as store:
            assert store.served_by is None
            own = Path(socket_path(str(db_path.resolve()))).name
            left = {entry.name for entry in directory.iterdir()}
            kept = {"2" * 32 + ".sock", "3" * 32 + ".sock", "names.key", own}
            salt = own.replace(".sock", ".salt")  # made at the first handshake: none here yet
            assert left - {salt} == {*kept, f"{'7' * 32}.opening.{os.getpid()}"}, left
    finally:
        live.close()
        shutil.rmtree(runtime)
    assert any("left by an owner that was killed" in record.getMessage() for record in caplog.records)


# -- handover ---------------------------------------------------------------------------------


async def test_when_the_owner_is_killed_a_client_takes_the_file_over(
    service: Service, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert service.ask("add alice before the kill") == "added"
    with CitadelSessionStore(db_path, KEY) as client:
        alice = client.session("alice")
        assert client.served_by == service.pid
        service.kill()
        # At once: without any wait the client could make instead (for a next owner, for an
        # answer, for a handshake), each raised to 60 s here. The takeover took 0.32 s at most
        # under load (benchmarks/suite_under_load.py --runs 2 --command -- python -m pytest -q -s
        # tests/test_serving.py -k ..., 2026-12-08): the bound, 30 s, is 10x+ that.
        set_handover_wait(monkeypatch, 60.0)
        for wait in ("SILENCE_SECONDS", "CONNECT_SECONDS"):
            monkeypatch.setattr(client_module, wait, 60.0)
        started = time.monotonic()
        await alice.add_items(items("after the kill"))
        took = time.monotonic() - started
        assert client.served_by is None, "this process took the file over"
        assert await alice.get_items() == items("before the kill", "after the kill")
        assert took < 60.0 / 2, took
        # And it serves the file now: another process becomes its client.
        code = textwrap.dedent(
            """
            import sys
            from citadeldb_openai_agents import CitadelSessionStore
            with CitadelSessionStore(sys.argv[1], sys.argv[2]) as store:
                print(store.served_by)
            """
        )
        done = subprocess.run([sys.executable, "-c", code, str(db_path), KEY], capture_output=True, text=True)
        assert done.stdout.strip() == str(os.getpid()), done.stderr


@pytest.mark.parametrize(
    ("when", "operation"),
    [
        ("after-next", "append"),
        ("before", "pop"),
        ("at-note", "pop"),
        ("after-next", "pop"),
        ("before", "clear"),
        ("at-note", "clear"),
        ("after-next", "clear"),
    ],
)
async def test_a_write_in_flight_when_the_owner_dies_is_applied_once(
    service: Service, db_path: Path, when: str, operation: str
) -> None:
    for text in ("one", "two", "three"):
        assert service.ask(f"add alice {text}") == "added"
    with CitadelSessionStore(db_path, KEY) as client:
        alice = client.session("alice")
        assert service.ask(f"die-{when} {operation}") == "armed"
        if operation == "append":
            await alice.add_items(items("four"))
            expected = items("one", "two", "three", "four")
        elif operation == "pop":
            assert await alice.pop_item() == items("three")[0]
            expected = items("one", "two")
        else:
            await alice.clear_session()
            expected = []
        assert client.served_by is None
        assert await alice.get_items() == expected
        assert client.verify().ok


def test_the_last_store_to_close_stops_serving(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="citadeldb_openai_agents")
    address = socket_path(str(db_path.resolve()))
    first = CitadelSessionStore(db_path, KEY, argon2_profile="iot")
    second = CitadelSessionStore(db_path, KEY)
    assert os.path.exists(address)
    first.close()
    assert os.path.exists(address), "another store of this process still uses the file"
    second.close()
    assert not os.path.exists(address)
    assert any(record.getMessage().startswith("serving ") for record in caplog.records)


def test_the_serve_command_owns_the_file_until_sigterm(db_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    env.update(CITADEL_PATH=str(db_path), CITADEL_KEY=KEY, CITADEL_ARGON2_PROFILE="iot")
    server = subprocess.Popen(
        [sys.executable, "-m", "citadeldb_openai_agents", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith(f"serving {db_path} until SIGTERM (pid {server.pid})"), first
        with CitadelSessionStore(db_path, KEY) as client:
            assert client.served_by == server.pid
            asyncio.run(client.session("alice").add_items(items("through the sidecar")))
        again = subprocess.run(
            [sys.executable, "-m", "citadeldb_openai_agents", "serve"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert again.returncode == 1 and f"process {server.pid} already holds" in again.stderr
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0
    assert "stopped: the file is closed and no longer served" in out
    assert "client connected" in err and "client left" in err and KEY not in err
    assert not os.path.exists(socket_path(str(db_path.resolve())))
    with CitadelSessionStore(db_path, KEY) as owner:
        assert owner.served_by is None
        assert asyncio.run(owner.session("alice").get_items()) == items("through the sidecar")


# -- settings fixed per file: adopted from the owner -----------------------------------------

OWNER_WITH_SETTINGS = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], ttl=3600, sync_mode="off", argon2_profile="iot")
    print("ready", flush=True)
    sys.stdin.read()
    """
)


SERVED_BY_WITH_SETTINGS = textwrap.dedent(
    """
    import sys
    from citadeldb_openai_agents import CitadelSessionStore
    with CitadelSessionStore(sys.argv[1], sys.argv[2], ttl=3600, sync_mode="off") as store:
        print(store.served_by)
    """
)


@contextlib.contextmanager
def owner_running(script: str, path: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`script` run on `path` and `args` (it prints "ready" once it owns the file); killed at the end."""
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(path), KEY, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "ready\n"
        yield owner
    finally:
        owner.kill()
        owner.wait(timeout=30)


def test_adopted_settings_stay_when_the_adopter_takes_the_file_over(db_path: Path) -> None:
    with (
        owner_running(OWNER_WITH_SETTINGS, db_path) as owner,
        CitadelSessionStore(db_path, KEY, adopt=("ttl", "sync_mode")) as adopter,
    ):
        assert adopter.served_by == owner.pid
        assert (adopter.ttl, adopter.adopted) == (3600, {"ttl": 3600, "sync_mode": "off"})
        owner.kill()
        owner.wait(timeout=30)
        asyncio.run(adopter.session("s").add_items(items("written after the owner died")))
        assert adopter.served_by is None  # took the file over
        assert adopter.ttl == 3600
        # It serves the file as it was served (not with its own default sync mode): a
        # process set like the old owner is its client.
        like_the_old_owner = subprocess.run(
            [sys.executable, "-c", SERVED_BY_WITH_SETTINGS, str(db_path), KEY],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert like_the_old_owner.stdout.strip() == str(os.getpid()), like_the_old_owner.stderr
        assert adopter.export("s") == items("written after the owner died")


def test_adopt_names_only_settings_fixed_per_file(db_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'tll'.*only 'ttl', 'embedder', 'sync_mode'"):
        CitadelSessionStore(db_path, KEY, adopt=["tll"])
    with pytest.raises(ValueError, match="not the string 'ttl'"):
        CitadelSessionStore(db_path, KEY, adopt="ttl")
    assert not db_path.exists()


def test_a_takeover_opens_the_file_in_the_sync_mode_it_adopted() -> None:
    # Citadel applies the sync mode at each open and does not say which one it applied:
    # what is checked is that the options a takeover opens with (LocalFile makes Citadel's from
    # them, storage.engine.database_options) are the owner's mode, and only what was adopted.
    opening = Opening(
        "f.cdl", "/f.cdl", Secret(b"k"), citadeldb.MockEmbedder(dim=8), StoreOptions(cache_size=99), True,
        frozenset({"sync_mode"}),
    )  # fmt: skip
    opening.adopt_from(
        OwnerHello(1, "/f.cdl", StoreOptions(ttl=60.0, sync_mode="off"), ("mock", 8, "cosine"))
    )
    assert opening.options == StoreOptions(sync_mode="off", cache_size=99)
    assert opening.adopted == {"sync_mode": "off"}


OWNER_WITH_ANOTHER_EMBEDDER = textwrap.dedent(
    """
    import sys, citadeldb
    from citadeldb_openai_agents import CitadelSessionStore
    store = CitadelSessionStore(sys.argv[1], sys.argv[2], embedder=citadeldb.MockEmbedder(dim=64), argon2_profile="iot")
    print("ready", flush=True)
    sys.stdin.read()
    """
)


async def test_an_adopted_embedder_is_a_name_only_so_a_takeover_with_another_is_refused(
    db_path: Path,
) -> None:
    with (
        owner_running(OWNER_WITH_ANOTHER_EMBEDDER, db_path) as owner,
        CitadelSessionStore(db_path, KEY, adopt=["embedder"]) as adopter,
    ):
        assert adopter.embedder_identity.dim == 64
        owner.kill()
        owner.wait(timeout=30)
        with pytest.raises(EmbedderMismatchError, match="dim 64, embedder has dim 128"):
            await adopter.session("s").add_items(items("not written"))
    with CitadelSessionStore(db_path, KEY, embedder=citadeldb.MockEmbedder(dim=64)) as store:
        assert store.session_ids() == []
