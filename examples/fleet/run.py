"""Start a fleet on this machine: one uvicorn server per shard behind nginx, on 127.0.0.1.

    python examples/fleet/run.py --shards a,b,c --port 8800 --dir /tmp/fleet
    python examples/fleet/run.py --dir /tmp/fleet --add d     # beside the running fleet

Each shard runs app.py under ``uvicorn --workers 2`` on port PORT+1, PORT+2, ..., in
DIR/<name>/, with its settings in DIR/<name>/citadel.toml (its file, its key file, the
fleet's ring file DIR/ring.toml and its ``shard``) and its passphrase in
DIR/<name>/citadel.key (a new random one, mode 600, unless the file exists). nginx
(nginx.conf.template) listens on 127.0.0.1:PORT. The process ids of each shard (uvicorn's
master, then its workers) are in DIR/<name>/pids, one a line. Each shard records its
erasures in its own ledger, DIR/<name>/erasures.ledger (a fleet-wide CITADEL_ERASURE_LEDGER in
the environment takes its place for every shard: one ledger shared by the shards' files).
Requests to ``/turn`` need ``Authorization: Bearer TOKEN``, the token in DIR/token (a new
random one, mode 600, unless the file exists). With the OpenTelemetry SDK and its Prometheus
exporter installed, every process of every shard exposes its metrics on a port of its own, its
target in DIR/metrics/SHARD-PID.json; DIR/prometheus.yml scrapes them all. Prints ``ready`` once every
shard answers through nginx, and stops everything on SIGTERM or Ctrl-C (each shard's store
closes in its lifespan), shards added since included.

``--add NAME`` changes the ring of the running fleet as docs/deployment.md ("Changing the
ring") says: ``ring --begin`` (the sessions that move are refused, 503, on every shard), the
new shard started and added to nginx (``nginx -s reload``), ``rebalance`` on each old shard,
``ring --finish``; then it prints ``added NAME: moved K sessions`` and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", help="the shards' names, comma-separated")
    parser.add_argument("--port", type=int, help="nginx's port; the shards' follow it")
    parser.add_argument("--dir", type=Path, required=True, help="where each shard's directory goes")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers per shard")
    parser.add_argument("--argon2-profile", help="the key-derivation cost of new files (iot for tests)")
    parser.add_argument("--add", metavar="NAME", help="add a shard to the fleet running in --dir")
    args = parser.parse_args()
    root = args.dir.resolve()
    if args.add:
        return _add(root, args.add)
    if not args.shards or not args.port:
        parser.error("--shards and --port start a fleet (or --add NAME adds a shard to one)")
    names = [name.strip() for name in args.shards.split(",")]
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    started: list[subprocess.Popen[bytes]] = []
    try:
        ports = {name: args.port + 1 + number for number, name in enumerate(names)}
        root.mkdir(parents=True, exist_ok=True)
        (root / "ring.toml").write_text(f"shards = [{', '.join(map(json.dumps, names))}]\n")
        _write_prometheus_config(root)
        _private(root / "token")
        fleet = {"port": args.port, "ports": ports, "workers": args.workers, "profile": args.argon2_profile}
        (root / "fleet.json").write_text(json.dumps(fleet))
        for name in names:
            started.append(_start_shard(root, name, ports[name], fleet))
        started.append(_start_nginx(root, args.port, ports))
        for name, server in zip(names, started, strict=False):
            _wait_for(args.port, name, [server, started[-1]], args.workers, root / name / "pids", stopping)
        print("ready", flush=True)
        stopping.wait()
    finally:
        _stop(started)
        _stop_added(root, names)
    return 0


def _add(root: Path, name: str) -> int:
    """Add shard `name` to the fleet running in `root`, moving the sessions the new ring gives it."""
    fleet = json.loads((root / "fleet.json").read_text())
    old = list(fleet["ports"])
    if name in old:
        raise SystemExit(f"shard {name} is in the fleet already")
    configs = [arg for shard in old for arg in ("--shard-config", f"{shard}={root / shard / 'citadel.toml'}")]
    _library(root / old[0], "ring", "--begin", ",".join([*old, name]))
    fleet["ports"][name] = max(fleet["ports"].values()) + 1
    server = _start_shard(root, name, fleet["ports"][name], fleet)
    _write_nginx_conf(root, fleet["port"], fleet["ports"])
    reload = ["nginx", "-p", str(root), "-c", str(root / "nginx.conf"), "-s", "reload"]
    subprocess.run(reload, check=True, capture_output=True)  # graceful: requests under way finish
    _wait_for(fleet["port"], name, [server], fleet["workers"], root / name / "pids", threading.Event())
    (root / "fleet.json").write_text(json.dumps(fleet))
    moved = 0
    for shard in old:
        report = _library(
            root / shard, "rebalance", "--shard-config", f"{name}={root / name / 'citadel.toml'}"
        )
        moved += int(report.splitlines()[-1].split()[1])  # "moved K sessions from shard X"
    _library(root / old[0], "ring", "--finish", *configs)
    print(f"added {name}: moved {moved} sessions", flush=True)
    return 0


def _library(directory: Path, *command: str) -> str:
    """A command of the library's CLI with the shard's configuration; its output (exit on failure)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "citadeldb_openai_agents",
            *command,
            "--config",
            str(directory / "citadel.toml"),
        ],
        capture_output=True,
        text=True,
        cwd=directory,
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:1])} on {directory.name} failed: {done.stderr.strip()}")
    return done.stdout


