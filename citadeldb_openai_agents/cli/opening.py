"""What every command does before its library call: its settings read and its store opened, with
the configuration's warnings printed first; and how a command declines (`Refused`, exit 1) or
ends on a usage error (exit 2)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from .. import CitadelSessionStore, DatabaseNotFoundError
from ..config import CitadelSettings, configuration_warnings, from_config, load_settings, open_existing_store


class Refused(Exception):
    """The command itself declines to run (no confirmation, no new passphrase, ...)."""


def usage(message: str) -> NoReturn:
    """A usage error ends the command as argparse ends its own: the message, then exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def open_new_or_existing(args: argparse.Namespace, target: CitadelSettings) -> CitadelSessionStore:
    """The file the command writes to: created only with --create (a typo must not start a new file)."""
    try:
        return open_store(args, target, create=args.create)
    except DatabaseNotFoundError as exc:
        if not exc.creation_refused:
            raise
        raise Refused(f"{exc} To start a new, empty file there, pass --create.") from None


def settings_of(args: argparse.Namespace) -> CitadelSettings:
    """The command's settings, from --config and every other source, as `from_config` reads them."""
    with warnings_printed():
        return load_settings(args.config)


def open_store(
    args: argparse.Namespace, settings: CitadelSettings | None = None, *, create: bool = False
) -> CitadelSessionStore:
    """The configured store: an existing file only, unless `create` (init, and --create)."""
    with warnings_printed():
        settings = settings if settings is not None else load_settings(args.config)
        return from_config(settings) if create else open_existing_store(settings)


@contextmanager
def warnings_printed() -> Iterator[None]:
    """Print the configuration's warnings as ``warning:`` lines, before any error that follows."""
    messages: list[str] = []
    try:
        with configuration_warnings() as messages:
            yield
    finally:
        for message in messages:
            print(f"warning: {message}", file=sys.stderr)
