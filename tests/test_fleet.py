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
import importlib.util
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, shard_for

ROOT = Path(__file__).resolve().parent.parent
SHARDS = ["a", "b", "c"]
SESSIONS = [f"user-{n}" for n in range(24)]

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (.ci/run installs it)"
)


@contextmanager
def running_fleet(tmp_path: Path, port: int, workers: int = 2) -> Iterator[str]:
    """examples/fleet/run.py's fleet of SHARDS on `port`, until SIGTERM (its group SIGKILLed if it
    hangs); yields the bearer token its app wants."""
    command = [sys.executable, str(ROOT / "examples" / "fleet" / "run.py"), "--shards", ",".join(SHARDS)]
    command += ["--port", str(port), "--dir", str(tmp_path), "--argon2-profile", "iot"]
    command += ["--workers", str(workers)]
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
        yield (tmp_path / "token").read_text().strip()
    finally:
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(timeout=30)
        finally:
            if fleet.poll() is None:
                os.killpg(fleet.pid, signal.SIGKILL)


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


def turn(port: int, session_id: str, text: str, token: str) -> tuple[int, dict[str, object]]:
    return post(port, json.dumps({"session_id": session_id, "text": text}).encode(), token)


def post(port: int, body: bytes, token: str | None) -> tuple[int, dict[str, object]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    connection.request("POST", "/turn", body, headers)
    response = connection.getresponse()
    body = response.read()
    try:
        return response.status, json.loads(body)
    except ValueError:
        return response.status, {"html": body.decode(errors="replace")[:80]}


def turns(
    port: int, session_ids: list[str], text: str, token: str
) -> dict[str, tuple[int, dict[str, object]]]:
    with ThreadPoolExecutor(8) as pool:
        return dict(
            zip(session_ids, pool.map(lambda s: turn(port, s, text, token), session_ids), strict=True)
        )


# How long a wait for the fleet's processes may take before the test fails instead of hanging:
# a SIGKILLed shard's port refused 0.15 s after the kill at most under load, and every session had
# a turn answered within 1.0 s, before and after --add (benchmarks/suite_under_load.py, 2026-12-08).
WAIT_SECONDS = 60


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Until `condition()`, polled (another process's state: no event crosses to this one)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_SECONDS} s for {what}"
        time.sleep(0.05)


def refused(port: int) -> Callable[[], bool]:
    """Whether nothing listens on `port` (every process holding the socket has gone)."""

    def check() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        except TimeoutError:  # not answered within the second: asked again
            return False
        return False

    return check


def session_ids_in(path: Path, key: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        with CitadelSessionStore(path, key, argon2_profile="iot") as store:
            return {s: len(await store.session(s).get_items()) for s in store.session_ids()}

    return asyncio.run(read())


def questions_in(path: Path, key: str) -> dict[str, list[tuple[str, bool]]]:
    """Each session's user messages, in order, as the file holds them, each with whether a reply follows.

    The SDK stores a turn's question before the model answers: a turn refused between the two
    (a ring change begun meanwhile) leaves its question alone, and its request failed.
    """

    async def read() -> dict[str, list[tuple[str, bool]]]:
        found = {}
        with CitadelSessionStore(path, key, argon2_profile="iot") as store:
            for session_id in store.session_ids():
                items = await store.session(session_id).get_items()
                found[session_id] = [
                    (str(item["content"]), items[n + 1 : n + 2] != [] and items[n + 1]["role"] == "assistant")
                    for n, item in enumerate(items)
                    if item["role"] == "user"
                ]
        return found

    return asyncio.run(read())


def test_three_shards_behind_nginx_keep_each_session_on_its_shard_and_a_dead_shard_fails_only_its_own(
    tmp_path: Path,
) -> None:
    port = free_ports(len(SHARDS) + 1)
    with running_fleet(tmp_path, port) as token:
        home = {session_id: shard_for(session_id, SHARDS) for session_id in SESSIONS}
        assert set(home.values()) == set(SHARDS)
        for number in (1, 2):
            answers = turns(port, SESSIONS, f"turn {number}", token)
            assert {s: (status, body.get("items")) for s, (status, body) in answers.items()} == {
                s: (200, 2 * number) for s in SESSIONS
            }
        os.kill(int((tmp_path / "b" / "pids").read_text().split()[0]), signal.SIGKILL)  # its master
        for pid in (tmp_path / "b" / "pids").read_text().split()[1:]:
            os.kill(int(pid), signal.SIGKILL)
        # Dead once its port refuses: a request nginx had already sent it, for any session,
        # fails with a 502 (nginx never sends a POST twice), and the client retries it.
        wait_for(refused(port + 1 + SHARDS.index("b")), "the killed shard's port to refuse connections")
        answers = turns(port, SESSIONS, "turn 3", token)
        for session_id, (status, body) in answers.items():
            if home[session_id] == "b":
                assert status >= 500, (session_id, status, body)  # never a 200 from another file
            else:
                assert (status, body.get("items")) == (200, 6), (session_id, status, body)
    for shard in SHARDS:
        key = (tmp_path / shard / "citadel.key").read_text().strip()
        held = session_ids_in(tmp_path / shard / "agent.cdl", key)
        mine = {s: 4 if shard == "b" else 6 for s in SESSIONS if home[s] == shard}
        assert held == mine, shard


def test_one_worker_per_shard_is_ready_and_the_app_refuses_what_it_must_not_serve(tmp_path: Path) -> None:
    port = free_ports(len(SHARDS) + 1)
    with running_fleet(tmp_path, port, workers=1) as token:
        assert turn(port, "user-1", "hello", token)[0] == 200
        refused_without = post(port, json.dumps({"session_id": "user-1", "text": "hi"}).encode(), None)
        assert refused_without == (401, {"error": "a bearer token is required"})
        assert post(port, b'{"session_id": "user-1", "text": "hi"}', "not-the-token")[0] == 401
        nested = post(port, b"[" * 30_000 + b"]" * 30_000, token)
        assert nested == (400, {"error": "the JSON body is nested too deeply"})
        oversized = post(port, json.dumps({"session_id": "user-1", "text": "x" * 70_000}).encode(), token)
        assert oversized == (400, {"error": "the body is over 65536 bytes"})  # the router's, as the app's
        # Each shard records its erasures in its own ledger, and an erasure through the CLI reaches it.
        shard = shard_for("user-1", SHARDS)
        config = tmp_path / shard / "citadel.toml"
        assert f'erasure_ledger = "{tmp_path / shard / "erasures.ledger"}"' in config.read_text()
        erased = subprocess.run(
            [
                sys.executable,
                "-m",
                "citadeldb_openai_agents",
                "erase",
                "user-1",
                "--yes",
                "--config",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert erased.returncode == 0, erased.stderr
        assert f"#1 in {tmp_path / shard / 'erasures.ledger'}" in erased.stdout
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600


def scraped(target: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A Prometheus endpoint's samples, by name and labels (the text format, parsed)."""
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        parsed = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if parsed is None or line.startswith("#"):
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', parsed[2] or ""))
        found[(parsed[1], labels)] = float(parsed[3])
    return found


def summed(
    samples: list[dict[tuple[str, frozenset[tuple[str, str]]], float]], name: str, **labels: str
) -> float:
    return sum(
        value
        for scrape in samples
        for (metric, found), value in scrape.items()
        if metric == name and set(labels.items()) <= found
    )


@pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter.prometheus") is None,
    reason="the fleet exposes metrics with opentelemetry-exporter-prometheus (the test extra)",
)
def test_each_process_of_a_shard_exposes_its_metrics_and_a_shards_sum_counts_each_write_once(
    tmp_path: Path,
) -> None:
    """Two workers per shard, one the file's owner and one its client: each exposes its own series
    (its file_sd target), the owner counts the file's writes, each counts its own calls."""
    port = free_ports(len(SHARDS) + 1)
    with running_fleet(tmp_path, port) as token:
        home = {session_id: shard_for(session_id, SHARDS) for session_id in SESSIONS}
        for number in (1, 2):
            answers = turns(port, SESSIONS, f"turn {number}", token)
            assert all(status == 200 for status, _ in answers.values()), answers
        targets = [json.loads(path.read_text())[0] for path in sorted((tmp_path / "metrics").glob("*.json"))]
        assert sorted(t["labels"]["shard"] for t in targets) == sorted(SHARDS * 2)  # two processes a shard
        config = (tmp_path / "prometheus.yml").read_text()
        assert f"files: ['{tmp_path / 'metrics'}/*.json']" in config
        for shard in SHARDS:
            samples = [scraped(t["targets"][0]) for t in targets if t["labels"]["shard"] == shard]
            path = str((tmp_path / shard / "agent.cdl").resolve())
            held = sum(1 for s in SESSIONS if home[s] == shard)
            # Two turns of two items for each of its sessions: written once, by the owner alone.
            assert summed(samples, "citadel_items_written_total", db_namespace=path) == 4 * held, shard
            writers = [s for s in samples if summed([s], "citadel_items_written_total")]
            assert len(writers) == 1, "only the process that owns the file counts its writes"
            timed = summed(
                samples, "db_client_operation_duration_seconds_count", db_operation_name="get_items"
            )
            assert timed >= 2 * held, shard  # every process times its own calls, client and owner
    assert not list((tmp_path / "metrics").glob("*.json")), "a stopped process leaves its target behind"


# The long tier: 37 s of the main run's 390 (tests/test_ring_change.py makes the same change on files
# no server holds, in the main run).
@pytest.mark.slow
@pytest.mark.parametrize("ledger", ["per shard", "fleet-wide"])
def test_a_shard_added_under_load_takes_its_sessions_whole_and_only_they_are_refused_while_they_move(
    tmp_path: Path, ledger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if ledger == "fleet-wide":  # every shard's erasures in one ledger, as CITADEL_ERASURE_LEDGER says
        monkeypatch.setenv("CITADEL_ERASURE_LEDGER", str(tmp_path / "fleet.ledger"))
    port = free_ports(len(SHARDS) + 2)
    new = [*SHARDS, "d"]
    moving = {s for s in SESSIONS if shard_for(s, new) != shard_for(s, SHARDS)}
    assert moving and all(shard_for(s, new) == "d" for s in moving)
    # Each turn: its session, text and status, when it was sent and when it was answered.
    results: list[tuple[str, str, int, float, float]] = []
    stop = threading.Event()

    def client(mine: list[str]) -> None:
        for number in itertools.count():
            for session_id in mine:
                if stop.is_set():
                    return
                sent = time.monotonic()
                status, _ = turn(port, session_id, f"{session_id} turn {number}", token)
                results.append((session_id, f"{session_id} turn {number}", status, sent, time.monotonic()))

    def answered(sessions: set[str], after: float = 0.0) -> Callable[[], bool]:
        """Whether each of `sessions` has had a turn sent after `after` answered 200."""
        return lambda: (
            sessions <= {s for s, _, status, sent, _ in list(results) if status == 200 and sent > after}
        )

    with running_fleet(tmp_path, port) as token:
        clients = [threading.Thread(target=client, args=(SESSIONS[n::4],)) for n in range(4)]
        for thread in clients:
            thread.start()
        wait_for(answered(set(SESSIONS)), "a turn of every session answered before the change")
        begun = time.monotonic()
        add = [
            sys.executable,
            str(ROOT / "examples" / "fleet" / "run.py"),
            "--dir",
            str(tmp_path),
            "--add",
            "d",
        ]
        # 38 s at most (29 s under load, benchmarks/suite_under_load.py, 2026-12-08): 10x+ that.
        added = subprocess.run(add, capture_output=True, text=True, timeout=600)
        finished = time.monotonic()
        wait_for(answered(moving, after=finished), "a turn of each moved session answered after the change")
        stop.set()
        for thread in clients:
            thread.join(timeout=120)
    assert added.returncode == 0, added.stderr
    print(
        f"\nadd under load: {added.stdout.strip()} in {finished - begun:.1f} s; "
        f"{sum(r[2] == 200 for r in results)} turns answered 200, "
        f"{sum(r[2] != 200 for r in results)} refused (each a turn of one of the {len(moving)} moving sessions)"
    )
    moved_before = {s for s, _, status, _, done in results if status == 200 and done < begun and s in moving}
    count = int(added.stdout.split("moved ")[1].split()[0])
    assert added.stdout.strip() == f"added d: moved {count} sessions"
    # Each move's erasure at its old shard is in the ledger: one entry per session moved.
    ledgers = (
        [tmp_path / "fleet.ledger"]
        if ledger == "fleet-wide"
        else [tmp_path / s / "erasures.ledger" for s in SHARDS]
    )
    assert sum(len(path.read_text().splitlines()) for path in ledgers if path.exists()) == count
    assert len(moved_before) <= count <= len(moving)
    # Refused: only the moving sessions, only while --add ran, and only as "moving, retry" (503).
    # A refused turn was under way while --add ran: sent before it ended, answered after it began.
    refusals = [(s, status, sent, done) for s, _, status, sent, done in results if status != 200]
    assert refusals, "no turn met the change: the load did not overlap it"
    assert all(
        s in moving and status == 503 and sent <= finished and done >= begun
        for s, status, sent, done in refusals
    ), refusals
    assert answered(moving, after=finished)(), "a moved session was not served after the change"
    # Every session in one file, the one the new ring names; every acknowledged turn in it once, in order.
    held: dict[str, dict[str, list[str]]] = {}
    for shard in new:
        key = (tmp_path / shard / "citadel.key").read_text().strip()
        held[shard] = questions_in(tmp_path / shard / "agent.cdl", key)
    for session_id in SESSIONS:
        homes = [shard for shard in new if session_id in held[shard]]
        assert homes == [shard_for(session_id, new)], (session_id, homes)
        acknowledged = [text for s, text, status, *_ in results if s == session_id and status == 200]
        refused_texts = {text for s, text, status, *_ in results if s == session_id and status != 200}
        stored = held[homes[0]][session_id]
        assert [text for text, answered in stored if text in acknowledged and answered] == acknowledged, (
            session_id
        )
        assert all(text in refused_texts for text, _ in stored if text not in acknowledged), session_id
        assert len({text for text, _ in stored}) == len(stored), session_id  # none twice
