"""CitadelSession: the Agents SDK `Session` protocol over a `CitadelSessionStore`, which makes them.

The store's work on its file is `FileStore`'s (store.py); the public store class is here, beside
the session it makes and that opens it, so neither module imports the other back.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import BranchError, CitadelSessionError, ForkedStoreError, SessionClosedError
from .history import complete_despite_cancellation
from .options import SessionOptions, TtlMode, check_max_items, coerce_session_settings
from .original_api import refuse_region
from .people import check_labels, check_owner, owner_by_pattern
from .results import Erasure, HistoryHit
from .store import FileStore
from .telemetry import given, returned, traced

if TYPE_CHECKING:
    from agents import FunctionTool, RunContextWrapper
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings


module_logger = logging.getLogger("citadeldb_openai_agents")

# Called with the session and the run's context before each history call a run makes.
RunContextHook = Callable[["CitadelSession", "RunContextWrapper[Any]"], None]


class CitadelSession:
    """An Agents SDK session whose history lives encrypted in a Citadel file.

    Either give a file and passphrase (the session opens, or joins, the process's
    store on that file and closes its share on `close`)::

        session = CitadelSession("user-123", "agent.cdl", key=passphrase)

    or mint it from a store: ``store.session("user-123")``.

    The four protocol methods behave as `agents.SQLiteSession`'s do, and the branches, turns
    and usage of `AdvancedSQLiteSession` are here too. Session ids are
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

    As the SDK's: ``session_settings`` may be a dict (unknown keys: `TypeError`); ``logger`` gets its logs.
    """

    def __init__(
        self,
        session_id: str,
        db_path: str | os.PathLike[str] | None = None,
        key: str | None = None,
        *,
        store: CitadelSessionStore | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        embedder: Any | None = None,
        ttl: float | None = None,
        on_run_context: RunContextHook | None = None,
        max_items: int | None = None,
        ttl_mode: TtlMode | None = None,
        idle_ttl: float | None = None,
        owner: str | None = None,
        labels: dict[str, Any] | None = None,
        region: str | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        try:
            refuse_region(region)  # 2.x's argument: raises, naming the way over (original_api.py)
            session_settings = coerce_session_settings(session_settings)
            self._max_items = check_max_items(max_items)
            self.owner = None if owner is None else check_owner(owner, "CitadelSession's owner=")
            self.labels = None if labels is None else check_labels(labels, "CitadelSession's labels=")
            own = SessionOptions.of(ttl_mode=ttl_mode, idle_ttl=idle_ttl)
            if not isinstance(session_id, str):
                raise TypeError(f"session_id must be a str, not {type(session_id).__name__}")
            if store is not None:
                passed = (("db_path", db_path), ("key", key), ("embedder", embedder), ("ttl", ttl))
                given = [name for name, value in passed if value is not None]
                del passed  # it holds the passphrase: error trackers record a failed frame's locals
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
        self.session_id, self._session_settings, self._store = session_id, session_settings, store
        self._logger = logger or module_logger
        own_options = None if own == SessionOptions() else own
        self._history = store._history(session_id, own_options, self.owner, self.labels)
        self._closed, self.on_run_context = False, on_run_context

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
    def session_settings(self, settings: SessionSettings | dict[str, Any] | None) -> None:
        self._session_settings = coerce_session_settings(settings)

    @property
    def store(self) -> CitadelSessionStore:
        """The store this session's items live in."""
        return self._store

    @traced("get_items", counted=returned)
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

    @traced("add_items", counted=given)
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

    @traced("pop_item", counted=lambda args, popped: int(popped is not None))
    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None) -> TResponseInputItem | None:
        """Remove the newest item, erasing its key, and return it (None when empty)."""
        self._check_open(wrapper)
        return await complete_despite_cancellation(asyncio.to_thread(self._history.pop_item))

    @traced("clear_session")
    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Remove every item of this session, erasing their keys."""
        self._check_open(wrapper)
        await complete_despite_cancellation(asyncio.to_thread(self._history.clear))

    @traced("search", counted=returned)
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

    @traced("compaction_snapshot")
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

    @traced("replace_items", counted=given)
    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The SDK's private hook for a manual ``run_compaction()``: every item replaced at once, crash-safe."""
        self._check_open()
        replace = asyncio.to_thread(self._history.replace_all, list(items))
        return await complete_despite_cancellation(replace)

    def search_tool(
        self, name: str = "search_history", limit: int = 5, *, across_owner: bool = False
    ) -> FunctionTool:
        """This session's `search` as an SDK `FunctionTool`, for the agent that uses the session.

        With ``SessionSettings(limit=N)`` the model sees only the newest N items; with this
        tool (``Agent(tools=[session.search_tool()])``) it can look up older ones. The tool
        takes a query and returns text: the `limit` best matches, each with its position in
        the session (1 is the oldest), who said it (role) and its text. It never returns
        another session's items or expired ones.

        ``across_owner=True`` widens it to every session of this session's owner (which it
        must have: `ValueError` otherwise), so that the agent recalls what this person said in
        an earlier conversation; each hit names its conversation. The tool takes only a query:
        no argument names an owner, so a model cannot reach another person's sessions.
        """
        self._check_open()
        from .search_tool import owner_search_tool, search_tool

        if not across_owner:
            return search_tool(self._search_placed, name=name, limit=limit)
        owner = self.owner
        if owner is None:
            raise ValueError(
                f"search_tool(across_owner=True) searches the sessions of this session's owner, and "
                f"session {self.session_id!r} was given none: make it with owner=... (or owner_pattern)"
            )
        store = self._store
        return owner_search_tool(
            lambda query, n: asyncio.to_thread(store.search, query, owner=owner, limit=n),
            name=name,
            limit=limit,
        )

    @traced("search_tool", counted=lambda args, found: len(found[0]))
    async def _search_placed(self, query: str, limit: int) -> tuple[list[HistoryHit], int]:
        """The search tool's hits, with their positions, and how many items the session holds."""
        self._check_open()
        return await asyncio.to_thread(self._history.search_with_positions, query, limit)

    @traced("ping")
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

    # -- AdvancedSQLiteSession's branches, turns and usage (storage/branches.py, storage/usage.py) --

    @property
    def current_branch(self) -> str:
        """The branch `add_items`, `pop_item` and reads without ``branch_id`` use ("main" at first)."""
        return self._history.branch

    @traced("create_branch_from_turn")
    async def create_branch_from_turn(self, turn_number: int, branch_name: str | None = None) -> str:
        """Copy the current branch's items before user turn `turn_number` into a new branch, and
        switch to it; return its name (`branch_name`, never one used before in this session, or
        ``branch_from_turn_<n>_<time>``).

        Raises:
            BranchError: no user message starts that turn, or the name is blank or was used.
        """
        self._check_open()
        return await complete_despite_cancellation(
            asyncio.to_thread(self._history.create_branch, turn_number, branch_name)
        )

    @traced("create_branch_from_content")
    async def create_branch_from_content(self, search_term: str, branch_name: str | None = None) -> str:
        """`create_branch_from_turn` from the first user turn of the current branch holding `search_term`."""
        matching = await self.find_turns_by_content(search_term)
        if not matching:
            raise BranchError(f"No user turns found containing '{search_term}'")
        return await self.create_branch_from_turn(matching[0]["turn"], branch_name)

    @traced("switch_to_branch")
    async def switch_to_branch(self, branch_id: str) -> None:
        """Make `branch_id` the current branch (`BranchError` if it holds no item)."""
        self._check_open()
        await asyncio.to_thread(self._history.switch, branch_id)

    @traced("delete_branch")
    async def delete_branch(self, branch_id: str, force: bool = False) -> Erasure:
        """Erase a branch, keys destroyed, and return the receipt; its name stays used.

        Raises:
            BranchError: it does not exist, is "main", or is the current one without
                ``force=True`` (with it, "main" becomes current first).
        """
        self._check_open()
        return await complete_despite_cancellation(
            asyncio.to_thread(self._history.delete_branch, branch_id, force)
        )

    @traced("list_branches")
    async def list_branches(self) -> list[dict[str, Any]]:
        """Each branch holding items: ``branch_id``, ``message_count``, ``user_turns``,
        ``is_current``, ``created_at`` (UTC, as SQLite writes it), the oldest first."""
        self._check_open()
        return await asyncio.to_thread(self._history.list_branches)

    @traced("get_conversation_turns")
    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        """Each user turn of a branch (None: the current one): ``turn``, ``content`` (cut at 100
        characters), ``full_content``, ``timestamp``, ``can_branch``."""
        self._check_open()
        return await asyncio.to_thread(self._history.conversation_turns, branch_id)

    @traced("find_turns_by_content")
    async def find_turns_by_content(
        self, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The user turns holding `search_term` (ASCII letters in either case), as `get_conversation_turns`."""
        self._check_open()
        return await asyncio.to_thread(self._history.find_turns, search_term, branch_id)

    @traced("get_conversation_by_turns")
    async def get_conversation_by_turns(
        self, branch_id: str | None = None
    ) -> dict[int, list[dict[str, str | None]]]:
        """Each turn's items in order, as ``{"type": ..., "tool_name": ...}`` (turn 0: before any user message)."""
        self._check_open()
        return await asyncio.to_thread(self._history.by_turns, branch_id)

    @traced("get_tool_usage")
    async def get_tool_usage(self, branch_id: str | None = None) -> list[tuple[str | None, int, int]]:
        """(tool name, calls, turn) for each tool called in each turn of a branch, by turn."""
        self._check_open()
        return await asyncio.to_thread(self._history.tool_usage, branch_id)

    @traced("store_run_usage")
    async def store_run_usage(self, result: Any) -> None:
        """Keep a run's usage (``result.context_wrapper.usage``) as the current turn's, encrypted.

        As the SDK's, it never raises: a failure is logged, and the run's result stands.
        """
        try:
            self._check_open()
            usage = result.context_wrapper.usage
            if usage is not None:
                await complete_despite_cancellation(asyncio.to_thread(self._history.store_usage, usage))
        except Exception as exc:
            self._logger.error("failed to store the session's usage: %s", type(exc).__name__)

    @traced("get_session_usage")
    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """Every stored turn's usage added up (``requests``, the token counts, ``total_turns``), of
        one branch or (None) of all; None when none is stored."""
        self._check_open()
        return await asyncio.to_thread(self._history.session_usage, branch_id)

    @traced("get_turn_usage")
    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """One turn's usage with its token details ({} when none), or (None) every turn's, of a
        branch (None: the current one)."""
        self._check_open()
        return await asyncio.to_thread(self._history.turn_usage, user_turn_number, branch_id)

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

    def _telemetry(self) -> tuple[str, str, str | None]:
        """Its store's, for its spans (telemetry/): never the session's id."""
        return self._store._telemetry()

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


class CitadelSessionStore(FileStore):
    """An encrypted Citadel file shared by every session in it, and the sessions it makes.

    What it does on its file is `FileStore`'s (store.py); this class adds `session()`, here
    beside `CitadelSession`, which opens one of these when given a path.

    Args:
        path: The database file (created when missing, unless ``create=False``; its directory
            must exist). A relative path resolves against the working directory. Creating a
            file is logged at INFO (logger ``citadeldb_openai_agents``) with its absolute path.
        key: The passphrase. Kept for the store's life in a private buffer zeroed on close
            (taking the file over from an owner that went means opening it again).
        embedder: Embeds item text for `CitadelSession.search`; default
            ``citadeldb.MockEmbedder(dim=128)`` (no download). Any object with ``dim``, ``metric``,
            ``model_id`` and ``embed_with_cancel`` works; one with ``embed`` / ``embed_queries`` is adapted.
        ttl, ttl_mode: Seconds each item lives after its own write (``ttl_mode="item"``, the
            default), or the whole session after its last write, which every add or pop pushes
            forward (``"session"``); None keeps items forever. Expired items are invisible at once
            and erased (keys destroyed) when their session is next written or by `purge`; an
            expired session when next used, by `purge`, or by the file's owner within a minute.
        idle_ttl: Seconds a session may go without a write before it is erased whole (as a session
            TTL erases it), whatever the mode. None: never for idleness.
        session_settings: Default `SessionSettings` for sessions minted here.
        argon2_profile: Citadel's key-derivation cost for a *new* file ("iot", "desktop",
            "server"); an existing file keeps its own.
        sync_mode: Citadel's durability for writes while this process owns the file: "full"
            (default: each commit flushes the key file and, twice, the pages), "normal" (the pages
            once) or "off" (the key file only: a killed process loses nothing, a power cut may
            lose recent writes). Applied at every open: every process on one file needs the same.
        cache_size: Citadel's page cache in ~8 KiB pages for this process; default
            `DEFAULT_CACHE_PAGES` (16,384: at most ~128 MiB, filled as pages are read).
            Search is fast only while the cache holds the file (docs/performance.md).
        create: False refuses to create a new file (`DatabaseNotFoundError`): a wrong path or
            working directory cannot silently start an empty database.
        serve: True (the default): the process that opens the file first owns it and serves it
            to the other processes that open it, which become its clients with no change to
            their code, and take it over if it goes. False: the file is this process's alone
            (another gets `DatabaseLockedError`); a forked child's store raises `ForkedStoreError`.
        socket_dir: The directory for the socket the owner serves the file on: this user's, mode
            0700 (made so if missing; refused otherwise). None: ``$XDG_RUNTIME_DIR``'s, the home's
            cache, or ``citadeldb-openai-agents-<uid>`` in the temporary directory, the first private
            one found. Every process on one file needs the same.
        adopt: Settings fixed per file (`FIXED_PER_FILE`: ttl, embedder, sync_mode, erasure_ledger)
            taken from the owner when this store is its client, not refused if they differ (`adopted`
            says what was taken; a takeover keeps them). `from_config` adopts those it leaves unset.
        shards, shard: The fleet's shard names and this process's (`shard_for` places each
            session on one): an operation on another shard's session raises `WrongShardError`.
            Or `ring_file` in place of `shards`: a file an operator rewrites to change the ring live.
        erasure_ledger: A file outside the database where the owner records every erasure
            before it starts (`LedgerError` if it cannot), so `restore_backup` erases it again.
            The file keeps the ledger's head: a ledger cut short is refused when read or appended to.
        ledger_mirror: A second copy of the ledger (another volume): every erasure is
            written to both, and refused if either cannot be; a restore reads the longer chain.
        max_items: The most items a session keeps: each `add_items` erases the oldest beyond it,
            as `pop_item` erases (keys destroyed). None: no cap. `session(...)` may give a session
            its own ``max_items``, ``ttl_mode`` and ``idle_ttl``.
        owner_pattern: A regular expression with a group named ``owner`` that finds the person
            in a session id (``^(?P<owner>[^:]+):``): `session(id)` given no ``owner`` takes the
            one it finds, and `apply_owner_pattern` records it for sessions written before.
        region: citadeldb-openai-agents 2.x's region; refused (`ReplacedApiError`) with the command
            that imports a 2.x file's region. Its `items`, `append` and `erase` raise the same way.

    Stores on one file in one process share one open database (another passphrase is refused);
    every process on it needs the same passphrase, TTL rules, embedder, sync mode and ledger, or adopts them.
    """

    def session(
        self,
        session_id: str,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        on_run_context: RunContextHook | None = None,
        max_items: int | None = None,
        ttl_mode: TtlMode | None = None,
        idle_ttl: float | None = None,
        owner: str | None = None,
        labels: dict[str, Any] | None = None,
        logger: logging.Logger | None = None,
    ) -> CitadelSession:
        """A session (created on its first write); `WrongShardError` for another shard's.
        `on_run_context`, and `max_items`, `ttl_mode`, `idle_ttl` in place of the store's, and
        `owner` (the person it is about; given none, the one `owner_pattern` finds in the id),
        `labels`, `session_settings` (a dict too) and `logger`: as `CitadelSession` takes them."""
        self._check_open()
        self._file.check_shard(session_id)
        if owner is not None:
            owner = check_owner(owner, "store.session's owner=")
        elif self.owner_pattern is not None:  # a new session follows the rule when none is given
            owner = owner_by_pattern(self.owner_pattern, session_id)
        settings = self.session_settings if session_settings is None else session_settings
        session = CitadelSession(
            session_id,
            store=self,
            session_settings=settings,
            max_items=max_items,
            ttl_mode=ttl_mode,
            idle_ttl=idle_ttl,
            owner=owner,
            labels=labels,
            logger=logger,
        )
        session.on_run_context = on_run_context
        return session

    def __enter__(self) -> CitadelSessionStore:
        return self
