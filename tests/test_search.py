"""Search: a reply is found by the question it answers, even across restarts and segments."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import citadeldb
import pytest

from citadeldb_openai_agents import CitadelSessionStore

from stub_embedders import StubEmbedder

QUESTION = {"role": "user", "content": "What is the wifi password at the office?"}
ANSWER = {
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "id": "msg_1",
    "content": [
        {"type": "output_text", "text": "It is hunter2-blue, printed by the door.", "annotations": []}
    ],
}


async def test_the_answer_outranks_the_question_it_answers(store: CitadelSessionStore) -> None:
    session = store.session("s")
    await session.add_items([QUESTION])  # the SDK saves input and output in separate calls
    await session.add_items([ANSWER])
    hits = await session.search("office wifi password", limit=2)
    assert hits == [ANSWER, QUESTION]


async def test_the_question_is_remembered_across_a_restart(make_store, db_path: Path) -> None:
    first = make_store()
    await first.session("s").add_items([QUESTION])
    first.close()
    second = make_store()
    await second.session("s").add_items([ANSWER])
    assert (await second.session("s").search("office wifi password", limit=1)) == [ANSWER]


async def test_ranking_merges_segments_by_distance(make_store) -> None:
    # Wide hashed vectors: at the default 128 dimensions, word-hash collisions decide.
    store = make_store(embedder=citadeldb.MockEmbedder(dim=2048))
    session = store.session("long")
    filler = [
        item
        for n in range(130)
        for item in (
            {"role": "user", "content": f"question {n} about trains"},
            {"role": "assistant", "content": f"answer {n} about sandwiches"},
        )
    ]
    await session.add_items(filler)  # fills the first segment
    await session.add_items([QUESTION, ANSWER])  # lands in the second
    await session.add_items(filler)
    assert len(store._file._local._layout.state("long").segments) == 2
    assert (await session.search("office wifi password", limit=1)) == [ANSWER]


async def test_a_reply_is_embedded_with_its_question_but_keyword_indexed_alone(make_store) -> None:
    embedder = StubEmbedder()
    store = make_store(embedder=embedder)
    await store.session("s").add_items([QUESTION, ANSWER])
    question, answer = QUESTION["content"], ANSWER["content"][0]["text"]
    items_embedded = [
        text for text in embedder.embedded if text not in ("layout", "session")
    ]  # meta, catalog
    assert items_embedded == [question, f"{question}\n{answer}"]
    [region] = store._file._local._layout.segment_regions(store._file._local._layout.state("s"))
    atoms = store._file._local._database.memory.fetch(region, "item", limit=10)
    assert [atom.text for atom in atoms] == [question, answer]  # what the keyword index holds


async def test_a_json_tool_output_is_embedded_as_readable_pairs_and_returned_verbatim(make_store) -> None:
    embedder = StubEmbedder()
    store = make_store(embedder=embedder)
    output = '{"booking_ref": "FNW-55302", "slots": [{"bay": "B1", "loan_car": false}], "price": 234}'
    call = {"type": "function_call", "call_id": "c1", "name": "book", "arguments": "{}", "id": "fc_1"}
    result = {"type": "function_call_output", "call_id": "c1", "output": output}
    not_json = {"type": "function_call_output", "call_id": "c2", "output": "{not json: the text as it is"}
    deep = {"type": "function_call_output", "call_id": "c3", "output": "[" * 5000 + "]" * 5000}
    await store.session("s").add_items([QUESTION, call, result, not_json, deep])
    question = QUESTION["content"]
    embedded = [text for text in embedder.embedded if text.startswith(question)][1:]
    assert embedded == [
        f"{question}\nbook {{}}",
        f"{question}\nbooking ref: FNW-55302; bay: B1; loan car: false; price: 234",
        f"{question}\n{{not json: the text as it is",
        f"{question}\n{deep['output']}",  # deeper than json reads: as it is
    ]
    assert await store.session("s").get_items() == [QUESTION, call, result, not_json, deep]


async def test_embedding_a_deep_tool_output_loses_no_finaliser(make_store, monkeypatch) -> None:
    # json's parser recurses in C: run near the recursion limit, whatever Python code the
    # garbage collector runs meanwhile (here a gc callback; in a service, an abandoned
    # generator's close) fails with RecursionError and is dropped as "unraisable". Deep text
    # must therefore not be parsed at all.
    lost: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: lost.append(unraisable.exc_type.__name__))

    def collector_runs_python(phase: str, info: dict[str, int]) -> None:
        def nested(depth: int) -> int:
            return nested(depth - 1) if depth else 0

        nested(20)

    session = make_store(embedder=StubEmbedder()).session("s")
    deep = {"type": "function_call_output", "call_id": "c3", "output": "[" * 5000 + "]" * 5000}
    threshold = gc.get_threshold()
    gc.callbacks.append(collector_runs_python)
    gc.set_threshold(1)  # a collection at every allocation: one happens at every depth
    try:
        await session.add_items([QUESTION, deep])
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(collector_runs_python)
    assert lost == []
    assert await session.get_items() == [QUESTION, deep]


async def test_a_users_statement_is_not_ranked_down_as_their_questions_are(make_store) -> None:
    # Wide hashed vectors: both messages are then exactly as near the query, and share its words.
    store = make_store(embedder=citadeldb.MockEmbedder(dim=2048))
    statement = {"role": "user", "content": "The locker code is 4471"}
    question = {"role": "user", "content": "What is the locker code"}
    session = store.session("s")
    await session.add_items([statement])
    await session.add_items([question])  # newer: it would win the tie
    # The question's distance is weighed up (it resembles the query more than its answer
    # would); the statement is the answer, and is not.
    assert await session.search("locker code", limit=2) == [statement, question]


async def test_a_popped_question_is_not_used_for_the_next_reply(make_store) -> None:
    embedder = StubEmbedder()
    session = make_store(embedder=embedder).session("s")
    await session.add_items([{"role": "user", "content": "tell me about llamas"}])
    await session.pop_item()
    await session.add_items([{"role": "assistant", "content": "They are smaller."}])
    assert embedder.embedded[-1] == "They are smaller."


def test_the_page_cache_defaults_to_holding_a_large_file(make_store, monkeypatch: pytest.MonkeyPatch) -> None:
    """16,384 pages of ~8 KiB: the default the README documents (Citadel's own is under 1,000)."""
    asked: list[dict[str, object]] = []
    real = citadeldb.DatabaseOptions

    def recording(**options: object) -> object:
        asked.append(options)
        return real(**options)

    monkeypatch.setattr(citadeldb, "DatabaseOptions", recording)
    make_store().close()
    make_store(cache_size=500).close()
    assert [options["cache_size"] for options in asked] == [16_384, 500]


async def test_a_larger_page_cache_is_an_option(make_store) -> None:
    store = make_store(cache_size=20_000)
    await store.session("s").add_items([QUESTION, ANSWER])
    assert await store.session("s").search("office wifi password", limit=1) == [ANSWER]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="cache_size"):
            make_store(cache_size=bad)


def test_cache_size_from_the_environment(clean_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from citadeldb_openai_agents import CitadelSettings, ConfigurationError

    monkeypatch.setenv("CITADEL_CACHE_SIZE", "20000")
    assert CitadelSettings(key="k").cache_size == 20_000
    monkeypatch.setenv("CITADEL_CACHE_SIZE", "lots")
    with pytest.raises(ConfigurationError, match="CITADEL_CACHE_SIZE"):
        CitadelSettings(key="k")
