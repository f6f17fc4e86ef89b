"""How well does CitadelSession.search find the item that answers a question, and how fast?

    python benchmarks/search_quality/evaluate.py           # full: Mock and all-MiniLM-L6-v2 (~7 min, 2 busy cores)
    python benchmarks/search_quality/evaluate.py --quick   # MockEmbedder, 12 queries, no scale/latency: CI smoke

The labelled set (dataset.json, next to this file) holds conversations in Agents
SDK item format and queries, each naming the ONE item of its session that
answers it. Every configuration gets fresh files (argon2_profile="iot") in a
temporary directory.

* package: the store's public API as a user calls it (``add_items`` per turn,
  ``await session.search(q, limit=5)``).
* variants: the same sessions searched without the package, so the indexed text
  and the ranking can change without touching it. The indexed text: "own" (the
  item's text), "question+own" (a non-user item's text after the user message
  that asked for it) or "question in vector only" (own text for the keywords, the
  question with it for the vector: what the package does). Two kinds of ranking:

  - "exhaustive": the package's design since issue 17 (storage/search_index.py),
    emulated here with numpy over every item of the session: vector distance, a
    user message's distance times a penalty, minus a BM25 bonus scaled so that
    the best keyword match gets `keyword_weight`; ties go to the newer item. Only
    the quantisation and the tokens come from the package (search_blocks.derive:
    int8 vectors, normalised first for cosine; word_hashes: lowercased words,
    crc32), so that the two rank the same numbers. The distance, the penalty, the
    BM25 and the tie rule are computed independently here (float64, per item, a
    Python sort), not by calling search_index.rank.
  - "recall": the package's design until issue 17, on raw citadeldb: its segment
    layout (storage/segments.py: 256-atom encrypted regions), Citadel's hybrid
    recall per segment (RecallOptions weights, k per segment) and a merge of the
    segments' hits (by Citadel's relevance, or by distance with user items
    penalised). These rows show what the old design gave.

  PACKAGE, the exhaustive variant with the package's settings on its text, must
  return exactly the package's top 5 on the labelled set ("raw baseline = package
  (dataset)"; the exit status is 1 otherwise).
* scale: each session padded with generated filler turns to 1,000 items (four
  segments), quality again: the variants (one file per session for the recall
  ones) and the package itself, all sessions in one 6,000-item file; how many
  queries get exactly PACKAGE's top 5 from the package there is reported.
* latency: ``await session.search(q, limit=5)`` on a 1,000-item session through
  the public API, alone in its file and in a file of 6,000 items, with the
  store's default page cache (16,384 pages) and with a small one (500 pages,
  about Citadel's own default); plus the query embedding alone, the numpy
  emulation, and the old design's search on raw citadeldb.

Recall@1, recall@5 and MRR (reciprocal rank of the answer in the top 5, 0 when
absent). A query is "paraphrastic" when no content-word stem of it occurs in the
answer's indexed text; the fraction is computed here, not read from the labels.

Document vectors are memoised by text (the same model, each text embedded once
per run) so that variants do not re-embed and rank the vectors the package
stored; query embeddings in every latency figure are computed afresh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import citadeldb
import numpy as np
from citadeldb import RecallOptions

from citadeldb_openai_agents import CitadelSessionStore

# On purpose, this harness reaches into the package's internals: its raw emulation must index
# the same text, quantise vectors and split words exactly as the package does (the parity check),
# and the recall variants lay sessions out as the package did until issue 17.
from citadeldb_openai_agents.options import DEFAULT_CACHE_PAGES
from citadeldb_openai_agents.storage.codec import ITEM_KIND, readable, search_text
from citadeldb_openai_agents.storage.search_blocks import derive, word_hashes
from citadeldb_openai_agents.storage.segments import SEGMENT_CAPACITY

HERE = Path(__file__).resolve().parent
DATASET = HERE / "dataset.json"
RESULTS = HERE.parent / "results"
KEY = "search-quality-benchmark"
LIMIT = 5
OVERFETCH = 3 * LIMIT  # per-segment candidates when a recall variant's ranking is redone here
BM25_K1, BM25_B = 1.2, 0.75  # the exhaustive variants' keyword score (as the package's)
SCALE_ITEMS = 1_000
QUICK_QUERIES = 12
LATENCY_QUERIES = 40
LATENCY_ROUNDS = 2  # configurations take turns, round after round: the machine is shared and noisy
LATENCY_WARMUP = 5
SMALL_CACHE_PAGES = 500  # about Citadel's own default: less than a 1,000-item session's file
# Citadel 2.7.0's default RecallOptions weights (semantic, keyword, recency, importance), as
# fitted to its relevance; `default_weights_hold` re-checks them on every run.
DEFAULT_WEIGHTS = (0.45, 0.2, 0.2, 0.15)
TARGETS = {"recall@5": 0.9, "recall@1": 0.6, "search_ms": 30.0}  # the issue's, for all-MiniLM-L6-v2

# -- the labelled set -----------------------------------------------------------------


@dataclass
class Session:
    id: str
    turns: list[list[dict[str, Any]]]
    items: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.items = [item for turn in self.turns for item in turn]


@dataclass(frozen=True)
class Query:
    id: str
    session: str
    text: str
    answer_index: int
    labelled_paraphrastic: bool


@dataclass
class Dataset:
    sessions: dict[str, Session]
    queries: list[Query]

    def answer(self, query: Query) -> dict[str, Any]:
        return self.sessions[query.session].items[query.answer_index]


def load_dataset(path: Path) -> Dataset:
    """Read and check the labelled set: answers in range, ids agreeing, items unique per session."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    sessions = {s["id"]: Session(s["id"], s["turns"]) for s in raw["sessions"]}
    problems = []
    for session in sessions.values():
        keys = [item_key(item) for item in session.items]
        if len(set(keys)) != len(keys):
            problems.append(f"session {session.id}: two items are identical, so hits cannot be told apart")
    queries = []
    for entry in raw["queries"]:
        session = sessions.get(entry["session"])
        index = entry["answer_index"]
        if session is None or not 0 <= index < len(session.items):
            problems.append(f"{entry['id']}: no item {index} in session {entry['session']!r}")
            continue
        if entry.get("answer_id") and session.items[index].get("id") != entry["answer_id"]:
            problems.append(f"{entry['id']}: item {index} is not {entry['answer_id']} (indices drifted?)")
        queries.append(
            Query(entry["id"], entry["session"], entry["query"], index, bool(entry["paraphrastic"]))
        )
    if problems:
        raise SystemExit("dataset.json is inconsistent:\n  " + "\n  ".join(problems))
    return Dataset(sessions, queries)


def item_key(item: Any) -> str:
    return json.dumps(item, sort_keys=True, ensure_ascii=False)


