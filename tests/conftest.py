"""Shared fixtures: a scratch directory per test and stores on it."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from citadeldb_openai_agents import CitadelSessionStore
from citadeldb_openai_agents.config import forget_taken_variables
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
    """No CITADEL_* variable, no systemd credentials directory and no ./citadel.toml leak in from
    the machine running the tests, nor a passphrase variable an earlier test's settings took."""
    forget_taken_variables()
    for name in list(os.environ):
        if name.upper().startswith("CITADEL_") or name == "CREDENTIALS_DIRECTORY":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def no_passphrase_kept_between_tests() -> Iterator[None]:
    """The settings take CITADEL_KEY out of os.environ and keep it (config/taken.py): what one test
    set must not configure the next one, whose monkeypatch no longer sets it."""
    yield
    forget_taken_variables()


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


@dataclass(frozen=True)
class Nobody:
    """How to run Python as `nobody` (another user than the tests'): its account, a system Python
    it may run, and an environment that finds this checkout's packages."""

    user: Any  # pwd.struct_passwd
    python: str
    env: dict[str, str]

    def run(self, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, "-c", textwrap.dedent(code), *args],
            env=self.env,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture
def nobody() -> Nobody:
    """Python as `nobody`, skipped with the reason where that cannot be (not root, no such Python)."""
    import pwd  # POSIX only, as the tests that use it

    import citadeldb

    import citadeldb_openai_agents

    if os.getuid() != 0:
        pytest.skip("needs root to run a process as nobody")
    user = pwd.getpwnam("nobody")
    python = shutil.which("python3.11", path="/usr/bin:/usr/local/bin")
    packages = Path(citadeldb.__file__).resolve().parent.parent
    source = Path(citadeldb_openai_agents.__file__).resolve().parent.parent
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(FAST_SOCKET_KDF), str(source), str(packages)]),
        "TESTS_SOCKET_KDF": "fast",
    }
    runs = [python, "-c", "import citadeldb, citadeldb_openai_agents"] if python else None
    if runs is None or subprocess.run(runs, env=env, user=user.pw_uid, group=user.pw_gid).returncode != 0:
        pytest.skip("no Python 3.11 that nobody can run with this venv's packages (they must be readable)")
    return Nobody(user, python or "", env)
