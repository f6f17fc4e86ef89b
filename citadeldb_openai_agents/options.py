"""The store's options, each defined once: the settings, the store and the CLI all use these.

A duration (the TTL), the key-derivation profile, the durability mode, the page
cache and the passphrase rules: what each accepts, its default, and the message
when a value is wrong.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from .errors import EmptyPassphraseError

if TYPE_CHECKING:
    from agents.memory import SessionSettings

Argon2Profile = Literal["iot", "desktop", "server"]
SyncMode = Literal["full", "normal", "off"]
# "item": each item expires `ttl` after its own write; "session": the whole session expires
# `ttl` after its last write (every write pushes it forward, as RedisSession's TTL).
TtlMode = Literal["item", "session"]
ARGON2_PROFILES: tuple[str, ...] = get_args(Argon2Profile)
SYNC_MODES: tuple[str, ...] = get_args(SyncMode)
TTL_MODES: tuple[str, ...] = get_args(TtlMode)
DEFAULT_SYNC_MODE: SyncMode = "full"  # Citadel's own

# Citadel's own default (under 1,000 pages of ~8 KiB) does not hold a 1,000-item session's
# segments, and recall then re-reads and re-decrypts pages on every search
# (benchmarks/search_quality). 16,384 pages: at most ~128 MiB, filled only as pages are read.
DEFAULT_CACHE_PAGES = 16_384

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def check_ttl(seconds: Any) -> float | None:
    """A TTL as the store takes it: a positive, finite number of seconds, or None (keep forever)."""
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ValueError(f"ttl must be a positive number of seconds or None (keep forever), not {seconds!r}")
    return float(seconds)


def check_ttl_mode(mode: Any) -> TtlMode | None:
    """How the TTL counts, "item" or "session"; None: the store's (or "item", the default)."""
    if mode is not None and mode not in TTL_MODES:
        raise ValueError(f"ttl_mode must be one of {', '.join(TTL_MODES)}, not {mode!r}")
    return mode  # type: ignore[no-any-return]


def check_idle_ttl(seconds: Any, *, never: bool = False) -> float | None:
    """How long a session may go without a write before it is erased: positive seconds, or None.

    With `never` (one session's own setting), ``math.inf`` is accepted too: that session is
    never erased for idleness, whatever the store's setting.
    """
    if never and seconds == math.inf and not isinstance(seconds, bool):
        return math.inf
    try:
        return check_ttl(seconds)
    except ValueError:
        forever = ", math.inf (never)" if never else ""
        raise ValueError(
            f"idle_ttl must be a positive number of seconds{forever} or None, not {seconds!r}"
        ) from None


def check_max_items(count: Any) -> int | None:
    """A session's item cap as the store takes it: a positive whole number, or None (no cap)."""
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"max_items must be a positive whole number or None (no cap), not {count!r}")
    return count


# The settings every process on one file must share; a store may adopt the owner's (`check_adopt`).
FIXED_PER_FILE = (
    "ttl", "embedder", "sync_mode", "erasure_ledger", "ledger_mirror", "ttl_mode", "idle_ttl"
)  # fmt: skip


def check_adopt(names: Any) -> frozenset[str]:
    """The settings a store takes from the file's owner: some of `FIXED_PER_FILE`."""
    if isinstance(names, str):
        raise ValueError(f"adopt must be a collection of setting names, not the string {names!r}")
    chosen = frozenset(names)
    unknown = sorted(map(repr, chosen - set(FIXED_PER_FILE)))
    if unknown:
        known = ", ".join(map(repr, FIXED_PER_FILE))
        raise ValueError(
            f"adopt names settings that are not fixed per file: {', '.join(unknown)} (only {known})"
        )
    return chosen


def format_duration(seconds: float) -> str:
    """A duration as a person writes it, in the largest unit that divides it: ``30d``, ``2h``, ``90s``."""
    for unit in ("d", "h", "m"):
        count = seconds / _UNIT_SECONDS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds:g}s"


def parse_duration(value: Any, name: str = "ttl") -> float | None:
    """A TTL (or another duration setting, `name`) as the settings take it: `check_ttl`'s
    seconds, or a duration such as ``90s``, ``15m``, ``24h``, ``7d``.

    None stays None (keep forever). Raises `ValueError` for anything else, or a
    duration that is not positive.
    """
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    try:
        if seconds is None:
            raise ValueError(value)
        return check_ttl(seconds)
    except ValueError:
        raise ValueError(
            f"{value!r} is not a positive duration; give seconds (3600) or a number with a unit "
            f"s, m, h or d (90s, 15m, 24h, 7d), or leave {name} unset"
            + (" to keep items forever" if name == "ttl" else "")
        ) from None


def check_argon2_profile(profile: Any) -> Argon2Profile | None:
    """The key-derivation profile for a new file, or None for Citadel's default."""
    if profile is not None and profile not in ARGON2_PROFILES:
        raise ValueError(f"argon2_profile must be one of {', '.join(ARGON2_PROFILES)}, not {profile!r}")
    return profile  # type: ignore[no-any-return]