def is_user(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "user"


# -- lexical overlap: is a query paraphrastic? -------------------------------------------

STOPWORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "aren't",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "can't",
        "could",
        "couldn't",
        "did",
        "didn't",
        "do",
        "does",
        "doesn't",
        "doing",
        "don't",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "get",
        "gets",
        "got",
        "had",
        "hadn't",
        "has",
        "hasn't",
        "have",
        "haven't",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "isn't",
        "it",
        "it's",
        "its",
        "itself",
        "just",
        "let's",
        "me",
        "more",
        "most",
        "much",
        "many",
        "must",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "shouldn't",
        "so",
        "some",
        "such",
        "than",
        "that",
        "that's",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "there's",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "upon",
        "us",
        "very",
        "was",
        "wasn't",
        "we",
        "were",
        "weren't",
        "what",
        "what's",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "won't",
        "would",
        "wouldn't",
        "you",
        "you'd",
        "you'll",
        "you're",
        "you've",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "s",
        "t",
        "re",
        "ve",
        "ll",
        "d",
        "m",
        "last",
        "next",
        "one",
        "two",
    ]
)
_SUFFIXES = (
    "ations",
    "ation",
    "ments",
    "ment",
    "ings",
    "ing",
    "ies",
    "ied",
    "es",
    "ed",
    "ers",
    "er",
    "ly",
    "al",
    "ance",
    "ence",
    "y",
    "s",
    "e",
)


def stem(word: str) -> str:
    """A rough stem: the word without its first matching common suffix (keeping 3+ letters)."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def content_stems(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower().replace("\u2019", "'"))
    words = [w.removesuffix("'s") for w in words]
    return {stem(w) for w in words if w not in STOPWORDS}


def shares_content_word(query: str, answer: str) -> bool:
    """True when a query stem equals an answer stem, or one is a prefix (4+ letters) of the other."""
    answer_stems = content_stems(answer)
    for q in content_stems(query):
        for a in answer_stems:
            shorter, longer = sorted((q, a), key=len)
            if q == a or (len(shorter) >= 4 and longer.startswith(shorter)):
                return True
    return False


def paraphrase_report(dataset: Dataset) -> dict[str, Any]:
    measured = {
        q.id: not shares_content_word(q.text, search_text(dataset.answer(q))) for q in dataset.queries
    }
    return {
        "measured": measured,
        "count": sum(measured.values()),
        "fraction": sum(measured.values()) / len(measured),
        "labelled_fraction": sum(q.labelled_paraphrastic for q in dataset.queries) / len(dataset.queries),
        "label_disagreements": [q.id for q in dataset.queries if measured[q.id] != q.labelled_paraphrastic],
    }


# -- metrics ------------------------------------------------------------------------------


def metrics(ranks: Iterable[int | None]) -> dict[str, float]:
    """recall@1, recall@5 and MRR over the top 5, from 1-based ranks (None: not in the top 5)."""
    ranks = list(ranks)
    n = len(ranks) or 1
    found = [r for r in ranks if r is not None and r <= LIMIT]
    return {
        "recall@1": sum(r == 1 for r in found) / n,
        "recall@5": len(found) / n,
        "mrr": sum(1 / r for r in found) / n,
        "n": len(ranks),
    }


def rank_of(answer: dict[str, Any], hits: list[Any]) -> int | None:
    key = item_key(answer)
    return next((position for position, hit in enumerate(hits, 1) if item_key(hit) == key), None)


def question_first(dataset: Dataset, query: Query, hits: list[Any]) -> bool | None:
    """Whether the user message that asked for the answer outranks it (None: the answer is a user item)."""
    items = dataset.sessions[query.session].items
    if is_user(items[query.answer_index]):
        return None
    question = next((i for i in reversed(items[: query.answer_index]) if is_user(i)), None)
    asked = rank_of(question, hits) if question is not None else None
    answered = rank_of(items[query.answer_index], hits)
    return asked is not None and (answered is None or asked < answered)


def groups(
    ranks: dict[str, int | None], dataset: Dataset, queries: list[Query], paraphrastic: dict[str, bool]
) -> dict[str, dict[str, float]]:
    named = {
        "all": queries,
        "paraphrastic": [q for q in queries if paraphrastic[q.id]],
        "lexical": [q for q in queries if not paraphrastic[q.id]],
        "answer is a user item": [q for q in queries if is_user(dataset.answer(q))],
    }
    return {name: metrics(ranks[q.id] for q in group) for name, group in named.items() if group}


# -- embedders ------------------------------------------------------------------------------


def make_embedder(name: str) -> Any:
    if name == "mock":
        return citadeldb.MockEmbedder(dim=128)
    from citadeldb_openai_agents import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


class MemoisedEmbedder:
    """The wrapped model with document vectors memoised by text; its identity, unchanged.

    Query embeddings through `embed_queries_with_cancel` (what the package calls) are
    always computed afresh, so search latencies include them; `embed_query` memoises
    them for the quality runs of the raw variants.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dim, self.metric, self.model_id = inner.dim, inner.metric, inner.model_id
        self._documents: dict[str, list[float]] = {}
        self._queries: dict[str, list[float]] = {}

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        missing = list(dict.fromkeys(t for t in texts if t not in self._documents))
        if missing:
            for text, vector in zip(
                missing, self.inner.embed_with_cancel(missing, cancel_token), strict=True
            ):
                self._documents[text] = list(vector)
        return [self._documents[t] for t in texts]

    def embed_queries_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        embed = getattr(self.inner, "embed_queries_with_cancel", self.inner.embed_with_cancel)
        return embed(texts, cancel_token)

    def embed_query(self, text: str) -> list[float]:
        if text not in self._queries:
            self._queries[text] = list(self.embed_queries_with_cancel([text])[0])
        return self._queries[text]


# -- the package, through its public API -------------------------------------------------


def open_store(path: str, embedder: Any, cache_size: int | None = None) -> CitadelSessionStore:
    return CitadelSessionStore(path, KEY, embedder=embedder, argon2_profile="iot", cache_size=cache_size)


async def fill(store: CitadelSessionStore, session: Session, batch: int | None = None) -> None:
    """Add a session's items: a turn per add_items call, or `batch` items per call."""
    handle = store.session(session.id)
    if batch is None:
        for turn in session.turns:
            await handle.add_items(turn)
        return
    for start in range(0, len(session.items), batch):
        await handle.add_items(session.items[start : start + batch])


async def package_tops(store: CitadelSessionStore, queries: list[Query]) -> dict[str, list[Any]]:
    return {q.id: await store.session(q.session).search(q.text, limit=LIMIT) for q in queries}


async def search_latency(
    path: str, embedder: Any, session_id: str, texts: list[str], pages: int | None
) -> list[float]:
    """Times (ms) of `await session.search(q, limit=5)`, one per text, after reopening the file."""
    store = open_store(path, embedder, cache_size=pages)
    try:
        handle = store.session(session_id)
        for text in texts[:LATENCY_WARMUP]:
            await handle.search(text, limit=LIMIT)
        samples = []
        for text in texts:
            start = time.perf_counter()
            await handle.search(text, limit=LIMIT)
            samples.append((time.perf_counter() - start) * 1000)
    finally:
        store.close()
    return samples


def embedding_latency(embedder: MemoisedEmbedder, texts: list[str]) -> list[float]:
    samples = []
    for text in texts:
        start = time.perf_counter()
        embedder.embed_queries_with_cancel([text])
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": statistics.median(ordered),
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
        "samples": len(ordered),
    }


