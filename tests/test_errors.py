"""Errors a user can hit: each names the cause and the fix, and leaves the files untouched."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import citadeldb
import pytest

from citadeldb_openai_agents import (
    CitadelSession,
    CitadelSessionError,
    CitadelSessionStore,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EmbedderError,
    EmbedderMismatchError,
    EmptyPassphraseError,
    WrongPassphraseError,
)
from citadeldb_openai_agents.serving import handover, shared_file

from stub_embedders import StubEmbedder


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("empty", ["", None])
def test_empty_passphrase_is_refused_before_touching_disk(db_path: Path, empty: Any) -> None:
    with pytest.raises(EmptyPassphraseError, match="CITADEL_KEY") as caught:
        CitadelSessionStore(db_path, empty)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ValueError):
        CitadelSession("s", db_path, empty)
    assert list(db_path.parent.iterdir()) == []


async def test_wrong_passphrase_says_so_and_changes_no_byte(make_store, db_path: Path, key: str) -> None:
    store = make_store()
    await store.session("s").add_items([{"n": 1}])
    store.close()
    before = snapshot(db_path.parent)
    with pytest.raises(WrongPassphraseError, match="wrong passphrase") as caught:
        CitadelSessionStore(db_path, "not the passphrase")
    assert "not the passphrase" not in str(caught.value)
    assert isinstance(caught.value, CitadelSessionError)
    assert snapshot(db_path.parent) == before
    again = make_store()
    assert await again.session("s").get_items() == [{"n": 1}]


def test_same_file_with_another_passphrase_in_one_process(
    store: CitadelSessionStore, db_path: Path, key: str
) -> None:
    with pytest.raises(WrongPassphraseError, match="already open in this process"):
        CitadelSession("s", db_path, "another passphrase")
    assert store.session_ids() == []


def test_file_held_by_another_process(db_path: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the holder's serve = false mark, this process would wait HANDOVER_SECONDS for the
    # holder to serve the file, then fail: made a minute here, so that "at once" is "well under
    # that wait" with a wide margin.
    monkeypatch.setattr(handover, "HANDOVER_SECONDS", 60.0)
    monkeypatch.setattr(shared_file, "HANDOVER_SECONDS", 60.0)  # the deadline an open starts with
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sys
            from citadeldb_openai_agents import CitadelSessionStore
            store = CitadelSessionStore(sys.argv[1], sys.argv[2], argon2_profile="iot", serve=False)
            print("ready", flush=True)
            sys.stdin.readline()
            store.close()
        """),
            str(db_path),
            key,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        start = time.monotonic()
        with pytest.raises(DatabaseLockedError) as caught:
            CitadelSessionStore(db_path, key)
        took = time.monotonic() - start
        # Refused in 0.021 s at most under load (benchmarks/suite_under_load.py, 2026-12-08): half
        # the wait is 1000x that.
        assert took < handover.HANDOVER_SECONDS / 2, "must fail at once, not wait for the holder to serve"
        message = str(caught.value)
        assert str(db_path) in message and "one process" in message and key not in message
    finally:
        holder.communicate("\n", timeout=60)
    with CitadelSessionStore(db_path, key) as store:
        assert store.session_ids() == []


def test_missing_directory(tmp_path: Path, key: str) -> None:
    with pytest.raises(DatabaseNotFoundError, match="does not exist") as caught:
        CitadelSessionStore(tmp_path / "nowhere" / "agent.cdl", key)
    assert isinstance(caught.value, FileNotFoundError)


def test_store_with_file_arguments_is_a_type_error(
    store: CitadelSessionStore, db_path: Path, key: str
) -> None:
    for kwargs in (
        {"db_path": db_path},
        {"key": key},
        {"ttl": 5},
        {"embedder": citadeldb.MockEmbedder(dim=8)},
    ):
        with pytest.raises(TypeError, match="takes its file and settings from the store"):
            CitadelSession("s", store=store, **kwargs)
    with pytest.raises(TypeError, match="db_path and key"):
        CitadelSession("s")


class NotAnEmbedder:
    dim = 8


class LegacyEmbedder:
    """The older protocol: embed / embed_queries, no cancellation."""

    dim, metric, model_id = 16, "cosine", "legacy-test-v1"

    def __init__(self) -> None:
        self.inner = citadeldb.MockEmbedder(dim=16)
        self.calls = 0

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        return self.inner.embed(texts)

    def embed_queries(self, texts: list[str]) -> list[list[float]]:
        return self.inner.embed_queries(texts)


