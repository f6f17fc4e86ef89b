"""The operator commands (``python -m citadeldb_openai_agents``): main.py parses and runs,
commands.py holds one function per command, render.py prints."""

from .main import main

__all__ = ["main"]
