"""The README's first command: the demo runs with no API key and tells the truth, as the README
and docs/index.md show it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo() -> str:
    """What the demo prints, run once as the README runs it: no API key, no CITADEL_* variable,
    socket keys at full cost (tests/conftest.py lowers it for every other test's processes)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OPENAI_API_KEY", "TESTS_SOCKET_KDF") and not k.startswith("CITADEL_")
    }
    done = subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", "demo"],
        capture_output=True,
        text=True,
        # 85 s under load (benchmarks/suite_under_load.py, 2026-12-08), at the full socket-key cost: 10x that.
        timeout=900,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_remembers_across_processes_then_forgets(demo: str) -> None:
    out = demo
    ask, after = out.split("[process 2")[1], out.split("[process 4")[1]
    assert "history fed to the model: 3 item(s)" in ask
    assert "assistant: Your dog is called Mochi." in ask
    assert "readback confirmed: True" in out
    assert "assistant: I don't know your dog's name." in after
    assert "Files on disk containing the word 'Mochi': none" in out
    tool = out.split("[process 5")[1]
    assert "history fed to the model: 7 item(s)" in tool
    assert "- #5, user: My locker code is 4711." in tool
    assert "assistant: Your locker code is 4711." in tool
    assert "Files on disk containing the word 'locker': none" in out


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_readme_shows_the_demos_output_as_it_prints_it(demo: str, page: str) -> None:
    """The README and the site's front page show the whole output, the temporary path aside."""
    after_the_command = (ROOT / page).read_text().split("$ python -m citadeldb_openai_agents demo\n", 1)[1]
    shown = after_the_command.split("```", 1)[0]

    def without_the_file(text: str) -> list[str]:  # the demo's file is in a new temporary directory
        return [
            re.sub(r"^Encrypted session file: .*", "Encrypted session file: *", line)
            for line in text.splitlines()
        ]

    assert without_the_file(shown) == without_the_file(demo)
