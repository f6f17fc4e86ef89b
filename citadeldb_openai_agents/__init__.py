"""Encrypted, embedded conversation memory for the OpenAI Agents SDK, stored in Citadel."""

from .config import from_config
from .embedders import Embedder, EmbedderIdentity, LegacyEmbedderAdapter
from .errors import (
    BackupExistsError,
    CitadelSessionError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EmbedderMismatchError,
    EmptyPassphraseError,
    InvalidItemError,
    SessionClosedError,
    SessionNotFoundError,
    WrongPassphraseError,
)
from .layout import Erasure
from .session import CitadelSession
from .settings import CitadelSettings, ConfigurationError
from .sentence_embedder import SentenceTransformerEmbedder
from .store import (
    CitadelSessionStore,
    IntegrityReport,
    ReembedSummary,
    SessionSummary,
    reembed,
)

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
    "EmbedderMismatchError",
    "EmptyPassphraseError",
    "Erasure",
    "IntegrityReport",
    "InvalidItemError",
    "LegacyEmbedderAdapter",
    "ReembedSummary",
    "SentenceTransformerEmbedder",
    "SessionClosedError",
    "SessionNotFoundError",
    "SessionSummary",
    "WrongPassphraseError",
    "from_config",
    "reembed",
]
__version__ = "0.1.0"
