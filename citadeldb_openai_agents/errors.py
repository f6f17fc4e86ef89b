"""The package's exceptions: one base class, a subclass per cause.

Every message names the cause and the fix, and none ever contains a passphrase.
Subclasses also derive from the built-in exception a caller would expect
(``ValueError`` for a bad argument, ``RuntimeError`` for a closed session), so
both ``except CitadelSessionError`` and ``except ValueError`` work. No citadeldb
exception reaches a caller: storage/translate.py turns each into one of these.

    CitadelSessionError
    ├── ConfigurationError (ValueError)        the settings: every problem, each with its fix
    ├── EmptyPassphraseError (ValueError)      an empty passphrase, refused before any file is touched
    ├── WrongPassphraseError                   the passphrase does not open the file (or a damaged key file)
    ├── DatabaseLockedError                    another process holds the file (names it)
    ├── DatabaseNotFoundError (FileNotFoundError)  no file where expected, or a companion file missing
    ├── CorruptDatabaseError                   damage found; nothing was changed (restore from a backup)
    ├── StorageError                           Citadel failed in a way none of the above describes
    ├── ForkedStoreError (RuntimeError)        a store used in a process forked from its owner
    ├── SessionClosedError (RuntimeError)      a closed store or session was used
    ├── InvalidItemError (TypeError, ValueError)  an item that is not JSON; nothing was written
    ├── EmbedderError (RuntimeError)           the embedder failed
    ├── EmbedderMismatchError (ValueError)     the file's vectors come from another model
    ├── SessionNotFoundError (LookupError)     an operator command named a session that holds nothing
    ├── SessionNotEmptyError (ValueError)      an import into a session that holds other items
    ├── MoveConflictError (ValueError)         a move whose target holds other items, or whose session changed
    ├── BranchError (ValueError)               a branch or turn that is not there, or a branch name used before
    ├── ImportSourceError (ValueError)         an import's source cannot be read as a session file
    │   └── OriginalSourceError                a Citadel file given to import_file: import_original reads it
    ├── OriginalLayoutError                    a whole file of citadeldb-openai-agents 2.x: import it
    ├── ReplacedApiError (TypeError)           a 2.x call that works otherwise here (names the replacement)
    ├── WrongShardError (LookupError)          the session belongs to another shard (names it)
    │   └── ShardMovingError                   it is moving to another shard: retry shortly
    ├── BackupExistsError (FileExistsError)    a backup would overwrite a file
    └── ExportExistsError (FileExistsError)    an export would overwrite a file; nothing was written

    ConfigurationWarning (UserWarning)         a configuration that works but is risky
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .results import LockHolder


class CitadelSessionError(Exception):
    """Base class of every error this package raises on purpose."""


class EmptyPassphraseError(CitadelSessionError, ValueError):
    """The passphrase is empty; Citadel would accept it, we refuse it."""


# How the calls that take the passphrase as `key` name it as its source (see WrongPassphraseError).
KEY_ARGUMENT = "the key= argument"


class WrongPassphraseError(CitadelSessionError):
    """The passphrase does not open the file (or differs from the one it is open with).

    The message is the `cause`, then what to check: the passphrase, named by where it came
    from (`source`: "the key= argument", "the environment variable CITADEL_KEY", "the key file
    /etc/app/key, named by ...") and followed by `check`, the rest of the fix. Code that meets
    the failure knows the cause and the fix; the public call that took the passphrase knows its
    source and adds it (`came_from`), so a new source only has to describe itself. `hint` says
    more about that source (how a key file was read). None of them ever holds the passphrase.
    """

    def __init__(
        self, cause: str, check: str | None = None, source: str | None = None, hint: str = ""
    ) -> None:
        self.cause, self.check, self.source, self.hint = cause, check, source, hint
        came = "" if source is None else f" (it came from {source})"
        if check is not None:
            told = f"{cause} Check the passphrase{came}{check}"
        else:  # a message with no place for the source (one rebuilt from another process's)
            told = cause if source is None else f"{cause} The passphrase came from {source}."
        super().__init__(f"{told} {hint}" if hint else told)

    def came_from(self, source: str, hint: str = "") -> WrongPassphraseError:
        """This error told for a passphrase that came from `source`: a new one, with no traceback."""
        return WrongPassphraseError(self.cause, self.check, source, hint)

    def __reduce__(self) -> tuple[type[WrongPassphraseError], tuple[str, str | None, str | None, str]]:
        return (type(self), (self.cause, self.check, self.source, self.hint))


class DatabaseLockedError(CitadelSessionError):
    """Another process holds the Citadel file.

    `holder` is that process (its PID and shortened command line), or None where it
    cannot be known (not Linux, or its lock is not visible from here).
    """

    def __init__(self, message: str, *, holder: LockHolder | None = None) -> None:
        super().__init__(message)
        self.holder = holder


class DatabaseNotFoundError(CitadelSessionError, FileNotFoundError):
    """The file's directory (or a companion file Citadel needs) does not exist.

    `creation_refused` is True when the file itself does not exist and the caller
    forbade creating it (``create=False``).
    """

    def __init__(self, message: str, *, creation_refused: bool = False) -> None:
        super().__init__(message)
        self.creation_refused = creation_refused


# What a damaged or unreadable file's message advises, except where `verify` itself is running.
RUN_VERIFY = (
    "Run `python -m citadeldb_openai_agents verify` for a report, and restore the file and its "
    "companion files from a backup."
)
# Where users of the original package (citadeldb-openai-agents 2.x) read how to come over.
MIGRATION_PAGE = "docs/migrating.md, 'Coming from citadeldb-openai-agents 2.x'"
# Damage the open-time audit counted per session: `repair` can keep everything else.
RUN_VERIFY_OR_REPAIR = RUN_VERIFY[:-1] + ", or run `repair --yes` to keep every item that can still be read."


class _Advised(CitadelSessionError):
    """An error whose message is its `cause`, then `advice`: what to do about it.

    The advice depends on who meets the error: a store's call advises running `verify`, and
    `verify` itself, meeting the same damage, tells the same cause with other advice (`advising`)
    instead of advising the user to run what they are running.
    """

    def __init__(self, cause: str, advice: str = "") -> None:
        self.cause, self.advice = cause, advice
        super().__init__(f"{cause} {advice}" if advice else cause)

    def advising(self, advice: str) -> _Advised:
        """The same cause, with `advice`: a new error of this type, with no traceback."""
        return type(self)(self.cause, advice)

    def __reduce__(self) -> tuple[type[_Advised], tuple[str, str]]:
        return (type(self), (self.cause, self.advice))


class CorruptDatabaseError(_Advised):
    """Citadel found damage in the file; `cause` names it, `advice` says what to do."""


class StorageError(_Advised):
    """Citadel failed in a way no other error here describes; the message names the file and what to do."""


class EmbedderMismatchError(CitadelSessionError, ValueError):
    """The file's items were embedded with another model than the one configured."""


class EmbedderError(CitadelSessionError, RuntimeError):
    """The embedder raised while embedding items or a query; nothing was written."""


class InvalidItemError(CitadelSessionError, TypeError, ValueError):
    """An item in an ``add_items`` batch cannot be stored as JSON; nothing was written."""


class SessionClosedError(CitadelSessionError, RuntimeError):
    """An operation was attempted on a closed session or store."""


class ForkedStoreError(CitadelSessionError, RuntimeError):
    """A store (or a session of it) was used in a process forked from the one that opened it.

    Also raised by opening a store, in such a process, on a file its parent held open
    when it forked. `path` is the file, `owner_pid` the process that opened it.
    """

    def __init__(self, message: str, path: str, owner_pid: int) -> None:
        super().__init__(message)
        self.path = path
        self.owner_pid = owner_pid

    def __reduce__(self) -> tuple[type[ForkedStoreError], tuple[str, str, int]]:
        # multiprocessing pickles a worker's exception back to the parent; the default
        # (the class called with `args` alone) would fail for want of path and owner_pid.
        return (type(self), (str(self), self.path, self.owner_pid))


class SessionNotFoundError(CitadelSessionError, LookupError):
    """An operator command named a session that holds no live item."""


class InvalidOwnerError(CitadelSessionError, ValueError):
    """An owner (the person a session is about) that cannot be stored: empty, over 256 bytes of
    UTF-8, or holding a lone surrogate. The message names where the value came from."""


class InvalidLabelsError(CitadelSessionError, ValueError):
    """A session's labels that are not a small JSON object of short keys and scalar values."""


class OwnerMismatchError(CitadelSessionError, ValueError):
    """A session was given another owner than the one its file records; nothing was read or
    written. Changing a session's owner is explicit: `store.set_owner` or `owner set`."""


class OwnerNotFoundError(CitadelSessionError, LookupError):
    """A privacy request named an owner the file holds no session of, and never erased."""


class SessionNotEmptyError(CitadelSessionError, ValueError):
    """An import into a session that holds items other than this import's; nothing was written."""


class MoveConflictError(CitadelSessionError, ValueError):
    """A move that would mix or lose items: the target holds other items under the session's id,
    or the session changed while it was moved. Nothing was erased: the source still holds it."""


class BranchError(CitadelSessionError, ValueError):
    """A branch or turn that does not exist, a branch name used before, or a branch that cannot go
    (main, the current one); the words are `AdvancedSQLiteSession`'s, and so is the ValueError."""


class ImportSourceError(CitadelSessionError, ValueError):
    """An import's source is not a session file this package reads (or is damaged)."""


class OriginalSourceError(ImportSourceError):
    """`import_file` was given a Citadel file: one of citadeldb-openai-agents 2.x is imported with
    `import_original`, which takes its passphrase."""


class ReplacedApiError(CitadelSessionError, TypeError):
    """A call of citadeldb-openai-agents 2.x that works otherwise here: the message names what
    replaces it and the migration page."""


class OriginalLayoutError(CitadelSessionError):
    """The file was written by the original package, citadeldb-openai-agents 2.x: it is whole,
    and its sessions come over with `import_original` (`python -m citadeldb_openai_agents import`).
    `regions` maps each region in that layout to its unexpired items."""

    def __init__(self, message: str, regions: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.regions = dict(regions or {})

    def __reduce__(self) -> tuple[type[OriginalLayoutError], tuple[str, dict[str, int]]]:
        return (type(self), (str(self), self.regions))


class BackupExistsError(CitadelSessionError, FileExistsError):
    """A backup's destination (or one of its companion files) already exists."""


class ExportExistsError(CitadelSessionError, FileExistsError):
    """An export's destination file (or one of them) already exists; nothing was written."""


class LedgerError(CitadelSessionError):
    """The erasure ledger cannot be written (the erasure was refused) or cannot be trusted
    (a line changed or missing: a restore stops before it writes anything)."""


class WrongShardError(CitadelSessionError, LookupError):
    """The session belongs to another shard of the fleet (`owner`); nothing was read or written.

    Raised by a store whose settings name the fleet's `shards` and this process's `shard`,
    for every operation on a session `shard_for` places elsewhere.
    """

    def __init__(self, message: str, *, session_id: str, owner: str, shard: str) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.owner = owner
        self.shard = shard


class ShardMovingError(WrongShardError):
    """The session is moving from shard `source` to `owner` (a ring change): refused until it has
    moved, then `owner` serves it. Nothing was read or written; retry shortly."""

    def __init__(self, message: str, *, session_id: str, owner: str, shard: str, source: str) -> None:
        super().__init__(message, session_id=session_id, owner=owner, shard=shard)
        self.source = source


class ConfigurationError(CitadelSessionError, ValueError):
    """The configuration is not usable. `problems` lists every problem found, each with its fix.

    `config_file` is the TOML file that was read, when there was one.
    """

    def __init__(self, problems: Sequence[str] | str, *, config_file: Path | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.config_file = config_file
        if len(self.problems) == 1:
            message = f"the configuration is not usable: {self.problems[0]}"
        else:
            listed = "\n".join(f"  - {problem}" for problem in self.problems)
            message = f"the configuration is not usable ({len(self.problems)} problems):\n{listed}"
        super().__init__(message)


class ConfigurationWarning(UserWarning):
    """A configuration that works but is risky (e.g. a key file others can read)."""
