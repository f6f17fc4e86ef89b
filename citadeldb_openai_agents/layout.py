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
* ``<hid>`` is an HMAC of the session id under a random per-file salt, because
  region names are not encrypted: the file does not reveal (or let anyone
  confirm) a session id. The ids themselves live in the encrypted catalog;
* the catalog region holds one atom per session (its payload the session id).
  It is the commit point of a clear: the catalog atom is forgotten first, then
  the segments are dropped; segments whose session has no catalog atom (a
  clear interrupted by a crash) are dropped when the file is next opened;
* a batch always lands in one segment (one `remember_batch`), so it is atomic;
* an item's atom text (Citadel's keyword index) is the item's own text; its vector,
  computed here and handed to Citadel, is of a reply's text after its question.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import citadeldb
from citadeldb.memory import AtomHit, Memory

from .embedders import Embedder, EmbedderIdentity, embed_documents, embed_query
from .errors import EmbedderMismatchError
from .items import ITEM_KIND, decode_item, is_user_message, search_text

LAYOUT_FORMAT = 1
SEGMENT_CAPACITY = 256
META_REGION = "coa.meta"
CATALOG_REGION = "coa.catalog"
SEGMENT_PREFIX = "coa.s."
_ALL = 2**63 - 1  # fetch's default limit is 100; "everything" must be asked for.
_QUESTION_LOOKBACK = 32  # items searched back for the latest user message after a restart
# Search ranks by vector distance with a user message's distance weighed up by this:
# a question resembles a query more than its answer does (benchmarks/search_quality).
_USER_DISTANCE_FACTOR = 1.3
_CANDIDATES_PER_LIMIT = 3  # per segment: candidates for `limit` results, re-ranked across segments


@dataclass
class SessionState:
    """What this process knows about one session's segments (guarded by `lock`)."""

    session_id: str
    hid: str
    segments: list[int] = field(default_factory=list)
    catalog_id: int | None = None
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
    """The sessions of one open file; shared by every store on it."""

    def __init__(self, memory: Memory, embedder: Embedder) -> None:
        self.embedder = embedder
        self.identity = EmbedderIdentity.of(embedder)
        self._attached: set[str] = set()
        self._states: dict[str, SessionState] = {}  # by hid
        self._by_id: dict[str, SessionState] = {}
        self._states_lock = threading.Lock()
        self._attach(memory, META_REGION)
        self._attach(memory, CATALOG_REGION)
        self._salt = self._load_meta(memory)
        self._load_index(memory)

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

    def _load_meta(self, memory: Memory) -> bytes:
        found = memory.fetch(META_REGION, "layout", limit=1)
        if found:
            meta = found[0].payload
        else:
            meta = {
                "format": LAYOUT_FORMAT,
                "salt": secrets.token_hex(32),
                "embedder": self.identity.__dict__,
            }
            # Text is never empty: Citadel re-embeds (reembed_file) from an atom's text.
            memory.remember(META_REGION, {"kind": "layout", "text": "layout", "payload": meta})
        recorded = EmbedderIdentity(**meta["embedder"])
        if recorded != self.identity:
            raise self._mismatch(
                f"it records {recorded.model_id!r} (dim {recorded.dim}, {recorded.metric})"
            )
        return bytes.fromhex(meta["salt"])

    def _load_index(self, memory: Memory) -> None:
        for hit in memory.fetch(CATALOG_REGION, "session", limit=_ALL):
            state = self._new_state(_catalog_session_id(hit.payload))
            state.catalog_id = hit.id
        orphans = []
        for name in _region_names(memory):
            parsed = _parse_segment(name)
            if parsed is None:
                continue
            hid, number = parsed
            state = self._states.get(hid)
            if state is None or state.catalog_id is None:
                orphans.append(name)
            else:
                state.segments.append(number)
        for state in self._states.values():
            state.segments.sort()
        # Segments of a session without a catalog atom: a clear that a crash interrupted.
        for region in orphans:
            memory.drop_region(region)

    def hid(self, session_id: str) -> str:
        """The session's region-name stem: reveals nothing without the file's salt."""
        digest = hmac.new(
            self._salt, session_id.encode("utf-8", "surrogatepass"), hashlib.sha256
        ).hexdigest()
        return digest[:32]

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

    # -- regions ------------------------------------------------------------------

    def _region(self, memory: Memory, state: SessionState, number: int) -> str:
        """The segment's region name, attached to the embedder (once per process)."""
        name = _segment_name(state, number)
        self._attach(memory, name)
        return name

    def _live_ids(self, memory: Memory, state: SessionState, number: int) -> list[int]:
        return [hit.id for hit in memory.fetch(self._region(memory, state, number), ITEM_KIND, limit=_ALL)]

    def _drop_segment(self, memory: Memory, state: SessionState, number: int) -> None:
        # Dropping an encrypted region destroys its atoms' keys (tests/test_erasure.py),
        # attached or not; attaching first would cost ~3 ms a segment after a reopen.
        name = _segment_name(state, number)
        memory.drop_region(name)
        self._attached.discard(name)
        state.segments.remove(number)
        if not state.segments or number > state.segments[-1]:
            state.tail_ids = None
            state.tail_stored = 0

    def _tail_ids(self, memory: Memory, state: SessionState) -> list[int]:
        if state.tail_ids is None:
            state.tail_ids = self._live_ids(memory, state, state.segments[-1])
            state.tail_stored = max(state.tail_stored, len(state.tail_ids))
        return state.tail_ids

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
        if state.catalog_id is None:
            entry = {"kind": "session", "text": "session", "payload": _catalog_payload(state.session_id)}
            state.catalog_id = memory.remember(CATALOG_REGION, entry)
        if expires_at is not None:
            self._erase_expired_head(memory, state)
        atoms = [
            {"kind": ITEM_KIND, "text": text, "embedding": vector, "payload": payload}
            for payload, text, vector in zip(payloads, texts, vectors)
        ]
        if expires_at is not None:
            for atom in atoms:
                atom["expires_at"] = expires_at
        new_segment = not state.segments or self._tail_stored(memory, state) >= SEGMENT_CAPACITY
        if new_segment:
            number = state.segments[-1] + 1 if state.segments else 0
            region = self._region(memory, state, number)
            state.segments.append(number)
            state.tail_ids, state.tail_stored = [], 0
        else:
            region = self._region(memory, state, state.segments[-1])
        try:
            ids = memory.remember_batch(region, atoms)
        except BaseException:
            if new_segment:
                self._drop_segment(memory, state, state.segments[-1])
            raise
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
            state.tail_ids = None  # something expired: rebuild the ids on next use
        return memory.fetch(region, ITEM_KIND, limit=need, newest=True)

    def all_items(self, memory: Memory, state: SessionState) -> list[str]:
        """The payloads of every live item, oldest first."""
        payloads: list[str] = []
        for number in state.segments:
            region = self._region(memory, state, number)
            payloads.extend(hit.payload for hit in memory.fetch(region, ITEM_KIND, limit=_ALL))
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
        """Erase the whole session: forget its catalog atom (the commit point), drop its segments.

        Returns the key-wrapping algorithm from the catalog atom's forget receipt, if
        the session had one (dropping a region gives no receipt).
        """
        state.last_question = None  # it may be what goes
        algorithm = None
        if state.catalog_id is not None:
            algorithm = memory.forget(CATALOG_REGION, [state.catalog_id]).algorithm
            state.catalog_id = None
        for number in list(state.segments):
            self._drop_segment(memory, state, number)
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
        erased = {number: self._live_ids(memory, state, number) for number in state.segments}
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

    def attest(self, memory: Memory, state: SessionState) -> dict[str, int]:
        """Citadel's per-atom verdicts (authentic, tampered, ...) for every live item."""
        verdicts: dict[str, int] = {}
        for number in state.segments:
            ids = self._live_ids(memory, state, number)
            for attestation in memory.verify(self._region(memory, state, number), ids) if ids else []:
                verdicts[attestation.verdict] = verdicts.get(attestation.verdict, 0) + 1
        return verdicts

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
        return [_segment_name(state, n) for n in state.segments]


