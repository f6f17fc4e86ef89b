"""Embedders: the protocol Citadel expects (protocol.py), where they come from (providers.py),
and a local sentence-transformers model (local.py, the ``embeddings`` extra)."""

from .local import SentenceTransformerEmbedder
from .protocol import Embedder, EmbedderIdentity, LegacyEmbedderAdapter

__all__ = ["Embedder", "EmbedderIdentity", "LegacyEmbedderAdapter", "SentenceTransformerEmbedder"]
