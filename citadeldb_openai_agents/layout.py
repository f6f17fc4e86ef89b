"""How sessions map onto Citadel regions, and the storage operations on them.

Measured on citadeldb 2.7.0 (see the README's "Storage layout"): filtering a
shared region by session scans the whole region, and even in a region of its
own, finding the newest atoms, `count` and `forget` cost time in proportion to
the region's size (a pop at 10,000 atoms: ~90 ms). Seeking from a known id
(`fetch(after_id=...)`, `fetch_one`) does not. So:

* each session is a chain of *segments*, regions of at most
  `SEGMENT_CAPACITY` atoms named ``coa.s.<hid>.<n>``; one atom per item, its
  payload the item's JSON text. Appends go to the tail segment, so a read of
  the newest N, a pop and an append touch one or two small regions whatever
  the session's length or the file's size;
* ``<hid>`` is an HMAC of the session id under a random per-file salt: a region
  name neither reveals a session id nor confirms a guessed one, even to someone
  who can read the (encrypted) pages. The ids themselves live in the catalog;
* the catalog region holds one atom per session, its `CatalogRecord`: the id, the
  live segments, and the erasure under way. Each write keeps the record ahead of
  the data (catalog.py), so that on open Citadel's unreadable atoms and regions
  are told apart from erasures a crash interrupted (damage.py), and the latter
  are finished;
* a batch always lands in one segment (one `remember_batch`), so it is atomic,
  and costs one commit: the record changes only when a segment is opened or
  dropped, on a pop and on a clear;
* an item's atom text (Citadel's keyword index) is the item's own text; its vector,
  computed here and handed to Citadel, is of a reply's text after its question.
* Every read checks that Citadel returned every item the pages hold (Citadel skips
  an atom whose key it cannot read, silently): a shortened history raises.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import citadeldb
from citadeldb.memory import AtomHit, Memory

from .catalog import (
    CATALOG_KIND,
    CATALOG_REGION,
    LAYOUT_FORMAT,
    META_KIND,
    META_REGION,
    CatalogRecord,
    parse_segment,
    segment_name,
    session_hid,
)
from .damage import ATOM_KEYS, AuditVerdict
from .embedders import Embedder, EmbedderIdentity, embed_documents, embed_query
from .errors import CorruptDatabaseError, EmbedderMismatchError
from .items import ITEM_KIND, decode_item, is_user_message, search_text

SEGMENT_CAPACITY = 256
_ALL = 2**63 - 1  # fetch's default limit is 100; "everything" must be asked for.
_QUESTION_LOOKBACK = 32  # items searched back for the latest user message after a restart
# Search ranks by vector distance with a user message's distance weighed up by this:
# a question resembles a query more than its answer does (benchmarks/search_quality).
_USER_DISTANCE_FACTOR = 1.3
_CANDIDATES_PER_LIMIT = 3  # per segment: candidates for `limit` results, re-ranked across segments

logger = logging.getLogger("citadeldb_openai_agents")

# The rows the file's pages hold for some regions: atom id -> expiry (µs) or None.
RowReader = Callable[[list[str]], dict[str, dict[int, int | None]]]


@dataclass
class SessionState:
    """What this process knows about one session's segments (guarded by `lock`)."""

    session_id: str
    hid: str
    segments: list[int] = field(default_factory=list)
    catalog_id: int | None = None
    record: CatalogRecord | None = None
    # Live atom ids of the tail segment, ascending, when known: they let a read of the
    # newest N seek (`after_id`) instead of scanning the segment.
    tail_ids: list[int] | None = None
    tail_stored: int = 0
    # The text of the session's latest user message, when known: a reply's vector is
    # computed with the question it answers (see `append`).
    last_question: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass(frozen=True)
class Erasure:
    """What erasing a session removed, with Citadel's evidence that the keys are gone."""

    items_erased: int
    regions_dropped: int
    algorithm: str
    readback_confirmed: bool


