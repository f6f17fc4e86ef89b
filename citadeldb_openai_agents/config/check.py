"""`check`: the configuration loaded exactly as `from_config` loads it, reported, before a deploy.

Every value with where it came from (the passphrase only as "set"), every source that
names a passphrase (the one used first), every problem found, and what opening the
database found, without ever creating it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..embedders.protocol import Embedder
from ..errors import CitadelSessionError, ConfigurationError, DatabaseLockedError
from ..results import LockHolder
from ..storage.files import database_size, resolve_path
from .load import ConfigSource, build_embedder, load_settings, no_database, open_store, relative_path_warning
from .model import CitadelSettings
from .notices import configuration_warnings
from .provenance import Origin


@dataclass(frozen=True)
class SettingReport:
    """One resolved setting: its value (the passphrase only as "set") and where it came from."""

    name: str
    value: Any
    origin: Origin
    overrides: tuple[Origin, ...] = ()


@dataclass(frozen=True)
class DatabaseReport:
    """What opening the database found. `exists` False: it is created on first use.

    `locked`: another process holds the file and does not serve it, so it was not
    opened; `held_by` is that process when it can be known. `served_by`: another
    process holds the file and serves it; the passphrase was verified through it.
    `adopted`: the settings fixed per file this configuration leaves unset, with the
    values taken from that process (`CitadelSessionStore.adopted`).
    """

    path: str
    exists: bool
    passphrase_verified: bool = False
    sessions: int | None = None
    size_bytes: int = 0
    locked: bool = False
    held_by: LockHolder | None = None
    served_by: int | None = None
    adopted: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckReport:
    """The result of `check_configuration`: settings, database, and every problem found."""

    config_file: str | None = None
    settings: list[SettingReport] = field(default_factory=list)
    database: DatabaseReport | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Every source naming a passphrase, in words: the first is used, the others are overridden.
    passphrase_sources: list[str] = field(default_factory=list)
    # The settings alone are valid (all that --no-open checks); the database may still fail.
    configuration_ok: bool = False

    @property
    def ok(self) -> bool:
        """True when the configuration (and, if opened, the database) is usable."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "ok": self.ok,
            "configuration_ok": self.configuration_ok,
            "config_file": self.config_file,
            "settings": {
                row.name: {
                    "value": row.value,
                    "source": row.origin.kind,
                    "detail": row.origin.detail or None,
                    "overrides": [str(origin) for origin in row.overrides],
                }
                for row in self.settings
            },
            "database": None if self.database is None else asdict(self.database),
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "passphrase_sources": list(self.passphrase_sources),
        }


def check_configuration(config: ConfigSource = None, *, open_database: bool = True) -> CheckReport:
    """Load the settings as `from_config` does, build the embedder and (unless told not to)
    open the database; report every value with its source and every problem found.

    An existing database is opened, which verifies the passphrase; a missing one is
    not created, only its directory checked (a problem itself when ``create`` is
    false). A file another process holds is a problem that says the configuration is
    valid (`CheckReport.configuration_ok`) and the passphrase unverified. A path that
    depends on the working directory (relative, not from the TOML file) is a warning.
    """
    report = CheckReport()
    with configuration_warnings() as messages:
        settings = _checked_settings(config, report)
    report.warnings.extend(messages)
    if settings is None:
        return report
    if not settings.path.is_absolute():
        report.warnings.append(relative_path_warning(settings))
    report.warnings.extend(_ledger_placement(settings))
    try:
        embedder = build_embedder(settings)
    except ConfigurationError as exc:
        report.problems.extend(exc.problems)
        return report
    report.configuration_ok = True
    if open_database:
        report.database = _check_database(settings, embedder, report.problems)
    return report


