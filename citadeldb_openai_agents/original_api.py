"""The calls of the original package, citadeldb-openai-agents 2.x, that work otherwise here.

Its README's calls work unchanged (`CitadelSession(id, path, key=..., embedder=...)`,
`store.session_ids()`, `session.search(query, limit=...)`). The rest of its 2.7.0 API acted on
Citadel's atoms in one region; each raises `ReplacedApiError`, naming what replaces it and the
migration page, so code written for 2.x stops with the way over instead of an AttributeError.
"""

from __future__ import annotations

from typing import Any, NoReturn

from .errors import MIGRATION_PAGE, ReplacedApiError

IMPORT_COMMAND = "python -m citadeldb_openai_agents import OLD.cdl"


def replaced(call: str, instead: str) -> ReplacedApiError:
    """The error for a 2.x `call`: what to write `instead`, and where the migration is told."""
    return ReplacedApiError(
        f"{call} is citadeldb-openai-agents 2.x's API; here, {instead}. See {MIGRATION_PAGE}."
    )


def refuse_region(region: str | None) -> None:
    """2.x's ``region=``: every session here lives in regions of its own, named by the package."""
    if region is not None:
        raise replaced(
            "region=",
            "sessions live in regions of the package's own, so leave it out. To bring a 2.x file's "
            f"region over, import it into a new file: {IMPORT_COMMAND} --source-region {region}",
        )


class OriginalStoreApi:
    """2.x's store methods that worked on Citadel's atoms: each raises, naming its replacement."""

    def items(self, session_id: str) -> NoReturn:
        """2.x: the session's Citadel hits. Here: `export(session_id)`, the items themselves."""
        raise replaced(
            f"store.items({session_id!r})",
            "store.export(session_id) returns the session's items, oldest first (2.x returned Citadel's "
            "hits, whose .payload['item'] was the item), or await store.session(session_id).get_items()",
        )

    def append(self, session_id: str, items: Any) -> NoReturn:
        """2.x: add items. Here: `session(session_id).add_items(items)` or `import_items`."""
        raise replaced(
            f"store.append({session_id!r}, items)",
            "await store.session(session_id).add_items(items), or "
            "store.import_items(session_id, items, mode='append') outside an event loop",
        )

    def erase(self, ids: Any) -> NoReturn:
        """2.x: forget atoms by id. Here atoms are not exposed: erase sessions, items or people."""
        raise replaced(
            "store.erase(ids)",
            "atoms are not exposed: store.erase_session(session_id) erases a session (with a receipt), "
            "await session.pop_item() its newest item, store.erase_owner(owner) a person's sessions",
        )
