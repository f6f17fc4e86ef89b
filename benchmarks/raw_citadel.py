"""The floor: raw citadeldb memory calls doing a session's work in our storage layout.

Same file layout as citadeldb_openai_agents (storage/segments.py): a meta region with a
salt, a catalog region with one atom per session, and each session a chain of
encrypted segment regions of at most 256 atoms named ``coa.s.<hid>.<n>``; one
atom per item whose payload is the item's JSON text and whose text is the
item's content (the embedder embeds it); newest-N reads seek from the tail's
known ids with ``fetch(after_id=...)``; a pop forgets in the tail segment; a
clear forgets the catalog atom and drops the segments.

Nothing else: no owner thread, no locks, no registry, no validation, no TTL,
no error translation. It imports nothing from our package, so the ratio
"ours / raw" is the cost our adapter adds to the engine. Where we know a
cheaper way to make the same calls, the floor takes it (so "ours / raw" also
shows what our code could still remove):

* the payloads of a read are decoded in one `json.loads` of their JSON texts
  joined into an array, not one call per item;
* the file is opened with the store's default page cache (16,384 pages), not Citadel's;
* a segment is dropped without attaching it first: `drop_region` works on a
  region this process never attached, and destroys its atoms' keys all the
  same (Citadel's `verify` says ``missing``), and attaching costs ~3 ms a region.

Written for the benchmark only; it is not a second implementation to use.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

import citadeldb

CAPACITY = 256
CACHE_PAGES = 16_384  # the store's default page cache (store.DEFAULT_CACHE_PAGES): same options
ALL = 2**63 - 1
META, CATALOG, PREFIX, KIND = "coa.meta", "coa.catalog", "coa.s.", "item"


class RawFile:
    """One open Citadel file, with what this process knows of its sessions."""

    def __init__(self, path: str, key: str, embedder: Any) -> None:
        options = citadeldb.DatabaseOptions(cache_size=CACHE_PAGES)
        self.db = citadeldb.connect(path, key=key, region_keys=True, options=options)
        self.memory = self.db.memory()
        self.embedder = embedder
        self.attached: set[str] = set()
        self.sessions: dict[str, RawSession] = {}
        self.attach(META)
        self.attach(CATALOG)
        found = self.memory.fetch(META, "layout", limit=1)
        if found:
            meta = found[0].payload
        else:
            meta = {"format": 1, "salt": secrets.token_hex(32)}
            self.memory.remember(META, {"kind": "layout", "text": "layout", "payload": meta})
        self.salt = bytes.fromhex(meta["salt"])
        catalog = {hit.payload: hit.id for hit in self.memory.fetch(CATALOG, "session", limit=ALL)}
        segments: dict[str, list[int]] = {}
        for region in self.memory.regions():
            if region.name.startswith(PREFIX):
                hid, _, number = region.name[len(PREFIX) :].partition(".")
                segments.setdefault(hid, []).append(int(number))
        for session_id, catalog_id in catalog.items():
            session = self.session(session_id)
            session.catalog_id = catalog_id
            session.segments = sorted(segments.get(session.hid, []))

    def attach(self, region: str) -> None:
        if region not in self.attached:
            self.memory.create_encrypted_region(region, self.embedder)
            self.attached.add(region)

    def session(self, session_id: str) -> RawSession:
        session = self.sessions.get(session_id)
        if session is None:
            hid = hmac.new(self.salt, session_id.encode(), hashlib.sha256).hexdigest()[:32]
            session = self.sessions[session_id] = RawSession(self, session_id, hid)
        return session

    def close(self) -> None:
        self.db.close()
        self.memory = self.db = None  # the file lock goes with the last Memory handle


class RawSession:
    """The four protocol operations, synchronous, as raw memory calls."""

    def __init__(self, file: RawFile, session_id: str, hid: str) -> None:
        self.file, self.session_id, self.hid = file, session_id, hid
        self.segments: list[int] = []
        self.catalog_id: int | None = None
        self.tail_ids: list[int] | None = None

    def region(self, number: int) -> str:
        name = f"{PREFIX}{self.hid}.{number}"
        self.file.attach(name)
        return name

    def known_tail_ids(self) -> list[int]:
        if self.tail_ids is None:
            tail = self.region(self.segments[-1])
            self.tail_ids = [hit.id for hit in self.file.memory.fetch(tail, KIND, limit=ALL)]
        return self.tail_ids

    def add_items(self, items: list[Any]) -> None:
        memory = self.file.memory
        if self.catalog_id is None:
            entry = {"kind": "session", "text": "session", "payload": self.session_id}
            self.catalog_id = memory.remember(CATALOG, entry)
        atoms = [
            {
                "kind": KIND,
                "text": _text(item),
                "payload": json.dumps(item, ensure_ascii=False, separators=(",", ":")),
            }
            for item in items
        ]
        if not self.segments or len(self.known_tail_ids()) >= CAPACITY:
            self.segments.append(self.segments[-1] + 1 if self.segments else 0)
            self.tail_ids = []
        self.tail_ids.extend(memory.remember_batch(self.region(self.segments[-1]), atoms))

    def get_items(self, limit: int | None = None) -> list[Any]:
        memory = self.file.memory
        if limit is None:
            return _decode(
                hit.payload
                for number in self.segments
                for hit in memory.fetch(self.region(number), KIND, limit=ALL)
            )
        hits: list[Any] = []
        for number in reversed(self.segments):
            need = limit - len(hits)
            if need <= 0:
                break
            if number == self.segments[-1]:
                ids = self.known_tail_ids()
                after = ids[-need - 1] if len(ids) > need else None
                found = memory.fetch(self.region(number), KIND, limit=need, after_id=after)
            else:
                found = memory.fetch(self.region(number), KIND, limit=need, newest=True)
            hits[:0] = found
        return _decode(hit.payload for hit in hits)

    def pop_item(self) -> Any | None:
        memory = self.file.memory
        while self.segments:
            number = self.segments[-1]
            ids = self.known_tail_ids()
            if not ids:
                self.drop(number)
                continue
            region = self.region(number)
            after = ids[-2] if len(ids) > 1 else None
            hit = memory.fetch(region, KIND, limit=1, after_id=after)[0]
            memory.forget(region, [hit.id])
            ids.pop()
            if not ids:
                self.drop(number)
            return json.loads(hit.payload)
        return None

    def clear_session(self) -> None:
        if self.catalog_id is not None:
            self.file.memory.forget(CATALOG, [self.catalog_id])
            self.catalog_id = None
        for number in list(self.segments):
            self.drop(number)

    def drop(self, number: int) -> None:
        region = f"{PREFIX}{self.hid}.{number}"
        self.file.memory.drop_region(region)
        self.file.attached.discard(region)
        self.segments.remove(number)
        self.tail_ids = None


def _decode(payloads: Any) -> list[Any]:
    """The items whose JSON texts these are, in one pass of the JSON decoder."""
    return json.loads("[" + ",".join(payloads) + "]")


def _text(item: Any) -> str:
    """The text the adapter indexes for an item (never empty): its content, or a call's."""
    content = item.get("content")
    if content is None and item.get("type") == "function_call_output":
        content = item.get("output")
    text = ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(part["text"] for part in content if isinstance(part, dict) and "text" in part)
    if not text and item.get("type") == "function_call":
        text = f"{item['name']} {item['arguments']}"
    return text or item.get("type") or item.get("role") or "item"
