"""The owner's socket is a trust boundary: each attack of the threat model (docs/reliability.md), tried.

Every attacker is a separate process of this user that does not know the passphrase
(`ATTACKER`, run with a role); the owner is a real service process (`Service`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_serving import Service, items

from citadeldb_openai_agents import (
    CitadelSessionError,
    CitadelSessionStore,
    StorageError,
    WrongPassphraseError,
)
from citadeldb_openai_agents.serving import client as client_module
from citadeldb_openai_agents.serving import handshake
from citadeldb_openai_agents.serving.address import Secret, SocketKey, socket_path
from citadeldb_openai_agents.serving.handshake import VERSION
from citadeldb_openai_agents.storage.lockholder import find_lock_holder

from conftest import KEY

# An attacker without the passphrase. Roles:
#   relay ADDRESS LOG: renames the owner's socket, listens at its name and forwards both ways,
#       logging every byte a client sent it (the owner still accepts at the new name);
#   fake-owner DB ADDRESS LOG: takes the file's lock (flock needs no passphrase), listens at the
#       socket's name, answers a handshake with random bytes and logs everything it received;
#   silent DB ADDRESS: takes the lock and listens, but never says a word.
# Each prints "ready" once in place, then runs until killed.
ATTACKER = textwrap.dedent(
    """
    import fcntl, os, select, socket, sys, threading
    from citadeldb_openai_agents.serving.handshake import VERSION  # the fake speaks the client's version
    role = sys.argv[1]

    def listen(address):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(64)
        return server

    def frame(data):
        return len(data).to_bytes(4, "big") + data

    if role == "relay":
        address, log = sys.argv[2], open(sys.argv[3], "ab", buffering=0)
        os.rename(address, address + ".moved")
        server = listen(address)
        print("ready", flush=True)
        def pump(client):
            owner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            owner.connect(address + ".moved")
            while True:
                ready, _, _ = select.select([client, owner], [], [])
                for side in ready:
                    data = side.recv(65536)
                    if not data:
                        return
                    if side is client:
                        log.write(data)
                    (owner if side is client else client).sendall(data)
        while True:
            client, _ = server.accept()
            threading.Thread(target=pump, args=(client,), daemon=True).start()
    else:
        database, address = sys.argv[2], sys.argv[3]
        lock = os.open(database, os.O_RDWR)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(address):
            os.unlink(address)
        server = listen(address)
        print("ready", flush=True)
        while True:
            client, _ = server.accept()
            if role == "silent":
                continue  # kept open, never answered
            log = open(sys.argv[4], "ab", buffering=0)
            client.settimeout(5)
            try:
                log.write(client.recv(65536))
                client.sendall(frame(b"CDLS" + VERSION.to_bytes(2, "big") + os.urandom(96)))  # salt, nonce, proof
                log.write(client.recv(65536))
            except OSError:
                pass
            client.close()
    """
)


class Attacker:
    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
        self.process = subprocess.Popen(
            [sys.executable, "-c", ATTACKER, *args], stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"
        self.pid = self.process.pid

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture
def attackers() -> Iterator[list[Attacker]]:
    started: list[Attacker] = []
    yield started
    for attacker in started:
        attacker.stop()


def _address(db_path: Path) -> str:
    return socket_path(str(db_path.resolve()))


def test_a_relay_at_the_sockets_name_gets_nothing_and_is_named(
    db_path: Path, tmp_path: Path, attackers: list[Attacker]
) -> None:
    """A process of this user moves the owner's socket aside and listens at its name, forwarding."""
    owner = Service(db_path)
    try:
        assert owner.ask("add alice secret history") == "added"
        recorded = tmp_path / "relay.bin"
        relay = Attacker("relay", _address(db_path), str(recorded))
        attackers.append(relay)
        with pytest.raises(CitadelSessionError, match="posing as the file's owner") as caught:
            CitadelSessionStore(db_path, KEY)
        assert f"process {relay.pid}" in str(caught.value) and f"process {owner.pid}" in str(caught.value)
        assert recorded.read_bytes() == b"", "the client sent the relay something"
    finally:
        owner.stop()


