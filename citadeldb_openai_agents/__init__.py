"""Encrypted, embedded conversation memory for the OpenAI Agents SDK, stored in Citadel."""

from .config import from_config
from .embedders import Embedder, EmbedderIdentity, LegacyEmbedderAdapter
from .errors import (
    CitadelSessionError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EmbedderMismatchError,
    EmptyPassphraseError,
    InvalidItemError,
    SessionClosedError,
    WrongPassphraseError,
)
from .layout import Erasure
from .session import CitadelSession
from .settings import CitadelSettings, ConfigurationError
from .store import CitadelSessionStore

__all__ = [
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
    "InvalidItemError",
    "LegacyEmbedderAdapter",
    "SessionClosedError",
    "WrongPassphraseError",
    "from_config",
]
__version__ = "0.1.0"
