"""CitadelSession: the Agents SDK `Session` protocol over a `CitadelSessionStore`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .branching import Branching
from .errors import CitadelSessionError, ForkedStoreError, SessionClosedError
from .history import complete_despite_cancellation
from .options import TtlMode, check_idle_ttl, check_max_items, check_ttl_mode
from .results import HistoryHit
from .storage.records import Retention
from .store import CitadelSessionStore

if TYPE_CHECKING:
    from agents import FunctionTool, RunContextWrapper
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings


# Called with the session and the run's context before each history call a run makes.
RunContextHook = Callable[["CitadelSession", "RunContextWrapper[Any]"], None]


class CitadelSession(Branching):
    """An Agents SDK session whose history lives encrypted in a Citadel file.

    Either give a file and passphrase (the session opens, or joins, the process's
    store on that file and closes its share on `close`)::

        session = CitadelSession("user-123", "agent.cdl", key=passphrase)

    or mint it from a store: ``store.session("user-123")``.

    The four protocol methods behave as `agents.SQLiteSession`'s do, and the branches, turns
    and usage of `AdvancedSQLiteSession` are here too (branching.py). Session ids are
    arbitrary strings, case-sensitive ("Bob" and "bob" are two sessions).

    The session takes the run's context (the SDK passes its ``RunContextWrapper`` as
    ``wrapper`` to sessions whose four methods accept it): ``on_run_context(session, wrapper)``
    is called before each of them reads or writes anything, so an application can check
    that the run's user or tenant may use this session, and raise to refuse it (the
    exception reaches `Runner.run`; nothing is read or written). Called without a
    context (directly, or by an SDK that passes none), the hook is not called.

    ``max_items`` caps the session: each `add_items` erases the oldest items beyond it
    (keys destroyed, as `pop_item` erases); None takes the store's cap (no cap by default).
    ``ttl_mode`` ("item" or "session") and ``idle_ttl`` (seconds; ``math.inf``: never for
    idleness) replace the store's for this session from its next write on; the file keeps them
    with the session, so every process (and a `purge`) ends it by them. None: the store's.
    """

    def __init__(
        self,
        session_id: str,
        db_path: str | os.PathLike[str] | None = None,
        key: str | None = None,
        *,
        store: CitadelSessionStore | None = None,
        session_settings: SessionSettings | None = None,
        embedder: Any | None = None,
        ttl: float | None = None,
        on_run_context: RunContextHook | None = None,
        max_items: int | None = None,
        ttl_mode: TtlMode | None = None,
        idle_ttl: float | None = None,
    ) -> None:
        try:
            self._max_items = check_max_items(max_items)
            own = Retention(check_ttl_mode(ttl_mode), check_idle_ttl(idle_ttl, never=True))
            if not isinstance(session_id, str):
                raise TypeError(f"session_id must be a str, not {type(session_id).__name__}")
            if store is not None:
                given = [
                    name
                    for name, value in (
                        ("db_path", db_path),
                        ("key", key),
                        ("embedder", embedder),
                        ("ttl", ttl),
                    )
                    if value is not None
                ]
                if given:
                    raise TypeError(
                        f"CitadelSession(store=...) takes its file and settings from the store; "
                        f"do not also pass {', '.join(given)}."
                    )
                self._owns_store = False
            else:
                if db_path is None:
                    raise TypeError("CitadelSession needs either db_path and key, or store=")
                store = CitadelSessionStore(db_path, key, embedder=embedder, ttl=ttl)  # type: ignore[arg-type]
                self._owns_store = True
        finally:
            del key  # error trackers record a failed frame's locals (see database.acquire)
        self.session_id = session_id
        self._session_settings = session_settings
        self._store = store
        self._history = store._history(session_id, None if own == Retention() else own)
        self._closed = False
        self.on_run_context = on_run_context

    @property
    def session_settings(self) -> SessionSettings:
        """The SDK's settings for this session (``limit``); the default one when none was given."""
        # Made on first read: importing the SDK costs a process ~2.5 s, and one that only
        # reads and writes through the store (a cron job, an owner, an export) never needs it.
        if self._session_settings is None:
            from agents.memory import SessionSettings

            self._session_settings = SessionSettings()
        return self._session_settings

    @session_settings.setter
    def session_settings(self, settings: SessionSettings | None) -> None:
        self._session_settings = settings

    @property
    def store(self) -> CitadelSessionStore:
        """The store this session's items live in."""
        return self._store

    async def get_items(
        self,
        limit: int | None = None,
        branch_id: str | None = None,
        *,
        wrapper: RunContextWrapper[Any] | None = None,
    ) -> list[TResponseInputItem]:
        """Return the history, oldest first.

        Args:
            limit: The number of newest items to return (still oldest first). None
                falls back to ``session_settings.limit``, and to every item when that
                is None too; 0 returns ``[]``.
            branch_id: A branch to read (None: the current one, "main" at first).
        """
        self._check_open(wrapper)
        resolved = limit
        if resolved is None and self._session_settings is not None:
            from agents.memory.session_settings import resolve_session_limit

            resolved = resolve_session_limit(None, self._session_settings)
        if resolved == 0:
            return []
        return await asyncio.to_thread(self._history.get_items, resolved, branch_id)

    async def add_items(
        self, items: list[TResponseInputItem], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Append items, atomically: all of the batch is stored or none of it.

        Raises:
            InvalidItemError: an item is not JSON (it names the item's position).
        """
        self._check_open(wrapper)
        if not items:
            return
        batch = list(items)
        await complete_despite_cancellation(asyncio.to_thread(self._history.add_items, batch, self.max_items))

    @property
    def max_items(self) -> int | None:
        """The most items this session keeps: its own cap, else its store's; None: no cap."""
        return self._max_items if self._max_items is not None else self._store.max_items

    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None) -> TResponseInputItem | None:
        """Remove the newest item, erasing its key, and return it (None when empty)."""
        self._check_open(wrapper)
        return await complete_despite_cancellation(asyncio.to_thread(self._history.pop_item))

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Remove every item of this session, erasing their keys."""
        self._check_open(wrapper)
        await complete_despite_cancellation(asyncio.to_thread(self._history.clear))

    async def search(self, query: str, *, limit: int = 5) -> list[TResponseInputItem]:
        """This session's items most relevant to `query`, best first.

        Ranked by the distance of each item's vector (the store's embedder) to the
        query's, with a small bonus for shared words (BM25) and user messages ranked
        a little lower than the answers they asked for; newest first among ties.
        The session's search data is read once and kept in memory, so a search costs
        the same in a file of any size. Never returns another session's items or
        expired ones.
        """
        self._check_open()
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, not {type(query).__name__}")
        if limit <= 0:
            return []
        return await asyncio.to_thread(self._history.search, query, limit)

    async def _get_compaction_snapshot(
        self, limit: Any, *args: Any, prune_prefix: Any = None, **kwargs: Any
    ) -> Any:
        """The SDK's private compaction hook: the newest `limit` items and an atomic ``replace_suffix``.

        `OpenAIResponsesCompactionSession` calls it (openai-agents 0.24) to replace a run's
        items with their compacted form. ``replace_suffix(start, output)`` returns False, and
        changes nothing, when those items changed since; a crash leaves the old items or the
        new ones, never neither and never both; the replaced items' keys are destroyed, as
        `pop_item` destroys them. A call of a shape this version does not know returns None:
        the SDK then uses its fallback (`clear_session` then `add_items`).
        """
        self._check_open()
        unexpected = bool(args or kwargs)
        return await self._history.compaction_snapshot(limit, prune_prefix, unexpected)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The SDK's private hook for a manual ``run_compaction()``: every item replaced at once, crash-safe."""
        self._check_open()
        replace = asyncio.to_thread(self._history.replace_all, list(items))
        return await complete_despite_cancellation(replace)

    def search_tool(self, name: str = "search_history", limit: int = 5) -> FunctionTool:
        """This session's `search` as an SDK `FunctionTool`, for the agent that uses the session.

        With ``SessionSettings(limit=N)`` the model sees only the newest N items; with this
        tool (``Agent(tools=[session.search_tool()])``) it can look up older ones. The tool
        takes a query and returns text: the `limit` best matches, each with its position in
        the session (1 is the oldest), who said it (role) and its text. It never returns
        another session's items or expired ones.
        """
        self._check_open()
        from .search_tool import search_tool

        return search_tool(self._search_placed, name=name, limit=limit)

    async def _search_placed(self, query: str, limit: int) -> tuple[list[HistoryHit], int]:
        """The search tool's hits, with their positions, and how many items the session holds."""
        self._check_open()
        return await asyncio.to_thread(self._history.search_with_positions, query, limit)

    async def ping(self) -> bool:
        """Whether the file answers (here, or through the process that owns it), as the SDK's
        network sessions' ``ping`` says whether their server does.

        Raises:
            SessionClosedError: the session or its store is closed (as theirs raise once closed).
        """
        self._check_open()
        try:
            await asyncio.to_thread(self._store.summary, self.session_id)
        except (SessionClosedError, ForkedStoreError):
            raise
        except CitadelSessionError:
            return False
        return True

    def close(self) -> None:
        """Close this session (and its store when the session opened it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_store:
            self._store.close()

    async def aclose(self) -> None:
        """`close` from a coroutine: closing the store it opened happens in a worker thread."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> CitadelSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> CitadelSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _check_open(self, wrapper: RunContextWrapper[Any] | None = None) -> None:
        # First: in a forked child, closed or not, the answer is the fork and its fix (the
        # call's one fork check).
        self._store._check_process()
        if self._closed:
            raise SessionClosedError("this CitadelSession is closed; create a new one to continue.")
        self._store._check_not_closed()
        if wrapper is not None and self.on_run_context is not None:
            self.on_run_context(self, wrapper)  # may raise: the call then reads and writes nothing

    def __repr__(self) -> str:
        return f"<CitadelSession {self.session_id!r} in {self._store.path!r}>"
