"""Encrypted, embedded conversation memory for the OpenAI Agents SDK, stored in Citadel.

The public API is what this module exports (`__all__`); every other module is private.
"""

from typing import TYPE_CHECKING, Any

from .config import CitadelSettings, from_config
from .embedders import Embedder, EmbedderIdentity, LegacyEmbedderAdapter, SentenceTransformerEmbedder
from .errors import (
    BackupExistsError,
    BranchError,
    CitadelSessionError,
    ConfigurationError,
    ConfigurationWarning,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    EmbedderError,
    EmbedderMismatchError,
    EmptyPassphraseError,
    ExportExistsError,
    ForkedStoreError,
    ImportSourceError,
    InvalidItemError,
    LedgerError,
    MoveConflictError,
    SessionClosedError,
    SessionNotEmptyError,
    SessionNotFoundError,
    ShardMovingError,
    StorageError,
    WrongPassphraseError,
    WrongShardError,
)
from .migration.copy import copy_session
from .migration.files import export_all, export_sqlite, import_file
from .offline import reembed, restore_backup, verify_file
from .results import (
    EndedSession,
    Erasure,
    ExportSummary,
    HistoryHit,
    ImportReport,
    ImportSummary,
    IntegrityReport,
    LockHolder,
    MoveSummary,
    PageLayout,
    PurgeReport,
    ReembedSummary,
    SessionExport,
    SessionIntegrity,
    SessionSummary,
)
from .shards import read_ring_file, shard_for, write_ring_file
from .store import CitadelSessionStore

__all__ = [
    "BackupExistsError",
    "BranchError",
    "CitadelSession",
    "CitadelSessionError",
    "CitadelSessionStore",
    "CitadelSettings",
    "ConfigurationError",
    "ConfigurationWarning",
    "CorruptDatabaseError",
    "DatabaseLockedError",
    "DatabaseNotFoundError",
    "Embedder",
    "EmbedderError",
    "EmbedderIdentity",
    "EmbedderMismatchError",
    "EmptyPassphraseError",
    "EndedSession",
    "Erasure",
    "ExportExistsError",
    "ExportSummary",
    "ForkedStoreError",
    "HistoryHit",
    "ImportReport",
    "ImportSourceError",
    "ImportSummary",
    "IntegrityReport",
    "InvalidItemError",
    "LedgerError",
    "LegacyEmbedderAdapter",
    "LockHolder",
    "MoveConflictError",
    "MoveSummary",
    "PageLayout",
    "PurgeReport",
    "ReembedSummary",
    "SentenceTransformerEmbedder",
    "SessionClosedError",
    "SessionExport",
    "SessionIntegrity",
    "SessionNotEmptyError",
    "SessionNotFoundError",
    "SessionSummary",
    "ShardMovingError",
    "StorageError",
    "WrongPassphraseError",
    "WrongShardError",
    "copy_session",
    "export_all",
    "export_sqlite",
    "from_config",
    "import_file",
    "read_ring_file",
    "reembed",
    "restore_backup",
    "shard_for",
    "verify_file",
    "write_ring_file",
]
__version__ = "0.2.0"

if TYPE_CHECKING:
    from .session import CitadelSession


def __getattr__(name: str) -> Any:
    # CitadelSession loads the Agents SDK (seconds); the operator CLI never needs it.
    if name == "CitadelSession":
        from .session import CitadelSession

        return CitadelSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