def check_sync_mode(mode: Any) -> SyncMode | None:
    """The durability of the writes made while this process owns the file, or None for "full".

    Citadel applies it at every open, not once per file: a file created with "off" and
    opened again without it is written with "full".
    """
    if mode is not None and mode not in SYNC_MODES:
        raise ValueError(f"sync_mode must be one of {', '.join(SYNC_MODES)}, not {mode!r}")
    return mode  # type: ignore[no-any-return]


def check_cache_size(pages: Any) -> int:
    """Citadel's page cache in pages; None means `DEFAULT_CACHE_PAGES`."""
    if pages is None:
        return DEFAULT_CACHE_PAGES
    if isinstance(pages, bool) or not isinstance(pages, int) or pages <= 0:
        raise ValueError(f"cache_size must be a positive number of pages, not {pages!r}")
    return pages


def check_passphrase(key: Any) -> str:
    """Refuse a missing or empty passphrase before anything touches the disk.

    Citadel accepts an empty one and would encrypt the file with it.
    """
    if key is None or (isinstance(key, str) and not key):
        raise EmptyPassphraseError(
            "the passphrase is empty: Citadel would encrypt the file with an empty key. "
            "Pass key=... (in deployments, set CITADEL_KEY or CITADEL_KEY_FILE)."
        )
    if not isinstance(key, str):
        kind = type(key).__name__
        del key  # bytes holding the passphrase: error trackers record a failed frame's locals
        raise TypeError(f"the passphrase must be a str, not {kind}")
    return key


def coerce_session_settings(settings: SessionSettings | dict[str, Any] | None) -> SessionSettings | None:
    """The SDK's `SessionSettings` for what a caller gave (None stays None), as the SDK's own
    sessions take it: a dict becomes one at construction, and an unknown key raises `TypeError`
    there, not at the first `get_items()`."""
    if not isinstance(settings, dict):
        return settings
    # Imported here, only for a dict: loading the Agents SDK costs seconds a process that only
    # reads and writes through the store (an owner, a cron job) never needs.
    from agents import memory

    coerce = getattr(memory, "coerce_session_settings", None)
    if coerce is not None:
        made: SessionSettings = coerce(settings)
        return made
    # openai-agents before 0.25 has no coerce_session_settings: the same rule, by hand.
    unknown = sorted(set(settings) - {field.name for field in fields(memory.SessionSettings)})
    if unknown:
        raise TypeError(f"Unknown session settings: {', '.join(map(str, unknown))}")
    return memory.SessionSettings(**settings)


def _absolute(path: Any) -> str:
    return str(os.path.abspath(os.path.expanduser(os.fspath(path))))


