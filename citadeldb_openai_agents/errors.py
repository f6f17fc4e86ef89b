"""The package's exceptions: one base class, a subclass per cause.

Every message names the cause and the fix, and none ever contains a passphrase.
Subclasses also derive from the built-in exception a caller would expect
(``ValueError`` for a bad argument, ``RuntimeError`` for a closed session), so
both ``except CitadelSessionError`` and ``except ValueError`` work.
"""

from __future__ import annotations


class CitadelSessionError(Exception):
    """Base class of every error this package raises on purpose."""


class EmptyPassphraseError(CitadelSessionError, ValueError):
    """The passphrase is empty; Citadel would accept it, we refuse it."""


class WrongPassphraseError(CitadelSessionError):
    """The passphrase does not open the file (or differs from the one it is open with)."""


class DatabaseLockedError(CitadelSessionError):
    """Another process holds the Citadel file."""


class DatabaseNotFoundError(CitadelSessionError, FileNotFoundError):
    """The file's directory (or a companion file Citadel needs) does not exist."""


class CorruptDatabaseError(CitadelSessionError):
    """Citadel found damage in the file."""


class EmbedderMismatchError(CitadelSessionError, ValueError):
    """The file's items were embedded with another model than the one configured."""


class InvalidItemError(CitadelSessionError, TypeError, ValueError):
    """An item in an ``add_items`` batch cannot be stored as JSON; nothing was written."""


class SessionClosedError(CitadelSessionError, RuntimeError):
    """An operation was attempted on a closed session or store."""


class SessionNotFoundError(CitadelSessionError, LookupError):
    """An operator command named a session that holds no live item."""


class BackupExistsError(CitadelSessionError, FileExistsError):
    """A backup's destination (or one of its companion files) already exists."""
