"""A client's side: calls sent to the process that owns the file, over its Unix socket.

Connections are pooled: the store's sessions call from many worker threads at once,
and a connection carries one call at a time. Each new connection proves the
passphrase (`multiprocessing.connection`'s HMAC challenge, both ways) and says hello
with the settings that must agree with the owner's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from typing import Any

from ..errors import CitadelSessionError, WrongPassphraseError
from .protocol import VERSION, ClientHello, OwnerHello

POOL = 16  # idle connections kept per file; more calls at once open more, closed when done


class OwnerGone(Exception):
    """No process serves the file at the address (any more): the caller takes it over, or waits."""


class RemoteOwner:
    """The owner of a file, reached through its socket."""

    def __init__(self, address: str, authkey: bytes, hello: ClientHello, path: str) -> None:
        self._address = address
        self._authkey = authkey
        self._hello = hello
        self._path = path
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        connection, self.owner = self._connect()
        self._idle.append(connection)

    def call(
        self,
        operation: str,
        args: tuple[Any, ...],
        progress: Callable[[int, int], None] | None = None,
        noted: list[Any] | None = None,
    ) -> Any:
        """Run `operation(*args)` in the owner; raise what it raised there, or `OwnerGone`.

        What the owner notes before it erases (a pop's item, a clear's newest atom) is
        appended to `noted` as it arrives, so it is there if the owner dies after.
        """
        connection = self._take()
        try:
            connection.send((operation, args, progress is not None))
            while True:
                reply = connection.recv()
                if reply[0] == "progress":
                    if progress is not None:
                        progress(reply[1], reply[2])
                elif reply[0] == "noted":
                    if noted is not None:
                        noted.append(reply[1])
                else:
                    break
        except (EOFError, OSError) as exc:
            connection.close()
            raise OwnerGone(str(exc)) from None
        self._give_back(connection)
        if reply[0] == "error":
            raise reply[1]
        return reply[1]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            with contextlib.suppress(OSError):
                connection.close()

    def _take(self) -> Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()[0]

    def _give_back(self, connection: Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < POOL:
                self._idle.append(connection)
                return
        connection.close()

    def _connect(self) -> tuple[Connection, OwnerHello]:
        try:
            connection = Client(self._address, family="AF_UNIX", authkey=self._authkey)
        except AuthenticationError:
            raise WrongPassphraseError(
                f"wrong passphrase for {self._path}: the process that holds the file and serves it "
                "does not accept it. Check CITADEL_KEY / CITADEL_KEY_FILE: every process on one file "
                "needs the same passphrase."
            ) from None
        except (OSError, EOFError) as exc:
            raise OwnerGone(str(exc)) from None
        try:
            connection.send(("hello", VERSION, self._hello))
            reply = connection.recv()
        except (OSError, EOFError) as exc:
            connection.close()
            raise OwnerGone(str(exc)) from None
        if reply[0] != "welcome":
            connection.close()
            raise CitadelSessionError(
                f"the process that holds {self._path} refused this one: {reply[1]}. Run the same "
                "version of citadeldb-openai-agents in every process on one file."
            )
        owner: OwnerHello = reply[1]
        return connection, owner
