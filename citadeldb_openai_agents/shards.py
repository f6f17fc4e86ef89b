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

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import WrongShardError

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


@dataclass(frozen=True)
class Ring:
    """The fleet's shards and the one this process is: it refuses the sessions of the others."""

    shards: tuple[str, ...]
    shard: str

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
        """Raise `WrongShardError` unless this shard holds the session."""
        owner = shard_for(session_id, self.shards)
        if owner != self.shard:
            raise WrongShardError(
                f"session {session_id!r} belongs to shard {owner!r}, not to this one ({self.shard!r}): "
                f"shard_for over the shards {', '.join(self.shards)} names it. Send its requests "
                "there; nothing was read or written here.",
                session_id=session_id,
                owner=owner,
                shard=self.shard,
            )
