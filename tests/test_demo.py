"""The README's first command: the demo runs with no API key and tells the truth."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_remembers_across_processes_then_forgets() -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY",) and not k.startswith("CITADEL_")
    }
    done = subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
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
