"""Every ```python block of README.md and docs/*.md runs as written, or says why it cannot here.

A block is a complete file a user can save and run: its imports included, async code under
`asyncio.run(main())` (no top-level `await`), no `...` standing for code. Where it needs a
model, its agent is given the SDK's scripted one (`agents.testing.ScriptedModel`), so it runs
offline. A block that cannot run offline says why in an HTML comment, which neither mkdocs nor
GitHub renders, on the nearest non-blank line above its fence:

    <!-- snippet: needs-openai-key -->         it calls OpenAI (an agent with the default model)
    <!-- snippet: needs-extra embeddings -->   it needs the `embeddings` extra and its model
    <!-- snippet: needs openai-agents>=0.24 --> it needs an SDK newer than the lowest we support

The last runs as written where the installed SDK is that version or newer (CI's run on the
lowest versions has 0.21), and is checked as a marked block elsewhere. A marked block is compiled, and every module and name it imports is imported, so a renamed or
removed API fails here too; nothing else of it runs. Every other block runs in this process (a
new interpreter per block would cost two seconds of imports each), as `__main__`, in a fresh
temporary working directory, with no OPENAI_API_KEY, no network (`getaddrinfo` refuses) and, of
the CITADEL_* variables, only `CITADEL_KEY` and `CITADEL_PATH` (absolute, in that directory)
set, as the configuration pages assume an operator does for `from_config()`. A plain or
```text fence right after a runnable block (nothing but blank lines between) is its output:
the block must print exactly that. Stores and sessions the block leaves in its namespace are
closed after it, and no file it opened may stay open. One test per block, its id the page and
the line of its fence (`README.md:26`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
import re
import socket
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from agents import set_tracing_disabled
from packaging.version import Version

from citadeldb_openai_agents import CitadelSession, CitadelSessionStore
from citadeldb_openai_agents.storage import registry

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
MARK = re.compile(r"^<!-- snippet: (.*?) -->$")
KINDS = {"needs-openai-key", "needs-extra embeddings"}
NEEDS_SDK = "needs openai-agents>="
PYTHON = {"python", "py", "python3", "pycon"}

set_tracing_disabled(True)  # as the blocks that run an agent do: no traces to export offline


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # the line of its opening fence, from 1
    code: str
    kind: str  # "runs", or the mark's kind
    output: str | None  # what it prints, when the page shows it right after
    needs_sdk: str | None = None  # the lowest openai-agents it runs on, when not the lowest we support

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def fences(lines: list[str]) -> list[tuple[int, int, str]]:
    """Each fenced block of a page: the line index of its opening and closing fence, its language."""
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening:
            end = next(
                (i for i in range(index + 1, len(lines)) if lines[i].strip() == opening.group(1)),
                len(lines),
            )
            found.append((index, end, opening.group(2)))
            index = end
        index += 1
    return found


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found = []
    every = fences(lines)
    for position, (start, end, language) in enumerate(every):
        if language not in PYTHON:
            continue
        assert language == "python", f"{page.name}:{start + 1}: write ```python, not ```{language}"
        above = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        mark = MARK.match(above.strip())
        kind = mark.group(1) if mark else "runs"
        needs_sdk = kind.removeprefix(NEEDS_SDK) if kind.startswith(NEEDS_SDK) else None
        kind = "runs" if needs_sdk else kind
        assert kind == "runs" or kind in KINDS, f"{page.name}:{start + 1}: unknown mark {above!r}"
        output = None
        if position + 1 < len(every):
            next_start, next_end, next_language = every[position + 1]
            between = lines[end + 1 : next_start]
            if next_language in ("", "text") and not any(line.strip() for line in between):
                output = "".join(line + "\n" for line in lines[next_start + 1 : next_end])
        # Padded with blank lines: a traceback's line numbers are the page's.
        code = "\n" * (start + 1) + "\n".join(lines[start + 1 : end]) + "\n"
        found.append(Block(str(page.relative_to(ROOT)), start + 1, code, kind, output, needs_sdk))
    return found


BLOCKS = [block for page in PAGES for block in blocks(page)]


def test_marks_sit_only_above_python_blocks() -> None:
    marked = {(block.page, block.line) for block in BLOCKS if block.kind != "runs" or block.needs_sdk}
    stray = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        starts = {start for start, _, language in fences(lines) if language == "python"}
        for number, line in enumerate(lines):
            if "<!-- snippet" in line:
                below = next((i for i in range(number + 1, len(lines)) if lines[i].strip()), None)
                if below not in starts or (str(page.relative_to(ROOT)), below + 1) not in marked:
                    stray.append(f"{page.name}:{number + 1}: {line.strip()}")
    assert not stray, f"marks not right above a ```python fence: {stray}"


def imported_names(tree: ast.Module) -> list[tuple[str, str | None]]:
    """(module, name) for each `from module import name`, (module, None) for each `import module`."""
    names: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "a block cannot import relatively"
            names += [(node.module, alias.name) for alias in node.names]
    return names


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind != "runs"], ids=lambda b: b.id)
def test_a_marked_block_compiles_and_its_imports_resolve(block: Block) -> None:
    assert block.output is None, "a block that does not run here cannot show what it prints"
    compiles_and_imports(block)


def compiles_and_imports(block: Block) -> None:
    tree = ast.parse(block.code, block.id)
    compile(tree, block.id, "exec")
    names = imported_names(tree)
    assert names, "a block is a complete file: it imports what it uses"
    for module_name, name in names:
        module = importlib.import_module(module_name)
        if name is not None and not hasattr(module, name):
            try:
                importlib.import_module(f"{module_name}.{name}")  # a submodule
            except ModuleNotFoundError as missing:
                if missing.name != f"{module_name}.{name}":
                    raise
                pytest.fail(f"{block.id}: cannot import {name} from {module_name}")


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory, CITADEL_KEY and CITADEL_PATH the only CITADEL_* variables, no API key,
    no network."""
    for name in list(os.environ):
        if name.upper().startswith("CITADEL_") or name == "OPENAI_API_KEY":
            monkeypatch.delenv(name)
    monkeypatch.setenv("CITADEL_KEY", "a passphrase an operator set")
    monkeypatch.setenv("CITADEL_PATH", str(tmp_path / "agent_sessions.cdl"))  # absolute: no warning
    monkeypatch.chdir(tmp_path)

    def no_network(*args: object, **kwargs: object) -> None:
        raise OSError("snippets run offline: no network")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    return tmp_path