def _start_shard(root: Path, name: str, port: int, fleet: dict[str, Any]) -> subprocess.Popen[bytes]:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    key = _private(directory / "citadel.key")
    profile = f'argon2_profile = "{fleet["profile"]}"\n' if fleet["profile"] else ""
    (directory / "citadel.toml").write_text(
        f'path = "{directory / "agent.cdl"}"\nkey_file = "{key}"\nring_file = "{root / "ring.toml"}"\n'
        f'shard = "{name}"\nerasure_ledger = "{directory / "erasures.ledger"}"\n{profile}'
    )
    (root / "metrics").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "CITADEL_CONFIG": str(directory / "citadel.toml"),
        "FLEET_TOKEN_FILE": str(root / "token"),
        "FLEET_METRICS_DIR": str(root / "metrics"),  # each process's Prometheus target (app.py)
    }
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", str(fleet["workers"]), "--no-access-log", "app:app"]
    log = open(directory / "server.log", "ab")  # noqa: SIM115 (the server's, for its life)
    return subprocess.Popen(command, cwd=directory, env=env, stdout=log, stderr=log, start_new_session=True)


def _write_prometheus_config(root: Path) -> None:
    """A Prometheus scrape configuration for this fleet: every process's target file in DIR/metrics."""
    (root / "prometheus.yml").write_text(
        "scrape_configs:\n"
        "  - job_name: agent-fleet\n"
        "    scrape_interval: 15s\n"
        "    file_sd_configs:\n"
        f"      - files: ['{root / 'metrics'}/*.json']\n"
        "        refresh_interval: 5s\n"
    )


def _private(path: Path) -> Path:
    """A secret file: a new random value, mode 600, unless it exists."""
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32) + "\n")
    return path


def _start_nginx(root: Path, port: int, ports: dict[str, int]) -> subprocess.Popen[bytes]:
    for part in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (root / "nginx-tmp" / part).mkdir(parents=True, exist_ok=True)
    _write_nginx_conf(root, port, ports)
    log = open(root / "nginx.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        ["nginx", "-p", str(root), "-c", str(root / "nginx.conf")],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def _write_nginx_conf(root: Path, port: int, ports: dict[str, int]) -> None:
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in ports.values())
    shards = "".join(
        f"\n    upstream shard_{name} {{\n        server 127.0.0.1:{p};\n    }}\n"
        for name, p in ports.items()
    )
    template = (HERE / "nginx.conf.template").read_text()
    # FLEET_NGINX_LOG: access log directives in place of `access_log off` (benchmarks/fleet.py).
    template = template.replace(
        "    access_log off;", os.environ.get("FLEET_NGINX_LOG", "    access_log off;")
    )
    conf = template.format(dir=root, port=port, servers=servers, shards=shards)
    (root / "nginx.conf").write_text(conf)


def _wait_for(
    port: int,
    name: str,
    needed: list[subprocess.Popen[bytes]],
    workers: int,
    pids: Path,
    stopping: threading.Event,
) -> None:
    """Until the shard answers through nginx and all its workers have started; then its pids file."""
    server = needed[0]
    deadline = time.monotonic() + 120
    while not stopping.is_set():
        for process in needed:
            if process.poll() is not None:
                raise SystemExit(f"{process.args[0]} exited: see {name}/server.log and nginx.log")
        children = _children(server.pid)
        # One worker: uvicorn serves in its own process, with no children.
        if len(children) >= (workers if workers > 1 else 0) and _healthy(port, name):
            pids.write_text("".join(f"{pid}\n" for pid in [server.pid, *children]))
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"shard {name} did not answer through nginx within 120 s")
        time.sleep(0.2)


def _healthy(port: int, name: str) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", f"/shards/{name}/health")
        return connection.getresponse().status == 200
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def _stop(started: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process group this script made (a graceful stop), SIGKILL after 15 s."""
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for process in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # workers a killed master left behind


def _stop_added(root: Path, names: list[str]) -> None:
    """Stop the shards `--add` started since (each uvicorn master leads its own process group)."""
    fleet = json.loads((root / "fleet.json").read_text())
    for name in fleet["ports"]:
        pids = root / name / "pids"
        if name in names or not pids.exists():
            continue
        master = int(pids.read_text().split()[0])
        with contextlib.suppress(OSError):
            if Path(f"/proc/{master}/cwd").resolve() == (root / name).resolve():  # still that shard
                os.killpg(master, signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
