"""A forked child whose serving parent has died stops itself, so that a restart finds the file free.

A child forked from a process that holds a file (gunicorn ``--preload``'s workers, a fork
pool's) holds the file's lock through the copy it inherited, and can never take the file
over: Citadel would join the inherited engine, lock and all. When that parent dies (a
SIGKILLed gunicorn master), every call of the child fails at once with the error that says
so (refusals.parent_gone), but while any such child lives, no restarted server can open the
file. So each one sends itself SIGTERM `GRACE_SECONDS` after its parent exits: a web
server's worker shuts down as on any stop, and the file is free once the last one has gone.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time

from ..storage.process_state import gone

log = logging.getLogger("citadeldb_openai_agents")

GRACE_SECONDS = 3.0  # for calls under way to fail with the error that explains why
_POLL_SECONDS = 0.5  # where a pidfd cannot be had


def watch_parent(parent: int, paths: list[str]) -> None:
    """Start watching `parent` from this forked child (at most one watcher a process)."""
    global _watching
    if _watching == os.getpid():
        return
    _watching = os.getpid()
    threading.Thread(target=_wait, args=(parent, paths), name="citadel-orphan-watch", daemon=True).start()


_watching: int | None = None


def _wait(parent: int, paths: list[str]) -> None:
    _until_gone(parent)
    log.warning(
        "process %s, which served %s to this process (forked from it), has exited; this process "
        "holds the file's lock through the copy it inherited and cannot take the file over, so it "
        "stops itself (SIGTERM) in %g s to let a restarted server have the file",
        parent,
        ", ".join(paths),
        GRACE_SECONDS,
    )
    time.sleep(GRACE_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)


def _until_gone(pid: int) -> None:
    try:
        descriptor = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or already gone
        while not gone(pid):
            time.sleep(_POLL_SECONDS)
        return
    try:
        select.select([descriptor], [], [])  # readable once the process has exited
    finally:
        os.close(descriptor)
