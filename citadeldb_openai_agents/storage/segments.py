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
  the data (records.py), so that on open Citadel's unreadable atoms and regions
  are told apart from erasures a crash interrupted (audit.py), and the latter
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

import hashlib
import hmac
import logging
import re
import secrets
import threading
from collections.abc import Mapping
from typing import Any

import citadeldb
from citadeldb.memory import AtomHit, Memory

from ..embedders.protocol import Embedder, EmbedderIdentity
from ..errors import RUN_VERIFY, ConfigurationError, CorruptDatabaseError, EmbedderMismatchError
from ..options import StoreOptions
from .audit import AuditVerdict, logged_name
from .codec import ITEM_KIND
from .completeness import CompletenessCheck, RowReader, now_micros
from .erasure_notes import ErasureNotes, head_of
from .ledger import LedgerHead
from .receipts import RecentErasures
from .records import (
    CATALOG_KIND,
    CATALOG_REGION,
    LAYOUT_FORMAT,
    MAIN,
    META_KIND,
    META_REGION,
    CatalogRecord,
    parse_segment,
    segment_name,
    session_hid,
)
from .search_index import SegmentIndex
from .segment_cache import SegmentCache, SegmentCaches, SessionState, live_ids

SEGMENT_CAPACITY = 256

# A session's id, or a branch of it: (id, branch). On the wire, a list of two.
SessionKey = str | tuple[str, str]


def split_key(key: SessionKey) -> tuple[str, str]:
    """(session id, branch) of a key."""
    return (key, MAIN) if isinstance(key, str) else (key[0], key[1])


def key_of(session_id: str, branch: str) -> SessionKey:
    """The key of a session's branch: the id alone for MAIN."""
    return session_id if branch == MAIN else (session_id, branch)


ALL = 2**63 - 1  # fetch's default limit is 100; "everything" must be asked for.

logger = logging.getLogger("citadeldb_openai_agents")