@dataclass(frozen=True)
class StoreOptions:
    """A store's settings for its file, checked once and passed whole to every layer that needs
    them, as the Agents SDK passes one `RunConfig`: the store's keyword arguments (and so
    `from_config`'s settings) become one of these in `FileStore.__init__`, and nothing below
    rebuilds a bundle of its own. Those of `FIXED_PER_FILE` (all but the embedder, which is an
    object) are the owner's terms on the wire: every process on a file shares them, or adopts
    the owner's (`taking`). Citadel's own open options are made from it in storage/engine.py.
    """

    ttl: float | None = None
    sync_mode: SyncMode = DEFAULT_SYNC_MODE
    erasure_ledger: str | None = None  # absolute
    ledger_mirror: str | None = None  # absolute: a second copy of the ledger (storage/ledger.py)
    ttl_mode: TtlMode = "item"
    idle_ttl: float | None = None
    argon2_profile: Argon2Profile | None = None  # a new file's; an existing one keeps its own
    cache_size: int = DEFAULT_CACHE_PAGES
    # This process's directory for the owner's socket (absolute; serving/directory.py), or None:
    # the first private one found. Every process on one file needs the same.
    socket_dir: str | None = None

    @classmethod
    def of(cls, **given: Any) -> StoreOptions:
        """Options from keyword arguments, each checked (`ValueError` naming it); None: the default."""
        unknown = set(given) - {option.name for option in fields(cls)}
        if unknown:
            raise TypeError(f"unknown store options: {', '.join(sorted(unknown))}")
        return cls(**{name: _CHECKS[name](value) for name, value in given.items() if value is not None})

    def shared(self) -> dict[str, Any]:
        """The settings fixed per file, by name (the embedder aside)."""
        return {name: getattr(self, name) for name in FIXED_PER_FILE if name != "embedder"}

    def taking(self, owner: StoreOptions, names: Collection[str]) -> StoreOptions:
        """These options with the owner's value of each setting fixed per file in `names`."""
        return replace(self, **{name: getattr(owner, name) for name in names if name != "embedder"})

    def for_session(self, own: SessionOptions | None) -> StoreOptions:
        """The options a session lives by: these, with each of its own that it sets."""
        if own is None:
            return self
        return replace(self, **{name: value for name, value in vars(own).items() if value is not None})

    def item_expiry(self, now: float) -> int | None:
        """When an item written at `now` (seconds) expires (µs since the epoch), or None: never, or
        not on its own (counted per session, the whole session expires: storage/retention.py)."""
        if self.ttl is None or self.ttl_mode == "session":
            return None
        return int((now + self.ttl) * 1_000_000)

    def session_limit(self) -> tuple[float, str] | None:
        """Seconds a session lives after its last write, and the setting that ends it then ("ttl"
        counted per session, or "idle_ttl": no write for that long, whatever the mode); None: no
        rule ends a whole session. The earlier of the two wins."""
        limits = (
            [(self.idle_ttl, "idle_ttl")] if self.idle_ttl is not None and self.idle_ttl < math.inf else []
        )
        if self.ttl_mode == "session" and self.ttl is not None:
            limits.append((self.ttl, "ttl"))
        return min(limits) if limits else None

    def session_rules(self) -> tuple[str, float | None, float | None]:
        """What decides when a whole session ends (the TTL only counts per session in that mode)."""
        return (self.ttl_mode, self.idle_ttl, self.ttl if self.ttl_mode == "session" else None)

    def describe_rules(self) -> str:
        ttl = "" if self.ttl_mode != "session" else f", ttl {self.ttl}s"
        idle = "no idle_ttl" if self.idle_ttl is None else f"idle_ttl {self.idle_ttl}s"
        return f"ttl_mode {self.ttl_mode!r}{ttl} and {idle}"

    @staticmethod
    def told(name: str, value: Any) -> str:
        """A setting's value as a message tells it."""
        if name == "ttl":
            return "no ttl (keep forever)" if value is None else f"ttl {format_duration(value)}"
        if name == "idle_ttl":
            return "none (never for idleness)" if value is None else format_duration(value)
        if name in ("erasure_ledger", "ledger_mirror"):
            return "none" if value is None else repr(value)
        return repr(value)

    def ends_sessions(self) -> bool:
        """Whether these settings name a rule that ends whole sessions (then `purge` reports the
        sessions it ended, none included)."""
        return self.ttl_mode == "session" or self.idle_ttl is not None


# Why `purge` erased a whole session, by the rule `StoreOptions.session_limit` names.
ENDED_BY = {"ttl": "its ttl ran out (ttl_mode session)", "idle_ttl": "idle for its idle_ttl"}

# How a setting shown by name reads when unset, where that is not simply "nothing", and which
# settings are durations: the config check prints these (cli/render.py).
UNSET_MEANS = {
    "ttl": "keep forever",
    "idle_ttl": "never for idleness",
    "cache_size": f"{DEFAULT_CACHE_PAGES} pages",
}
DURATIONS = frozenset({"ttl", "idle_ttl", "key_command_timeout"})


NEVER = -1  # a session's idle time of math.inf as its record and the wire hold it (JSON has no infinity)


@dataclass(frozen=True)
class SessionOptions:
    """A session's own options, in place of its store's: a field left None follows the store's
    (`StoreOptions.for_session`). The idle time may be ``math.inf``: never ended for idleness.
    Kept in the session's catalog record by the write that brings them, so every process (and
    a purge) ends the session by them."""

    ttl_mode: TtlMode | None = None
    idle_ttl: float | None = None

    @classmethod
    def of(cls, **given: Any) -> SessionOptions:
        """A session's options from keyword arguments, each checked (`ValueError` naming it)."""
        return cls(**{name: _SESSION_CHECKS[name](value) for name, value in given.items()})

    def to_payload(self) -> dict[str, Any]:
        """As the record and the wire hold it: JSON data (`math.inf` as `NEVER`)."""
        return {name: NEVER if value == math.inf else value for name, value in vars(self).items()}

    @classmethod
    def from_payload(cls, payload: Any) -> SessionOptions:
        """From `to_payload`'s form, each value checked (`ValueError` for anything else)."""
        names = {option.name for option in fields(cls)}
        if not isinstance(payload, dict) or not set(payload) <= names:
            raise ValueError(f"a session's options hold only {', '.join(sorted(names))}")
        never = {
            name: math.inf if value == NEVER and not isinstance(value, bool) else value
            for name, value in payload.items()
        }
        return cls.of(**never)


_SESSION_CHECKS: dict[str, Callable[[Any], Any]] = {
    "ttl_mode": check_ttl_mode,
    "idle_ttl": lambda seconds: check_idle_ttl(seconds, never=True),
}
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "ttl": check_ttl,
    "sync_mode": check_sync_mode,
    "erasure_ledger": _absolute,
    "ledger_mirror": _absolute,
    "ttl_mode": check_ttl_mode,
    "idle_ttl": check_idle_ttl,
    "argon2_profile": check_argon2_profile,
    "cache_size": check_cache_size,
    "socket_dir": _absolute,
}
