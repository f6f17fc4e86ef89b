"""Issue 47's holes in the owner's socket, each tried as the review found it (docs/reliability.md).

A flood from one process of this user, with a real owner and the real CLI as its client; a
socket key whose salt a dictionary could be computed for in advance; an account whose home
does not exist (run as `nobody`, when the tests run as root).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_serving import Service

from citadeldb_openai_agents import CitadelSessionError, CitadelSessionStore, DatabaseLockedError
from citadeldb_openai_agents.serving import shared_file
from citadeldb_openai_agents.serving.address import file_salt, socket_path
from citadeldb_openai_agents.serving.handshake import VERSION

from conftest import KEY, Nobody

# 48 threads of one process, each connecting to the owner's socket as fast as it is dropped:
# each sends nothing, so the owner holds it until the handshake's deadline (5 s), or sends
# garbage (argv[2] "garbage": dropped at once, and back at once). It says "flooding" and how many
# connections it made once it has made 100 (not after a fixed time), and at the end how many in all.
FLOOD = textwrap.dedent(
    """
    import socket, sys, threading, time
    address, garbage, stop = sys.argv[1], sys.argv[2] == "garbage", threading.Event()
    count = [0]

    def flood():
        while not stop.is_set():
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                peer.connect(address)
                count[0] += 1
                if garbage:
                    peer.sendall(b"\\xff" * 64)
                while peer.recv(4096):
                    pass
            except OSError:
                pass
            finally:
                peer.close()

    for number in range(48):
        threading.Thread(target=flood, daemon=True).start()
    deadline = time.monotonic() + 60  # 100 took 0.03 s at most under load (as `_cli` says)
    while count[0] < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("flooding", count[0], flush=True)
    sys.stdin.read()
    print(count[0], flush=True)
    """
)

# Holds the file's lock as an owner would, and at the socket's name either turns every peer
# away as a busy owner does ("busy") or is not there at all ("absent").
HOLDER = textwrap.dedent(
    """
    import fcntl, os, socket, sys
    database, address, role, version = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lock = os.open(database, os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(address):
        os.unlink(address)
    busy = b"CDLS" + version.to_bytes(2, "big") + b"busy"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if role == "busy":
        server.bind(address)
        server.listen(64)
    print("ready", flush=True)
    while role == "busy":
        peer, _ = server.accept()
        peer.send(len(busy).to_bytes(4, "big") + busy)
        peer.close()
    sys.stdin.read()
    """
)


# The CLI (`python -m citadeldb_openai_agents ARGS`), counting the connections it opens to an owner
# and those that failed (closed by the owner, turned away as busy, timed out), by error: its last
# line on stderr is "connections N [ErrorName=COUNT ...]".
COUNTING_CLI = textwrap.dedent(
    """
    import atexit, collections, runpy, sys
    from citadeldb_openai_agents.serving import client

    tried, failed, handshake = [0], collections.Counter(), client.RemoteOwner._handshake

    def counted(self):
        tried[0] += 1
        try:
            return handshake(self)
        except BaseException as exc:
            failed[type(exc).__name__] += 1
            raise

    def report():
        print("connections", tried[0], *(f"{name}={n}" for name, n in failed.items()), file=sys.stderr, flush=True)

    client.RemoteOwner._handshake = counted
    atexit.register(report)
    runpy.run_module("citadeldb_openai_agents", run_name="__main__", alter_sys=True)
    """
)


def _cli(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    """The CLI run with `args`: how long it took, and its outcome (stderr ends with its connections)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", COUNTING_CLI, *args],
        env=env,
        capture_output=True,
        text=True,
        # A hang's bound: `sessions` or `erase` under a flood took 2.9 s at most under load
        # (benchmarks/suite_under_load.py --runs 3 --command -- python -m pytest -q -s
        # tests/test_socket_hardening.py -k flood, 2026-12-08): 20x.
        timeout=60,
    )
    return time.monotonic() - started, done


def _connections(done: subprocess.CompletedProcess[str]) -> tuple[int, list[str]]:
    """How many connections a `_cli` run opened to the owner, and how many failed, by error."""
    word, count, *failed = done.stderr.splitlines()[-1].split()
    assert word == "connections", done.stderr
    return int(count), failed


