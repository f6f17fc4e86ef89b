"""The files that make one Citadel database, and the path two openers of it agree on."""

from __future__ import annotations

import os

# Citadel keeps these beside the database file; without any of them the data cannot be
# decrypted, so they are backed up, restored and moved together.
COMPANION_SUFFIXES = (".citadel-keys", ".citadel-regions", ".citadel-atomkeys")
AUDIT_SUFFIX = ".citadel-audit"  # Citadel's audit log: not needed to open the file


def resolve_path(path: str | os.PathLike[str]) -> str:
    """The canonical path two openers of one file agree on (relative, ``..``, symlinks resolved)."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def database_files(path: str) -> list[str]:
    """The file and every companion Citadel may keep beside it (they go together)."""
    return [path, *(path + suffix for suffix in (*COMPANION_SUFFIXES, AUDIT_SUFFIX))]


def database_size(path: str) -> int:
    """Bytes of the file and its companions."""
    return sum(os.path.getsize(name) for name in database_files(path) if os.path.isfile(name))