def test_a_relay_cannot_use_a_handshake_it_forwards_even_where_the_lock_holder_is_unknown(
    db_path: Path, tmp_path: Path, attackers: list[Attacker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the kernel's word on who holds the lock, the proofs alone stand: they bind both pids."""
    owner = Service(db_path)
    try:
        recorded = tmp_path / "relay.bin"
        attackers.append(Attacker("relay", _address(db_path), str(recorded)))
        holder = find_lock_holder(db_path)
        monkeypatch.setattr(client_module, "find_lock_holder", lambda path: holder)
        monkeypatch.setattr(client_module.RemoteOwner, "_check_peer", lambda self, sock: owner.pid)
        with pytest.raises(WrongPassphraseError, match="could not prove"):
            CitadelSessionStore(db_path, KEY)
        # The client's hello went through (its nonce, nothing keyed); its proof never did.
        assert len(recorded.read_bytes()) == 4 + 6 + 32
    finally:
        owner.stop()


def test_a_fake_owner_records_nothing_that_tests_a_passphrase(
    db_path: Path, tmp_path: Path, attackers: list[Attacker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that takes the lock (no passphrase needed) and plays the owner: the client refuses it
    before sending anything derived from the passphrase, so the recorded bytes cannot tell the
    right passphrase from a wrong one: with the client's nonce fixed, they are the same bytes."""
    CitadelSessionStore(db_path, KEY, argon2_profile="iot").close()
    recorded = tmp_path / "fake.bin"
    fake = Attacker("fake-owner", str(db_path), _address(db_path), str(recorded))
    attackers.append(fake)
    monkeypatch.setattr(handshake.secrets, "token_bytes", lambda size: b"n" * size)
    transcripts = []
    for candidate in (KEY, "a wrong guess"):
        with pytest.raises(WrongPassphraseError) as caught:
            CitadelSessionStore(db_path, candidate)
        assert f"process {fake.pid}, which holds the file" in str(caught.value)
        assert f"(this is process {os.getpid()})" in str(caught.value)
        transcripts.append(recorded.read_bytes())
        recorded.unlink()
    assert transcripts[0] == transcripts[1], "what the client sent depends on its passphrase"
    assert transcripts[0] == (38).to_bytes(4, "big") + b"CDLS" + VERSION.to_bytes(2, "big") + b"n" * 32


@pytest.mark.usefixtures("full_cost_socket_kdf")
def test_testing_a_guess_against_the_socket_costs_more_than_against_the_file(db_path: Path) -> None:
    """A fake client does get the owner's proof: each guess then costs one derivation of the
    socket's key, which must cost more than opening the file with the guess (its own KDF), for
    the costliest profile, "server" (benchmarks/socket_kdf.py measures all three)."""
    CitadelSessionStore(db_path, KEY, argon2_profile="server").close()

    def fastest(attempt: object) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            attempt()  # type: ignore[operator]
            times.append(time.perf_counter() - started)
        return min(times)

    def open_file() -> None:
        import citadeldb

        citadeldb.connect(str(db_path), key=KEY).close()

    def derive() -> None:
        SocketKey(Secret(b"a guess"), str(db_path)).derive(os.urandom(32))

    assert fastest(derive) > fastest(open_file)


def test_slow_and_idle_peers_cannot_hold_the_owner(db_path: Path) -> None:
    """Peers that trickle a byte at a time or say nothing are dropped when the handshake's one
    deadline passes (5 s for all of it), at most 4 of one process wait at once (the others are told
    the owner is busy, and nothing else), and the owner keeps serving."""
    owner = Service(db_path)
    peers: list[socket.socket] = []
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            session = client.session("alice")
            started = time.monotonic()
            for _ in range(80):
                peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                peer.connect(_address(db_path))
                peers.append(peer)
            time.sleep(0.5)
            status = Path(f"/proc/{owner.pid}/status").read_text().splitlines()
            threads = int(next(line for line in status if line.startswith("Threads:")).split()[1])
            assert threads < 32 + 10, f"{threads} threads for 80 peers"
            # The first ten trickle a valid hello's first bytes, one a second: each read would
            # wait 5 s for the next byte, but the handshake's deadline is for all of it.
            hello = (38).to_bytes(4, "big") + b"CDLS" + VERSION.to_bytes(2, "big")
            for second in range(6):
                for peer in peers[:10]:
                    with contextlib.suppress(OSError):
                        peer.send(hello[second : second + 1])
                asyncio.run(session.add_items(items("served through the flood")))  # a client goes on
                time.sleep(1.0)
            busy = b"CDLS" + VERSION.to_bytes(2, "big") + b"busy"  # to those past the caps, no more
            for peer in peers:
                peer.settimeout(max(0.1, started + 8.0 - time.monotonic()))
                with contextlib.suppress(ConnectionResetError):
                    sent = peer.recv(64, socket.MSG_WAITALL)
                    assert sent in (b"", len(busy).to_bytes(4, "big") + busy), "the owner sent a peer " + (
                        "that never proved itself something"
                    )
            assert time.monotonic() - started < 9.0, "a peer was kept past the handshake's deadline"
        with CitadelSessionStore(db_path, KEY) as late:  # and a new client gets in
            assert len(asyncio.run(late.session("alice").get_items())) == 6
    finally:
        for peer in peers:
            peer.close()
        log = owner.stop()
    # Refusals are logged ten a minute, then counted: a flood does not flood the log.
    assert 1 <= log.count("refused a peer") <= 11, log
    assert log.count("turned away a peer") <= 11, log  # those past the caps: a limit of their own


def test_a_silent_peer_holding_the_lock_fails_a_client_within_the_bound(
    db_path: Path, attackers: list[Attacker], monkeypatch: pytest.MonkeyPatch
) -> None:
    CitadelSessionStore(db_path, KEY, argon2_profile="iot").close()
    attackers.append(Attacker("silent", str(db_path), _address(db_path)))
    monkeypatch.setattr(client_module, "CONNECT_SECONDS", 1.0)
    started = time.monotonic()
    with pytest.raises(StorageError, match="did not complete the handshake within 1 s"):
        CitadelSessionStore(db_path, KEY)
    assert time.monotonic() - started < 5.0


def stop_every_thread(pid: int) -> None:
    """SIGSTOP `pid` and wait until each of its threads has stopped.

    kill() returns before the group stop completes (0.3-4 ms here): a call sent at once
    can still be answered by a thread that has not stopped yet (seen in CI).
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10.0
    tasks = Path(f"/proc/{pid}/task")
    while True:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that has just exited
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if all(state in "Tt" for state in states):
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop: {states}"
        time.sleep(0.001)


def test_a_stopped_owner_fails_a_call_and_an_open_within_the_bound(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = Service(db_path)
    try:
        with CitadelSessionStore(db_path, KEY) as client:
            session = client.session("alice")
            asyncio.run(session.add_items(items("before the stop")))
            monkeypatch.setattr(client_module, "SILENCE_SECONDS", 2.0)
            monkeypatch.setattr(client_module, "CONNECT_SECONDS", 1.0)
            stop_every_thread(owner.pid)
            started = time.monotonic()
            with pytest.raises(StorageError, match=f"process {owner.pid}, which holds .* has not answered"):
                asyncio.run(session.get_items())
            assert time.monotonic() - started < 6.0
            started = time.monotonic()
            with pytest.raises(StorageError, match="did not complete the handshake"):
                CitadelSessionStore(db_path, KEY)
            assert time.monotonic() - started < 5.0
            os.kill(owner.pid, signal.SIGCONT)
            assert asyncio.run(session.get_items()) == items("before the stop")
    finally:
        os.kill(owner.pid, signal.SIGCONT)
        owner.stop()


def test_socket_names_do_not_reveal_the_database_path(db_path: Path) -> None:
    """The names every user can list (/proc/net/unix) are keyed by a secret of this user's."""
    name = Path(_address(db_path)).stem
    unsalted = hashlib.sha256(str(db_path.resolve()).encode()).hexdigest()[:32]
    assert name != unsalted and len(name) == 32
    secret = Path(_address(db_path)).parent / "names.key"
    assert secret.stat().st_mode & 0o777 == 0o600


def test_another_users_squat_in_tmp_cannot_stop_this_users_store_or_erasure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old runtime directory's name, /tmp/citadeldb-openai-agents-<uid>, taken first by another
    user as a directory, a symlink or a plain file (sticky /tmp: this user cannot remove it).
    One test for the three forms: they share the one name, so they cannot run side by side."""
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another user (as that user would)")
    squat = Path(f"/tmp/citadeldb-openai-agents-{os.getuid()}")
    if squat.exists() or squat.is_symlink():
        pytest.skip(f"{squat} exists already: not this test's to replace")
    for form in ("directory", "symlink", "file"):
        squatted(tmp_path / form / "agent.cdl", squat, form, monkeypatch)


def squatted(db_path: Path, squat: Path, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    db_path.parent.mkdir()
    if form == "directory":
        squat.mkdir(mode=0o777)
    elif form == "symlink":
        squat.symlink_to("/")
    else:
        squat.write_text("squat")
    os.lchown(squat, 65534, 65534)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    try:
        for serve in (True, False):
            with CitadelSessionStore(db_path, KEY, argon2_profile="iot", serve=serve) as store:
                asyncio.run(store.session(f"s-{serve}").add_items(items("to erase")))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_") and k != "XDG_RUNTIME_DIR"}
        env.update(CITADEL_PATH=str(db_path), CITADEL_KEY=KEY)
        command = [sys.executable, "-m", "citadeldb_openai_agents"]
        for serving, session_id in (("true", "s-True"), ("false", "s-False")):
            env["CITADEL_SERVE"] = serving
            listed = subprocess.run([*command, "sessions"], env=env, capture_output=True, text=True)
            assert listed.returncode == 0 and session_id in listed.stdout, listed.stderr
            erased = subprocess.run(
                [*command, "erase", session_id, "--yes"], env=env, capture_output=True, text=True
            )
            assert erased.returncode == 0, erased.stderr
        with CitadelSessionStore(db_path, KEY) as store:
            assert store.session_ids() == []
    finally:
        if squat.is_dir() and not squat.is_symlink():
            squat.rmdir()
        else:
            squat.unlink()


def test_a_store_that_does_not_serve_never_touches_the_runtime_directory(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no private directory can be had, a store kept to one process still opens and erases."""
    from citadeldb_openai_agents.serving import address

    def unusable() -> Path:
        raise AssertionError("serve = false looked for the runtime directory")

    monkeypatch.setattr(address, "runtime_directory", unusable)
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot", serve=False) as store:
        asyncio.run(store.session("alice").add_items(items("hello")))
        receipt = store.erase_session("alice")
        assert (receipt.items_erased, receipt.readback_confirmed, store.session_ids()) == (1, True, [])


def test_a_sigkilled_serve_false_owner_leaves_no_refusal_behind(db_path: Path) -> None:
    alone = Service(db_path, serve=False)
    alone.kill()
    with CitadelSessionStore(db_path, KEY) as owner:
        assert owner.served_by is None
        second = Service(db_path)  # a client of this owner, not refused as "serve = false"
        assert second.ask("count alice") == "0"
        second.stop()
