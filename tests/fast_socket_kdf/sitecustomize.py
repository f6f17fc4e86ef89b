"""The test suite's processes derive socket keys at a low scrypt cost (never a deployment's).

Every process that serves or joins a file derives its socket's key with scrypt at n = 2**17
(serving/address.py, ~0.5 s and 128 MiB: a guess against a recorded handshake must cost more
than one against the file). The suite starts hundreds of such processes, so, as Django's test
settings swap in a fast password hasher, tests/conftest.py puts this directory on PYTHONPATH
and sets TESTS_SOCKET_KDF=fast: each test process, and every process it starts, then derives
socket keys at n = 2**10. Both ends of a socket must agree, so the flag travels in the
environment. The package never reads the flag; the tests that measure the cost, and the demo
(run as the README runs it), derive at full cost.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

SOCKET_SALT_DOMAIN = b"citadeldb-openai-agents/serve/"  # serving/address.py's salt prefix
FAST_N = 2**10


def install() -> None:
    """Replace hashlib.scrypt with one that lowers n for socket keys only (idempotent)."""
    real = getattr(hashlib.scrypt, "full_cost", hashlib.scrypt)

    def scrypt(password: Any, *, salt: bytes, n: int, **cost: Any) -> bytes:
        if bytes(salt).startswith(SOCKET_SALT_DOMAIN):
            n = FAST_N
        return real(password, salt=salt, n=n, **cost)

    scrypt.full_cost = real  # type: ignore[attr-defined]
    hashlib.scrypt = scrypt  # type: ignore[assignment]


if os.environ.get("TESTS_SOCKET_KDF") == "fast":
    install()