class SessionLayout:
    """The sessions of one open file; shared by every store on it.

    Args:
        memory: The file's memory engine.
        embedder: The embedder the file's vectors are bound to.
        verdict: The open-time audit of the file (damage.audit): it names the regions
            an interrupted erasure left, which are dropped here.
        rows: Reads the rows the pages hold for some regions (on the file's owner
            thread), to check that a read returned all of them.
        path: The file, for messages.
    """

    def __init__(
        self, memory: Memory, embedder: Embedder, verdict: AuditVerdict, rows: RowReader, path: str
    ) -> None:
        self.embedder = embedder
        self.identity = EmbedderIdentity.of(embedder)
        self.path = path
        self._rows = rows
        self._attached: set[str] = set()
        self._states: dict[str, SessionState] = {}  # by hid
        self._by_id: dict[str, SessionState] = {}
        self._states_lock = threading.Lock()
        self._attach(memory, META_REGION)
        self._attach(memory, CATALOG_REGION)
        self._salt, layout_format = self._load_meta(memory)
        self._load_index(memory, verdict)
        if layout_format < LAYOUT_FORMAT:
            self._upgrade(memory)

    # -- opening ------------------------------------------------------------------

    def _attach(self, memory: Memory, region: str) -> None:
        if region in self._attached:
            return
        try:
            memory.create_encrypted_region(region, self.embedder)
        except citadeldb.DataError as exc:
            raise self._mismatch(str(exc)) from None
        self._attached.add(region)

    def _mismatch(self, detail: str) -> EmbedderMismatchError:
        return EmbedderMismatchError(
            f"this file's items were embedded with another model than {self.identity.model_id!r} "
            f"(dim {self.identity.dim}, {self.identity.metric}): {detail}. Open it with the "
            "embedder it was written with, or re-embed the stored text with "
            "`python -m citadeldb_openai_agents reembed`."
        )

    def _load_meta(self, memory: Memory) -> tuple[bytes, int]:
        found = memory.fetch(META_REGION, META_KIND, limit=1)
        if found:
            meta = found[0].payload
            self._meta_id = found[0].id
        else:
            # A new file (the open-time audit refused a used file whose record is unreadable).
            meta = {
                "format": LAYOUT_FORMAT,
                "salt": secrets.token_hex(32),
                "embedder": self.identity.__dict__,
            }
            # Text is never empty: Citadel re-embeds (reembed_file) from an atom's text.
            self._meta_id = memory.remember(META_REGION, {"kind": META_KIND, "text": "layout", "payload": meta})
        recorded = EmbedderIdentity(**meta["embedder"])
        if recorded != self.identity:
            raise self._mismatch(
                f"it records {recorded.model_id!r} (dim {recorded.dim}, {recorded.metric})"
            )
        return bytes.fromhex(meta["salt"]), int(meta.get("format", 1))

    def _load_index(self, memory: Memory, verdict: AuditVerdict) -> None:
        for hit in memory.fetch(CATALOG_REGION, CATALOG_KIND, limit=_ALL):
            record = CatalogRecord.from_payload(hit.payload)
            state = self._new_state(record.session_id)
            state.catalog_id, state.record = hit.id, record
        for name in _region_names(memory, verdict.leftovers):
            parsed = parse_segment(name)
            if parsed is None:
                continue
            if name in verdict.leftovers:
                memory.drop_region(name)  # left by an erasure a crash interrupted
                continue
            hid, number = parsed
            state = self._states.get(hid)
            listed = None if state is None or state.record is None else state.record.segments
            if state is None or state.record is None or (listed is not None and number not in listed):
                # The audit explains every region or refuses the file: this one changed since.
                raise CorruptDatabaseError(
                    f"{self.path} changed while it was being opened: segment {name} has no "
                    "catalog record. Run `python -m citadeldb_openai_agents verify`."
                )
            state.segments.append(number)
        for state in list(self._states.values()):
            state.segments.sort()
            if state.record is not None and state.record.clearing:
                self.clear(memory, state)  # a clear a crash interrupted: finish it (its regions went above)

    def _upgrade(self, memory: Memory) -> None:
        """Rewrite a format-1 file's catalog records as format 2 (idempotent; the layout record last)."""
        for state in self.states():
            record = state.record
            if record is None or record.segments is not None:
                continue
            record.segments = list(state.segments)
            record.next_segment = state.segments[-1] + 1 if state.segments else 0
            self._write_record(memory, state)
        meta = dict(memory.fetch(META_REGION, META_KIND, limit=1)[0].payload)
        meta["format"] = LAYOUT_FORMAT
        memory.update_atom_payload(META_REGION, self._meta_id, meta)
        logger.info("upgraded %s to layout format %d", self.path, LAYOUT_FORMAT)

    def hid(self, session_id: str) -> str:
        """The session's region-name stem: reveals nothing without the file's salt."""
        return session_hid(self._salt, session_id)

    def _new_state(self, session_id: str) -> SessionState:
        hid = self.hid(session_id)
        state = self._states.get(hid)
        if state is None:
            state = SessionState(session_id=session_id, hid=hid)
            self._states[hid] = state
            self._by_id[session_id] = state
        return state

    def state(self, session_id: str) -> SessionState:
        """The (possibly empty) state of a session, created on first use."""
        state = self._by_id.get(session_id)  # skips the HMAC on every call but the first
        if state is not None:
            return state
        with self._states_lock:
            return self._new_state(session_id)

    def states(self) -> list[SessionState]:
        with self._states_lock:
            return list(self._states.values())

    # -- the catalog record --------------------------------------------------------

    def _write_record(self, memory: Memory, state: SessionState) -> None:
        """Store the session's record (creating its catalog atom on first use)."""
        assert state.record is not None
        payload = state.record.to_payload()
        if state.catalog_id is None:
            entry = {"kind": CATALOG_KIND, "text": "session", "payload": payload}
            state.catalog_id = memory.remember(CATALOG_REGION, entry)
        else:
            memory.update_atom_payload(CATALOG_REGION, state.catalog_id, payload)

    def _record(self, state: SessionState) -> CatalogRecord:
        if state.record is None:
            state.record = CatalogRecord(state.session_id)
        return state.record

    # -- regions ------------------------------------------------------------------

    def _region(self, memory: Memory, state: SessionState, number: int) -> str:
        """The segment's region name, attached to the embedder (once per process)."""
        name = segment_name(state.hid, number)
        self._attach(memory, name)
        return name

    def _live_hits(self, memory: Memory, state: SessionState, number: int) -> list[AtomHit]:
        return memory.fetch(self._region(memory, state, number), ITEM_KIND, limit=_ALL)

    def _open_segment(self, memory: Memory, state: SessionState) -> str:
        """A new tail segment: listed in the record first, then created."""
        record = self._record(state)
        number = record.next_segment
        record.next_segment += 1
        assert record.segments is not None  # format-1 records are upgraded on open
        record.segments.append(number)
        self._write_record(memory, state)
        region = self._region(memory, state, number)
        state.segments.append(number)
        state.tail_ids, state.tail_stored = [], 0
        return region

    def _drop_segment(self, memory: Memory, state: SessionState, number: int, *, unlist: bool = True) -> None:
        # Unlisted first: a crash before the drop leaves a region the record explains.
        # Dropping an encrypted region destroys its atoms' keys (tests/test_erasure.py),
        # attached or not; attaching first would cost ~3 ms a segment after a reopen.
        if unlist and state.record is not None and state.record.segments is not None:
            state.record.segments.remove(number)
            self._write_record(memory, state)
        name = segment_name(state.hid, number)
        memory.drop_region(name)
        self._attached.discard(name)
        state.segments.remove(number)
        if not state.segments or number > state.segments[-1]:
            state.tail_ids = None
            state.tail_stored = 0

    def _tail_ids(self, memory: Memory, state: SessionState) -> list[int]:
        if state.tail_ids is None:
            number = state.segments[-1]
            hits = self._live_hits(memory, state, number)
            self._check_complete(state, {number: [hit.id for hit in hits]})
            state.tail_ids = [hit.id for hit in hits]
            state.tail_stored = max(state.tail_stored, len(state.tail_ids))
        return state.tail_ids

    def _check_complete(self, state: SessionState, read: dict[int, list[int]], newest: int | None = None) -> None:
        """Raise unless `read` holds every unexpired item the pages hold in those segments.

        `read` maps a segment to the ids a read returned from it; with `newest`, the read
        asked for that many of the segment's newest items only.
        """
        names = {number: segment_name(state.hid, number) for number in read}
        stored = self._rows(list(names.values()))
        now = time.time_ns() // 1000  # after the reads: an item that expired since may be gone
        missing = expected = 0
        for number, ids in read.items():
            live = sorted(a for a, expires in stored[names[number]].items() if expires is None or expires > now)
            if newest is not None:
                live = live[-newest:]
            expected += len(live)
            missing += len(set(live) - set(ids))
        if missing:
            raise self.damaged(state, missing, expected)

    def damaged(self, state: SessionState, missing: int, expected: int) -> CorruptDatabaseError:
        """The error for a read that came back short."""
        return CorruptDatabaseError(
            f"{self.path} is damaged: {missing} of {expected} items of session {state.session_id!r} "
            f"cannot be read ({ATOM_KEYS}), and a read never returns a shortened history. Run "
            "`python -m citadeldb_openai_agents verify` for the full report, and restore the file "
            "and its companion files together from a backup."
        )

    # -- operations (each runs in a worker thread, under the session's lock) -------

    def append(
        self,
        memory: Memory,
        state: SessionState,
        payloads: list[str],
        texts: list[str],
        from_user: list[bool],
        expires_at: int | None,
    ) -> None:
        """Store one batch atomically, in one segment.

        Every item that is not the user's is embedded with the latest user message
        before it: a query matches the user's question better than the reply that
        answers it, so the reply's vector must carry the question's meaning too
        (benchmarks/search_quality). Its keyword text stays its own: the keyword
        index is what a longer text makes a write pay for (+20% a turn), the
        vector costs the same whatever it was computed from.
        """
        question = self._last_question(memory, state)
        contextual = []
        for text, user in zip(texts, from_user):
            if user:
                question = text
            contextual.append(_in_context(question, text, user))
        vectors = embed_documents(self.embedder, contextual)
        if expires_at is not None:
            self._erase_expired_head(memory, state)
        atoms = [
            {"kind": ITEM_KIND, "text": text, "embedding": vector, "payload": payload}
            for payload, text, vector in zip(payloads, texts, vectors)
        ]
        if expires_at is not None:
            for atom in atoms:
                atom["expires_at"] = expires_at
        if not state.segments or self._tail_stored(memory, state) >= SEGMENT_CAPACITY:
            region = self._open_segment(memory, state)
        else:
            region = self._region(memory, state, state.segments[-1])
        # A failed batch writes nothing; an empty listed segment is a valid tail.
        ids = memory.remember_batch(region, atoms)
        if state.tail_ids is not None:
            state.tail_ids.extend(ids)
        state.tail_stored += len(ids)
        state.last_question = question

    def _last_question(self, memory: Memory, state: SessionState) -> str:
        """The latest user message's text (looked up once, then kept up to date)."""
        if state.last_question is None:
            state.last_question = ""
            for payload in reversed(self.newest(memory, state, _QUESTION_LOOKBACK)):
                item = decode_item(payload)
                if is_user_message(item):
                    state.last_question = search_text(item)
                    break
        return state.last_question

    def _tail_stored(self, memory: Memory, state: SessionState) -> int:
        self._tail_ids(memory, state)
        return state.tail_stored

    def newest(self, memory: Memory, state: SessionState, limit: int) -> list[str]:
        """The payloads of the newest `limit` live items, oldest first."""
        hits: list[AtomHit] = []
        for number in reversed(state.segments):
            need = limit - len(hits)
            if need <= 0:
                break
            hits[:0] = self._newest_in(memory, state, number, need)
        return [hit.payload for hit in hits]

    def _newest_in(self, memory: Memory, state: SessionState, number: int, need: int) -> list[AtomHit]:
        region = self._region(memory, state, number)
        if number == state.segments[-1]:
            ids = self._tail_ids(memory, state)
            expected = ids[-need:]
            after = ids[-need - 1] if len(ids) > need else None
            hits = memory.fetch(region, ITEM_KIND, limit=need, after_id=after)
            if [hit.id for hit in hits] == expected:
                return hits
            state.tail_ids = None  # something expired (or went missing): look again
        hits = memory.fetch(region, ITEM_KIND, limit=need, newest=True)
        self._check_complete(state, {number: [hit.id for hit in hits]}, newest=need)
        return hits

    def all_items(self, memory: Memory, state: SessionState) -> list[str]:
        """The payloads of every live item, oldest first."""
        read: dict[int, list[int]] = {}
        payloads: list[str] = []
        for number in state.segments:
            hits = self._live_hits(memory, state, number)
            read[number] = [hit.id for hit in hits]
            payloads.extend(hit.payload for hit in hits)
        if read:
            self._check_complete(state, read)
        return payloads

    def pop(self, memory: Memory, state: SessionState) -> str | None:
        """Erase the newest live item and return its payload (None when there is none)."""
        state.last_question = None  # it may be what goes
        while state.segments:
            number = state.segments[-1]
            hits = self._newest_in(memory, state, number, 1)
            if not hits:
                # Only expired atoms left in the tail: erase them with their segment.
                self._drop_segment(memory, state, number)
                continue
            hit = hits[0]
            record = self._record(state)
            record.popping = hit.id  # announced: a crash mid-erasure is not damage
            if state.tail_ids == [hit.id] and record.segments is not None:
                # The segment's last live item: dropping the segment erases its key too.
                self._drop_segment(memory, state, number)
                return hit.payload
            self._write_record(memory, state)
            receipt = memory.forget(self._region(memory, state, number), [hit.id])
            if receipt.rows_deleted == 0:
                state.tail_ids = None
                continue
            if state.tail_ids:
                state.tail_ids.remove(hit.id)
            state.tail_stored = max(0, state.tail_stored - 1)
            if not state.tail_ids and not self._has_live(memory, state, number):
                self._drop_segment(memory, state, number)
            return hit.payload
        return None

    def clear(self, memory: Memory, state: SessionState) -> str | None:
        """Erase the whole session: mark its record as clearing, drop its segments, forget the record.

        Returns the key-wrapping algorithm from the catalog atom's forget receipt, if
        the session had one (dropping a region gives no receipt).
        """
        state.last_question = None  # it may be what goes
        if state.catalog_id is not None:
            record = self._record(state)
            if not record.clearing:
                record.clearing = True
                self._write_record(memory, state)
        for number in list(state.segments):
            self._drop_segment(memory, state, number, unlist=False)
        algorithm = None
        if state.catalog_id is not None:
            # The last step: a record gone while its segments remain can only be damage.
            algorithm = memory.forget(CATALOG_REGION, [state.catalog_id]).algorithm
            state.catalog_id = None
        state.record = None
        return algorithm

    def erase(self, memory: Memory, state: SessionState) -> Erasure | None:
        """`clear`, then read back through Citadel that every erased atom is gone.

        Dropping a region returns no receipt, so the evidence is gathered here: the
        ids of every stored item first, then, per dropped segment, a region of the
        same name is attached and Citadel's `verify` must call each of those ids
        ``missing`` (no row, no key). None when the file holds nothing for the session.
        """
        if state.catalog_id is None and not state.segments:
            return None
        erased = {number: [hit.id for hit in self._live_hits(memory, state, number)] for number in state.segments}
        algorithm = self.clear(memory, state) or "AES-256-KW(RFC3394)"
        confirmed = True
        for number, ids in erased.items():
            region = self._region(memory, state, number)
            verdicts = memory.verify(region, ids) if ids else []
            confirmed = confirmed and all(v.verdict == "missing" for v in verdicts)
            memory.drop_region(region)
            self._attached.discard(region)
        return Erasure(
            items_erased=sum(len(ids) for ids in erased.values()),
            regions_dropped=len(erased),
            algorithm=algorithm,
            readback_confirmed=confirmed,
        )

    def summary(self, memory: Memory, state: SessionState) -> tuple[int, int, int] | None:
        """(live items, creation time of the oldest, of the newest) in µs; None when empty."""
        oldest = next(
            (hits[0] for n in state.segments
             if (hits := memory.fetch(self._region(memory, state, n), ITEM_KIND, limit=1))),
            None,
        )
        if oldest is None:
            return None
        newest = next(
            (hits[0] for n in reversed(state.segments) if (hits := self._newest_in(memory, state, n, 1))),
            oldest,
        )
        count = sum(memory.count(self._region(memory, state, n), ITEM_KIND) for n in state.segments)
        return count, oldest.created_at, newest.created_at

    def inspect(self, memory: Memory, state: SessionState) -> tuple[int, int, dict[str, int]]:
        """(items the pages hold, items Citadel reads, Citadel's verdicts on those) for `verify`."""
        read = {n: [hit.id for hit in self._live_hits(memory, state, n)] for n in state.segments}
        names = {n: segment_name(state.hid, n) for n in read}
        stored = self._rows(list(names.values())) if names else {}
        now = time.time_ns() // 1000
        expected = readable = 0
        verdicts: dict[str, int] = {}
        for number, ids in read.items():
            live = {a for a, expires in stored[names[number]].items() if expires is None or expires > now}
            expected += len(live | set(ids))
            readable += len(ids)
            for attestation in memory.verify(names[number], ids) if ids else []:
                verdicts[attestation.verdict] = verdicts.get(attestation.verdict, 0) + 1
        return expected, readable, verdicts

    def has_live_item(self, memory: Memory, state: SessionState) -> bool:
        return any(self._has_live(memory, state, n) for n in reversed(state.segments))

    def _has_live(self, memory: Memory, state: SessionState, number: int) -> bool:
        return bool(memory.fetch(self._region(memory, state, number), ITEM_KIND, limit=1))

    def _erase_expired_head(self, memory: Memory, state: SessionState) -> None:
        """Erase expired atoms from the oldest segments (where expiry happens first)."""
        erased = 0
        while state.segments:
            number = state.segments[0]
            region = self._region(memory, state, number)
            erased += memory.evict(region, citadeldb.EvictionPolicy.expired())
            if len(state.segments) == 1 or self._has_live(memory, state, number):
                break
            self._drop_segment(memory, state, number)
        if erased:
            state.tail_ids = None

    def purge_expired(self, memory: Memory, state: SessionState) -> int:
        """Erase every expired atom of the session; drop segments left empty."""
        state.last_question = None  # it may be what goes
        erased = 0
        for number in list(state.segments):
            region = self._region(memory, state, number)
            erased += memory.evict(region, citadeldb.EvictionPolicy.expired())
            if not self._has_live(memory, state, number):
                self._drop_segment(memory, state, number)
        if erased:
            state.tail_ids = None
        if not state.segments and state.catalog_id is not None:
            memory.forget(CATALOG_REGION, [state.catalog_id])
            state.catalog_id = None
            state.record = None
        return erased

    def search(self, memory: Memory, state: SessionState, query: str, limit: int) -> list[str]:
        """The session's live items ranked by Citadel's hybrid recall, best first.

        Each segment proposes candidates with Citadel's hybrid recall; they are merged
        by vector distance, because Citadel's relevance is normalised per region and
        does not compare across segments.
        """
        if not state.segments:
            return []
        # Embed the query once, not once per segment: a real model costs ~10 ms a call.
        vector = embed_query(self.embedder, query)
        hits: list[AtomHit] = []
        for number in state.segments:
            region = self._region(memory, state, number)
            hits.extend(memory.recall(
                region, text=query, embedding=vector, k=limit * _CANDIDATES_PER_LIMIT, kinds=[ITEM_KIND]
            ))

        def distance(hit: AtomHit) -> float:
            base = hit.distance if hit.distance is not None else 2.0
            return base * _USER_DISTANCE_FACTOR if is_user_message(decode_item(hit.payload)) else base

        hits.sort(key=lambda hit: (distance(hit), -hit.id))
        return [hit.payload for hit in hits[:limit]]

    def segment_regions(self, state: SessionState) -> list[str]:
        return [segment_name(state.hid, n) for n in state.segments]