@pytest.mark.parametrize("sends", ["nothing", "garbage"])
def test_a_flood_from_one_process_keeps_no_other_out(db_path: Path, sends: str) -> None:
    """The review's shape: 48 threads of one process reconnect as fast as they are dropped; the
    owner takes at most 4 of them into a handshake at a time, so `sessions` and `erase` run as a
    client in another process, each getting in at its first connection (before: 3 failures in a
    row, ~12 s each, every connection closed or turned away while the flood held the handshakes).

    What is checked is the cost's cause, the connections that failed (none), not how long the
    commands took: 0.6 to 2.9 s under load, 0.6 to 1.7 s alone, where the bound was 5 s."""
    owner = Service(db_path)
    flood = None
    try:
        assert owner.ask("add alice to erase") == "added"
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOOD, socket_path(str(db_path.resolve())), sends],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flood.stdout is not None
        flooding, before = flood.stdout.readline().split()
        assert flooding == "flooding" and int(before) >= 100, (flooding, before)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
        env.update(CITADEL_PATH=str(db_path), CITADEL_KEY=KEY)
        took, listed = _cli("sessions", env=env)
        assert listed.returncode == 0 and "alice" in listed.stdout, listed.stderr
        print(f"sessions under a flood sending {sends}: {took:.2f} s")
        opened, failed = _connections(listed)
        assert opened >= 1 and not failed, f"sessions was kept out: {listed.stderr}"
        took, erased = _cli("erase", "alice", "--yes", env=env)
        assert erased.returncode == 0, erased.stderr
        print(f"erase under a flood sending {sends}: {took:.2f} s")
        opened, failed = _connections(erased)
        assert opened >= 1 and not failed, f"erase was kept out: {erased.stderr}"
        assert owner.ask("count alice") == "0"
        flood_stdout, _ = flood.communicate("", timeout=30)
        # It went on while the commands ran: 2,900 connections at least in their time under load
        # (benchmarks/suite_under_load.py, as `_cli` says), 29x the 100 asked.
        during = int(flood_stdout) - int(before)
        assert during > 100, f"the flood made only {during} connections while the commands ran"
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
            flood.wait(timeout=30)
        log = owner.stop()
    assert "peers in their handshake already" in log, log  # the flood was turned away