def _segment_name(state: SessionState, number: int) -> str:
    return f"{SEGMENT_PREFIX}{state.hid}.{number}"


def _catalog_payload(session_id: str) -> str | dict[str, str]:
    """The catalog's record of a session id: the id, or its escaped JSON text.

    Citadel refuses a payload holding a lone surrogate (tests/test_hostile_input.py found
    it), which a Python str can; its ``\\u`` escape round-trips. A dict keeps the two
    forms apart, so files written before the escape read as they did.
    """
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        return {"escaped": json.dumps(session_id)}
    return session_id


def _catalog_session_id(payload: str | dict[str, str]) -> str:
    return payload if isinstance(payload, str) else json.loads(payload["escaped"])


def _region_names(memory: Memory) -> list[str]:
    """The names of the file's regions, after finishing any drop a crash interrupted.

    citadeldb 2.7.0 drops a region in two steps: it erases the region's key, then
    deletes the region. A process killed between the two leaves a region whose key
    is gone, and `Memory.regions()` then raises for the whole file, so the file
    would never open again (tests/test_crash.py found it). Dropping such a region
    again completes the drop; its atoms were unreadable since the first step.
    """
    return [region.name for region in _regions(memory)]


def _regions(memory: Memory) -> list[Any]:
    """`_region_names`, with each region's recorded model (`citadeldb.RegionIdentity`)."""
    finished: set[str] = set()
    while True:
        try:
            return list(memory.regions())
        except citadeldb.EncryptionError as exc:
            match = _FORGOTTEN_REGION.fullmatch(str(exc))
            if match is None or match.group(1) in finished:
                raise
            finished.add(match.group(1))
            memory.drop_region(match.group(1))


_FORGOTTEN_REGION = re.compile(r"region '(.*)' has been forgotten: .*", re.DOTALL)


def _parse_segment(name: str) -> tuple[str, int] | None:
    if not name.startswith(SEGMENT_PREFIX):
        return None
    hid, _, number = name[len(SEGMENT_PREFIX):].partition(".")
    if not number.isdigit():
        return None
    return hid, int(number)


def reembed_file(memory: Memory, embedder: Embedder) -> tuple[int, int]:
    """Re-embed every region of this layout from its stored text; record the new embedder.

    Runs before any `SessionLayout` is built on the file (its regions must not be
    attached to the old embedder). Items, ids and keys are kept, and each item's
    vector is computed in context, as `append` computes it. Idempotent: if it is
    interrupted, running it again finishes the job. Returns (regions, items).
    """
    regions = {region.name: region for region in _regions(memory)}
    segments: dict[str, list[int]] = {}
    for name in regions:
        parsed = _parse_segment(name)
        if parsed is not None:
            segments.setdefault(parsed[0], []).append(parsed[1])
    items = 0
    for hid, numbers in segments.items():
        question = ""  # carried across a session's segments, in order
        for number in sorted(numbers):
            region = f"{SEGMENT_PREFIX}{hid}.{number}"
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
    found = memory.fetch(META_REGION, "layout", limit=1)
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
