"""An embedder for tests: Citadel's MockEmbedder, which records what it embeds and can be made to fail."""

from __future__ import annotations

import citadeldb


class StubEmbedder:
    """`citadeldb.MockEmbedder(dim)` vectors; `embedded` lists every text asked for, in order.

    Set `failure` to an exception and every call raises it (a model whose weights went
    missing, an embedding service that went down); set it back to None and calls work.
    """

    def __init__(self, dim: int = 128) -> None:
        self._inner = citadeldb.MockEmbedder(dim=dim)
        self.dim, self.metric, self.model_id = self._inner.dim, self._inner.metric, self._inner.model_id
        self.embedded: list[str] = []
        self.failure: BaseException | None = None

    def embed_with_cancel(self, texts: list[str], cancel_token: object = None) -> list[list[float]]:
        if self.failure is not None:
            raise self.failure
        self.embedded.extend(texts)
        return self._inner.embed_with_cancel(texts, cancel_token)