# -- variants, on raw citadeldb in the package's layout ---------------------------------------

TextOf = Callable[[list[dict[str, Any]], int], "str | tuple[str, str]"]


def own_text(items: list[dict[str, Any]], index: int) -> str:
    """What the package indexes: the item's own text."""
    return search_text(items[index])


def question_and_own_text(items: list[dict[str, Any]], index: int) -> str:
    """A non-user item's text after the latest user message before it (the question it answers)."""
    if is_user(items[index]):
        return search_text(items[index])
    question = next((search_text(i) for i in reversed(items[:index]) if is_user(i)), None)
    own = readable(search_text(items[index]))  # a JSON output as key: value pairs, as the package embeds it
    return own if question is None else question + "\n" + own


def question_in_vector_only(items: list[dict[str, Any]], index: int) -> tuple[str, str]:
    """(keyword text, embedded text): the item's own text for the keyword index, the
    question with it for the vector. The keyword index grows with the text and so does
    the cost of a write (+20% per turn for question+own); the vector does not."""
    return own_text(items, index), question_and_own_text(items, index)


TEXTS: dict[str, TextOf] = {
    "own": own_text,
    "question+own": question_and_own_text,
    "question in vector only": question_in_vector_only,
}


@dataclass(frozen=True)
class Variant:
    """How the items are ranked.

    kind: "exhaustive" (the package since issue 17: every item of the session scored
        here, ExhaustiveIndex) or "recall" (the package before it: Citadel's hybrid
        recall per segment, RawIndex, then a merge).
    weights (recall): Citadel's RecallOptions weights (semantic, keyword, recency,
        importance), each component min-max normalised over a region's candidates;
        None is Citadel's default, DEFAULT_WEIGHTS.
    merge (recall): "relevance" sorts all segments' hits by relevance, then distance,
        then recency (the package before 2026-11-30); "distance" sorts them by vector
        distance (the package until issue 17, with users="penalised", penalty=1.3).
    users: "ranked", "dropped", "penalised" (relevance minus `penalty`, or distance
        times `penalty`; in the exhaustive variants, only user messages that ask something,
        as the package since 2026-12-03), "after-reply" (recall: a user item never precedes the reply
        indexed under it: the reply moves up to just before it).
    keyword_weight (exhaustive): the BM25 bonus of the best keyword match, subtracted
        from its distance (0: vector distance alone).
    """

    kind: str = "recall"
    weights: tuple[float, float, float, float] | None = None
    merge: str = "relevance"
    users: str = "ranked"
    penalty: float = 0.0
    keyword_weight: float = 0.0

    @property
    def k(self) -> int:
        plain = self.merge == "relevance" and self.users == "ranked"
        return LIMIT if plain else OVERFETCH

    @property
    def label(self) -> str:
        if self.kind == "exhaustive":
            parts = ["exhaustive: distance"]
            if self.users == "penalised":
                parts.append(f"user items x{self.penalty:g}")
            elif self.users != "ranked":
                parts.append(f"user items {self.users}")
            parts.append(f"keyword bonus {self.keyword_weight:g}" if self.keyword_weight else "no keywords")
            return ", ".join(parts)
        weights = "default" if self.weights is None else "(" + ",".join(f"{w:g}" for w in self.weights) + ")"
        parts = [f"recall: weights {weights}"]
        if self.merge != "relevance":
            parts.append(f"merge by {self.merge}")
        if self.users == "penalised":
            parts.append(
                f"user items {'distance x' if self.merge == 'distance' else 'relevance -'}{self.penalty:g}"
            )
        elif self.users != "ranked":
            parts.append(f"user items {self.users}")
        if self.k != LIMIT:
            parts.append(f"k={self.k}/segment")
        return ", ".join(parts)


BASELINE = Variant()  # the package before 2026-11-30 (own text, Citadel's relevance merge)
# The package from 2026-11-30 until issue 17 (with PACKAGE_TEXT): recall per segment, merged by distance.
OLD_PACKAGE = Variant(merge="distance", users="penalised", penalty=1.3)
# What the package does now (storage/search_index.py): the raw emulation must match it exactly.
PACKAGE_TEXT = "question in vector only"
PACKAGE = Variant(kind="exhaustive", users="penalised", penalty=1.5, keyword_weight=0.03)


def variant_grid(scope: str, quick: bool) -> list[tuple[str, Variant]]:
    """(indexed text, variant) pairs to evaluate in a scope ("dataset" or "scale")."""
    exhaustive = [(text, PACKAGE) for text in TEXTS]
    if quick:
        return [*exhaustive, ("own", BASELINE), (PACKAGE_TEXT, OLD_PACKAGE)]
    # The package's ranking with one setting changed at a time (numpy: cheap).
    exhaustive += [
        (PACKAGE_TEXT, Variant(kind="exhaustive", users=users, penalty=penalty, keyword_weight=weight))
        for users, penalty, weight in (
            ("penalised", 1.5, 0.0),
            ("penalised", 1.5, 0.01),
            ("penalised", 1.5, 0.02),
            ("penalised", 1.5, 0.05),
            ("penalised", 1.5, 0.1),
            ("penalised", 1.5, 0.2),
            ("ranked", 1.0, 0.03),
            ("penalised", 1.2, 0.03),
            ("penalised", 1.3, 0.03),
            ("dropped", 1.0, 0.03),
        )
    ]
    weights = [(1, 0, 0, 0), (0, 1, 0, 0), (0.7, 0.3, 0, 0), (0.5, 0.5, 0, 0), (0.3, 0.7, 0, 0)]
    if scope == "scale":
        weights = [(1, 0, 0, 0), (0.7, 0.3, 0, 0)]
    chosen = (
        [BASELINE]
        + [Variant(weights=w) for w in weights]
        + [
            Variant(users="dropped"),
            Variant(users="penalised", penalty=0.2),
            Variant(merge="distance"),
            Variant(merge="distance", users="dropped"),
            Variant(merge="distance", users="penalised", penalty=1.2),
            OLD_PACKAGE,
            Variant(merge="distance", users="penalised", penalty=1.5),
            # Candidates by vector alone: is the per-segment hybrid recall what limits the merge?
            Variant(weights=(1, 0, 0, 0), merge="distance", users="penalised", penalty=1.3),
        ]
    )
    if scope == "scale":
        chosen = [v for v in chosen if v.penalty not in (1.2, 1.5)]
    pairs = exhaustive + [(text, v) for text in TEXTS for v in chosen]
    pairs.append(("question+own", Variant(merge="distance", users="after-reply")))
    return pairs


class Hit(NamedTuple):
    id: int
    relevance: float
    distance: float
    text: str
    payload: str


