"""What crosses the owner's socket, after `multiprocessing.connection`'s HMAC handshake.

Every message is a tuple, pickled by `multiprocessing.connection` (nothing from a peer
is unpickled before that peer has proved it knows the passphrase):

* client -> owner, once: ``("hello", VERSION, ClientHello)``; the owner answers
  ``("welcome", OwnerHello)``;
* client -> owner, per call: ``(operation, args, reporting)``; the owner answers with
  any number of ``("progress", done, total)`` (only when `reporting`), then
  ``("ok", value)`` or ``("error", exception)``.
  A pop or a clear first says what it is about to erase, ``("noted", value)``, so a
  client that loses the owner mid-call knows how to finish it (serving/shared.py).

Items cross as their JSON text, as the store hands them to storage. Exceptions cross
pickled: the client raises the very exception the owner's store raised.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from ..embedders.protocol import EmbedderIdentity
from ..errors import StorageError

VERSION = 4  # 2: pop and clear in one round trip, with a note; 3: progress on request; 4: sync mode


def wire_identity(embedder: EmbedderIdentity) -> tuple[str, int, str]:
    """An embedder's identity as the hellos carry it: model id, dimension, metric."""
    return (embedder.model_id, embedder.dim, embedder.metric)


@dataclass(frozen=True)
class Terms:
    """A store's settings that every process on one file must share, besides its embedder.

    The owner's apply to every call it serves: the TTL of what it writes, and the sync
    mode, which Citadel applies at each open (not once per file), so a client's would
    otherwise be silently replaced by the owner's, and by the next owner's after a handover.
    """

    ttl: float | None
    sync_mode: str


@dataclass(frozen=True)
class ClientHello:
    """Who is asking, and the settings fixed per file that must agree with the owner's."""

    pid: int
    program: str
    terms: Terms
    identity: tuple[str, int, str]  # the embedder: model id, dimension, metric


@dataclass(frozen=True)
class OwnerHello:
    """The owner's side of the handshake."""

    pid: int
    path: str
    terms: Terms
    identity: tuple[str, int, str]


# The operations a client may ask for, and whether one may be sent again after the owner
# died without answering: reads may; writes are made safe to resend (see client.py).
OPERATIONS = {
    "append": True,  # carries a batch id the owner checks before writing again
    "newest": True,
    "all_items": True,
    "search_placed": True,
    "pop": True,  # sent again only if the owner died before it noted the item it pops
    "clear": True,  # likewise, before it noted the newest item
    "pop_if_newest": True,  # names the atom noted: popping it again finds it gone
    "clear_through": True,  # names the newest atom noted: erasing again finds them gone
    "newest_rows": True,
    "oldest_rows": True,
    "replace_suffix": True,  # carries a batch id, like append
    "erase": False,  # its receipt is lost with the owner; the operator reruns it
    "summary": True,
    "session_ids": True,
    "summaries": True,
    "purge_expired": True,
    "verify": True,
    "backup": False,  # a second attempt would find the first one's files
}


# The operations that note what they are about to erase (see above).
NOTING = ("pop", "clear")

# The operations that report their progress on the whole file.
REPORTING = ("verify", "purge_expired", "summaries", "backup", "all_items")


def disagreements(owner: OwnerHello, mine: ClientHello) -> list[str]:
    """The settings fixed per file on which a client differs from its owner, each with both values."""
    problems = []
    if owner.terms.ttl != mine.terms.ttl:
        problems.append(
            f"ttl: this process has {_ttl(mine.terms.ttl)}, the owner has {_ttl(owner.terms.ttl)}"
        )
    if tuple(owner.identity) != tuple(mine.identity):
        problems.append(
            f"embedder: this process has {_identity(mine.identity)}, the owner has {_identity(owner.identity)}"
        )
    if owner.terms.sync_mode != mine.terms.sync_mode:
        problems.append(
            f"sync_mode: this process has {mine.terms.sync_mode!r}, the owner has {owner.terms.sync_mode!r}"
        )
    return problems


def _ttl(ttl: float | None) -> str:
    return "no ttl (keep forever)" if ttl is None else f"ttl {ttl:g} s"


def _identity(identity: tuple[str, int, str]) -> str:
    model_id, dim, metric = identity
    return f"{model_id!r} (dim {dim}, {metric})"


def portable(exc: BaseException) -> BaseException:
    """`exc`, or a `StorageError` telling it, if it would not survive the trip."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return StorageError(f"{type(exc).__name__}: {exc}")
    return exc