def _region_names(memory: Memory, leftovers: set[str]) -> list[str]:
    """The names of the file's regions, after finishing any drop a crash interrupted.

    citadeldb 2.7.0 drops a region in two steps: it erases the region's key, then
    deletes the region. A process killed between the two leaves a region whose key
    is gone, and `Memory.regions()` then raises for the whole file, so the file
    would never open again (tests/test_crash.py found it). Dropping such a region
    again completes the drop. A damaged key in ``-regions`` looks the same, so only
    the regions the open-time audit found left by an erasure (`leftovers`) are
    dropped; any other stops here.
    """
    return [region.name for region in _regions(memory, leftovers)]


def _regions(memory: Memory, leftovers: set[str]) -> list[Any]:
    """`_region_names`, with each region's recorded model (`citadeldb.RegionIdentity`)."""
    finished: set[str] = set()
    while True:
        try:
            return list(memory.regions())
        except citadeldb.EncryptionError as exc:
            match = _FORGOTTEN_REGION.fullmatch(str(exc))
            if match is None or match.group(1) in finished or match.group(1) not in leftovers:
                raise
            finished.add(match.group(1))
            memory.drop_region(match.group(1))


_FORGOTTEN_REGION = re.compile(r"region '(.*)' has been forgotten: .*", re.DOTALL)


