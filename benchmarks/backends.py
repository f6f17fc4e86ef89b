"""The session backends the benchmark compares, behind one small interface.

Each backend opens a file in a directory of its own, hands out session objects
with the SDK's four async protocol methods, and closes the file. Imports are
lazy: a worker process imports only its own backend, and the peer's worker runs
in the peer's virtual environment, where our package is not installed.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from pathlib import Path
from typing import Any

KEY = "benchmark passphrase"
# EncryptedSession's Fernet master key (high-entropy, as its docstring asks), fixed for reproducibility.
FERNET_KEY = "Y2l0YWRlbGRiLW9wZW5haS1hZ2VudHMtYmVuY2htYXI="
# EncryptedSession drops items older than its ttl (default 600 s) on read: keep them all.
FERNET_TTL = 10 * 365 * 86400
EMBEDDER_DIM = 64  # MockEmbedder(dim=64) for every Citadel backend, as for the peer


class Skipped(Exception):
    """The backend cannot run here; the message says why and how to enable it."""


class Backend:
    """Open one file, mint sessions on it, close it."""

    label = ""
    file_name = "sessions"

    def open(self, directory: Path) -> None:
        raise NotImplementedError

    def session(self, session_id: str) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SQLite(Backend):
    label = "SQLiteSession"
    file_name = "sessions.db"

    def __init__(self) -> None:
        from agents import SQLiteSession

        self._cls = SQLiteSession
        self._sessions: list[Any] = []

    def open(self, directory: Path) -> None:
        self._path = directory / self.file_name

    def session(self, session_id: str) -> Any:
        session = self._cls(session_id, self._path)
        self._sessions.append(session)
        return session

    def close(self) -> None:
        for session in self._sessions:
            session.close()
        self._sessions.clear()


class Encrypted(SQLite):
    label = "EncryptedSession"

    def __init__(self) -> None:
        super().__init__()
        try:
            from agents.extensions.memory import EncryptedSession
        except ImportError as exc:
            raise Skipped(
                f"agents.extensions.memory.EncryptedSession needs `cryptography` ({exc}): "
                "pip install cryptography"
            ) from None
        self._wrapper = EncryptedSession

    def session(self, session_id: str) -> Any:
        return self._wrapper(session_id, super().session(session_id), FERNET_KEY, ttl=FERNET_TTL)


class Ours(Backend):
    """CitadelSessionStore(...).session(id), through the public async API."""

    label = "ours"
    file_name = "sessions.cdl"

    def __init__(self) -> None:
        import citadeldb

        from citadeldb_openai_agents import CitadelSessionStore

        self._cls = CitadelSessionStore
        self._embedder = citadeldb.MockEmbedder(dim=EMBEDDER_DIM)
        self._store: Any = None

    def open(self, directory: Path) -> None:
        self._store = self._cls(directory / self.file_name, KEY, embedder=self._embedder)

    def session(self, session_id: str) -> Any:
        return self._store.session(session_id)

    def close(self) -> None:
        self._store.close()
        self._store = None


class OursSync(Ours):
    """Ours without the asyncio.to_thread hop: the store's blocking calls, on this thread."""

    label = "ours (sync)"

    def session(self, session_id: str) -> Any:
        if not hasattr(self._store, "_history"):
            raise Skipped("CitadelSessionStore._history is gone: update backends.OursSync")
        history = self._store._history(session_id, None)  # what CitadelSession's methods run
        return _Direct(
            get_items=_inline(lambda limit=None: history.get_items(limit)),
            add_items=_inline(lambda items: history.add_items(items, None)),
            pop_item=_inline(history.pop_item),
            clear_session=_inline(history.clear),
        )


class Raw(Backend):
    """Raw citadeldb calls in our layout (raw_citadel.py), each in asyncio.to_thread as ours."""

    label = "raw citadeldb"
    file_name = "sessions.cdl"
    threaded = True

    def __init__(self) -> None:
        import citadeldb
        import raw_citadel

        self._raw = raw_citadel
        self._embedder = citadeldb.MockEmbedder(dim=EMBEDDER_DIM)
        self._file: Any = None

    def open(self, directory: Path) -> None:
        self._file = self._raw.RawFile(str(directory / self.file_name), KEY, self._embedder)

    def session(self, session_id: str) -> Any:
        raw = self._file.session(session_id)
        wrap = _threaded if self.threaded else _inline
        return _Direct(
            get_items=wrap(raw.get_items),
            add_items=wrap(raw.add_items),
            pop_item=wrap(raw.pop_item),
            clear_session=wrap(raw.clear_session),
        )

    def close(self) -> None:
        self._file.close()
        self._file = None
        gc.collect()


class RawSync(Raw):
    label = "raw citadeldb (sync)"
    threaded = False


class Peer(Backend):
    """The published citadeldb-openai-agents 2.7.0 (run from its own virtual environment)."""

    label = "peer 2.7.0"
    file_name = "sessions.cdl"

    def __init__(self) -> None:
        from importlib.metadata import version

        import citadeldb

        import citadeldb_openai_agents

        self.version = version("citadeldb-openai-agents")
        if "site-packages" not in (citadeldb_openai_agents.__file__ or ""):
            raise Skipped(f"the peer worker imported {citadeldb_openai_agents.__file__}, not an install")
        self._cls = citadeldb_openai_agents.CitadelSessionStore
        self._embedder = citadeldb.MockEmbedder(dim=EMBEDDER_DIM)
        self._store: Any = None

    def open(self, directory: Path) -> None:
        self._store = self._cls(str(directory / self.file_name), KEY, embedder=self._embedder)

    def session(self, session_id: str) -> Any:
        return self._store.session(session_id)

    def close(self) -> None:
        self._store.close()
        self._store = None
        gc.collect()  # Citadel holds the file lock until every Memory handle is collected


class _Direct:
    """A protocol-shaped object over four callables that return awaitables."""

    def __init__(self, **methods: Any) -> None:
        self.__dict__.update(methods)


def _threaded(function: Any) -> Any:
    @functools.wraps(function)
    async def call(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(function, *args, **kwargs)

    return call


def _inline(function: Any) -> Any:
    @functools.wraps(function)
    async def call(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return call


BACKENDS: dict[str, type[Backend]] = {
    "sqlite": SQLite,
    "encrypted": Encrypted,
    "peer": Peer,
    "raw": Raw,
    "ours": Ours,
    "raw-sync": RawSync,
    "ours-sync": OursSync,
}