def close_what_it_left_open(namespace: dict[str, object], directory: Path) -> list[str]:
    """Close the stores and sessions left in the block's namespace; the files still open after."""
    for value in namespace.values():
        if isinstance(value, (CitadelSessionStore, CitadelSession)):
            value.close()
    still_open = [path for path in list(registry._registry) if Path(path).is_relative_to(directory.resolve())]
    for path in still_open:  # unreachable stores: let go of the file so later tests can open theirs
        while path in registry._registry:
            registry.release(registry._registry[path])
    return still_open


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "runs"], ids=lambda b: b.id)
def test_a_block_runs_as_written(block: Block, offline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if block.needs_sdk and Version(importlib.metadata.version("openai-agents")) < Version(block.needs_sdk):
        compiles_and_imports(block)  # what can be checked of it on this older SDK
        return
    module = types.ModuleType("__main__")
    module.__file__ = str(offline / Path(block.page).name.replace(".md", f"_{block.line}.py"))
    main = sys.modules["__main__"]
    sys.modules["__main__"] = module  # as runpy does: what the block defines lives in its own module
    try:
        exec(compile(block.code, block.id, "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = main
        still_open = close_what_it_left_open(module.__dict__, offline)
    assert not still_open, f"the block leaves {still_open} open: close its stores (`with`)"
    if block.output is not None:
        assert capsys.readouterr().out == block.output