def _ledger_placement(settings: CitadelSettings) -> list[str]:
    """A warning when every copy of the erasure ledger is on the database's filesystem: whoever
    can delete or roll back the database there can empty them too, and a restore over a lost file
    then brings erased sessions back, with nothing in the data's reach to tell (issue 59)."""
    if settings.erasure_ledger is None:
        return []
    data = _filesystem(settings.path)
    copies = [("erasure_ledger", settings.erasure_ledger), ("ledger_mirror", settings.ledger_mirror)]
    given = [(name, path) for name, path in copies if path is not None]
    if data is None or any(_filesystem(path) != data for _, path in given):
        return []
    named = " and its ledger_mirror " + str(settings.ledger_mirror) if settings.ledger_mirror else ""
    fix = (
        "set ledger_mirror (CITADEL_LEDGER_MIRROR)"
        if settings.ledger_mirror is None
        else "move ledger_mirror"
    )
    return [
        f"the erasure_ledger {settings.erasure_ledger}{named} {'are' if named else 'is'} on the same "
        f"filesystem as the database {resolve_path(settings.path)}: whoever can delete or roll back "
        "the database there can empty the ledger too, and a restore would then bring erased sessions "
        f"back unseen; {fix} to a file on another volume, out of the service's write reach where "
        "you can (docs/reliability.md, the erasure ledger)"
    ]


def _filesystem(path: Path) -> int | None:
    """The device of `path`'s nearest existing directory (the file may not be made yet)."""
    here = Path(resolve_path(path)).parent
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        return here.stat().st_dev
    except OSError:
        return None


def _checked_settings(config: ConfigSource, report: CheckReport) -> CitadelSettings | None:
    try:
        settings = load_settings(config)
    except ConfigurationError as exc:
        report.problems.extend(exc.problems)
        report.config_file = None if exc.config_file is None else str(exc.config_file)
        return None
    report.config_file = None if settings.config_file is None else str(settings.config_file)
    report.settings = [
        SettingReport(name, _shown(settings, name), *_where(settings, name))
        for name in settings.setting_names()
    ]
    report.passphrase_sources = settings.passphrase_sources()
    return settings


def _where(settings: CitadelSettings, name: str) -> tuple[Origin, tuple[Origin, ...]]:
    provenance = settings.provenance(name)
    return provenance.origin, provenance.overrides


def _shown(settings: CitadelSettings, name: str) -> Any:
    if name == "key":
        ran = settings.key_command_seconds
        return "set" if ran is None else f"set (command ran in {ran:.2f} s)"
    value: Any = settings
    for part in name.split("."):
        value = getattr(value, part)
    if name == "embedder.options":
        # Option values may be credentials (an API key); only their names are shown.
        return sorted(value)
    if name == "key_command" and value is not None:
        return shlex.join(value)  # as an operator types it
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _check_database(settings: CitadelSettings, embedder: Embedder, problems: list[str]) -> DatabaseReport:
    path = resolve_path(settings.path)
    if not os.path.exists(path) and not settings.create:
        problems.append(str(no_database(settings, existing_only=False)))
        return DatabaseReport(path, exists=False)
    if not os.path.exists(path):
        # A check must not create the file; whether it could is what matters.
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            problems.append(
                f"the directory {directory} for {path} does not exist; create it (mkdir -p) "
                "or change CITADEL_PATH / path"
            )
        elif not os.access(directory, os.W_OK | os.X_OK):
            problems.append(
                f"{path} does not exist and this user cannot create it in {directory}; "
                "fix the directory's owner or mode"
            )
        return DatabaseReport(path, exists=False)
    try:
        with open_store(settings, embedder, existing_only=True, warn_relative=False) as store:
            sessions = len(store.session_ids())
            served_by = store.served_by
            adopted = store.adopted
    except DatabaseLockedError as exc:
        # Normal while the service runs: the settings are fine, only the passphrase is unknown.
        who = "another process" if exc.holder is None else f"another process, {exc.holder}"
        problems.append(
            f"the configuration is valid, but {path} is held by {who}, so the passphrase could "
            "not be verified (one process owns a Citadel file at a time). While it runs, "
            "`python -m citadeldb_openai_agents check --no-open` checks the configuration "
            "alone; to verify the passphrase too, run check while the file is free."
        )
        return DatabaseReport(
            path, exists=True, size_bytes=database_size(path), locked=True, held_by=exc.holder
        )
    except (CitadelSessionError, OSError) as exc:
        problems.append(str(exc))
        return DatabaseReport(path, exists=True, size_bytes=database_size(path))
    return DatabaseReport(
        path,
        exists=True,
        passphrase_verified=True,
        sessions=sessions,
        size_bytes=database_size(path),
        served_by=served_by,
        adopted=adopted,
    )