def test_malformed_embedder_names_what_is_missing(db_path: Path, key: str) -> None:
    with pytest.raises(TypeError, match="metric, model_id, embed_with_cancel"):
        CitadelSessionStore(db_path, key, embedder=NotAnEmbedder())
    assert not db_path.exists()


async def test_legacy_embedder_is_adapted(make_store) -> None:
    embedder = LegacyEmbedder()
    store = make_store(embedder=embedder)
    session = store.session("s")
    await session.add_items([{"content": "the llama sleeps"}, {"content": "the stock market fell"}])
    assert await session.search("llama", limit=1) == [{"content": "the llama sleeps"}]
    assert embedder.calls > 0


async def test_file_embedded_with_another_model(make_store, db_path: Path) -> None:
    store = make_store()
    await store.session("s").add_items([{"content": "x"}])
    store.close()
    with pytest.raises(EmbedderMismatchError, match="reembed"):
        make_store(embedder=LegacyEmbedder())
    with pytest.raises(EmbedderMismatchError, match="dim 64"):
        make_store(embedder=citadeldb.MockEmbedder(dim=64))
    assert await make_store().session("s").get_items() == [{"content": "x"}]


async def test_an_embedder_that_fails_names_itself_and_writes_nothing(make_store) -> None:
    embedder = StubEmbedder(dim=16)
    session = make_store(embedder=embedder).session("s")
    await session.add_items([{"role": "user", "content": "kept"}])
    embedder.failure = OSError("model.safetensors: No such file or directory")
    with pytest.raises(
        EmbedderError, match=r"mock.*OSError: model.safetensors.*nothing was written"
    ) as caught:
        await session.add_items(
            [{"role": "user", "content": "lost"}, {"role": "assistant", "content": "too"}]
        )
    assert isinstance(caught.value, CitadelSessionError) and "check" in str(caught.value)
    with pytest.raises(EmbedderError, match="OSError"):
        await session.search("kept")
    embedder.failure = None
    assert await session.get_items() == [{"role": "user", "content": "kept"}]
    assert await session.search("kept", limit=1) == [{"role": "user", "content": "kept"}]


@pytest.mark.parametrize(
    ("vector", "cause"), [([1.0, 0.0], "2 dimensions, but declares dim 16"), ([float("nan")] * 16, "NaN")]
)
async def test_an_embedder_returning_bad_vectors_is_named(
    make_store, vector: list[float], cause: str
) -> None:
    embedder = StubEmbedder(dim=16)
    session = make_store(embedder=embedder).session("s")
    await session.add_items([{"role": "user", "content": "kept"}])
    embedder.embed_with_cancel = lambda texts, token=None: [vector for _ in texts]  # type: ignore[method-assign]
    with pytest.raises(EmbedderError, match=cause):
        await session.add_items([{"role": "user", "content": "lost"}])
    with pytest.raises(EmbedderError, match=cause):
        await session.search("anything")
    assert await session.get_items() == [{"role": "user", "content": "kept"}]


async def test_reembed_with_a_failing_embedder_keeps_the_file(make_store, db_path: Path, key: str) -> None:
    from citadeldb_openai_agents import reembed

    store = make_store()
    await store.session("s").add_items([{"role": "user", "content": "kept"}])
    store.close()
    broken = StubEmbedder(dim=16)
    broken.failure = OSError("model.safetensors: No such file or directory")
    with pytest.raises(EmbedderError, match=r"OSError: model\.safetensors.*finishes when run again"):
        reembed(db_path, key, broken)
    store = make_store()
    assert await store.session("s").get_items() == [{"role": "user", "content": "kept"}]
    store.close()
    broken.failure = None
    assert reembed(db_path, key, broken).items == 1
    reopened = make_store(embedder=broken)
    assert await reopened.session("s").search("kept", limit=1) == [{"role": "user", "content": "kept"}]


def test_reprs_and_messages_never_hold_the_passphrase(
    store: CitadelSessionStore, key: str, db_path: Path
) -> None:
    session = store.session("s")
    assert (
        key not in repr(store) and key not in repr(session) and key not in repr(store._file._local._database)
    )
    assert key not in repr(vars(store)) and key not in repr(vars(session))
