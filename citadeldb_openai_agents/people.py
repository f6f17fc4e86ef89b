"""Who a session is about: the rules for its owner (the person, the data subject), its labels,
and the pattern that finds the owner in a session id. Each checked once, here: the store's and
the session's arguments, the settings and the wire all use these.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import InvalidLabelsError, InvalidOwnerError

OWNER_MAX_BYTES = 256


def check_owner(owner: Any, source: str = "owner") -> str:
    """An owner (the person a session is about) as the file stores it; `InvalidOwnerError`
    naming `source` (the argument, setting or option it came from) otherwise."""
    if not isinstance(owner, str):
        raise InvalidOwnerError(f"{source}: an owner must be a str, not {type(owner).__name__}")
    if not owner.strip():
        raise InvalidOwnerError(f"{source}: an owner cannot be empty; name the person the session is about")
    try:
        size = len(owner.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidOwnerError(
            f"{source}: the owner holds a lone surrogate, which is not text any file can store"
        ) from None
    if size > OWNER_MAX_BYTES:
        raise InvalidOwnerError(
            f"{source}: an owner is at most {OWNER_MAX_BYTES} bytes of UTF-8, this one is {size}; "
            "use a stable id for the person (a user id), not a description"
        )
    return owner


LABELS_MAX = 16  # keys a session's labels may hold
LABELS_MAX_BYTES = 2048  # their JSON text at most


def check_labels(labels: Any, source: str = "labels") -> dict[str, Any]:
    """A session's labels as the file stores them: a small JSON object (at most `LABELS_MAX`
    keys, `LABELS_MAX_BYTES` of JSON) of text keys and scalar values (text, number, bool,
    null); `InvalidLabelsError` naming `source` otherwise."""
    if not isinstance(labels, dict):
        raise InvalidLabelsError(
            f"{source}: labels are a dict such as {{'agent': 'support'}}, not {type(labels).__name__}"
        )
    if len(labels) > LABELS_MAX:
        raise InvalidLabelsError(f"{source}: at most {LABELS_MAX} labels, not {len(labels)}")
    for name, value in labels.items():
        if not isinstance(name, str) or not name:
            raise InvalidLabelsError(f"{source}: a label's name is non-empty text, not {name!r}")
        if not (
            value is None
            or isinstance(value, (str, bool, int))
            or (isinstance(value, float) and math.isfinite(value))
        ):
            raise InvalidLabelsError(
                f"{source}: label {name!r} holds a {type(value).__name__}; a label is text, a number, "
                "true/false or null"
            )
    try:
        size = len(json.dumps(labels, ensure_ascii=False).encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidLabelsError(
            f"{source}: a label holds a lone surrogate, which no file can store"
        ) from None
    if size > LABELS_MAX_BYTES:
        raise InvalidLabelsError(
            f"{source}: labels are at most {LABELS_MAX_BYTES} bytes of JSON, these are {size}"
        )
    return dict(labels)


def check_owner_pattern(pattern: Any, source: str = "owner_pattern") -> re.Pattern[str] | None:
    """The rule that maps a session id to its owner: a regular expression with a group named
    ``owner`` (``^(?P<owner>[^:]+):``); `InvalidOwnerError` naming `source` otherwise."""
    if pattern is None or isinstance(pattern, re.Pattern):
        compiled = pattern
    elif not isinstance(pattern, str):
        raise InvalidOwnerError(
            f"{source} must be a regular expression (a str), not {type(pattern).__name__}"
        )
    else:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise InvalidOwnerError(f"{source} {pattern!r} is not a regular expression ({exc})") from None
    if compiled is not None and "owner" not in compiled.groupindex:
        raise InvalidOwnerError(
            f"{source} {compiled.pattern!r} has no group named owner: name the part of a session id "
            "that is the person, e.g. ^(?P<owner>[^:]+): for ids such as user-123:phone"
        )
    return compiled


# owner_pattern is matched against at most this much of a session id: an unanchored pattern
# took 1.41 s on a 20,000-character id (the retest, issue 59); the owner comes first in an id.
PATTERN_PREFIX = 1024


def owner_by_pattern(pattern: re.Pattern[str], session_id: str) -> str | None:
    """The owner `pattern` finds in the first `PATTERN_PREFIX` characters of `session_id` (None:
    it does not match, or its group is empty)."""
    found = pattern.search(session_id[:PATTERN_PREFIX])
    owner = None if found is None else found.group("owner")
    return check_owner(owner, f"owner_pattern's owner in session id {session_id!r}") if owner else None