class RawIndex:
    """Sessions as chains of encrypted 256-atom segments, laid out as storage/segments.py does."""

    def __init__(self, path: str, embedder: MemoisedEmbedder) -> None:
        # sync_mode "off" only speeds up building; searches read the same pages.
        options = citadeldb.DatabaseOptions(
            argon2_profile="iot", sync_mode="off", cache_size=DEFAULT_CACHE_PAGES
        )
        self.db = citadeldb.connect(path, key=KEY, region_keys=True, options=options)
        self.memory = self.db.memory()
        self.embedder = embedder
        self.segments: dict[str, list[str]] = {}
        self._recalled: dict[tuple[Any, ...], list[list[Hit]]] = {}

    def add_session(self, session: Session, text_of: TextOf) -> None:
        regions: list[str] = []
        stored = position = 0
        for turn in session.turns:
            atoms = []
            for item in turn:
                payload = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
                text = text_of(session.items, position)
                atom = {"kind": ITEM_KIND, "text": text, "payload": payload}
                if isinstance(text, tuple):  # (keyword text, embedded text)
                    atom["text"] = text[0]
                    atom["embedding"] = list(self.embedder.embed_with_cancel([text[1]])[0])
                atoms.append(atom)
                position += 1
            # As storage/segments.py: a batch lands in one segment; a new one starts once the tail holds 256.
            if not regions or stored >= SEGMENT_CAPACITY:
                regions.append(f"s.{session.id}.{len(regions)}")
                self.memory.create_encrypted_region(regions[-1], self.embedder)
                stored = 0
            self.memory.remember_batch(regions[-1], atoms)
            stored += len(atoms)
        self.segments[session.id] = regions

    def recall(self, session_id: str, query: str, vector: list[float], variant: Variant) -> list[list[Hit]]:
        """Each segment's hits, as layout.search asks for them (memoised: variants share them)."""
        key = (session_id, query, variant.weights, variant.k)
        if key not in self._recalled:
            options = RecallOptions(weights=variant.weights) if variant.weights is not None else None
            self._recalled[key] = [
                [
                    Hit(
                        h.id,
                        h.relevance or 0.0,
                        h.distance if h.distance is not None else 2.0,
                        h.text,
                        h.payload,
                    )
                    for h in self.memory.recall(
                        region, text=query, embedding=vector, k=variant.k, kinds=[ITEM_KIND], options=options
                    )
                ]
                for region in self.segments[session_id]
            ]
        return self._recalled[key]

    def search(self, session_id: str, query: str, vector: list[float], variant: Variant) -> list[Any]:
        hits = [hit for segment in self.recall(session_id, query, vector, variant) for hit in segment]
        return [json.loads(hit.payload) for hit in rank(hits, variant)]

    def close(self) -> None:
        self.db.close()
        self.memory = self.db = None


def rank(hits: list[Hit], variant: Variant) -> list[Hit]:
    """The top LIMIT of the segments' hits, merged as the variant says."""
    user = {hit.id: is_user(json.loads(hit.payload)) for hit in hits}
    if variant.users == "dropped":
        hits = [hit for hit in hits if not user[hit.id]]
    penalised = variant.users == "penalised"
    if variant.merge == "distance":
        factor = {hit.id: variant.penalty if penalised and user[hit.id] else 1.0 for hit in hits}
        ordered = sorted(hits, key=lambda h: (h.distance * factor[h.id], -h.id))
    else:
        minus = {hit.id: variant.penalty if penalised and user[hit.id] else 0.0 for hit in hits}
        ordered = sorted(hits, key=lambda h: (-(h.relevance - minus[h.id]), h.distance, -h.id))
    if variant.users == "after-reply":
        ordered = replies_first(ordered, user)
    return ordered[:LIMIT]


def replies_first(hits: list[Hit], user: dict[int, bool]) -> list[Hit]:
    result: list[Hit] = []
    for hit in hits:
        if hit in result:
            continue
        if user[hit.id]:
            reply = next((r for r in hits if not user[r.id] and r.text.startswith(hit.text + "\n")), None)
            if reply is not None and reply not in result:
                result.append(reply)
        result.append(hit)
    return result


@dataclass
class Scored:
    """One session as the exhaustive variants see it: its items, and its search data as the
    package stores it (search_blocks.derive: int8 rows and their scales, word hashes)."""

    items: list[dict[str, Any]]
    user: list[bool]
    rows: Any  # float64 (items x dim): each item's dequantised vector
    words: list[Counter[int]]  # each item's word hashes, counted
    lengths: list[int]  # each item's number of words


class ExhaustiveIndex:
    """Every item of a session scored against the query, as storage/search_index.rank does,
    but computed independently: float64 per item, a Python sort (see the module docstring)."""

    def __init__(self, embedder: MemoisedEmbedder) -> None:
        self.embedder = embedder
        self.sessions: dict[str, Scored] = {}

    def add_session(self, session: Session, text_of: TextOf) -> None:
        keyword, embedded = [], []
        for position in range(len(session.items)):
            text = text_of(session.items, position)
            own, vector_text = text if isinstance(text, tuple) else (text, text)
            keyword.append(own)
            embedded.append(vector_text)
        vectors = self.embedder.embed_with_cancel(embedded)
        entries = derive(vectors, keyword, [is_user(item) for item in session.items], self.embedder.metric)
        # The flag the package stores: a user message that asks something (search_blocks.asks).
        user = [bool(flag) for flag in entries.user]
        rows = entries.vectors.astype(np.float64) * entries.scales.astype(np.float64)[:, None]
        ends = np.cumsum(entries.lengths)
        words = [Counter(int(h) for h in part) for part in np.split(entries.tokens, ends[:-1])]
        lengths = [sum(counts.values()) for counts in words]
        self.sessions[session.id] = Scored(session.items, user, rows, words, lengths)

    def search(self, session_id: str, query: str, vector: list[float], variant: Variant) -> list[Any]:
        scored = self.sessions[session_id]
        distance = self.distances(scored, vector)
        bonus = self.keyword_bonus(scored, set(word_hashes(query)), variant.keyword_weight)
        keys = []
        for position, user in enumerate(scored.user):
            if user and variant.users == "dropped":
                continue
            factor = variant.penalty if user and variant.users == "penalised" else 1.0
            # By key, then newest first (a later position is a newer item).
            keys.append((distance[position] * factor - bonus[position], -position))
        return [scored.items[-negated] for _, negated in sorted(keys)[:LIMIT]]

    def distances(self, scored: Scored, vector: list[float]) -> list[float]:
        """Each item's distance to the query in Citadel's sense of the embedder's metric."""
        query = np.asarray(vector, dtype=np.float64)
        metric = self.embedder.metric
        if metric == "l2":
            return [float(d) for d in np.sqrt(((scored.rows - query) ** 2).sum(axis=1))]
        dots = scored.rows @ query
        if metric == "cosine":
            norm = float(np.sqrt(query @ query)) or 1.0
            return [1.0 - float(d) / norm for d in dots]
        return [1.0 - float(d) for d in dots]  # inner product

    @staticmethod
    def keyword_bonus(scored: Scored, words: set[int], weight: float) -> list[float]:
        """BM25 of each item for the query's words (the session's items are the corpus),
        scaled so that the best match gets `weight`."""
        count = len(scored.words)
        if not words or not count or not weight:
            return [0.0] * count
        average = sum(scored.lengths) / count or 1.0
        found = {w: sum(1 for counts in scored.words if counts[w]) for w in words}
        idf = {w: math.log(1 + (count - n + 0.5) / (n + 0.5)) for w, n in found.items() if n}
        scores = []
        for counts, length in zip(scored.words, scored.lengths, strict=True):
            norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average)
            scores.append(
                sum(idf[w] * counts[w] * (BM25_K1 + 1) / (counts[w] + norm) for w in idf if counts[w])
            )
        best = max(scores)
        return [score * (weight / best) if best > 0 else 0.0 for score in scores]

    def close(self) -> None:
        self.sessions.clear()


