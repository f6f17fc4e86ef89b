"""What a key command or a key file can do to the process that reads it (issue 59's retest).

A failing command may echo its secret on its standard error, print without end, or leave a
daemon behind; a key file may be a FIFO nothing writes to, or a device. Each is bounded, and
no secret reaches a message.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

from citadeldb_openai_agents.config import keyfile
from citadeldb_openai_agents.config.keycommand import run_key_command
from citadeldb_openai_agents.config.keyfile import read_key_file

SECRET = "s3cret-passphrase-from-the-vault"


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o700)
    return path


def refused(argv: list[str], timeout: float = 10.0) -> str:
    with pytest.raises(ValueError) as caught:
        run_key_command(argv, timeout)
    return str(caught.value)


def test_a_failing_command_that_echoes_its_output_on_stderr_is_quoted_without_it(tmp_path: Path) -> None:
    tool = script(tmp_path / "vault", f'echo "{SECRET}"\necho "vault: token {SECRET} rejected" >&2\nexit 2\n')
    message = refused([str(tool)])
    assert "failed with exit status 2" in message
    assert "vault: token [its output, left out] rejected" in message
    assert SECRET not in message


def test_a_command_that_prints_without_end_is_stopped_at_the_limit(tmp_path: Path) -> None:
    started = time.monotonic()
    message = refused(["yes"], timeout=60.0)
    assert "printed more than 64 KiB and was stopped" in message
    # Stopped at the limit, not at the timeout: `yes` fills 64 KiB in milliseconds.
    assert time.monotonic() - started < 60.0 / 2


def pid_state(pid: int) -> str | None:
    """The process's state letter, None once it is gone (a zombie reparented here shows Z)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_what_a_command_leaves_running_is_ended_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    tool = script(
        tmp_path / "tool", f'sleep 300 > /dev/null 2>&1 &\necho $! > "{pid_file}"\necho "{SECRET}"\n'
    )
    passphrase, _ = run_key_command([str(tool)])
    assert passphrase == SECRET
    daemon = int(pid_file.read_text())
    deadline = time.monotonic() + 30  # SIGKILL is delivered in milliseconds; 30 s is for a loaded machine
    while pid_state(daemon) not in (None, "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pid_state(daemon) in (None, "Z", "X"), "the command's background child is still running"


def test_a_fifo_key_file_is_read_with_a_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyfile, "PIPE_SECONDS", 0.5)
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo, 0o600)
    # No writer at all: the open no longer blocks for ever (before the fix it did); it is waited on.
    with pytest.raises(ValueError, match=r"is a pipe that nothing was written to within 0\.5 s"):
        read_key_file(fifo)
    # A writer that writes nothing: waited on for PIPE_SECONDS, then refused.
    opened = threading.Event()
    release = threading.Event()

    def silent_writer() -> None:
        descriptor = os.open(fifo, os.O_WRONLY)
        opened.set()
        release.wait(30)
        os.close(descriptor)

    writer = threading.Thread(target=silent_writer)
    writer.start()
    try:
        while not opened.is_set():
            with contextlib.suppress(OSError):  # the writer's open waits for a reader: give it one
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            opened.wait(0.01)
        with pytest.raises(ValueError, match=r"is a pipe that nothing was written to within 0\.5 s"):
            read_key_file(fifo)
    finally:
        release.set()
        writer.join(30)
    # A pipe written at once (bash's <(pass show agent)) is read as a file is.
    read, write = os.pipe()
    os.write(write, (SECRET + "\n").encode())
    os.close(write)
    try:
        assert read_key_file(f"/proc/self/fd/{read}") == SECRET
    finally:
        os.close(read)


def test_a_key_file_larger_than_a_passphrase_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="holds more than 64 KiB"):
        read_key_file("/dev/zero")
    big = tmp_path / "big.key"
    big.write_bytes(b"x" * (65 * 1024))
    big.chmod(0o600)
    with pytest.raises(ValueError, match="holds more than 64 KiB"):
        read_key_file(big)
