"""Key commands: a passphrase printed by a program (``vault kv get``, ``op read``, ``pass show``,
``systemd-creds cat``), the ``key_command`` setting.

The command is an argument list run without a shell, its standard input /dev/null and its
standard error captured; the passphrase is its standard output minus one trailing newline,
as a key file's is read. A failure is told by the command, its exit status and the first
line of its standard error, never by a character of its standard output.
"""

from __future__ import annotations

import os
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from .keyfile import without_one_newline

DEFAULT_TIMEOUT = 10.0

# A stderr line quoted in an error is cut here: enough to say why, not a whole log.
_STDERR_SHOWN = 200
# A passphrase is a line: a command printing more than this is not printing one (`yes`).
OUTPUT_LIMIT = 64 * 1024


def command_argv(value: Any) -> list[str]:
    """`key_command` as an argument list: a list of strings as it is, a string split as a
    shell splits words (`shlex`; it is never run by a shell). Raises `ValueError`."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:  # an unclosed quote
            raise ValueError(f"cannot be split into words ({exc}); write it as a list of strings") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(word, str) for word in value):
        raise ValueError("must be a list of strings, the program then its arguments")
    if not value or not value[0]:
        raise ValueError('is empty; give the program then its arguments, e.g. ["vault", "kv", "get", ...]')
    return list(value)


def shown(argv: Sequence[str]) -> str:
    """The command as an operator would type it (its arguments are not secret, its output is)."""
    return shlex.join(argv)


def run_key_command(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> tuple[str, float]:
    """The passphrase `argv` prints, and how long it took to, in seconds.

    Raises `ValueError` naming the command, with its exit status and the first line of its
    standard error, when it cannot be started, exits non-zero, runs past `timeout` seconds,
    prints nothing, more than `OUTPUT_LIMIT` bytes, or what is not UTF-8. Its whole process group
    is ended once it is done, so nothing it started in the background stays. The message never
    holds its standard output: any line of it is taken out of the standard error quoted.
    """
    started = time.monotonic()
    outcome = _run(list(argv), timeout)
    failure = outcome if isinstance(outcome, str) else _failure(*outcome)
    if failure is not None:
        # Raised here, outside every handler: no exception context holds the command's output.
        raise ValueError(f"the key command {shown(argv)} {failure}")
    assert not isinstance(outcome, str)
    passphrase = without_one_newline(outcome[1].decode("utf-8"))
    del outcome  # the output's bytes: gone as soon as the passphrase is taken from them
    return passphrase, time.monotonic() - started


def _run(argv: list[str], timeout: float) -> tuple[int, bytes, bytes] | str:
    """The command's exit status, stdout and stderr; or why it did not run to its end."""
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Its own process group: what it started goes with it (a shell script's `sleep`,
            # which would otherwise hold the pipe open and the wait with it, or a daemon left behind).
            start_new_session=True,
        )
    except FileNotFoundError:
        return f"cannot be run: {argv[0]} was not found; install it, or give its absolute path in key_command"
    except PermissionError:
        return f"cannot be run: {argv[0]} is not executable by this user; check its mode (chmod +x)"
    except OSError as exc:
        return f"cannot be run: {exc.strerror}; correct key_command"
    with process:
        try:
            read = _read_both(process, time.monotonic() + timeout)
            if read is None:
                return _timed_out(timeout)
            if isinstance(read, str):
                return read
            process.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return _timed_out(timeout)
        finally:
            _kill_group(process)  # also when it exited: nothing it started outlives it
            process.wait()
    return process.returncode, *read


def _read_both(process: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes] | str | None:
    """Its stdout (at most `OUTPUT_LIMIT` bytes) and stderr (its first `OUTPUT_LIMIT` kept, the rest
    read and dropped, so the command never blocks on a full pipe), until both close; None when
    `deadline` passes first, why it was stopped when it printed too much."""
    assert process.stdout is not None and process.stderr is not None
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                kept: bytearray = key.data
                kept.extend(chunk[: max(0, OUTPUT_LIMIT + 1 - len(kept))])
                if len(out) > OUTPUT_LIMIT:
                    return (
                        f"printed more than {OUTPUT_LIMIT // 1024} KiB and was stopped; it must print "
                        "the passphrase alone"
                    )
    return bytes(out), bytes(err)


def _timed_out(timeout: float) -> str:
    return (
        f"did not finish within {timeout:g} s and was stopped; check that it can run without a "
        "prompt (its standard input is /dev/null), or raise key_command_timeout"
    )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (AttributeError, OSError):  # not POSIX, or the group is gone already
        process.kill()


def _failure(status: int, out: bytes, err: bytes) -> str | None:
    """Why a finished command gave no passphrase, in words without its output; None: it did."""
    said = _first_line(err, out)
    if status < 0:
        return f"was killed by signal {-status} ({_signal_name(-status)}){said}; run it by hand as this user to see why"
    if status != 0:
        return f"failed with exit status {status}{said}; run it by hand as this user to see why"
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        # The decoder's message quotes a byte of the output: not repeated.
        return "printed what is not UTF-8 text; it must print the passphrase as text"
    if not without_one_newline(text):
        return f"printed nothing (exit status 0){said}; it must print the passphrase"
    return None


def _first_line(err: bytes, out: bytes) -> str:
    """The first line of its stderr, with anything its stdout printed taken out: a failing tool
    may echo what it was about to print, or the secret it was given (`vault: token ... rejected`
    is told apart by the operator from the command, not from the token)."""
    lines = err.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        return ", and nothing on its standard error"
    line = lines[0].strip()
    for printed in sorted(set(out.decode("utf-8", "replace").splitlines()), key=len, reverse=True):
        if printed.strip():
            line = line.replace(printed.strip(), "[its output, left out]")
    cut = line[:_STDERR_SHOWN] + ("…" if len(line) > _STDERR_SHOWN else "")
    return f"; its standard error began: {cut}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
