"""The README and docs/ say what the code does, where that can be checked mechanically.

The commands and variables the pages name, and no page calling a feature that exists
"planned" (the README's demo output is checked against the demo in test_demo.py). Outputs
that hold pids, times or random paths are left to the pages' own care.
"""

from __future__ import annotations

import re
from pathlib import Path

from citadeldb_openai_agents import CitadelSettings
from citadeldb_openai_agents.cli.main import _parser
from citadeldb_openai_agents.config.names import OTHER_VARIABLES, environment_variable, setting_fields
from citadeldb_openai_agents.embedders.providers import EMBEDDER_PROVIDERS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Words that promise a feature instead of describing one.
# The misspelling configuration.md shows being caught ("Did you mean CITADEL_TTL?").
MISSPELLED_ON_PURPOSE = {"CITADEL_TLL"}
PROMISES = re.compile(r"\b(planned|not yet (implemented|supported|available)|coming soon)\b", re.IGNORECASE)


def test_no_page_calls_a_feature_planned() -> None:
    found = [
        f"{page.name}:{number}: {line.strip()}"
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if PROMISES.search(line)
    ]
    assert not found, found


def test_every_command_the_pages_run_exists() -> None:
    parser = _parser()
    subcommands = next(a for a in parser._actions if a.dest == "command")
    commands = set(subcommands.choices)  # type: ignore[arg-type]
    named = {
        (page.name, match)
        for page in PAGES
        for match in re.findall(r"python -m citadeldb_openai_agents ([a-z][a-z-]*)", page.read_text())
    }
    unknown = sorted((page, command) for page, command in named if command not in commands)
    assert named and not unknown, unknown


def test_every_variable_the_pages_name_is_read() -> None:
    known = {environment_variable(name) for name, _ in setting_fields(CitadelSettings)} | set(OTHER_VARIABLES)
    named = {
        (page.name, variable)
        for page in PAGES
        for variable in re.findall(r"\bCITADEL_[A-Z0-9_]*[A-Z0-9]\b", page.read_text())
        if not variable.startswith("CITADEL_EMBEDDER__OPTIONS__") and variable not in MISSPELLED_ON_PURPOSE
    }
    unknown = sorted((page, variable) for page, variable in named if variable not in known)
    assert named and not unknown, unknown


# A markdown link's target: no scheme, no bare anchor ("#section"), the anchor cut off.
RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)#\s]+)(?:#[^)\s]*)?\)")


def test_every_relative_link_resolves_where_it_is_read() -> None:
    # mkdocs builds docs/ alone: a link out of it (to benchmarks/, say) is a dead link on the site,
    # a warning that fails `mkdocs build --strict` in CI. The README is read in the repository.
    broken = []
    for page in PAGES:
        root = ROOT if page.name == "README.md" else ROOT / "docs"
        for target in RELATIVE_LINK.findall(page.read_text()):
            resolved = (page.parent / target).resolve()
            if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_configuration_names_every_embedder_provider_the_code_accepts() -> None:
    rows = (ROOT / "docs" / "configuration.md").read_text().splitlines()
    provider_row = next(row for row in rows if row.startswith("| `[embedder] provider`"))
    missing = [name for name in EMBEDDER_PROVIDERS if f"`{name}`" not in provider_row]
    assert not missing, f"configuration.md's [embedder] provider row does not name {missing}"


def test_configuration_has_a_row_for_every_setting() -> None:
    rows = [
        row for row in (ROOT / "docs" / "configuration.md").read_text().splitlines() if row.startswith("| ")
    ]
    missing = [
        environment_variable(name)
        for name, _ in setting_fields(CitadelSettings)
        if not any(f"`{environment_variable(name)}`" in row for row in rows)
    ]
    assert not missing, f"configuration.md's table has no row for {missing}"


def test_the_readmes_first_screen_has_both_commands_then_the_quickstart() -> None:
    first_screen = (ROOT / "README.md").read_text().splitlines()[:40]
    demo = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python -m citadeldb_openai_agents demo"
    tests = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && python -m pytest -q -n auto"
    assert demo in first_screen and tests in first_screen and "## Quickstart" in first_screen
    assert first_screen.index(demo) < first_screen.index(tests) < first_screen.index("## Quickstart")
    # Right after the test command's fence: the measurements of its time live in docs/performance.md.
    after_the_commands = [line for line in first_screen[first_screen.index(tests) + 2 :] if line.strip()]
    assert after_the_commands[0] == "## Quickstart", after_the_commands[:3]


def test_deployment_quotes_the_served_ratios_of_the_sizing_table() -> None:
    # A user sizing a deployment reads one of the two pages: they must give the same figures.
    section = (ROOT / "docs" / "performance.md").read_text().split("### Sizing a deployment", 1)[1]
    section = section.split("\n### ", 1)[0]
    ranges: dict[tuple[str, str], tuple[float, float]] = {}
    for row in re.findall(r"^\| (quiet|one CPU-bound process beside), 3 runs \| (\d) \|(.*)$", section, re.M):
        low, high = re.findall(r"\| (\d\.\d\d)-(\d\.\d\d) \|", row[2])[0]
        ranges[(row[0], row[1])] = (float(low), float(high))
    assert set(ranges) == {(m, w) for m in ("quiet", "one CPU-bound process beside") for w in ("1", "2")}
    loaded = [ranges[("one CPU-bound process beside", w)] for w in ("1", "2")]
    quoted = [
        ranges[("quiet", "1")],
        ranges[("quiet", "2")],
        (min(low for low, _ in loaded), max(high for _, high in loaded)),
    ]
    deployment = " ".join((ROOT / "docs" / "deployment.md").read_text().split())
    for low, high in quoted:
        assert f"{low:.2f}-{high:.2f} times SQLiteSession" in deployment, (low, high)


def test_operations_lists_every_metric_as_the_code_declares_it() -> None:
    from citadeldb_openai_agents.telemetry.events import FIELDS
    from citadeldb_openai_agents.telemetry.metrics import INSTRUMENTS

    page = (ROOT / "docs" / "operations.md").read_text()
    rows = dict(
        (found[1], (found[2], found[3], found[4]))
        for found in re.finditer(
            r"^\| `((?:citadel|db)\.[a-z._]+)` \| (\w+) \| `([^`]+)` \| (.+) \|$", page, re.M
        )
    )
    assert rows == INSTRUMENTS
    named = set(re.findall(r"`(citadel_[a-z_]+)`", page))
    assert set(FIELDS) <= named, sorted(set(FIELDS) - named)
