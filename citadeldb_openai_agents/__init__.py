"""Encrypted, embedded conversation memory for the OpenAI Agents SDK, stored in Citadel."""

from typing import TYPE_CHECKING, Any


from .config import from_config
from .embedders import Embedder, EmbedderIdentity, LegacyEmbedderAdapter
from .errors import (
    BackupExistsError,
    CitadelSessionError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EmbedderError,
    EmbedderMismatchError,
    EmptyPassphraseError,
    ForkedStoreError,
    InvalidItemError,
    SessionClosedError,
    SessionNotFoundError,
    StorageError,
    WrongPassphraseError,
)
from .layout import Erasure
from .settings import CitadelSettings, ConfigurationError
from .sentence_embedder import SentenceTransformerEmbedder
from .results import IntegrityReport, ReembedSummary, SessionIntegrity, SessionSummary
from .store import CitadelSessionStore, reembed, verify_file

__all__ = [
    "BackupExistsError",
    "CitadelSession",
    "CitadelSessionStore",
    "CitadelSessionError",
    "CitadelSettings",
    "ConfigurationError",
    "CorruptDatabaseError",
    "DatabaseLockedError",
    "DatabaseNotFoundError",
    "Embedder",
    "EmbedderIdentity",
    "EmbedderError",
    "EmbedderMismatchError",
    "EmptyPassphraseError",
    "Erasure",
    "ForkedStoreError",
    "IntegrityReport",
    "InvalidItemError",
    "LegacyEmbedderAdapter",
    "ReembedSummary",
    "SentenceTransformerEmbedder",
    "SessionClosedError",
    "SessionIntegrity",
    "SessionNotFoundError",
    "SessionSummary",
    "StorageError",
    "WrongPassphraseError",
    "from_config",
    "reembed",
    "verify_file",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from .session import CitadelSession


def __getattr__(name: str) -> Any:
    # CitadelSession loads the Agents SDK (seconds); the operator CLI never needs it.
    if name == "CitadelSession":
        from .session import CitadelSession

        return CitadelSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
