"""Passphrase variables taken out of the environment once read, so no child process inherits them.

Agents run tools as child processes, and every child inherits ``os.environ``: a passphrase
left in ``CITADEL_KEY`` would be handed to each of them. The settings take it out of
``os.environ`` as they read it and keep it here, in this process's memory only, so that a
second `from_config()` in the process still finds it. The kernel's copy of the environment the
process started with (``/proc/<pid>/environ``) cannot be changed from inside: a process of the
same user can still read the value there (docs/configuration.md says so).
"""

from __future__ import annotations

import os
import threading

from pydantic import SecretStr


class TakenVariables:
    """The passphrase variables this process took out of ``os.environ``, each with its last value.

    A variable set again (by the process, or a test) replaces what was kept. One that is absent
    now was unset after it was read: its kept value stands in only where no other source gives a
    passphrase (the settings rank it last), so a second `from_config()` still finds it, and a
    configuration that now names a key file or command is not told the passphrase is set twice.
    The values are `SecretStr`: a repr shows none.
    """

    def __init__(self) -> None:
        self._values: dict[str, SecretStr] = {}
        self._lock = threading.Lock()

    def take(self, name: str) -> str | None:
        """The variable's value if it is set now, taken out of ``os.environ`` and kept; else None."""
        with self._lock:
            value = os.environ.pop(name, None)
            if value is not None:
                self._values[name] = SecretStr(value)
            return value

    def kept(self, name: str) -> str | None:
        """The value kept when the variable was last taken; None when it never was."""
        with self._lock:
            kept = self._values.get(name)
            return None if kept is None else kept.get_secret_value()

    def forget(self) -> None:
        """Drop every value kept: each variable reads as unset until it is set again."""
        with self._lock:
            self._values.clear()

    def __repr__(self) -> str:
        return f"TakenVariables({sorted(self._values)})"


TAKEN = TakenVariables()


def take_variable(name: str) -> str | None:
    """`name`'s value if it is set now, taken out of ``os.environ`` (kept in this process only)."""
    return TAKEN.take(name)


def kept_variable(name: str) -> str | None:
    """The value `name` had when it was taken, though it is unset now; see `TakenVariables`."""
    return TAKEN.kept(name)


def forget_taken_variables() -> None:
    """Forget every passphrase variable taken from the environment (between tests, say)."""
    TAKEN.forget()