def raw_tops(
    index: RawIndex | ExhaustiveIndex, queries: list[Query], variant: Variant
) -> dict[str, list[Any]]:
    return {
        q.id: index.search(q.session, q.text, index.embedder.embed_query(q.text), variant) for q in queries
    }


def raw_latency(index: RawIndex, session_id: str, texts: list[str], variant: Variant) -> list[float]:
    """One raw search, query embedding included (never memoised), no thread hop."""
    samples = []
    for text in texts[:LATENCY_WARMUP] + texts:
        start = time.perf_counter()
        vector = list(index.embedder.embed_queries_with_cancel([text])[0])
        options = RecallOptions(weights=variant.weights) if variant.weights is not None else None
        hits = [
            Hit(h.id, h.relevance or 0.0, h.distance if h.distance is not None else 2.0, h.text, h.payload)
            for region in index.segments[session_id]
            for h in index.memory.recall(
                region, text=text, embedding=vector, k=variant.k, kinds=[ITEM_KIND], options=options
            )
        ]
        [json.loads(hit.payload) for hit in rank(hits, variant)]
        samples.append((time.perf_counter() - start) * 1000)
    return samples[LATENCY_WARMUP:]


def default_weights_hold(directory: str) -> bool:
    """Whether Citadel's default relevance is DEFAULT_WEIGHTS over its per-component scores.

    Each unit weight vector (1,0,0,0), (0,1,0,0), ... makes recall return one component
    alone (min-max normalised over the candidates); the default relevance must be their
    weighted sum for every hit.
    """
    db = citadeldb.connect(
        os.path.join(directory, "weights.cdl"),
        key=KEY,
        options=citadeldb.DatabaseOptions(argon2_profile="iot", sync_mode="off"),
    )
    try:
        memory = db.memory()
        embedder = citadeldb.MockEmbedder(dim=64)
        memory.create_region("w", embedder)
        texts = [
            "the dog is called Mochi",
            "Mochi likes the park",
            "rain in Lisbon today",
            "dog food prices rose",
            "a cat named Tom",
            "parks in Berlin",
        ]
        for text, importance in zip(texts, (0.1, 0.9, 0.5, 0.0, 0.3, 0.7), strict=True):
            memory.remember("w", {"kind": ITEM_KIND, "text": text, "payload": text, "importance": importance})
        vector = embedder.embed_queries(["dog park"])[0]

        def relevance(weights: tuple[float, ...] | None) -> dict[int, float]:
            options = RecallOptions(weights=weights) if weights else None
            return {
                h.id: h.relevance
                for h in memory.recall("w", text="dog park", embedding=vector, k=6, options=options)
            }

        default = relevance(None)
        parts = [relevance(tuple(float(i == j) for j in range(4))) for i in range(4)]
        return all(
            abs(default[i] - sum(w * part[i] for w, part in zip(DEFAULT_WEIGHTS, parts, strict=True))) < 1e-4
            for i in default
        )
    finally:
        db.close()


# -- scale: sessions padded with filler turns ------------------------------------------------

