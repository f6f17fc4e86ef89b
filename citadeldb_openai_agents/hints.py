"""The "Did you mean ...?" hint that configuration problems end with."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


def closest(name: str, candidates: Sequence[str]) -> str:
    """A "Did you mean X?" hint naming the candidate nearest `name`, or an empty string."""
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" Did you mean {match[0]}?" if match else ""