class SessionLayout:
    """The sessions of one open file; shared by every store on it.

    Args:
        memory: The file's memory engine.
        embedder: The embedder the file's vectors are bound to.
        verdict: The open-time audit of the file (damage.audit): it names the regions
            an interrupted erasure left, which are dropped here.
        rows, writes: What checks that a read returned every item (completeness.py).
        path: The file, for messages.
    """

    def __init__(
        self,
        memory: Memory,
        embedder: Embedder,
        verdict: AuditVerdict,
        rows: RowReader,
        writes: Mapping[str | None, int],
        path: str,
    ) -> None:
        self.embedder = embedder
        self.identity = EmbedderIdentity.of(embedder)
        self.path = path
        self.caches = SegmentCaches(writes)
        self.completeness = CompletenessCheck(rows, self.caches, path)
        self._attached: set[str] = set()
        self._states: dict[str, SessionState] = {}  # by hid
        self._by_id: dict[SessionKey, SessionState] = {}
        self._branches: dict[str, dict[str, SessionState]] = {}  # by session id, then name (not MAIN)
        self._states_lock = threading.Lock()
        self._attach(memory, META_REGION)
        self._attach(memory, CATALOG_REGION)
        self._salt, layout_format = self._load_meta(memory)
        # How long its sessions live (retention.py): the first store to open the file here sets it.
        self.retention = StoreOptions()
        self._retention_set = False
        self._load_index(memory, verdict)
        if layout_format < LAYOUT_FORMAT:
            self._upgrade(memory)

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
            self._meta_id = memory.remember(
                META_REGION, {"kind": META_KIND, "text": "layout", "payload": meta}
            )
        self._meta = dict(meta)
        recorded = EmbedderIdentity(**meta["embedder"])
        if recorded != self.identity:
            raise self._mismatch(f"it records {recorded.model_id!r} (dim {recorded.dim}, {recorded.metric})")
        return bytes.fromhex(meta["salt"]), int(meta.get("format", 1))

    def _load_index(self, memory: Memory, verdict: AuditVerdict) -> None:
        for count in verdict.sessions:
            if count.search_data:
                logger.warning(
                    "%d search data atoms of %s in %s could not be read (damaged keys); "
                    "no item is lost: they are rebuilt from the items on the next search",
                    count.search_data,
                    logged_name(count),  # by its hash: a log line never names a session
                    self.path,
                )
        self.erasures = ErasureNotes(self._salt, self._meta.get("ledger_head"))  # and the ledger's head
        self.recent = RecentErasures()  # this owner's last erasure, retention's receipts (receipts.py)
        for hit in memory.fetch(CATALOG_REGION, CATALOG_KIND, limit=ALL):
            record = CatalogRecord.from_payload(hit.payload)
            state = self._new_state(record.session_id, record.branch)
            state.catalog_id, state.record = hit.id, record
            self.erasures.saw(record)
        for name in _region_names(memory, verdict.leftovers):
            parsed = parse_segment(name)
            if parsed is None:
                continue
            if name in verdict.leftovers:
                memory.drop_region(name)  # left by an erasure a crash interrupted
                continue
            hid, number = parsed
            owner = self._states.get(hid)
            listed = None if owner is None or owner.record is None else owner.record.segments
            if owner is None or owner.record is None or (listed is not None and number not in listed):
                # The audit explains every region or refuses the file: this one changed since.
                raise CorruptDatabaseError(
                    f"{self.path} changed while it was being opened: segment {name} has no catalog record.",
                    RUN_VERIFY,
                )
            owner.segments.append(number)
        for state in list(self._states.values()):
            state.segments.sort()
            left = state.record
            if left is not None and (left.clearing or left.copying) and state.catalog_id is not None:
                # A clear (or a branch's copy) a crash interrupted: its segments went above (the
                # audit named them left over), its record goes last.
                self.forget_record(memory, state)
                self.forget_state(state)

    def _upgrade(self, memory: Memory) -> None:
        """Rewrite a format-1 file's catalog records as format 2 (idempotent; the layout record last)."""
        for state in self.states():
            record = state.record
            if record is None or record.segments is not None:
                continue
            record.segments = list(state.segments)
            record.next_segment = state.segments[-1] + 1 if state.segments else 0
            self.write_record(memory, state)
        meta = dict(memory.fetch(META_REGION, META_KIND, limit=1)[0].payload)
        meta["format"] = LAYOUT_FORMAT
        memory.update_atom_payload(META_REGION, self._meta_id, meta)
        self._meta = meta  # else the next update_meta would write format 1 back
        logger.info("upgraded %s to layout format %d", self.path, LAYOUT_FORMAT)

    @property
    def meta(self) -> Mapping[str, Any]:
        """The layout record's values, as this process last read or wrote them."""
        return self._meta

    def update_meta(self, memory: Memory, **values: Any) -> None:
        """Store the layout record with these values changed (data_owners.py keeps its own there)."""
        with self._states_lock:
            meta = {**self._meta, **values}
            memory.update_atom_payload(META_REGION, self._meta_id, meta)
            self._meta = meta

    def keyed(self, purpose: bytes, text: str) -> str:
        """`text`'s salted HMAC for `purpose`, keyed apart from session ids: reveals nothing, and
        confirms no guess, without the file's salt."""
        key = hmac.new(self._salt, purpose, hashlib.sha256).digest()
        return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    def hid(self, session_id: str, branch: str = MAIN) -> str:
        """The session's (or branch's) region-name stem: reveals nothing without the file's salt."""
        return session_hid(self._salt, session_id, branch)

    def _new_state(self, session_id: str, branch: str = MAIN) -> SessionState:
        hid = self.hid(session_id, branch)
        state = self._states.get(hid)
        if state is None:
            state = SessionState(session_id=session_id, hid=hid, branch=branch)
            self._states[hid] = state
            self._by_id[key_of(session_id, branch)] = state
            if branch != MAIN:
                self._branches.setdefault(session_id, {})[branch] = state
        return state

    def state(self, key: SessionKey) -> SessionState:
        """The (possibly empty) state of a session, or of one of its branches (``(id, branch)``),
        created on first use."""
        state = self._by_id.get(key)  # skips the HMAC on every call but the first
        if state is not None:
            return state
        with self._states_lock:
            return self._new_state(*split_key(key))

    def states(self) -> list[SessionState]:
        with self._states_lock:
            return list(self._states.values())

    def branches(self, session_id: str) -> list[SessionState]:
        """The session's branches other than MAIN that this file holds, by name."""
        with self._states_lock:
            found = self._branches.get(session_id, {})
            return [found[name] for name in sorted(found)]

    def forget_state(self, state: SessionState) -> None:
        """A branch deleted: its state goes (its name stays used, in MAIN's record)."""
        with self._states_lock:
            self._states.pop(state.hid, None)
            self._by_id.pop(key_of(state.session_id, state.branch), None)
            self._branches.get(state.session_id, {}).pop(state.branch, None)

    def write_record(self, memory: Memory, state: SessionState) -> None:
        """Store the session's record; a newer ledger head in it goes to the layout record first (issue 59)."""
        assert state.record is not None
        if (newer := self.erasures.handed_over(held := self._meta.get("ledger_head"), state.record)) not in (None, head_of(held)):  # fmt: skip
            self.update_meta(memory, ledger_head=list(newer))
        payload = state.record.to_payload()
        if state.catalog_id is None:
            entry = {"kind": CATALOG_KIND, "text": "session", "payload": payload}
            state.catalog_id = memory.remember(CATALOG_REGION, entry)
        else:
            memory.update_atom_payload(CATALOG_REGION, state.catalog_id, payload)

    def record(self, state: SessionState) -> CatalogRecord:
        if state.record is None:
            state.record = CatalogRecord(state.session_id, state.branch)
        return state.record

    def region(self, memory: Memory, state: SessionState, number: int) -> str:
        """The segment's region name, attached to the embedder (once per process)."""
        name = segment_name(state.hid, number)
        self._attach(memory, name)
        return name

    def adopt_ledger_head(self, memory: Memory, head: LedgerHead | None) -> None:
        """A restored file's head: the ledger's, once its entries are replayed, so a ledger cut
        short after the restore is refused as one cut short before it."""
        if self.erasures.adopted(head):
            self.update_meta(memory, ledger_head=list(self.erasures.head or ()))

    def forget_record(self, memory: Memory, state: SessionState) -> str:
        """Forget the session's catalog record (its key destroyed), handing the ledger head it holds
        to the layout record first (erasure_notes.py); the algorithm of the receipt."""
        assert state.catalog_id is not None
        head = self.erasures.handed_over(self._meta.get("ledger_head"), state.record)
        if head is not None:
            self.update_meta(memory, ledger_head=list(head))
        algorithm = str(memory.forget(CATALOG_REGION, [state.catalog_id]).algorithm)
        state.catalog_id = None
        return algorithm

    def keep_retention(self, retention: StoreOptions) -> None:
        """Its sessions' TTL mode and idle time from now on: the first store here sets them, and
        another store in this process must name the same (as a client must name the owner's)."""
        if not self._retention_set:
            self.retention, self._retention_set = retention, True
        elif retention.session_rules() != self.retention.session_rules():
            raise ConfigurationError(
                f"{self.path} is already open in this process with {self.retention.describe_rules()}; this "
                f"store asked for {retention.describe_rules()}. Every store on one file ends sessions by the same rules."
            )

    def live_hits(self, memory: Memory, state: SessionState, number: int) -> list[AtomHit]:
        return memory.fetch(self.region(memory, state, number), ITEM_KIND, limit=ALL)

    def open_segment(self, memory: Memory, state: SessionState) -> str:
        """A new tail segment: listed in the record first, then created."""
        record = self.record(state)
        number = record.next_segment
        record.next_segment += 1
        assert record.segments is not None  # format-1 records are upgraded on open
        record.segments.append(number)
        self.write_record(memory, state)
        region = self.region(memory, state, number)
        state.segments.append(number)
        # A new region: empty, so its rows, payloads and search entries are all known.
        index = SegmentIndex(self.identity.dim, complete=True)
        state.cache[number] = SegmentCache(self.caches.stamp(state, number), {}, {}, index)
        return region

    def drop_segment(self, memory: Memory, state: SessionState, number: int, *, unlist: bool = True) -> None:
        # Unlisted first: a crash before the drop leaves a region the record explains.
        # Dropping an encrypted region destroys its atoms' keys (tests/test_erasure.py),
        # attached or not; attaching first would cost ~3 ms a segment after a reopen.
        if unlist and state.record is not None and state.record.segments is not None:
            state.record.segments.remove(number)
            self.write_record(memory, state)
        name = segment_name(state.hid, number)
        memory.drop_region(name)
        self._attached.discard(name)
        state.segments.remove(number)
        state.cache.pop(number, None)  # what it held went with the region

    def tail_ids(self, state: SessionState) -> list[int]:
        """The tail segment's live item ids, ascending, as the pages list them: a read of the
        newest N seeks from one (`after_id`) instead of scanning the segment."""
        number = state.segments[-1]
        atoms = self.completeness.atoms(state, [number])[number]
        return live_ids(atoms, now_micros())

    def has_live(self, memory: Memory, state: SessionState, number: int) -> bool:
        return bool(memory.fetch(self.region(memory, state, number), ITEM_KIND, limit=1))

    def tail_stored(self, state: SessionState) -> int:
        """How many item rows the tail segment holds, expired or not."""
        number = state.segments[-1]
        return len(self.completeness.atoms(state, [number])[number])

    def detach(self, name: str) -> None:
        """Forget that a region is attached (it was dropped)."""
        self._attached.discard(name)

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
    return [region.name for region in regions(memory, leftovers)]


def regions(memory: Memory, leftovers: set[str]) -> list[Any]:
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
