"""Which shard of a fleet holds a session, by a function a router can compute too.

`shard_for(session_id, shards)` is rendezvous (highest random weight) hashing over
SHA-256. For each shard name, its score for a session is the SHA-256 digest of the
name's UTF-8 bytes, one NUL byte, and the session id's UTF-8 bytes (lone surrogates
encoded as they are, Python's ``surrogatepass``), read as a big-endian unsigned 256-bit
integer; the shard with the highest score holds the session. It depends on the set of
names only, not their order. Adding a shard moves only the sessions the new name now
scores highest for (about 1/n of them), each to the new shard; removing one moves only
its own sessions. docs/deployment.md ("Many machines") specifies it for routers.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import telemetry
from .errors import ConfigurationError, ShardMovingError, WrongShardError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Names a router's configuration and a URL can carry as they are.
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_shards(shards: Sequence[str]) -> tuple[str, ...]:
    """The shard names as a tuple; ValueError unless they are distinct, valid names, at least one."""
    if isinstance(shards, str):
        raise ValueError(f"shards is a list of shard names, not one string ({shards!r})")
    names = tuple(shards)
    if not names:
        raise ValueError("shards is empty: name every shard of the fleet, in any order")
    bad = [name for name in names if not isinstance(name, str) or not SHARD_NAME.fullmatch(name)]
    if bad:
        raise ValueError(
            f"shard names are 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or "
            f"digit; not {', '.join(map(repr, bad))}"
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"shards lists {', '.join(map(repr, twice))} more than once")
    return names


def shard_for(session_id: str, shards: Sequence[str]) -> str:
    """The shard (one of `shards`) that holds `session_id` (see the module's docstring).

    Raises:
        ValueError: `shards` is empty, names a shard twice, or holds an invalid name.
    """
    names = check_shards(shards)
    key = b"\0" + session_id.encode("utf-8", "surrogatepass")
    return max(names, key=lambda name: hashlib.sha256(name.encode() + key).digest())


# Set while this thread moves sessions for a ring change (`moving_sessions`).
_MOVING: contextvars.ContextVar[bool] = contextvars.ContextVar("citadel_moving", default=False)


@contextlib.contextmanager
def moving_sessions() -> Iterator[None]:
    """Let this thread's calls read, copy and erase the sessions a ring change moves.

    Everyone else's calls on those sessions are refused (`ShardMovingError`) until the ring
    change finishes; the mover's, on the shard a session leaves and the one it goes to, are not.
    """
    token = _MOVING.set(True)
    try:
        yield
    finally:
        _MOVING.reset(token)


@dataclass(frozen=True)
class Ring:
    """The fleet's shards and the one this process is: it refuses the sessions of the others.

    `previous` is the ring before a change under way: a session the two rings place on different
    shards is moving, and refused everywhere (`ShardMovingError`) but to the mover.
    """

    shards: tuple[str, ...]
    shard: str
    previous: tuple[str, ...] | None = None

    @classmethod
    def of(cls, shards: Sequence[str] | None, shard: str | None) -> Ring | None:
        """The ring, or None when neither is given; ValueError when only one is, or `shard` is not in it."""
        if shards is None and shard is None:
            return None
        if shards is None or shard is None:
            missing = "shards (every shard's name)" if shards is None else "shard (this process's)"
            raise ValueError(f"shards and shard go together: set {missing} too, or neither")
        names = check_shards(shards)
        if shard not in names:
            raise ValueError(f"shard {shard!r} is not one of the shards {', '.join(names)}")
        return cls(names, shard)

    def check(self, session_id: str) -> None:
        """Raise `WrongShardError` unless this shard holds the session (`ShardMovingError` while it moves)."""
        owner = shard_for(session_id, self.shards)
        if self.previous is not None:
            source = shard_for(session_id, self.previous)
            if source != owner:
                if _MOVING.get() and self.shard in (source, owner):
                    return
                raise ShardMovingError(
                    f"session {session_id!r} is moving from shard {source!r} to {owner!r} (a ring change "
                    "is under way): it is refused until it has moved, then "
                    f"{owner!r} serves it. Retry shortly; nothing was read or written here.",
                    session_id=session_id,
                    owner=owner,
                    shard=self.shard,
                    source=source,
                )
        if owner != self.shard:
            raise WrongShardError(
                f"session {session_id!r} belongs to shard {owner!r}, not to this one ({self.shard!r}): "
                f"shard_for over the shards {', '.join(self.shards)} names it. Send its requests "
                "there; nothing was read or written here.",
                session_id=session_id,
                owner=owner,
                shard=self.shard,
            )


class RingFile:
    """The ring read from a TOML file an operator rewrites during a ring change.

    The file holds ``shards`` (the fleet's names) and, while sessions move, ``previous`` (the
    ring before the change). Every check looks at the file's identity (inode, size, mtime: a
    stat, not a read) and reads it again when it changed, so that every process of every
    shard follows a change at its next call. A file that cannot be read or is not valid
    refuses every session (`ConfigurationError`): a guess could give a session two homes.
    Rewrite it atomically (write a new file, then rename it over the old one), as
    ``python -m citadeldb_openai_agents ring`` does.
    """

    def __init__(self, path: str | os.PathLike[str], shard: str) -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self.shard = shard
        self._cached: tuple[tuple[int, int, int], Ring] | None = None
        ring = self.current()
        if shard not in ring.shards and shard not in (ring.previous or ()):
            raise ValueError(
                f"shard {shard!r} is not in the ring file {self.path} (shards {', '.join(ring.shards)}); "
                "correct shard, or add it to the ring (docs/deployment.md, 'Changing the ring')"
            )

    @classmethod
    def of(cls, path: str | os.PathLike[str], shards: Sequence[str] | None, shard: str | None) -> RingFile:
        """The ring file for this shard; ValueError when `shards` is given too, or `shard` is not."""
        if shards is not None:
            raise ValueError("set shards or ring_file, not both: the ring file holds the shards")
        if shard is None:
            raise ValueError("ring_file needs shard (this process's shard name) too")
        return cls(path, shard)

    def current(self) -> Ring:
        """The ring the file holds now."""
        try:
            status = os.stat(self.path)
        except OSError as exc:
            raise _unusable(self.path, f"it cannot be read ({exc.strerror})") from None
        identity = (status.st_ino, status.st_size, status.st_mtime_ns)
        cached = self._cached
        if cached is not None and cached[0] == identity:
            return cached[1]
        ring = self._read()
        if cached is not None and (cached[1].shards, cached[1].previous) != (ring.shards, ring.previous):
            telemetry.events.ring_changed(self.path, ring.shards, ring.previous or ())  # once per process
        self._cached = (identity, ring)
        return ring

    def check(self, session_id: str) -> None:
        """`Ring.check` against the ring the file holds now."""
        self.current().check(session_id)

    def _read(self) -> Ring:
        shards, previous = read_ring_file(self.path)
        return Ring(shards, self.shard, previous)


def read_ring_file(path: str | os.PathLike[str]) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """The ``shards`` and ``previous`` (None when no change is under way) a ring file holds.

    Raises:
        ConfigurationError: the file cannot be read, is not TOML, or does not hold valid names.
    """
    try:
        with open(path, "rb") as file:
            data: dict[str, Any] = tomllib.load(file)
    except OSError as exc:
        raise _unusable(path, f"it cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise _unusable(path, f"it is not TOML ({exc})") from None
    unknown = sorted(set(data) - {"shards", "previous"})
    if unknown or "shards" not in data:
        raise _unusable(path, f"it holds {', '.join(unknown)}" if unknown else "it names no shards")
    try:
        shards = check_shards(data["shards"])
        previous = None if data.get("previous") is None else check_shards(data["previous"])
    except (TypeError, ValueError) as exc:
        raise _unusable(path, str(exc)) from None
    return shards, previous


def _unusable(path: str | os.PathLike[str], why: str) -> ConfigurationError:
    return ConfigurationError(
        [
            f"the ring file {os.fspath(path)} is not usable: {why}. It holds shards = [...] and, during "
            "a ring change, previous = [...]; every session is refused until it is mended "
            "(nothing was read or written)"
        ]
    )


def write_ring_file(
    path: str | os.PathLike[str], shards: Sequence[str], previous: Sequence[str] | None
) -> None:
    """Write a ring file atomically: a new file beside it, then renamed over it (readers see one or the other)."""
    names = check_shards(shards)
    before = None if previous is None else check_shards(previous)
    lines = [f"shards = [{', '.join(map(_quoted, names))}]"]
    if before is not None and set(before) != set(names):
        lines.append(f"previous = [{', '.join(map(_quoted, before))}]")
    target = os.path.abspath(os.path.expanduser(path))
    temporary = f"{target}.{os.getpid()}.new"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, target)


def _quoted(name: str) -> str:
    return f'"{name}"'  # shard names are letters, digits, '.', '_' and '-' (SHARD_NAME)
