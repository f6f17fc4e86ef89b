"""The package's shape, as the style guide states it: one way data flows, one door to citadeldb.

Read from the source with `ast`, not by importing: an import that only runs in a
rarely taken branch counts as much as any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "citadeldb_openai_agents"
ROOT = PACKAGE.name

# Imports made inside a function, on purpose, each for a reason; any other is a cycle in disguise.
DEFERRED = {
    # The Agents SDK costs seconds to import; the operator CLI never needs a CitadelSession.
    ("citadeldb_openai_agents", "citadeldb_openai_agents.session"),
    ("citadeldb_openai_agents.store", "citadeldb_openai_agents.session"),
    ("citadeldb_openai_agents.cli.commands", "citadeldb_openai_agents.demo"),
    # sentence-transformers (the embeddings extra) is loaded only when that provider is chosen.
    ("citadeldb_openai_agents.embedders.providers", "citadeldb_openai_agents.embedders.local"),
}
# Only the storage layer talks to citadeldb (and the provider that wraps Citadel's own embedder).
CITADELDB_ALLOWED = ("citadeldb_openai_agents.storage.", "citadeldb_openai_agents.embedders.providers")
# What the CLI may use: the public API and the configuration's, never the store's insides.
CLI_ALLOWED = {
    "citadeldb_openai_agents",
    "citadeldb_openai_agents.config",
    "citadeldb_openai_agents.errors",
    "citadeldb_openai_agents.options",
    "citadeldb_openai_agents.results",
    "citadeldb_openai_agents.demo",
}
MAX_LINES = 420  # "no module over about 400 lines"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(imported at module level, imported inside a function); TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    top: set[str] = set()
    deferred: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (deferred if in_function else top).update(targets(child, package))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return top, deferred


def targets(node: ast.Import | ast.ImportFrom, package: str) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    known = modules()
    found = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        found.add(submodule if submodule in known else base)
    return found


def internal_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {t for t in imports(path)[0] if t in known and t != name} for name, path in known.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = internal_graph()
    assert cycle(graph) is None, f"import cycle: {' -> '.join(cycle(graph) or [])}"


def test_imports_inside_functions_are_only_the_deliberate_ones() -> None:
    known = modules()
    deferred = {
        (name, target)
        for name, path in known.items()
        for target in imports(path)[1]
        if target in known and target != name
    }
    assert deferred <= DEFERRED, f"deferred imports not on the list: {sorted(deferred - DEFERRED)}"
    # Even counting the deliberate ones as edges, nothing but store <-> session closes a loop.
    graph = internal_graph()
    for source, target in deferred - {("citadeldb_openai_agents.store", "citadeldb_openai_agents.session")}:
        graph[source].add(target)
    assert cycle(graph) is None, f"import cycle: {' -> '.join(cycle(graph) or [])}"


def test_only_the_storage_layer_imports_citadeldb() -> None:
    importers = sorted(
        name
        for name, path in modules().items()
        if any(t == "citadeldb" or t.startswith("citadeldb.") for t in set().union(*imports(path)))
    )
    assert importers, "the scan found no importer of citadeldb at all"
    strays = [name for name in importers if not name.startswith(CITADELDB_ALLOWED)]
    assert not strays, f"citadeldb imported outside storage/: {strays}"


def test_the_cli_uses_only_the_public_api() -> None:
    for name, path in modules().items():
        if not name.startswith(f"{ROOT}.cli"):
            continue
        used = {
            t for t in set().union(*imports(path)) if t.startswith(ROOT) and not t.startswith(f"{ROOT}.cli")
        }
        assert used <= CLI_ALLOWED, f"{name} reaches into {sorted(used - CLI_ALLOWED)}"


def test_no_module_is_much_over_400_lines() -> None:
    long = {
        name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long
