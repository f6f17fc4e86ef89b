"""Configuration warnings (a key file others can read, ...), collected where they are raised.

`check` lists them in its report, the operator commands print them as ``warning:``
lines before any error (a world-readable key file may be why), and library code
sees them as ordinary `warnings`. Any other warning passes through untouched.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import ConfigurationWarning


@contextmanager
def configuration_warnings() -> Iterator[list[str]]:
    """Collect the `ConfigurationWarning` messages raised inside, in a list filled on exit."""
    messages: list[str] = []
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigurationWarning)
            yield messages
    finally:
        for warning in caught:
            if issubclass(warning.category, ConfigurationWarning):
                messages.append(str(warning.message))
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
