"""Why a process that found the file held cannot use it: each error names the cause and the fix."""

from __future__ import annotations

from ..errors import ConfigurationError, DatabaseLockedError, WrongPassphraseError
from . import orphans
from .server import MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PROCESS


def not_serving_here(locked: DatabaseLockedError) -> DatabaseLockedError:
    """This process has serve = false and found the file held."""
    return DatabaseLockedError(
        f"{locked} This process has serve = false, so it does not become a client of the "
        "process that holds the file: leave serve on (the default) to share the file "
        "between processes, or stop that process, then retry.",
        holder=locked.holder,
    )


def kept_to_itself(locked: DatabaseLockedError) -> DatabaseLockedError:
    """The holder has serve = false."""
    return DatabaseLockedError(
        f"{locked} It keeps the file to itself (serve = false there), so this process "
        "cannot be its client: leave serve on (the default) in every process on the "
        "file, or stop that process, then retry.",
        holder=locked.holder,
    )


def parent_gone(path: str, parent: int, exited: bool, waited: float) -> DatabaseLockedError:
    """A forked child's parent held the file and serves it no more."""
    what = "it has exited" if exited else f"no process has served it for {waited:g} s"
    return DatabaseLockedError(
        f"{path} was served to this process by its parent, process {parent}, and {what}: the "
        "parent is gone or stuck. This process and the others forked from that parent still hold "
        "the file's lock through the copy they inherited, so none of them can take the file over. "
        "Restart the whole server, all its processes (gunicorn: its master and workers); each "
        f"process forked from it stops itself (SIGTERM) {orphans.GRACE_SECONDS:g} s after it exited."
    )


def never_served(
    locked: DatabaseLockedError, waited: float, *, opening: bool = False, busy: bool = False
) -> DatabaseLockedError:
    """The holder did not serve the file in time (`busy`: it answered, and turned this process away)."""
    if busy:
        return DatabaseLockedError(
            f"{locked} {owner_busy(waited)}",
            holder=locked.holder,
        )
    if opening:
        return DatabaseLockedError(
            f"{locked} It has been opening the file for more than {waited:g} s without serving it: "
            "it is stuck, or the file is too big to open in that time (an open reads every row). "
            "Stop that process, then retry; split a file this big into shards (docs/deployment.md).",
            holder=locked.holder,
        )
    return DatabaseLockedError(
        f"{locked} It did not serve the file within {waited:g} s: it is not a store of this "
        "package, or it is stuck opening the file. Stop that process, then retry.",
        holder=locked.holder,
    )


def owner_busy(waited: float) -> str:
    """Why an owner that is alive and answering turned this process away: never advice to stop it."""
    return (
        f"It is running and answers on its socket, but turned this process away for {waited:g} s: too "
        "many other connections were in their handshake with it (at most "
        f"{MAX_HANDSHAKES} at once, {MAX_HANDSHAKES_PER_PROCESS} per process). "
        "It is not stuck, so do not stop it: other processes of this user are flooding its socket; "
        "find them with `ss -xp` (peers of the socket named in its log) and stop those, then retry."
    )


def settings_differ(problems: list[str], owner: int, path: str) -> ConfigurationError:
    """A setting fixed per file (TTL, embedder, sync mode) differs between this process and the owner."""
    return ConfigurationError(
        [
            f"{problem} (the owner is process {owner}, which holds {path}); "
            "every process on one file needs the same value: set the owner's, or leave it unset "
            "(from_config then adopts the owner's; the store's adopt= argument does the same)"
            for problem in problems
        ]
    )


# How long a client waits, after the owner refused its passphrase, for its source (a key file,
# a key command) to give the new one: the operator's step between rotate-key and updating it.
ROTATION_SECONDS = 60.0


def rotated_elsewhere(path: str, source: str, waited: float | None = None) -> WrongPassphraseError:
    """The file's passphrase was changed (rotate-key) after this process read its own."""
    if waited is None:
        return WrongPassphraseError(
            f"the passphrase of {path} was changed (rotate-key) after this process read it from "
            f"{source}, which cannot be read again: restart this process with the new passphrase "
            "(with key_file or key_command, a process reads it again by itself after a rotation)."
        )
    return WrongPassphraseError(
        f"the passphrase of {path} was changed (rotate-key), and {source} still gives the old one "
        f"after {waited:g} s: write the new passphrase there, as rotate-key's next step says; this "
        "process carries on once it can read it."
    )


def in_flight_unknown(
    refused: WrongPassphraseError, operation: str, owner: int | None
) -> WrongPassphraseError:
    """`refused` (the takeover after the owner died could not open the file) for a call that was in
    flight then: the owner may have done it before it died, and nobody can tell this process."""
    return WrongPassphraseError(
        f"{refused.cause} The write in progress ({operation}) when process {owner or 'that held the file'} "
        "stopped may or may not have been stored: once restarted, read the session (or run "
        "`python -m citadeldb_openai_agents export SESSION_ID`) before writing it again.",
        refused.check,
        refused.source,
        refused.hint,
    )