@pytest.mark.parametrize("holder", ["busy", "absent"])
def test_a_timed_out_join_says_stop_the_holder_only_when_it_does_not_answer(
    db_path: Path, holder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that answers "busy" to every connection is alive: the error says so and never to
    stop it; a holder with no socket at all is shown not to serve, and may be stopped."""
    CitadelSessionStore(db_path, KEY, argon2_profile="iot").close()
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(db_path),
            socket_path(str(db_path.resolve())),
            holder,
            str(VERSION),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        monkeypatch.setattr(shared_file, "HANDOVER_SECONDS", 1.0)
        with pytest.raises(DatabaseLockedError) as caught:
            CitadelSessionStore(db_path, KEY)
        message = str(caught.value)
        assert f"PID {process.pid}" in message
        if holder == "busy":
            assert "not stuck, so do not stop it" in message and "Stop that process" not in message, message
        else:
            assert "Stop that process" in message, message
    finally:
        process.kill()
        process.wait(timeout=30)


def test_the_socket_keys_salt_is_random_per_file_and_the_owner_sends_its_own(
    tmp_path: Path, db_path: Path
) -> None:
    """No dictionary serves every deployment at a common path: the salt is the file's 32 random
    bytes (a new one where the runtime directory was wiped), and a client agrees with a live
    owner whose salt file was replaced meanwhile: the owner's handshake carries the salt."""
    first = Path(tempfile.mkdtemp(prefix="salt-", dir="/tmp"))  # short enough for a socket's name
    second = Path(tempfile.mkdtemp(prefix="salt-", dir="/tmp"))
    database = str(db_path.resolve())
    salts = {file_salt(database, str(first)), file_salt(database, str(second))}
    assert file_salt(database, str(first)) in salts and len(salts) == 2, "the salt is the path's"
    owner = Service(db_path)
    try:
        with CitadelSessionStore(db_path, KEY) as client:  # the owner derives at its first peer
            assert client.served_by == owner.pid
        kept = Path(socket_path(database)).with_suffix(".salt")
        used = kept.read_bytes()
        kept.write_bytes(os.urandom(32))  # wiped and made anew: the live owner keeps its own
        with CitadelSessionStore(db_path, KEY) as client:
            assert client.served_by == owner.pid
            assert asyncio.run(client.session("s").get_items()) == []
        kept.unlink()
        assert file_salt(database) not in (used, b""), "a new salt is not random"
    finally:
        owner.stop()
        shutil.rmtree(first)
        shutil.rmtree(second)


def test_socket_dir_is_used_when_private_and_refused_naming_it_otherwise(
    tmp_path: Path, db_path: Path
) -> None:
    chosen = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp")) / "run"  # made 0700 by the store
    try:
        with CitadelSessionStore(db_path, KEY, argon2_profile="iot", socket_dir=chosen) as store:
            assert store.served_by is None and store.options.socket_dir == str(chosen)
            assert (chosen.stat().st_mode & 0o777) == 0o700
            address = socket_path(str(db_path.resolve()), str(chosen))
            assert Path(address).parent == chosen and os.path.exists(address)
            env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
            env.update(CITADEL_PATH=str(db_path), CITADEL_KEY=KEY, CITADEL_SOCKET_DIR=str(chosen))
            _, listed = _cli("check", env=env)
            assert "serving" in listed.stdout, listed.stdout + listed.stderr  # a client, through it
        chosen.chmod(0o755)
        with pytest.raises(
            CitadelSessionError, match=r"socket_dir \(CITADEL_SOCKET_DIR\) is .*open to others"
        ):
            CitadelSessionStore(db_path, KEY, argon2_profile="iot", socket_dir=chosen)
        link = chosen.parent / "link"
        chosen.chmod(0o700)
        link.symlink_to(chosen)
        with pytest.raises(CitadelSessionError, match="is a symlink"):
            CitadelSessionStore(db_path, KEY, argon2_profile="iot", socket_dir=link)
    finally:
        shutil.rmtree(chosen.parent)


# Run as `nobody` (home /nonexistent): a store serving its file, and the CLI as its client.
HOMELESS = textwrap.dedent(
    """
    import asyncio, os, subprocess, sys
    from citadeldb_openai_agents import CitadelSessionStore
    from citadeldb_openai_agents.serving.address import socket_path
    path, key = sys.argv[1], sys.argv[2]
    try:
        store = CitadelSessionStore(path, key, argon2_profile="iot")
    except Exception as exc:
        print("refused", exc, flush=True)
        sys.exit(0)
    asyncio.run(store.session("alice").add_items([{"role": "user", "content": "hi"}]))
    env = dict(os.environ, CITADEL_PATH=path, CITADEL_KEY=key)
    listed = subprocess.run([sys.executable, "-m", "citadeldb_openai_agents", "sessions"], env=env,
                            capture_output=True, text=True)
    print("served", store.served_by, os.path.dirname(socket_path(os.path.realpath(path))), flush=True)
    print(listed.returncode, "alice" in listed.stdout, listed.stderr.replace(chr(10), " "), flush=True)
    store.close()
    """
)


@pytest.fixture
def homeless(nobody: Nobody) -> Iterator[tuple[Callable[[], list[str]], Path]]:
    """How to run Python as `nobody`, whose home does not exist, and a directory it may write."""
    user, python, env = nobody.user, nobody.python, nobody.env
    if os.path.exists(user.pw_dir):
        pytest.skip(f"nobody's home {user.pw_dir} exists here")
    scratch = Path(tempfile.mkdtemp(prefix="homeless-", dir="/tmp"))
    os.chown(scratch, user.pw_uid, user.pw_gid)
    shared = Path(f"/tmp/citadeldb-openai-agents-{user.pw_uid}")
    if shared.exists() or shared.is_symlink():
        pytest.skip(f"{shared} exists already: not this test's to replace")
    command = [python, "-c", HOMELESS, str(scratch / "agent.cdl"), KEY]

    def run() -> list[str]:
        done = subprocess.run(
            command, env=env, user=user.pw_uid, group=user.pw_gid, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    try:
        yield run, shared
    finally:
        shutil.rmtree(scratch)
        if shared.is_dir() and not shared.is_symlink():
            shutil.rmtree(shared)


def test_an_account_without_a_home_serves_in_a_private_directory_or_names_socket_dir(
    homeless: tuple[Callable[[], list[str]], Path],
) -> None:
    """nobody's home, /nonexistent, cannot be made: serving starts in /tmp/citadeldb-openai-agents-65534
    (made 0700, checked with lstat), and the CLI joins it there. Another user's squat at that name
    is refused: the error is one line naming socket_dir."""
    run, shared = homeless
    lines = run()
    assert lines[0].startswith("served "), lines
    served, listed = lines
    assert served.split()[:2] == ["served", "None"] and served.split()[2] == str(shared), served
    assert listed.startswith("0 True"), listed
    status = shared.lstat()
    assert (status.st_uid, status.st_mode & 0o777) == (pwd.getpwnam("nobody").pw_uid, 0o700)
    shutil.rmtree(shared)
    shared.mkdir(mode=0o777)  # another user's (root's) squat at the name
    try:
        (refused,) = run()
        print(refused)
        assert refused.startswith("refused ") and "socket_dir (CITADEL_SOCKET_DIR)" in refused, refused
    finally:
        shared.rmdir()
