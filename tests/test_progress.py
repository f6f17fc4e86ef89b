"""Long operations report progress: the library through a callback, the CLI as a bar on a terminal only."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, reembed

from conftest import KEY


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A closed file of five sessions, two of them with items that have expired."""
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot", ttl=0.05) as store:
        for n in range(2):
            asyncio.run(store.session(f"expiring-{n}").add_items([{"n": n}]))
    time.sleep(0.1)
    with CitadelSessionStore(path, KEY) as store:
        for n in range(3):
            # A segment takes batches until it holds 256 items: 260, then 40, make two.
            asyncio.run(store.session(f"kept-{n}").add_items([{"n": n}] * 260))
            asyncio.run(store.session(f"kept-{n}").add_items([{"n": n}] * 40))
    return path


def test_verify_and_purge_report_each_session(filled: Path) -> None:
    with CitadelSessionStore(filled, KEY) as store:
        seen: list[tuple[int, int]] = []
        assert store.verify(progress=lambda done, total: seen.append((done, total))).ok
        assert seen == [(n, 5) for n in range(1, 6)]
        seen.clear()
        assert store.purge_expired(progress=lambda done, total: seen.append((done, total))) == 2
        assert seen == [(n, 5) for n in range(1, 6)]


def test_backup_reports_the_bytes_copied_and_ends_at_the_total(filled: Path, tmp_path: Path) -> None:
    with CitadelSessionStore(filled, KEY) as store:
        seen: list[tuple[int, int]] = []
        written = store.backup(tmp_path / "copy.cdl", progress=lambda done, total: seen.append((done, total)))
    total = sum(os.path.getsize(name) for name in written)
    assert seen and seen[-1] == (seen[-1][1], seen[-1][1])
    assert seen[-1][1] == pytest.approx(total, rel=0.1)
    assert all(done <= of for done, of in seen)


def test_reembed_reports_each_region(filled: Path) -> None:
    import citadeldb

    seen: list[tuple[int, int]] = []
    summary = reembed(filled, KEY, citadeldb.MockEmbedder(dim=64), progress=lambda d, t: seen.append((d, t)))
    segments = summary.regions - 2  # the catalog and the layout record are re-embedded last
    assert seen == [(n, segments) for n in range(1, segments + 1)]


def run_with_stderr_on_a_terminal(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run a command whose stderr is a pseudo-terminal; return (exit code, stdout, what the terminal showed)."""
    terminal, command_end = pty.openpty()
    # A terminal of 24 rows and 80 columns: tqdm draws nothing on one without a size.
    fcntl.ioctl(command_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "citadeldb_openai_agents", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=command_end,
        stdin=subprocess.DEVNULL,
    )
    os.close(command_end)
    shown = b""
    try:
        while True:
            ready, _, _ = select.select([terminal], [], [], 60)
            assert ready, f"the command printed nothing for 60 s: {shown!r}"
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # the command closed the terminal: it ended
                break
            if not chunk:
                break
            shown += chunk
        out, _ = process.communicate(timeout=60)
    finally:
        os.close(terminal)
    return process.returncode, out.decode(), shown.decode(errors="replace")


@pytest.fixture
def environment(filled: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    return {**env, "CITADEL_PATH": str(filled), "CITADEL_KEY": KEY}


def test_verify_draws_a_bar_on_a_terminal(environment: dict[str, str]) -> None:
    code, out, shown = run_with_stderr_on_a_terminal("verify", env=environment)
    assert code == 0 and "OK: no damage or tampering found." in out
    assert "verifying" in shown and "5/5" in shown


def test_no_bar_when_stderr_is_not_a_terminal_or_the_output_is_json(environment: dict[str, str]) -> None:
    piped = subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", "verify"],
        env=environment,
        capture_output=True,
        text=True,
    )
    assert piped.returncode == 0 and piped.stderr == ""
    code, out, shown = run_with_stderr_on_a_terminal("verify", "--json", env=environment)
    assert code == 0 and '"ok": true' in out
    assert "verifying" not in shown


def test_export_reports_each_segment(filled: Path) -> None:
    with CitadelSessionStore(filled, KEY) as store:
        seen: list[tuple[int, int]] = []
        items = store.export("kept-0", progress=lambda done, total: seen.append((done, total)))
    assert len(items) == 300 and seen == [(1, 2), (2, 2)]