# Filler: small talk a long-lived assistant session accumulates, from varied templates so
# that near-duplicates stay rare (a few templates would flood every top 5 with copies).
_CITIES = [
    ("Tokyo", 7),
    ("New York", -6),
    ("Sydney", 8),
    ("Sao Paulo", -5),
    ("Delhi", 3.5),
    ("Reykjavik", -2),
    ("Nairobi", 1),
    ("Vancouver", -9),
    ("Seoul", 7),
    ("Cairo", 1),
    ("Mexico City", -7),
    ("Dubai", 2),
    ("Singapore", 6),
    ("Honolulu", -12),
    ("Moscow", 1),
]
_SYNONYMS = [
    ("happy", "cheerful"),
    ("big", "large"),
    ("quick", "rapid"),
    ("smart", "clever"),
    ("tired", "weary"),
    ("angry", "furious"),
    ("begin", "commence"),
    ("show", "display"),
    ("help", "assist"),
    ("end", "finish"),
    ("funny", "amusing"),
    ("sad", "gloomy"),
    ("brave", "bold"),
    ("calm", "serene"),
    ("odd", "peculiar"),
    ("rich", "wealthy"),
    ("tiny", "minute"),
    ("wise", "sage"),
    ("loud", "noisy"),
    ("old", "ancient"),
]
_TASKS = [
    "water the plants",
    "call grandma",
    "buy stamps",
    "pick up the dry cleaning",
    "take the bins out",
    "send the birthday card",
    "charge the bike battery",
    "defrost the freezer",
    "book a haircut",
    "return the library books",
    "walk the dog",
    "renew the parking permit",
    "clean the gutters",
    "order printer ink",
    "back up the laptop",
    "pay the window cleaner",
    "feed the neighbour's cat",
    "collect the kids from football",
    "change the bed sheets",
    "buy a present for Lena",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_CAPITALS = [
    ("Peru", "Lima"),
    ("Kenya", "Nairobi"),
    ("Norway", "Oslo"),
    ("Vietnam", "Hanoi"),
    ("Chile", "Santiago"),
    ("Ghana", "Accra"),
    ("Canada", "Ottawa"),
    ("Poland", "Warsaw"),
    ("Egypt", "Cairo"),
    ("Nepal", "Kathmandu"),
    ("Australia", "Canberra"),
    ("Morocco", "Rabat"),
    ("Iceland", "Reykjavik"),
    ("Colombia", "Bogota"),
    ("Finland", "Helsinki"),
    ("Mongolia", "Ulaanbaatar"),
]
_WORDS = {
    "apple": ("manzana", "Apfel", "pomme"),
    "window": ("ventana", "Fenster", "fenetre"),
    "cloud": ("nube", "Wolke", "nuage"),
    "bridge": ("puente", "Bruecke", "pont"),
    "butterfly": ("mariposa", "Schmetterling", "papillon"),
    "library": ("biblioteca", "Bibliothek", "bibliotheque"),
    "mountain": ("montana", "Berg", "montagne"),
    "spoon": ("cuchara", "Loeffel", "cuillere"),
    "river": ("rio", "Fluss", "riviere"),
    "key": ("llave", "Schluessel", "cle"),
}
_LANGUAGES = ("Spanish", "German", "French")
_LANDMARKS = [
    ("the Eiffel Tower", 330),
    ("Big Ben's tower", 96),
    ("the Statue of Liberty", 93),
    ("the Burj Khalifa", 828),
    ("the Leaning Tower of Pisa", 56),
    ("the Space Needle", 184),
    ("Cologne Cathedral", 157),
    ("the CN Tower", 553),
    ("the Great Pyramid", 139),
    ("Tokyo Skytree", 634),
]
_GROCERIES = [
    "eggs",
    "oat milk",
    "tomatoes",
    "apples",
    "batteries",
    "rice",
    "coffee beans",
    "dish soap",
    "lemons",
    "yoghurt",
    "onions",
    "bin bags",
    "toothpaste",
    "bananas",
    "flour",
    "cheddar",
]
_FILMS = [
    ("comedy", "Paddington 2", 2017),
    ("thriller", "Knives Out", 2019),
    ("sci-fi", "Arrival", 2016),
    ("animated", "Spirited Away", 2001),
    ("drama", "The Farewell", 2019),
    ("documentary", "Free Solo", 2018),
    ("musical", "La La Land", 2016),
    ("western", "True Grit", 2010),
    ("horror", "A Quiet Place", 2018),
    ("romance", "Before Sunrise", 1995),
]
_WEATHER = ["sunny", "overcast", "drizzly", "windy", "foggy", "snowing lightly", "clear but cold", "humid"]


def _filler_turn(rng: random.Random) -> tuple[str, str]:
    """One question and its answer, from a dozen kinds of small talk."""
    kind = rng.randrange(12)
    n = rng.randint(2, 900)
    if kind == 0:
        return f"Convert {n} miles to kilometres.", f"{n} miles is about {n * 1.609:.1f} km."
    if kind == 1:
        return f"How many pounds is {n} kg?", f"{n} kg is roughly {n * 2.2046:.1f} lb."
    if kind == 2:
        a, b = rng.randint(12, 999), rng.randint(12, 999)
        return f"What's {a} times {b}?", f"{a} x {b} = {a * b}."
    if kind == 3:
        (city, offset), hour = rng.choice(_CITIES), rng.randint(0, 23)
        local = (hour + offset) % 24
        return (
            f"What time is it in {city} when it's {hour}:00 in Berlin?",
            f"When it's {hour}:00 in Berlin it's {int(local)}:{'30' if local % 1 else '00'} in {city}.",
        )
    if kind == 4:
        word, synonym = rng.choice(_SYNONYMS)
        return (
            f"Another word for '{word}' in paragraph {n} of my essay?",
            f"In paragraph {n}, '{synonym}' works well instead of '{word}'.",
        )
    if kind == 5:
        task, day, hour = rng.choice(_TASKS), rng.choice(_DAYS), rng.randint(7, 21)
        return (
            f"Remind me to {task} on {day} at {hour}:00.",
            f"Okay, I'll remind you to {task} on {day} at {hour}:00.",
        )
    if kind == 6:
        country, capital = rng.choice(_CAPITALS)
        return (
            f"Quiz round {n}: what's the capital of {country}?",
            f"Round {n}: the capital of {country} is {capital}.",
        )
    if kind == 7:
        word, language = rng.choice(list(_WORDS)), rng.randrange(3)
        return (
            f"How do you say '{word}' in {_LANGUAGES[language]}? (flashcard {n})",
            f"Flashcard {n}: '{word}' is '{_WORDS[word][language]}' in {_LANGUAGES[language]}.",
        )
    if kind == 8:
        landmark, metres = rng.choice(_LANDMARKS)
        return (
            f"How tall is {landmark}, in feet? Asking for trivia night #{n}.",
            f"For trivia night #{n}: {landmark} is about {metres} m, roughly {round(metres * 3.281)} ft.",
        )
    if kind == 9:
        item, count = rng.choice(_GROCERIES), rng.randint(1, 12)
        return (f"Add {count} {item} to shopping list {n}.", f"Added {count} x {item} to shopping list {n}.")
    if kind == 10:
        genre, title, year = rng.choice(_FILMS)
        return (f"Suggest a {genre} film for movie night {n}.", f"For movie night {n}: '{title}' ({year}).")
    city, condition, temp = rng.choice(_CITIES)[0], rng.choice(_WEATHER), rng.randint(-5, 34)
    return (
        f"What's the weather in {city} right now? (check {n})",
        f"Check {n}: it's {temp} C and {condition} in {city}.",
    )


def padded(session: Session, total: int) -> Session:
    """The session with filler turns spread evenly between its own, up to `total` items.

    Every session draws the same filler sequence, so its vectors are embedded once.
    """
    rng = random.Random(7)
    seen = {item_key(item) for item in session.items}
    fillers: list[list[dict[str, Any]]] = []
    count = len(session.items)
    while count + 2 <= total:
        question, answer = _filler_turn(rng)
        turn = [{"role": "user", "content": question}, _assistant(f"msg_fill_{len(fillers)}", answer)]
        if any(item_key(item) in seen for item in turn):
            continue
        seen.update(item_key(item) for item in turn)
        fillers.append(turn)
        count += 2
    turns: list[list[dict[str, Any]]] = []
    per_gap = len(fillers) / (len(session.turns) + 1)
    taken = 0
    for position, turn in enumerate(session.turns, 1):
        upto = round(per_gap * position)
        turns.extend(fillers[taken:upto])
        turns.append(turn)
        taken = upto
    turns.extend(fillers[taken:])
    return Session(session.id, turns)


def _assistant(message_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "id": message_id,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def scaled(dataset: Dataset, queries: list[Query]) -> tuple[Dataset, list[Query]]:
    """Every session padded to SCALE_ITEMS, with the queries' answer indices moved along."""
    sessions = {sid: padded(s, SCALE_ITEMS) for sid, s in dataset.sessions.items()}
    moved = []
    for q in queries:
        keys = [item_key(item) for item in sessions[q.session].items]
        moved.append(
            Query(q.id, q.session, q.text, keys.index(item_key(dataset.answer(q))), q.labelled_paraphrastic)
        )
    return Dataset(sessions, moved), moved


# -- the run -------------------------------------------------------------------------------


class Evaluation:
    """One embedder's rows (quality per scope, text and variant), latencies and checks."""

    def __init__(
        self,
        name: str,
        dataset: Dataset,
        queries: list[Query],
        paraphrastic: dict[str, bool],
        directory: str,
        log: Callable[[str], None],
    ) -> None:
        self.name, self.dataset, self.queries, self.paraphrastic = name, dataset, queries, paraphrastic
        self.directory, self.log = directory, log
        started = time.perf_counter()
        self.embedder = MemoisedEmbedder(make_embedder(name))
        log(f"[{name}] {self.embedder.model_id} ready in {time.perf_counter() - started:.1f} s")
        self.rows: list[dict[str, Any]] = []
        self.checks: dict[str, bool] = {}
        self.agreement: dict[str, int] | None = None
        self.latency: dict[str, Any] = {}

    def add_row(
        self,
        scope: str,
        text: str,
        variant: str,
        tops: dict[str, list[Any]],
        dataset: Dataset,
        queries: list[Query],
    ) -> None:
        ranks = {q.id: rank_of(dataset.answer(q), tops[q.id]) for q in queries}
        asked_first = [f for q in queries if (f := question_first(dataset, q, tops[q.id])) is not None]
        row = {
            "scope": scope,
            "text": text,
            "variant": variant,
            "metrics": groups(ranks, dataset, queries, self.paraphrastic),
            "question_above_answer": sum(asked_first) / len(asked_first),
            "ranks": ranks,
        }
        self.rows.append(row)
        self.log(f"[{self.name}] {scope:8} {text:12} {variant:62} {fmt(row['metrics']['all'])}")

    async def quality(self, quick: bool) -> None:
        path = os.path.join(self.directory, f"{self.name}-package.cdl")
        store = open_store(path, self.embedder)
        try:
            for session in self.dataset.sessions.values():
                await fill(store, session)
            package = await package_tops(store, self.queries)
        finally:
            store.close()
        self.add_row("dataset", PACKAGE_TEXT, "package (public API)", package, self.dataset, self.queries)
        raw = self.variants("dataset", self.dataset, self.queries, quick)
        self.checks["raw baseline = package (dataset)"] = raw == package

    def variants(
        self, scope: str, dataset: Dataset, queries: list[Query], quick: bool, per_session_files: bool = False
    ) -> dict[str, list[Any]]:
        """Evaluate the grid; return PACKAGE's top 5 per query (for the parity check)."""
        baseline: dict[str, list[Any]] = {}
        grid = variant_grid(scope, quick)
        for text in TEXTS:
            chosen = [v for t, v in grid if t == text]
            if not chosen:
                continue
            exhaustive = ExhaustiveIndex(self.embedder)
            for session in dataset.sessions.values():
                exhaustive.add_session(session, TEXTS[text])
            recall = (
                self.indexes(scope, text, dataset, per_session_files)
                if any(v.kind == "recall" for v in chosen)
                else {}
            )
            for variant in chosen:
                tops: dict[str, list[Any]] = {}
                indexes: dict[str, RawIndex | ExhaustiveIndex] = (
                    {"*": exhaustive} if variant.kind == "exhaustive" else dict(recall)
                )
                for sid, index in indexes.items():
                    tops.update(raw_tops(index, [q for q in queries if sid in (q.session, "*")], variant))
                if text == PACKAGE_TEXT and variant == PACKAGE:
                    baseline = tops
                self.add_row(scope, text, variant.label, tops, dataset, queries)
            for index in recall.values():
                index.close()
        return baseline

    def indexes(
        self, scope: str, text: str, dataset: Dataset, per_session_files: bool
    ) -> dict[str, RawIndex]:
        def index_of(sessions: list[Session], name: str) -> RawIndex:
            index = RawIndex(
                os.path.join(self.directory, f"{self.name}-{scope}-{text}-{name}.cdl"), self.embedder
            )
            for session in sessions:
                index.add_session(session, TEXTS[text])
            return index

        if per_session_files:
            return {sid: index_of([s], sid) for sid, s in dataset.sessions.items()}
        return {"*": index_of(list(dataset.sessions.values()), "all")}

    async def scale(self) -> None:
        big, big_queries = scaled(self.dataset, self.queries)
        raw = self.variants("scale", big, big_queries, quick=False, per_session_files=True)
        first = next(iter(big.sessions.values()))
        alone = os.path.join(self.directory, f"{self.name}-alone.cdl")
        crowded = os.path.join(self.directory, f"{self.name}-crowded.cdl")
        store = open_store(alone, self.embedder)
        try:
            await fill(store, first)
            store.backup(crowded)
        finally:
            store.close()
        # The other sessions in 100-item batches (quicker to write; the ranking is the same).
        store = open_store(crowded, self.embedder)
        try:
            for session in list(big.sessions.values())[1:]:
                await fill(store, session, batch=100)
            package = await package_tops(store, big_queries)
        finally:
            store.close()
        self.add_row("scale", PACKAGE_TEXT, "package (public API)", package, big, big_queries)
        self.agreement = {
            "queries": len(big_queries),
            "same_top5": sum(package[q.id] == raw[q.id] for q in big_queries),
            "same_answer_rank": sum(
                rank_of(big.answer(q), package[q.id]) == rank_of(big.answer(q), raw[q.id])
                for q in big_queries
            ),
        }
        self.log(f"[{self.name}] scale: package = raw baseline {self.agreement}")
        await self.latencies(
            big,
            first,
            {"alone in its file": alone, f"in a file of {SCALE_ITEMS * len(big.sessions):,} items": crowded},
        )

    async def latencies(self, big: Dataset, session: Session, files: dict[str, str]) -> None:
        """Every configuration in turn, round after round; medians of the pooled samples."""
        texts = [q.text for q in self.queries][:LATENCY_QUERIES]
        # The old design (until issue 17) on raw citadeldb, for comparison.
        old = RawIndex(os.path.join(self.directory, f"{self.name}-latency-old.cdl"), self.embedder)
        old.add_session(session, TEXTS[PACKAGE_TEXT])
        samples: dict[str, list[float]] = {}
        for _ in range(LATENCY_ROUNDS):
            samples.setdefault("query embedding alone", []).extend(embedding_latency(self.embedder, texts))
            for where, path in files.items():
                for label, pages in (
                    ("store's default page cache", None),
                    (f"cache_size={SMALL_CACHE_PAGES}", SMALL_CACHE_PAGES),
                ):
                    key = f"package: {SCALE_ITEMS}-item session {where}, {label}"
                    samples.setdefault(key, []).extend(
                        await search_latency(path, self.embedder, session.id, texts, pages)
                    )
            key = (
                "the old design on raw citadeldb, session alone in its file, the store's page cache: "
                f"{PACKAGE_TEXT}, {OLD_PACKAGE.label}"
            )
            samples.setdefault(key, []).extend(raw_latency(old, session.id, texts, OLD_PACKAGE))
        old.close()
        for key, values in samples.items():
            self.latency[key] = summary(values)
            self.log(f"[{self.name}] latency {key}: {self.latency[key]['median_ms']:.1f} ms")

    def report(self) -> dict[str, Any]:
        return {
            "model_id": self.embedder.model_id,
            "rows": self.rows,
            "latency": self.latency,
            "checks": self.checks,
            "scale_agreement": self.agreement,
        }


def fmt(m: dict[str, float]) -> str:
    return f"R@1 {m['recall@1']:.3f}  R@5 {m['recall@5']:.3f}  MRR {m['mrr']:.3f}"


def markdown(report: dict[str, Any]) -> str:
    names = list(report["embedders"])
    data, para = report["dataset"], report["paraphrase"]
    lines = [
        f"Dataset: {data['sessions']} sessions, {data['items']} items, {data['queries_in_file']} queries "
        f"({data['queries']} evaluated). Paraphrastic, measured (no content-word stem shared with the answer's "
        f"indexed text): {para['count']}/{data['queries_in_file']} = {para['fraction']:.2f} "
        f"(author's labels: {para['labelled_fraction']:.2f}).",
        "",
        "Q>A: share of queries whose answer is a reply and whose question (the user message before it) "
        "ranks above it.",
        "",
        "| scope | indexed text | variant | "
        + " | ".join(f"{n} R@1 | {n} R@5 | {n} MRR | {n} Q>A" for n in names)
        + " |",
        "|---|---|---|" + "---:|---:|---:|---:|" * len(names),
    ]
    rows = {
        n: {(r["scope"], r["text"], r["variant"]): r for r in report["embedders"][n]["rows"]} for n in names
    }
    for key in rows[names[0]]:
        cells = []
        for n in names:
            m = rows[n][key]["metrics"]["all"]
            cells.append(
                f"{m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['mrr']:.3f} | "
                f"{rows[n][key]['question_above_answer']:.2f}"
            )
        lines.append(f"| {' | '.join(key)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "By query group, R@1 / R@5 / MRR (n):",
        "",
        "| embedder | scope | indexed text | variant | paraphrastic | lexical | answer is a user item |",
        "|---|---|---|---|---|---|---|",
    ]
    shown = {
        (scope, text, variant)
        for scope in ("dataset", "scale")
        for text, variant in (
            (PACKAGE_TEXT, "package (public API)"),
            (PACKAGE_TEXT, PACKAGE.label),
            (PACKAGE_TEXT, OLD_PACKAGE.label),
            ("own", BASELINE.label),
        )
    }
    for n in names:
        for key, row in rows[n].items():
            if key not in shown:
                continue
            cells = []
            for g in ("paraphrastic", "lexical", "answer is a user item"):
                m = row["metrics"].get(g)
                cells.append(
                    f"{m['recall@1']:.2f} / {m['recall@5']:.2f} / {m['mrr']:.2f} ({m['n']})" if m else "-"
                )
            lines.append(f"| {n} | {' | '.join(key)} | " + " | ".join(cells) + " |")
    if any(report["embedders"][n]["latency"] for n in names):
        lines += [
            "",
            f"Latency, ms (median / p90 of {LATENCY_ROUNDS} rounds x {LATENCY_QUERIES} queries, "
            "configurations taking turns); load average "
            f"{report['machine']['loadavg_start']:.1f} at start, {report['machine']['loadavg_end']:.1f} at end:",
            "",
            "| measurement | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(names),
        ]
        keys = list(dict.fromkeys(k for n in names for k in report["embedders"][n]["latency"]))
        for key in keys:
            cells = []
            for n in names:
                lat = report["embedders"][n]["latency"].get(key)
                cells.append(f"{lat['median_ms']:.1f} / {lat['p90_ms']:.1f}" if lat else "-")
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    if "minilm" in report["embedders"]:
        lines += ["", *targets(report["embedders"]["minilm"])]
    weights = report["citadel_default_weights"]
    lines += [
        "",
        f"Citadel's default weights are {tuple(weights['weights'])} (semantic, keyword, recency, importance): "
        + ("yes" if weights["hold"] else "NO"),
    ]
    lines += [
        "Checks: "
        + "; ".join(
            f"{n}: {k}: {'yes' if v else 'NO'}"
            for n in names
            for k, v in report["embedders"][n]["checks"].items()
        )
    ]
    agreements = [(n, e["scale_agreement"]) for n, e in report["embedders"].items() if e["scale_agreement"]]
    if agreements:
        lines.append(
            f"Package vs its raw emulation ({PACKAGE.label}) on {SCALE_ITEMS}-item sessions: "
            + "; ".join(
                f"{n}: the same top 5 for {a['same_top5']}/{a['queries']} queries, the answer at the same "
                f"rank for {a['same_answer_rank']}/{a['queries']}"
                for n, a in agreements
            )
            + "."
        )
    return "\n".join(lines)


def targets(minilm: dict[str, Any]) -> list[str]:
    """The targets for all-MiniLM-L6-v2, met or not, by the package and by the old design."""
    rows = {(r["scope"], r["text"], r["variant"]): r["metrics"]["all"] for r in minilm["rows"]}
    lines = [
        f"Targets, all-MiniLM-L6-v2 (recall@5 >= {TARGETS['recall@5']}, recall@1 >= {TARGETS['recall@1']}, "
        f"median search <= {TARGETS['search_ms']:g} ms on a {SCALE_ITEMS}-item session):"
    ]
    for label, key in (
        ("package (public API)", ("dataset", PACKAGE_TEXT, "package (public API)")),
        ("the old design (until issue 17)", ("dataset", PACKAGE_TEXT, OLD_PACKAGE.label)),
        (f"package, {SCALE_ITEMS}-item sessions", ("scale", PACKAGE_TEXT, "package (public API)")),
        (f"the old design, {SCALE_ITEMS}-item sessions", ("scale", PACKAGE_TEXT, OLD_PACKAGE.label)),
    ):
        m = rows.get(key)
        if m:
            met = m["recall@5"] >= TARGETS["recall@5"] and m["recall@1"] >= TARGETS["recall@1"]
            lines.append(
                f"- {label}: recall@5 {m['recall@5']:.3f}, recall@1 {m['recall@1']:.3f}: "
                f"{'met' if met else 'NOT met'}"
            )
    for key, lat in minilm["latency"].items():
        if key.startswith("package:"):
            met = lat["median_ms"] <= TARGETS["search_ms"]
            lines.append(f"- {key}: median {lat['median_ms']:.1f} ms: {'met' if met else 'NOT met'}")
    return lines


async def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    dataset = load_dataset(args.dataset)
    paraphrase = paraphrase_report(dataset)
    # Quick: every n-th query, so that each session is represented.
    queries = (
        dataset.queries[:: len(dataset.queries) // QUICK_QUERIES][:QUICK_QUERIES]
        if args.quick
        else dataset.queries
    )
    embedders = ["mock"] if args.quick else args.embedders
    log = (
        (lambda message: print(message, file=sys.stderr, flush=True))
        if args.verbose
        else (lambda message: None)
    )
    report: dict[str, Any] = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg()[0],
        },
        "dataset": {
            "sessions": len(dataset.sessions),
            "items": sum(len(s.items) for s in dataset.sessions.values()),
            "queries": len(queries),
            "queries_in_file": len(dataset.queries),
        },
        "paraphrase": paraphrase,
        "package": {"text": PACKAGE_TEXT, "variant": PACKAGE.label},
        "embedders": {},
    }
    with tempfile.TemporaryDirectory(prefix="search-quality-") as directory:
        report["citadel_default_weights"] = {
            "weights": DEFAULT_WEIGHTS,
            "hold": default_weights_hold(directory),
        }
        for name in embedders:
            evaluation = Evaluation(name, dataset, queries, paraphrase["measured"], directory, log)
            await evaluation.quality(args.quick)
            if not args.quick:
                await evaluation.scale()
            report["embedders"][name] = evaluation.report()
    report["machine"]["loadavg_end"] = os.getloadavg()[0]
    report["seconds"] = time.perf_counter() - started
    print(markdown(report))
    print(f"\n{report['seconds']:.0f} s in all")
    if args.json_out or not args.quick:
        out = args.json_out or RESULTS / f"search_quality-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    checks = [report["citadel_default_weights"]["hold"]]
    checks += [ok for e in report["embedders"].values() for ok in e["checks"].values()]
    return 0 if all(checks) else 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="MockEmbedder, 12 queries, no scale or latency")
    parser.add_argument("--embedders", nargs="+", default=["mock", "minilm"], choices=["mock", "minilm"])
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument(
        "--json-out", type=Path, help="where to write the JSON (default: benchmarks/results/...)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    sys.exit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
