"""The layout's names and records: what each region is called and what its record atoms hold.

A file holds three kinds of region (segments.py says why):

* ``coa.meta``: one atom, the layout record: its format, the file's salt and the
  embedder its vectors are bound to;
* ``coa.catalog``: one atom per session, its `CatalogRecord`;
* ``coa.s.<hid>.<n>``: segment n of the session whose salted HMAC is <hid>.

Format 2 keeps in each catalog record the session's live segments and the erasure
under way, written before the erasure starts. On open, an atom or region that
Citadel cannot read is then either one a crash interrupted us erasing (the record
says so) or damage (audit.py). Format 1 records held only the session id; such
files are upgraded when opened.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from ..options import SessionOptions

LAYOUT_FORMAT = 2
# Every region of this layout is named under it (a region outside it is not ours: original_layout.py).
PREFIX = "coa."
META_REGION = "coa.meta"
META_KIND = "layout"
CATALOG_REGION = "coa.catalog"
CATALOG_KIND = "session"
SEGMENT_PREFIX = "coa.s."
# The regions and kinds whose records the open-time audit reads (inventory.take_inventory).
RECORD_KINDS = {META_REGION: META_KIND, CATALOG_REGION: CATALOG_KIND}


MAIN = "main"  # the branch every session has, stored as the session itself (no branch in its record)


def session_hid(salt: bytes, session_id: str, branch: str = MAIN) -> str:
    """A session's (or one of its branches') region-name stem: reveals nothing, and confirms no
    guess, without the file's salt. A branch's is keyed apart (its own key, derived from the
    salt), so no session id, whatever its text, names another session's branch."""
    if branch == MAIN:
        key, text = salt, session_id
    else:
        key, text = hmac.new(salt, b"coa.branch", hashlib.sha256).digest(), json.dumps([session_id, branch])
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]


def segment_name(hid: str, number: int) -> str:
    return f"{SEGMENT_PREFIX}{hid}.{number}"


def parse_segment(name: str) -> tuple[str, int] | None:
    """(hid, number) of a segment's region name; None for any other region."""
    if not name.startswith(SEGMENT_PREFIX):
        return None
    hid, _, number = name[len(SEGMENT_PREFIX) :].partition(".")
    if not number.isdigit():
        return None
    return hid, int(number)


@dataclass
class CatalogRecord:
    """What a session's catalog atom says about it.

    Writes keep it ahead of the data: a segment is listed before it is created and
    unlisted before it is dropped, the atoms a pop (or a partial clear) erases are named
    in `erasing` before it
    erases it, and `clearing` is set before a clear drops anything. So whatever a
    crash interrupts, the record explains every region and atom that is left.
    """

    session_id: str
    # The branch this record's segments hold (AdvancedSQLiteSession's): MAIN is the session itself.
    branch: str = MAIN
    # The session's live segment numbers, ascending; None in a format-1 record (then
    # every segment of the session is live).
    segments: list[int] | None = field(default_factory=list)
    # The number the next new segment takes: numbers are never reused, so a
    # segment dropped once can never be mistaken for a live one.
    next_segment: int = 0
    erasing: list[int] = field(default_factory=list)
    clearing: bool = False
    # The batch id of a replacement under way (suffix.py): its new items and this id
    # are written in one batch, then the items in `erasing` are forgotten.
    replacing: str | None = None
    # The session's own retention (a write brought it), and when it was last popped (µs): a
    # pop is a write, and its session's TTL or idle time counts from it (retention.py).
    retention: SessionOptions | None = None
    touched: int | None = None
    # MAIN's record: every branch name the session has used (never used again, as the SDK's).
    branches: list[str] = field(default_factory=list)
    # Whether the segments hold usage atoms (a run's tokens, usage.py): a pop then looks for them.
    usage: bool = False
    # A branch being created (its items copied, branches.py): erased on open if a crash cut it off.
    copying: bool = False
    # MAIN's record: the person the session is about (data_owners.py), and when that was recorded
    # (µs). Inside the encrypted record, as the session id is: no file holds it in plain text.
    owner: str | None = None
    owner_since: int | None = None
    labels: dict[str, Any] | None = None  # MAIN's: a few the application gave (listings return them)
    # The erasure ledger's head (number, MAC) after this session's newest erasure, written in the
    # commit that announces it: the file's head is the newest of these and the layout record's.
    ledger: list[Any] | None = None

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "segments": self.segments,
            "next": self.next_segment,
            "erasing": self.erasing,
            "clearing": self.clearing,
        }
        if self.replacing is not None:
            payload["replacing"] = self.replacing
        if self.retention is not None:
            payload["retention"] = self.retention.to_payload()
        if self.touched is not None:
            payload["touched"] = self.touched
        if self.branch != MAIN:
            payload["branch"] = self.branch
        if self.branches:
            payload["branches"] = self.branches
        if self.usage:
            payload["usage"] = True
        if self.copying:
            payload["copying"] = True
        if self.owner is not None:
            payload["owner"], payload["owner_since"] = self.owner, self.owner_since
        if self.labels is not None:
            payload["labels"] = self.labels
        if self.ledger is not None:
            payload["ledger"] = self.ledger
        try:
            self.session_id.encode("utf-8")
            payload["session"] = self.session_id
        except UnicodeEncodeError:
            # Citadel refuses a payload holding a lone surrogate, which a str can hold;
            # its JSON escape round-trips (tests/test_hostile_input.py).
            payload["escaped"] = json.dumps(self.session_id)
        return payload

    @classmethod
    def from_payload(cls, payload: Any) -> CatalogRecord:
        if isinstance(payload, str):  # format 1: the id alone
            return cls(payload, segments=None)
        session_id = payload["session"] if "session" in payload else json.loads(payload["escaped"])
        if "segments" not in payload:  # format 1, an escaped id
            return cls(session_id, segments=None)
        return cls(
            session_id,
            segments=list(payload["segments"]),
            next_segment=int(payload["next"]),
            erasing=list(payload.get("erasing", ())),
            clearing=bool(payload.get("clearing")),
            replacing=payload.get("replacing"),
            retention=SessionOptions.from_payload(payload["retention"]) if "retention" in payload else None,
            touched=payload.get("touched"),
            branch=payload.get("branch", MAIN),
            branches=list(payload.get("branches", ())),
            usage=bool(payload.get("usage")),
            copying=bool(payload.get("copying")),
            owner=payload.get("owner"),
            ledger=payload.get("ledger"),
            owner_since=payload.get("owner_since"),
            labels=payload.get("labels"),
        )


def record_hid(salt: bytes, record: CatalogRecord) -> str:
    """The region-name stem of the session (or branch) `record` describes."""
    return session_hid(salt, record.session_id, record.branch)
