"""The embedder protocol Citadel expects, the identity that binds vectors to a model, and embedding calls.

Citadel calls ``embed_with_cancel(texts, cancel_token)`` (and, for asymmetric
models, ``embed_queries_with_cancel``) and reads ``dim``, ``metric`` and
``model_id``. Embedders written against the older protocol have only
``embed`` / ``embed_queries``; they are wrapped rather than refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import EmbedderError


@runtime_checkable
class Embedder(Protocol):
    """What Citadel needs from an embedder (the protocol of `citadeldb.MockEmbedder`)."""

    @property
    def dim(self) -> int: ...

    @property
    def metric(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]: ...


@dataclass(frozen=True)
class EmbedderIdentity:
    """What binds stored vectors to a model: vectors of two identities do not mix."""

    model_id: str
    dim: int
    metric: str

    @classmethod
    def of(cls, embedder: Embedder) -> EmbedderIdentity:
        return cls(str(embedder.model_id), int(embedder.dim), str(embedder.metric))


class LegacyEmbedderAdapter:
    """Presents an ``embed`` / ``embed_queries`` embedder through the cancellable protocol."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        if callable(getattr(inner, "embed_queries", None)):
            self.embed_queries_with_cancel = self._embed_queries_with_cancel

    @property
    def dim(self) -> int:
        return int(self._inner.dim)

    @property
    def metric(self) -> str:
        return str(self._inner.metric)

    @property
    def model_id(self) -> str:
        return str(self._inner.model_id)

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        _check_cancelled(cancel_token)
        vectors: list[list[float]] = self._inner.embed(texts)
        return vectors

    def _embed_queries_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        _check_cancelled(cancel_token)
        vectors: list[list[float]] = self._inner.embed_queries(texts)
        return vectors

    def __repr__(self) -> str:
        return f"LegacyEmbedderAdapter({self._inner!r})"


def embed_documents(
    embedder: Embedder, texts: list[str], outcome: str = "nothing was written"
) -> list[list[float]]:
    """The vectors of `texts` as stored items, in one call; an embedder's failure as `EmbedderError`
    (whose message says `outcome`: what became of the call)."""
    return _vectors(embedder, embedder.embed_with_cancel, texts, outcome)


def embed_query(embedder: Embedder, text: str) -> list[float]:
    """The vector of a search query (the query side of an asymmetric model, when it has one)."""
    embed = getattr(embedder, "embed_queries_with_cancel", embedder.embed_with_cancel)
    return _vectors(embedder, embed, [text])[0]


def _vectors(
    embedder: Embedder, embed: Any, texts: list[str], outcome: str = "nothing was written"
) -> list[list[float]]:
    try:
        vectors = embed(texts, None)
    except Exception as exc:
        raise embedder_failed(embedder.model_id, f"{type(exc).__name__}: {exc}", outcome) from exc
    if len(vectors) != len(texts):
        raise embedder_failed(
            embedder.model_id, f"it returned {len(vectors)} vectors for {len(texts)} texts", outcome
        )
    # Citadel takes lists of Python floats; numpy arrays (what most models return) convert in C.
    vectors = [vector.tolist() if hasattr(vector, "tolist") else list(vector) for vector in vectors]
    for vector in vectors:
        # Citadel would refuse these too, with an error that names neither the embedder nor the fix.
        if len(vector) != embedder.dim:
            raise embedder_failed(
                embedder.model_id,
                f"it returned a vector of {len(vector)} dimensions, but declares dim {embedder.dim}",
                outcome,
            )
        if not all(map(math.isfinite, vector)):
            raise embedder_failed(embedder.model_id, "it returned a vector holding NaN or infinity", outcome)
    return vectors


def embedder_failed(model_id: str | None, detail: str, outcome: str = "nothing was written") -> EmbedderError:
    """The error for an embedder that raised, naming the model, its error and the fix."""
    named = f" {model_id!r}" if model_id else ""
    return EmbedderError(
        f"the embedder{named} failed ({detail}); {outcome}. Fix the embedder "
        "(its model path, device, or the factory that builds it; "
        "`python -m citadeldb_openai_agents check` loads the configured one) and retry."
    )


def _check_cancelled(cancel_token: Any) -> None:
    if cancel_token is not None:
        cancel_token.check()
