"""Check that each lower bound in pyproject.toml equals its pin in .ci/lowest-versions.txt.

.ci/run runs this before the lowest-versions run, so the floors the package declares and the
versions that run installs (and the README quotes) cannot drift apart. Exit 1 names each
disagreement. Any Python: tomllib on 3.11+, tomli on 3.10.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / ".ci" / "lowest-versions.txt"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    problems: list[str] = []
    pins: dict[str, str] = {}
    for raw in PINS.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pin = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if pin is None:
            problems.append(f"{PINS.name}: not an exact pin: {line!r}")
            continue
        pins[normalize(pin[1])] = pin[2]
    with (ROOT / "pyproject.toml").open("rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    for dependency in dependencies:
        parsed = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?([^;]*)", dependency)
        assert parsed is not None, dependency
        name, spec = normalize(parsed[1]), parsed[2]
        floor = re.search(r">=\s*([^,\s]+)", spec)
        if floor is None:
            problems.append(f"pyproject.toml: {dependency!r} has no lower bound (>=)")
        elif name not in pins:
            problems.append(f"{name} >={floor[1]} is not pinned in {PINS.name}")
        elif pins[name] != floor[1]:
            problems.append(f"{name}: pyproject.toml says >={floor[1]}, {PINS.name} pins =={pins[name]}")
    for problem in problems:
        print(f"check_floors: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_floors: each floor in pyproject.toml is pinned in {PINS.name}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
