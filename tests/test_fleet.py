"""A fleet behind a real nginx (examples/fleet): each session on one shard, a dead shard's sessions fail.

examples/fleet/run.py starts three shards (uvicorn, two workers each, one file each, the
ring in their citadel.toml) behind nginx on 127.0.0.1, as a user starts it. Turns go
through nginx to every session; the shard that does not hold a session answers 421 with
its owner and nginx sends the request there. Then one shard's processes are SIGKILLed,
with nginx's default retry: its sessions get a 5xx, never a 200 from an empty history,
and every other session goes on. Last, each shard's file is opened: it holds exactly the
sessions `shard_for` names, each whole.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, shard_for

ROOT = Path(__file__).resolve().parent.parent
SHARDS = ["a", "b", "c"]
SESSIONS = [f"user-{n}" for n in range(24)]

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (.ci/run installs it)"
)


def free_ports(count: int) -> int:
    """A base port with the `count` ports from it free on 127.0.0.1."""
    for _ in range(100):
        base = random.randrange(20000, 40000)
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free ports")


def turn(port: int, session_id: str, text: str) -> tuple[int, dict[str, object]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/turn", json.dumps({"session_id": session_id, "text": text}))
    response = connection.getresponse()
    body = response.read()
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, {"html": body.decode(errors="replace")[:80]}


def turns(port: int, session_ids: list[str], text: str) -> dict[str, tuple[int, dict[str, object]]]:
    with ThreadPoolExecutor(8) as pool:
        return dict(zip(session_ids, pool.map(lambda s: turn(port, s, text), session_ids), strict=True))


def refused(port: int) -> None:
    """Until nothing listens on `port` (every process holding the socket has gone)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return
        time.sleep(0.05)
    raise AssertionError(f"port {port} still accepts connections")


def session_ids_in(path: Path, key: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        with CitadelSessionStore(path, key, argon2_profile="iot") as store:
            return {s: len(await store.session(s).get_items()) for s in store.session_ids()}

    return asyncio.run(read())


def test_three_shards_behind_nginx_keep_each_session_on_its_shard_and_a_dead_shard_fails_only_its_own(
    tmp_path: Path,
) -> None:
    port = free_ports(len(SHARDS) + 1)
    command = [sys.executable, str(ROOT / "examples" / "fleet" / "run.py"), "--shards", ",".join(SHARDS)]
    command += ["--port", str(port), "--dir", str(tmp_path), "--argon2-profile", "iot"]
    fleet = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert fleet.stdout is not None
        assert fleet.stdout.readline().strip() == "ready", (tmp_path / "nginx.log").read_text()
        home = {session_id: shard_for(session_id, SHARDS) for session_id in SESSIONS}
        assert set(home.values()) == set(SHARDS)
        for number in (1, 2):
            answers = turns(port, SESSIONS, f"turn {number}")
            assert {s: (status, body.get("items")) for s, (status, body) in answers.items()} == {
                s: (200, 2 * number) for s in SESSIONS
            }
        os.kill(int((tmp_path / "b" / "pids").read_text().split()[0]), signal.SIGKILL)  # its master
        for pid in (tmp_path / "b" / "pids").read_text().split()[1:]:
            os.kill(int(pid), signal.SIGKILL)
        # Dead once its port refuses: a request nginx had already sent it, for any session,
        # fails with a 502 (nginx never sends a POST twice), and the client retries it.
        refused(port + 1 + SHARDS.index("b"))
        answers = turns(port, SESSIONS, "turn 3")
        for session_id, (status, body) in answers.items():
            if home[session_id] == "b":
                assert status >= 500, (session_id, status, body)  # never a 200 from another file
            else:
                assert (status, body.get("items")) == (200, 6), (session_id, status, body)
    finally:
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(timeout=30)
        finally:
            if fleet.poll() is None:
                os.killpg(fleet.pid, signal.SIGKILL)
    for shard in SHARDS:
        key = (tmp_path / shard / "citadel.key").read_text().strip()
        held = session_ids_in(tmp_path / shard / "agent.cdl", key)
        mine = {s: 4 if shard == "b" else 6 for s in SESSIONS if home[s] == shard}
        assert held == mine, shard
