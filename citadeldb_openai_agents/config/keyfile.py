"""Key files: how a passphrase is read from one.

One trailing newline is stripped (what ``echo`` and editors add) and every other
character kept, whitespace included: a passphrase may contain any of them.
"""

from __future__ import annotations

import os
import select
import stat
import time
import warnings
from pathlib import Path

from ..errors import ConfigurationWarning
from .taken import kept_variable, take_variable


def read_key_file(path: str | os.PathLike[str]) -> str:
    """The passphrase in `path`, one trailing newline stripped.

    Raises `ValueError` naming the path (never the content) when the file is
    missing, unreadable, larger than `KEY_FILE_LIMIT`, not UTF-8 or empty, or a pipe not
    written to within `PIPE_SECONDS`; warns (`ConfigurationWarning`) when group or others can
    read it.
    """
    path = Path(path).expanduser().absolute()
    try:
        data = _read_bounded(path)
    except FileNotFoundError:
        raise ValueError(
            f"the key file {path} does not exist; create it (chmod 600) or correct the path"
        ) from None
    except IsADirectoryError:
        raise ValueError(f"the key file {path} is a directory; point to the file inside it") from None
    except TimeoutError:
        raise ValueError(
            f"the key file {path} is a pipe that nothing was written to within {PIPE_SECONDS:g} s; "
            "point key_file at a file, or write the passphrase into the pipe"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"the key file {path} cannot be read ({exc.strerror}); check its owner and mode"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # The decoder's message quotes a byte of the secret, so it is not repeated.
        raise ValueError(f"the key file {path} is not UTF-8 text; write the passphrase as text") from None
    passphrase = without_one_newline(text)
    if not passphrase:
        raise ValueError(f"the key file {path} is empty; write the passphrase into it")
    _warn_if_shared(path)
    return passphrase


# A passphrase is a line: a key file larger than this is not one (a log, /dev/zero).
KEY_FILE_LIMIT = 64 * 1024
# A pipe (bash's <(pass show agent), a FIFO) must be written within this, or it is not waited on.
PIPE_SECONDS = 10.0


def _read_bounded(path: Path) -> bytes:
    """The file's bytes, at most `KEY_FILE_LIMIT`; a pipe or device read with a deadline, so a FIFO
    no one writes to cannot hang the process (opened without blocking). `ValueError` past either."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError
        if stat.S_ISREG(mode):
            os.set_blocking(descriptor, True)
            data = _read_up_to(descriptor, None)
        else:
            data = _read_up_to(descriptor, time.monotonic() + PIPE_SECONDS)
    finally:
        os.close(descriptor)
    if len(data) > KEY_FILE_LIMIT:
        raise ValueError(
            f"the key file {path} holds more than {KEY_FILE_LIMIT // 1024} KiB; a key file holds the "
            "passphrase alone, on one line"
        )
    return data


def _read_up_to(descriptor: int, deadline: float | None) -> bytes:
    """Up to one byte past the limit; with a `deadline`, waiting for each read no longer than it."""
    chunks: list[bytes] = []
    size = 0
    while size <= KEY_FILE_LIMIT:
        if deadline is not None:
            ready, _, _ = select.select([descriptor], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
        try:
            chunk = os.read(descriptor, KEY_FILE_LIMIT + 1 - size)
        except BlockingIOError:  # a pipe's writer has not written yet
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def without_one_newline(text: str) -> str:
    """`text` less one trailing newline (``\\n`` or ``\\r\\n``): what ``echo`` and editors add."""
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _warn_if_shared(path: Path) -> None:
    if os.name != "posix":
        return
    mode = path.stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warnings.warn(
            f"the key file {path} is readable by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"restrict it with chmod 600 {path} (a Kubernetes secret volume: defaultMode: 0400)",
            ConfigurationWarning,
            stacklevel=2,
        )


NEW_KEY_VARIABLE = "CITADEL_NEW_KEY"
NEW_KEY_FILE_VARIABLE = "CITADEL_NEW_KEY_FILE"


SOURCE_KEY_VARIABLE = "CITADEL_SOURCE_KEY"
SOURCE_KEY_FILE_VARIABLE = "CITADEL_SOURCE_KEY_FILE"


def new_passphrase(new_key_file: str | os.PathLike[str] | None = None) -> tuple[str, str] | None:
    """The new passphrase for a key rotation, and where it came from; None when none is given.

    From `new_key_file` (``--new-key-file``), else ``CITADEL_NEW_KEY`` or
    ``CITADEL_NEW_KEY_FILE`` (not both). Raises `ValueError` naming the source (never
    the value) for an unreadable or empty file, or for both variables set.
    """
    return _passphrase_given(new_key_file, "--new-key-file", NEW_KEY_VARIABLE, NEW_KEY_FILE_VARIABLE, "new")


def source_passphrase(source_key_file: str | os.PathLike[str] | None = None) -> tuple[str, str] | None:
    """The passphrase of a file to import (`import`'s source), and where it came from; None when
    none is given. From `source_key_file` (``--source-key-file``), else ``CITADEL_SOURCE_KEY`` or
    ``CITADEL_SOURCE_KEY_FILE`` (not both), as `new_passphrase`."""
    return _passphrase_given(
        source_key_file, "--source-key-file", SOURCE_KEY_VARIABLE, SOURCE_KEY_FILE_VARIABLE, "source file's"
    )


def _passphrase_given(
    key_file: str | os.PathLike[str] | None, flag: str, variable: str, file_variable: str, whose: str
) -> tuple[str, str] | None:
    if key_file is not None:
        return read_key_file(key_file), f"{flag} {os.fspath(key_file)}"
    # The value is taken out of the environment: no child process inherits it (taken.py).
    value, file = take_variable(variable), os.environ.get(file_variable)
    if value is not None and file is not None:
        raise ValueError(
            f"the {whose} passphrase is set twice, by {variable} and by {file_variable}; unset one of them"
        )
    if value is not None:
        return value, variable
    if file is not None:
        return read_key_file(file), f"{file_variable} {file}"
    # Unset since it was read: it counts only when nothing else is set now.
    kept = kept_variable(variable)
    return None if kept is None else (kept, variable)
