"""Asking the process that serves a file for an answer, without ever becoming its owner.

`status` must not change who holds a file: a store would take the file over when its owner
stops (handover.py), and open it when no one holds it. `ask_owner` only connects to the
socket, proving the passphrase as any client does (and checking, with the kernel, that the
peer is the lock's holder), and sends one operation; it never opens the file here.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TypeVar

from ..errors import StorageError
from ..options import StoreOptions
from ..storage.files import resolve_path
from ..storage.lockholder import shorten_command
from ..storage.process_state import current_pid
from .address import Secret, SocketKey, socket_path
from .client import RemoteOwner
from .operations import Operation
from .protocol import ClientHello
from .transport import OwnerGone

T = TypeVar("T")


def ask_owner(
    path: str | os.PathLike[str], key: str, options: StoreOptions, operation: Operation[T], *args: Any
) -> T | None:
    """`operation(*args)` as the process that serves the file runs it; None when no process does
    (no socket, or nothing answers there). Raises `WrongPassphraseError` when the owner refuses
    the passphrase, `StorageError` when it stops during the call."""
    resolved = resolve_path(path)
    passphrase = Secret(key.encode("utf-8", "surrogatepass"))
    del key  # error trackers record a failed frame's locals
    socket_key = SocketKey(passphrase, resolved, options.socket_dir)
    try:
        address = socket_path(resolved, options.socket_dir)
        if not os.path.exists(address):
            return None
        program = shorten_command(list(getattr(sys, "orig_argv", sys.argv)) or ["python"])
        # The embedder is not compared by the owner; a client that asks writes nothing with one.
        hello = ClientHello(current_pid(), program, options, ("none", 1, "cosine"))
        try:
            remote = RemoteOwner(address, socket_key, hello, resolved)
        except OwnerGone:
            return None
        try:
            return remote.call(operation, args, None, None)
        except OwnerGone:
            raise StorageError(
                f"the process that serves {resolved} (PID {remote.owner.pid}) stopped during "
                f"{operation.name}: run it again (this process never takes the file over)."
            ) from None
        finally:
            remote.close()
    finally:
        passphrase.wipe()
        socket_key.forget()
