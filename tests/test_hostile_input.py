"""Hostile input: any JSON item comes back exactly, anything else is refused untouched, any id is its own.

Property-based (hypothesis). The default run keeps the example counts modest;
``python -m pytest -m slow tests/test_hostile_input.py`` runs the same properties
with many more examples, and a 10 MB item of astral-plane text.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import hashlib
import itertools
import json
import random
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from citadeldb_openai_agents import CitadelSessionStore, InvalidItemError

from conftest import KEY

# Every code point; lone surrogates drawn often (Python strings can hold them; so must we).
ANY_CHARACTER = st.characters(exclude_categories=()) | st.characters(categories=["Cs"])
TEXT = st.text(ANY_CHARACTER, max_size=40)
BIG = 10**4000  # Python refuses to print integers of more than 4,300 digits
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-BIG, max_value=BIG)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TEXT, inner, max_size=6),
    max_leaves=30,
)
SDK_LIKE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system"]),
        "content": TEXT
        | st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": TEXT}), max_size=3),
    },
    optional={"id": TEXT, "extra": JSON_VALUES},
)
ITEMS = SDK_LIKE | JSON_VALUES

# Large, deeply nested items are the point here (hostile input), so hypothesis must not abort
# a run when many of them exceed its entropy budget (data_too_large fired at random on 3.13).
_BIG_ON_PURPOSE = [HealthCheck.too_slow, HealthCheck.data_too_large]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=_BIG_ON_PURPOSE)
MANY = settings(max_examples=600, deadline=None, suppress_health_check=_BIG_ON_PURPOSE)


def exactly(value: Any) -> str:
    """A form that compares key order and types (True is not 1, 1.0 is not 1, -0.0 is not 0.0)."""
    return json.dumps(value, ensure_ascii=True, allow_nan=False)


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture
def shared_store(db_path: Path) -> Iterator[CitadelSessionStore]:
    """One store for every example of a property (an open per example would dominate).

    Without fsync: what these properties test is the encoding, not durability.
    """
    with CitadelSessionStore(db_path, KEY, argon2_profile="iot", sync_mode="off") as store:
        yield store


def fresh_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"example-{next(counter)}"


# -- JSON round-trips --------------------------------------------------------------------


def check_round_trip(store: CitadelSessionStore, new_id: Callable[[], str], batches: list[list[Any]]) -> None:
    session = store.session(new_id())
    written = [item for batch in batches for item in batch]

    async def run() -> None:
        for batch in batches:
            await session.add_items(batch)
        assert exactly(await session.get_items()) == exactly(written)
        assert exactly(await session.get_items(limit=2)) == exactly(written[-2:])
        assert exactly(await session.pop_item()) == exactly(written[-1])

    asyncio.run(run())


def test_any_json_item_round_trips_exactly(shared_store: CitadelSessionStore) -> None:
    new_id = fresh_ids()

    @FAST
    @given(st.lists(st.lists(ITEMS, min_size=1, max_size=4), min_size=1, max_size=3))
    def prop(batches: list[list[Any]]) -> None:
        check_round_trip(shared_store, new_id, batches)

    prop()


@pytest.mark.slow
def test_any_json_item_round_trips_exactly_many(shared_store: CitadelSessionStore) -> None:
    new_id = fresh_ids()

    @MANY
    @given(st.lists(st.lists(ITEMS, min_size=1, max_size=4), min_size=1, max_size=3))
    def prop(batches: list[list[Any]]) -> None:
        check_round_trip(shared_store, new_id, batches)

    prop()


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"level": level, "next": value}
    return value


async def test_edge_values_round_trip_exactly(store: CitadelSessionStore, db_path: Path) -> None:
    items = [
        {},
        [],
        "",
        {"": ""},
        {"z": 1, "a": 2, "m": {"y": [], "b": {}}},  # Citadel itself would sort these keys
        {"int": 1, "float": 1.0, "true": True, "zero": -0.0, "tiny": 5e-324, "huge": 1.7976931348623157e308},
        {"big": BIG, "negative": -BIG},
        {"astral": "𝄞😀𓀀🂡", "surrogate": "\ud800 alone", "bom": "\ufeff", "nul": "\x00"},
        {"separators": "\u2028\u2029\r\n", "rtl": "\u202eevil", "zwj": "👩\u200d💻"},
        nested(400),
    ]
    session = store.session("edges")
    await session.add_items(items)
    assert exactly(await session.get_items()) == exactly(items)
    store.close()
    with CitadelSessionStore(db_path, KEY) as reopened:
        assert exactly(await reopened.session("edges").get_items()) == exactly(items)


async def test_a_ten_megabyte_item_round_trips(store: CitadelSessionStore, db_path: Path) -> None:
    rng = random.Random(10)
    words = ["tool", "output", "línea", "数据", "𝄞", "\n", '"quoted"', "\\", "{}"]
    text = " ".join(rng.choice(words) if n % 50 == 0 else "ascii" for n in range(2_000_000))
    big = {"type": "function_call_output", "call_id": "call_1", "output": text[:10_000_000]}
    assert len(big["output"]) == 10_000_000
    session = store.session("big")
    await session.add_items([{"role": "user", "content": "before"}, big])
    await session.add_items([{"role": "user", "content": "after"}])
    got = await session.get_items()
    assert got[1] == big and exactly(got) == exactly(
        [{"role": "user", "content": "before"}, big, {"role": "user", "content": "after"}]
    )
    store.close()
    with CitadelSessionStore(db_path, KEY) as reopened:
        assert (await reopened.session("big").get_items(limit=2))[0] == big


@pytest.mark.slow
async def test_a_ten_megabyte_item_of_astral_text_round_trips(store: CitadelSessionStore) -> None:
    rng = random.Random(11)
    text = "".join(rng.choice('aé中𝄞😀 \n"\\\u2028\ud800') for _ in range(10_000_000))
    session = store.session("big")
    await session.add_items([{"role": "user", "content": text}])
    assert await session.get_items() == [{"role": "user", "content": text}]
    await session.search("needle")
    assert await session.pop_item() == {"role": "user", "content": text}


# -- refusals ----------------------------------------------------------------------------


class Opaque:
    pass


NOT_JSON = st.sampled_from(
    [
        {1, 2},
        b"bytes",
        bytearray(b"x"),
        datetime.datetime(2024, 1, 1),
        decimal.Decimal("1.1"),
        complex(1, 2),
        Opaque(),
        float("nan"),
        float("inf"),
        float("-inf"),
        10**5000,  # more digits than Python will print
        nested(100_000),  # deeper than json can write on any supported Python (3.13 writes 5,000)
        print,
    ]
)


@st.composite
def batches_with_one_bad_value(draw: st.DrawFn) -> tuple[list[Any], int]:
    batch = draw(st.lists(ITEMS, min_size=1, max_size=4))
    position = draw(st.integers(0, len(batch)))
    bad = draw(NOT_JSON)
    wrapper = draw(st.sampled_from(["bare", "in-dict", "in-list", "deep"]))
    item = {
        "bare": bad,
        "in-dict": {"role": "user", "content": "ok", "payload": bad},
        "in-list": [1, "two", bad],
        "deep": {"a": [{"b": {"c": [bad]}}]},
    }[wrapper]
    batch.insert(position, item)
    return batch, position


def check_refusal(store: CitadelSessionStore, directory: Path, batch: list[Any], position: int) -> None:
    session = store.session("refusals")
    before_items = asyncio.run(session.get_items())
    before_ids = store.session_ids()
    before_files = snapshot(directory)
    with pytest.raises(InvalidItemError, match=f"item {position} of the batch") as caught:
        asyncio.run(session.add_items(batch))
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
    assert "Nothing of this batch was written" in str(caught.value)
    assert snapshot(directory) == before_files, "a refused batch must not write a byte"
    assert asyncio.run(session.get_items()) == before_items
    assert store.session_ids() == before_ids
    with pytest.raises(InvalidItemError):
        asyncio.run(store.session(f"never-created-{position}").add_items(batch))
    assert store.session_ids() == before_ids


def test_a_batch_with_any_non_json_value_is_refused_and_nothing_is_written(
    shared_store: CitadelSessionStore, db_path: Path
) -> None:
    asyncio.run(shared_store.session("refusals").add_items([{"content": "already here"}]))

    @FAST
    @given(batches_with_one_bad_value())
    def prop(case: tuple[list[Any], int]) -> None:
        check_refusal(shared_store, db_path.parent, *case)

    prop()


@pytest.mark.slow
def test_a_batch_with_any_non_json_value_is_refused_many(
    shared_store: CitadelSessionStore, db_path: Path
) -> None:
    asyncio.run(shared_store.session("refusals").add_items([{"content": "already here"}]))

    @MANY
    @given(batches_with_one_bad_value())
    def prop(case: tuple[list[Any], int]) -> None:
        check_refusal(shared_store, db_path.parent, *case)

    prop()


# -- session ids -------------------------------------------------------------------------

LOOK_ALIKES = {"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "i": "і", "l": "Ӏ", "0": "O"}


def variants(session_id: str) -> set[str]:
    """Ids a careless store might fold into `session_id`: case, normal forms, look-alikes, padding."""
    found = {
        session_id,
        session_id.upper(),
        session_id.lower(),
        session_id.swapcase(),
        session_id.casefold(),
        session_id + " ",
        " " + session_id,
        session_id + "\u200b",
        session_id + "\x00",
        "".join(LOOK_ALIKES.get(c, c) for c in session_id),
    }
    with contextlib.suppress(UnicodeError):
        found |= {unicodedata.normalize(form, session_id) for form in ("NFC", "NFD", "NFKC", "NFKD")}
    return found


def check_isolation(store: CitadelSessionStore, ids: set[str]) -> None:
    async def run() -> None:
        for session_id in sorted(ids):
            await store.session(session_id).add_items([{"owner": session_id}])
        for session_id in ids:
            assert await store.session(session_id).get_items() == [{"owner": session_id}]
        assert set(store.session_ids()) == ids

    try:
        asyncio.run(run())
    finally:
        for session_id in ids:
            asyncio.run(store.session(session_id).clear_session())
    assert store.session_ids() == []


ID_SEEDS = st.text(ANY_CHARACTER, max_size=12) | st.sampled_from(
    ["Bob", "alice", "user-123", "ǅungla", "ß", "İ", "ﬁ"]
)


def test_any_session_id_and_its_variants_stay_isolated(shared_store: CitadelSessionStore) -> None:
    @settings(FAST, max_examples=25)
    @given(st.lists(ID_SEEDS, min_size=1, max_size=2))
    def prop(seeds: list[str]) -> None:
        check_isolation(shared_store, set().union(*(variants(seed) for seed in seeds)))

    prop()


@pytest.mark.slow
def test_any_session_id_and_its_variants_stay_isolated_many(shared_store: CitadelSessionStore) -> None:
    @MANY
    @given(st.lists(ID_SEEDS, min_size=1, max_size=3))
    def prop(seeds: list[str]) -> None:
        check_isolation(shared_store, set().union(*(variants(seed) for seed in seeds)))

    prop()


async def test_very_long_session_ids_stay_isolated(store: CitadelSessionStore, db_path: Path) -> None:
    long = "x" * 100_000
    ids = [long, long + "y", long[:-1] + "X", "", "\ud800", "😀" * 20_000]
    for session_id in ids:
        await store.session(session_id).add_items([{"owner": session_id}])
    store.close()
    with CitadelSessionStore(db_path, KEY) as reopened:
        assert reopened.session_ids() == sorted(ids)
        for session_id in ids:
            assert await reopened.session(session_id).get_items() == [{"owner": session_id}]
        # Region names carry a salted HMAC, never the id: no length limit leaks through.
        await reopened.session(long).clear_session()
        assert await reopened.session(long + "y").get_items() == [{"owner": long + "y"}]
    kept = sorted(
        set(ids) - {long}
    )  # listed exactly after another reopen: none truncated, the cleared one gone
    with CitadelSessionStore(db_path, KEY) as reopened:
        listed = [summary.session_id for summary in reopened.sessions()]
        assert reopened.session_ids() == listed == kept
        assert [len(session_id) for session_id in listed] == [len(session_id) for session_id in kept]


@pytest.mark.parametrize(
    "change",
    [
        {"erasure_ledger": 5},  # not a path
        {"ttl": "1h"},  # a duration as text, not seconds
        {"sync_mode": "fast"},
        {"cache_size": -1},
        {"idle_ttl": True},
        {"unknown": 1},
    ],
)
def test_a_hello_whose_terms_are_not_a_stores_options_is_a_protocol_error(change: dict[str, object]) -> None:
    """The terms a client or an owner tells are checked by the store's own checks; anything else
    is a ProtocolError (the connection is dropped), never another exception out of the parser."""
    from citadeldb_openai_agents.options import StoreOptions
    from citadeldb_openai_agents.serving.operations import ProtocolError
    from citadeldb_openai_agents.serving.protocol import CLIENT_HELLO

    terms = {**vars(StoreOptions()), **change}
    hello = {"pid": 1, "program": "x", "terms": terms, "identity": ["m", 8, "cosine"]}
    with pytest.raises(ProtocolError):
        CLIENT_HELLO(hello)
    assert CLIENT_HELLO({**hello, "terms": vars(StoreOptions())}).terms == StoreOptions()