def reembed_file(memory: Memory, embedder: Embedder, leftovers: set[str]) -> tuple[int, int]:
    """Re-embed every region of this layout from its stored text; record the new embedder.

    Runs before any `SessionLayout` is built on the file (its regions must not be
    attached to the old embedder). Items, ids and keys are kept, and each item's
    vector is computed in context, as `append` computes it. Idempotent: if it is
    interrupted, running it again finishes the job. Returns (regions, items).
    """
    regions = {region.name: region for region in _regions(memory, leftovers)}
    segments: dict[str, list[int]] = {}
    for name in regions:
        parsed = parse_segment(name)
        if parsed is not None:
            segments.setdefault(parsed[0], []).append(parsed[1])
    items = 0
    for hid, numbers in segments.items():
        question = ""  # carried across a session's segments, in order
        for number in sorted(numbers):
            region = segment_name(hid, number)
            # Reading the items needs the region attached, to the model it was written with.
            memory.create_encrypted_region(region, _StoredModel(regions[region]))
            contexts: dict[str, deque[str]] = {}
            for hit in memory.fetch(region, ITEM_KIND, limit=_ALL):
                item = decode_item(hit.payload)
                user = is_user_message(item)
                own = search_text(item)  # not hit.text: files written before 2026-11-30 hold question+own there
                if user:
                    question = own
                contexts.setdefault(hit.text, deque()).append(_in_context(question, own, user))
            items += memory.reembed_region(region, _InContext(embedder, contexts)).atoms_migrated
    # The meta region last: it records the embedder, so it moves once the rest has.
    others = [name for name in (CATALOG_REGION, META_REGION) if name in regions]
    for name in others:
        memory.reembed_region(name, embedder)
    found = memory.fetch(META_REGION, META_KIND, limit=1)
    if found:
        meta = dict(found[0].payload)
        meta["embedder"] = EmbedderIdentity.of(embedder).__dict__
        memory.update_atom_payload(META_REGION, found[0].id, meta)
    return sum(len(numbers) for numbers in segments.values()) + len(others), items


def _in_context(question: str, text: str, from_user: bool) -> str:
    """What an item's vector is computed from: a reply's text after the question it answers."""
    return f"{question}\n{text}" if question and not from_user else text


class _StoredModel:
    """A region's recorded model, to attach it by: reading needs no embedding."""

    def __init__(self, region: Any) -> None:
        self.dim, self.metric, self.model_id = region.dim, region.metric, region.model_id

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        raise RuntimeError(f"{self.model_id!r} is not loaded; this region is being re-embedded")


class _InContext:
    """`embedder` as `reembed_region` should call it: each stored text embedded in context.

    Citadel re-embeds a region from its atoms' stored texts, in id order; `contexts`
    maps each live item's stored text to the texts its vectors come from, in id
    order too. A text it does not know (an expired item) is embedded as it is.
    """

    def __init__(self, embedder: Embedder, contexts: dict[str, deque[str]]) -> None:
        self.dim, self.metric, self.model_id = embedder.dim, embedder.metric, embedder.model_id
        self._embedder = embedder
        self._contexts = contexts

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        in_context = [queue.popleft() if (queue := self._contexts.get(t)) else t for t in texts]
        return self._embedder.embed_with_cancel(in_context, cancel_token)
