"""Shared fixtures: a scratch directory per test and stores on it."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from citadeldb_openai_agents import CitadelSessionStore
from citadeldb_openai_agents.storage.memory_handle import MemoryHandle

KEY = "correct horse battery staple"

# Socket keys at a low scrypt cost in this process and every process a test starts
# (tests/fast_socket_kdf/sitecustomize.py says why; the cost tests and the demo pay the full one).
FAST_SOCKET_KDF = Path(__file__).resolve().parent / "fast_socket_kdf"
os.environ["TESTS_SOCKET_KDF"] = "fast"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAST_SOCKET_KDF), os.environ.get("PYTHONPATH")]))
_fast = importlib.util.spec_from_file_location("fast_socket_kdf", FAST_SOCKET_KDF / "sitecustomize.py")
assert _fast is not None and _fast.loader is not None
_fast.loader.exec_module(importlib.util.module_from_spec(_fast))  # installs it here, as site does in children


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers per core (at most 8). Most of the suite's time is spent waiting on the
    processes it starts (servers coming up, owners handing over, kill loops), not on a core: on the
    2-core machine the suite took 298 s with one worker per core and 225 s with two
    (docs/performance.md, "The test suite's own timing")."""
    return max(2, min(2 * (os.cpu_count() or 1), 8))


@pytest.fixture
def clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No CITADEL_* variable and no ./citadel.toml leak in from the machine running the tests."""
    for name in list(os.environ):
        if name.upper().startswith("CITADEL_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def full_cost_socket_kdf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Socket keys at the cost a deployment pays, here and in the processes this test starts."""
    monkeypatch.setattr(hashlib, "scrypt", getattr(hashlib.scrypt, "full_cost", hashlib.scrypt))
    monkeypatch.delenv("TESTS_SOCKET_KDF")


@pytest.fixture
def key() -> str:
    return KEY


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "agent.cdl"


@pytest.fixture
def make_store(db_path: Path) -> Iterator[Callable[..., CitadelSessionStore]]:
    """Open stores on the test's file (the fast "iot" KDF); all are closed afterwards."""
    opened: list[CitadelSessionStore] = []

    def make(path: Path | None = None, **kwargs: Any) -> CitadelSessionStore:
        kwargs.setdefault("argon2_profile", "iot")
        store = CitadelSessionStore(path or db_path, kwargs.pop("key", KEY), **kwargs)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., CitadelSessionStore]) -> CitadelSessionStore:
    return make_store()


@dataclass(frozen=True)
class ForgedAttestation:
    """A verdict as Citadel's `AtomAttestation` gives it (Citadel's own cannot be built)."""

    atom_id: int
    verdict: str


@pytest.fixture
def readback_still_finds(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """A fault at the engine boundary: Citadel's `verify` calls these atoms ``authentic``
    even after they were erased, as if their keys had survived.

    Every operation reaches Citadel through the open file's `MemoryHandle`; its `verify`
    is replaced, for stores already open and those opened later (the CLI's own) alike.
    Call the fixture with the atom ids the readback should still find.
    """
    still_there: set[int] = set()

    def verify(handle: MemoryHandle, region: str, ids: list[int]) -> list[Any]:
        return [
            ForgedAttestation(found.atom_id, "authentic")
            if found.atom_id in still_there and found.verdict == "missing"
            else found
            for found in handle.__getattr__("verify")(region, ids)  # Citadel's own verify
        ]

    monkeypatch.setattr(MemoryHandle, "verify", verify, raising=False)

    def still_finds(*atom_ids: int) -> None:
        still_there.update(atom_ids)

    return still_finds


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a snippet in a fresh interpreter (another process owns nothing of ours)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
