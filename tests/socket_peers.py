"""Peers of an owner's socket that are not a store: a well-behaved one, for tests that speak the protocol."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from citadeldb_openai_agents.serving.address import Secret, SocketKey, socket_path
from citadeldb_openai_agents.serving.channel import Channel
from citadeldb_openai_agents.serving.handshake import client_side, peer_process


def authenticated_peer(db_path: Path, key: str, socket_key: SocketKey | None = None) -> Channel:
    """A peer that knows the passphrase, proves it and says hello, as a client of this package does.

    `socket_key` (the file's, from `key`) spares the derivation (~0.5 s) to a test opening many.
    Its handshake took 0.09 s at most, the owner's welcome 0.012 s, under load
    (benchmarks/suite_under_load.py --runs 3 --command -- python -m pytest -q -s
    tests/test_sealed_frames.py tests/test_serving.py, 2026-12-08): each is due in 10 s, 100x+.
    """
    path = str(db_path.resolve())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path(path))
    channel = Channel(sock)
    peer = peer_process(sock)
    assert peer is not None
    client_side(channel, socket_key or SocketKey(Secret(key.encode()), path), peer[0], time.monotonic() + 10)
    channel.send(
        [
            "hello",
            {
                "pid": os.getpid(),
                "program": "test",
                "terms": {
                    "ttl": None,
                    "sync_mode": "full",
                    "erasure_ledger": None,
                    "ledger_mirror": None,
                    "ttl_mode": "item",
                    "idle_ttl": None,
                    "argon2_profile": None,
                    "cache_size": 16384,
                    "socket_dir": None,
                },
                "identity": ["any", 1, "cosine"],
            },
        ]
    )
    assert channel.receive(time.monotonic() + 10)[0] == "welcome"
    return channel
