"""Who a session is about: its owner (the data subject), and the owners whose erasure began.

A privacy request names a person, not a session. A session's owner is kept in MAIN's catalog
record (records.py), encrypted as the session id is; its branches are MAIN's. Giving a session
an owner it lacks records it; giving it another one than recorded raises before anything is
read or written: an owner changes only by `set_owner`, which records when.

An owner's erasure is noted in the layout record before its first session goes (as the salted
HMAC of the owner, keyed apart from session ids), so that running it again after everything is
gone says the erasure is complete instead of "never held"; a crash between sessions leaves each
one whole or erased, and the next run erases what is left.
"""

from __future__ import annotations

from typing import Any, Literal

from citadeldb.memory import Memory

from ..errors import OwnerMismatchError
from .completeness import now_micros
from .records import MAIN
from .segment_cache import SessionState
from .segments import SessionLayout

ERASED_OWNERS = "erased_owners"  # the layout record's list of owners whose erasure began
_OWNER_PURPOSE = b"coa.owner"


def keep(
    layout: SessionLayout,
    memory: Memory,
    state: SessionState,
    owner: str | None,
    labels: dict[str, Any] | None = None,
) -> None:
    """Before a session's call or write that names `owner`: record it where none is, refuse
    another (`OwnerMismatchError`, nothing read or written); record `labels` if they differ.
    A session the file does not hold yet keeps them in the record its first write lists."""
    if state.branch != MAIN or (owner is None and labels is None):
        return
    record = layout.record(state)
    if owner is not None and record.owner not in (None, owner):  # refused before anything changes
        raise OwnerMismatchError(
            f"session {state.session_id!r} belongs to another owner than the one given; nothing was "
            "read or written. An owner changes only explicitly: store.set_owner(session_ids, owner), "
            "or `python -m citadeldb_openai_agents owner set SESSION_ID --owner NEW`."
        )
    changed = False
    if owner is not None and record.owner is None:
        record.owner, record.owner_since, changed = owner, now_micros(), True
    if labels is not None and labels != record.labels:
        record.labels, changed = labels, True
    if changed:
        _write(layout, memory, state)


def _write(layout: SessionLayout, memory: Memory, state: SessionState) -> None:
    if state.catalog_id is not None:  # else the first write lists its first segment with the record
        layout.write_record(memory, state)


def set_owner(
    layout: SessionLayout, memory: Memory, state: SessionState, owner: str
) -> Literal["missing", "unchanged", "changed"]:
    """Record `owner` as the session's, whatever it had: the explicit change."""
    if state.catalog_id is None or state.record is None:
        return "missing"
    if state.record.owner == owner:
        return "unchanged"
    state.record.owner, state.record.owner_since = owner, now_micros()
    layout.write_record(memory, state)
    return "changed"


def recorded(
    layout: SessionLayout, memory: Memory | None, state: SessionState
) -> tuple[str | None, dict[str, Any] | None]:
    """The owner and labels of the session `state` holds (a branch's are MAIN's), from the
    record this process holds (`memory` unused: the signature of a session's operation)."""
    main = state if state.branch == MAIN else layout.state(state.session_id)
    return (None, None) if main.record is None else (main.record.owner, main.record.labels)


def owner_of(layout: SessionLayout, state: SessionState) -> str | None:
    """The owner of the session `state` holds (a branch's is MAIN's)."""
    return recorded(layout, None, state)[0]


def owned(layout: SessionLayout, owner: str) -> list[str]:
    """The ids of the sessions the file records as `owner`'s, sorted: from the records this
    process holds, without reading a session."""
    return sorted(
        state.session_id
        for state in layout.states()
        if state.branch == MAIN and state.catalog_id is not None and owner_of(layout, state) == owner
    )


def begin_erasure(layout: SessionLayout, memory: Memory, owner: str) -> tuple[list[str], bool]:
    """The owner's sessions, and whether an erasure of theirs began before; the erasure noted
    in the layout record before any session goes."""
    sessions = owned(layout, owner)
    noted = list(layout.meta.get(ERASED_OWNERS, []))
    hid = layout.keyed(_OWNER_PURPOSE, owner)
    began_before = hid in noted
    if sessions and not began_before:
        layout.update_meta(memory, **{ERASED_OWNERS: [*noted, hid]})
    return sessions, began_before
