"""from_config(): settings -> store. Also the embedder providers and the checks behind `check`.

Agent code says ``store = from_config()``; operators configure the rest (see
`CitadelSettings`) and run ``python -m citadeldb_openai_agents check``, which
calls `check_configuration` and loads the settings exactly as `from_config` does.
The other operator commands open the store with `open_existing_store`.
"""

from __future__ import annotations

import importlib
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import citadeldb

from .database import database_files, resolve_path
from .embedders import DEFAULT_MOCK_DIM, Embedder, resolve_embedder
from .errors import (
    CitadelSessionError,
    CorruptDatabaseError,
    DatabaseLockedError,
    DatabaseNotFoundError,
    WrongPassphraseError,
)
from .lock_holder import LockHolder
from .results import IntegrityReport
from .settings import (
    KEY_FILE,
    SECRETS_DIRECTORY,
    CitadelSettings,
    ConfigurationError,
    ConfigurationWarning,
    EmbedderSettings,
    Origin,
    closest,
)
from .store import CitadelSessionStore, ReembedSummary, reembed, verify_file

ConfigSource = str | os.PathLike[str] | CitadelSettings | None
EmbedderBuilder = Callable[[EmbedderSettings], Any]
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def from_config(config: ConfigSource = None, **overrides: Any) -> CitadelSessionStore:
    """Open the store the configuration describes.

    Args:
        config: A TOML file, a `CitadelSettings`, or None (then ``CITADEL_CONFIG``,
            else ``./citadel.toml`` when it exists, else variables and defaults only).
        **overrides: Settings that win over every other source (``ttl="1h"``, ...).

    Raises `ConfigurationError` listing every problem found in the configuration,
    and `DatabaseNotFoundError` naming the path and its source when the file does
    not exist and ``create`` is false (``from_config(create=False)``,
    ``CITADEL_CREATE=false``); other errors opening the file (`WrongPassphraseError`,
    ...) pass through. Calls that resolve to the same file in one process share one
    open database.
    """
    settings = load_settings(config, **overrides)
    return _open_store(settings, build_embedder(settings))


def load_settings(config: ConfigSource = None, **overrides: Any) -> CitadelSettings:
    """The settings `from_config` would use (see its arguments)."""
    if isinstance(config, CitadelSettings):
        if overrides:
            raise TypeError(
                "from_config(settings, **overrides): put the overrides into the settings "
                "instead, e.g. CitadelSettings(ttl=...)"
            )
        return config
    return CitadelSettings(_config_file=config, **overrides)


def open_existing_store(config: ConfigSource = None) -> CitadelSessionStore:
    """`from_config` for operator commands: the database must exist already.

    A command run with a mistyped path would otherwise create an empty file and
    report "no sessions" instead of the mistake.

    Raises `DatabaseNotFoundError` naming the path and the setting it came from;
    otherwise raises as `from_config` does.
    """
    settings = load_settings(config)
    return _open_store(settings, build_embedder(settings), existing_only=True)


def verify_from_config(config: ConfigSource = None) -> tuple[str, IntegrityReport]:
    """The configured file's path and `CitadelSessionStore.verify` report.

    A damaged file refuses to open for use; it is then inspected with `verify_file`,
    which changes nothing, so the report says what is damaged.
    """
    settings = load_settings(config)
    try:
        with open_existing_store(settings) as store:
            return store.path, store.verify()
    except CorruptDatabaseError as exc:
        if getattr(exc, "verdict", None) is None:
            raise
    path = resolve_path(settings.path)
    return path, verify_file(path, settings.key.get_secret_value())


def _session_settings(limit: int) -> Any:
    # Imported here: loading the Agents SDK costs seconds the operator commands never need.
    from agents.memory import SessionSettings

    return SessionSettings(limit=limit)


def reembed_from_config(config: ConfigSource = None) -> ReembedSummary:
    """`reembed` the configured file with the configured embedder (the fix for a model change)."""
    settings = load_settings(config)
    try:
        return reembed(settings.path, settings.key.get_secret_value(), build_embedder(settings))
    except DatabaseNotFoundError as exc:
        if not exc.creation_refused:
            raise
        raise _no_database(settings, existing_only=True) from None


# -- embedders ---------------------------------------------------------------------------


def build_embedder(settings: CitadelSettings) -> Embedder:
    """The embedder the ``[embedder]`` table describes, built by its provider.

    Raises `ConfigurationError` naming the setting at fault and its fix.
    """
    table = settings.embedder
    builder = EMBEDDER_PROVIDERS.get(table.provider)
    if builder is None:
        names = sorted(EMBEDDER_PROVIDERS)
        raise ConfigurationError(
            f"unknown embedder provider {table.provider!r} (from "
            f"{settings.provenance('embedder.provider').origin}); use one of "
            f"{', '.join(names)}.{closest(table.provider, names)}"
        )
    return builder(table)


def _mock_embedder(table: EmbedderSettings) -> Embedder:
    """Citadel's hashed bag-of-words: no download, no network; fine for tests and demos."""
    if table.factory is not None or table.options:
        raise ConfigurationError(
            "embedder.factory and embedder.options apply to provider 'import'; "
            "remove them, or set provider = 'import'"
        )
    if table.model is not None or table.device is not None:
        raise ConfigurationError(
            "embedder.model and embedder.device apply to provider 'sentence-transformers'; "
            "remove them, or set provider = 'sentence-transformers'"
        )
    return citadeldb.MockEmbedder(dim=table.dim or DEFAULT_MOCK_DIM)


def _imported_embedder(table: EmbedderSettings) -> Embedder:
    """Any embedder a user brings: ``factory(**options)`` must return one."""
    problems = []
    if table.dim is not None:
        problems.append(
            "embedder.dim applies to provider 'mock'; for provider 'import' pass the "
            "dimension in embedder.options if the factory takes one"
        )
    if table.model is not None or table.device is not None:
        problems.append(
            "embedder.model and embedder.device apply to provider 'sentence-transformers'; "
            "for provider 'import' pass them in embedder.options"
        )
    if not table.factory:
        problems.append(
            "provider 'import' needs embedder.factory = \"package.module:callable\" "
            "(CITADEL_EMBEDDER__FACTORY)"
        )
    elif not _FACTORY.match(table.factory):
        problems.append(
            f"embedder.factory {table.factory!r} is not of the form package.module:callable"
        )
    if problems:
        raise ConfigurationError(problems)
    assert table.factory is not None
    factory = _load_factory(table.factory)
    try:
        made = factory(**table.options)
    except Exception as exc:
        raise ConfigurationError(
            f"embedder.factory {table.factory!r} raised {type(exc).__name__}: {exc} "
            f"(called with the options {sorted(table.options) or 'none'}); "
            "fix embedder.options or the factory"
        ) from exc
    try:
        return resolve_embedder(made)
    except TypeError as exc:
        raise ConfigurationError(
            f"embedder.factory {table.factory!r} returned something that is not an embedder: {exc}"
        ) from exc


def _load_factory(spec: str) -> Callable[..., Any]:
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"embedder.factory {spec!r}: cannot import {module_name} ({exc}); install the "
            "package that provides it, or correct the module path"
        ) from exc
    except Exception as exc:
        raise ConfigurationError(
            f"embedder.factory {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from exc
    owner = module_name
    for part in attribute.split("."):
        if not hasattr(target, part):
            names = [name for name in dir(target) if not name.startswith("_")]
            raise ConfigurationError(
                f"embedder.factory {spec!r}: {owner} has no attribute {part!r}."
                f"{closest(part, names)} Correct the name after the colon"
            )
        target, owner = getattr(target, part), f"{owner}.{part}"
    if not callable(target):
        raise ConfigurationError(
            f"embedder.factory {spec!r} names a {type(target).__name__}, not a callable; "
            "name a function or class that returns an embedder"
        )
    return target


def _sentence_transformers_embedder(table: EmbedderSettings) -> Embedder:
    """A local sentence-embedding model (the ``embeddings`` extra), loaded offline."""
    unused = [
        f"embedder.{name}"
        for name, value in (("dim", table.dim), ("factory", table.factory), ("options", table.options))
        if value
    ]
    if unused:
        raise ConfigurationError(
            f"{', '.join(unused)} do not apply to provider 'sentence-transformers' "
            "(it takes model and device); remove them"
        )
    from .sentence_embedder import DEFAULT_MODEL, SentenceTransformerEmbedder

    try:
        return SentenceTransformerEmbedder(table.model or DEFAULT_MODEL, device=table.device or "cpu")
    except (ImportError, FileNotFoundError, OSError, ValueError) as exc:
        raise ConfigurationError(f"embedder provider 'sentence-transformers': {exc}") from None


# The place later providers plug in: a name and a builder from the [embedder] table.
EMBEDDER_PROVIDERS: dict[str, EmbedderBuilder] = {
    "mock": _mock_embedder,
    "import": _imported_embedder,
    "sentence-transformers": _sentence_transformers_embedder,
}


def _open_store(
    settings: CitadelSettings, embedder: Embedder, *, existing_only: bool = False
) -> CitadelSessionStore:
    """The store, its errors told in the configuration's terms (which setting, which file).

    A missing file is created as the ``create`` setting says, never when `existing_only`
    (operator commands, check).
    """
    limit = settings.session_limit
    try:
        return CitadelSessionStore(
            settings.path,
            settings.key.get_secret_value(),
            embedder=embedder,
            ttl=settings.ttl,
            session_settings=None if limit is None else _session_settings(limit),
            argon2_profile=settings.argon2_profile,
            sync_mode=settings.sync_mode,
            cache_size=settings.cache_size,
            create=settings.create and not existing_only,
        )
    except WrongPassphraseError as exc:
        hint = _key_file_hint(settings)
        if hint is None:
            raise
        raise WrongPassphraseError(f"{exc} {hint}") from None
    except DatabaseNotFoundError as exc:
        if not exc.creation_refused:
            raise
        raise _no_database(settings, existing_only=existing_only) from None


def _no_database(settings: CitadelSettings, *, existing_only: bool) -> DatabaseNotFoundError:
    """The store's refusal to create a file, naming where the path and the refusal came from."""
    if existing_only:
        refusal, fix = "operator commands never create one", "or pass --config"
    else:
        refusal = f"create is false (from {settings.provenance('create').origin})"
        fix = "or set create = true (CITADEL_CREATE=true) to start a new, empty database there"
    relative = "" if settings.path.is_absolute() else (
        f"; {settings.path} is relative, so it resolved against the working directory {os.getcwd()}"
    )
    return DatabaseNotFoundError(
        f"there is no database at {resolve_path(settings.path)} (path from "
        f"{settings.provenance('path').origin}{relative}); {refusal}. Correct CITADEL_PATH / "
        f"path, {fix}.",
        creation_refused=True,
    )


def _key_file_hint(settings: CitadelSettings) -> str | None:
    """Why a passphrase read from a file may be wrong, without a character of it.

    Returns None when the passphrase did not come from a file. Its own frame is gone
    before the caller raises, so no traceback holds the passphrase it looks at.
    """
    origin = settings.provenance("key").origin
    if origin.kind not in (KEY_FILE, SECRETS_DIRECTORY):
        return None
    passphrase = settings.key.get_secret_value()
    edges = []
    if passphrase[0].isspace():
        edges.append(f"starts with {_whitespace_name(passphrase[0])}")
    if passphrase[-1].isspace():
        still = "still " if passphrase[-1] in "\r\n" else ""
        edges.append(f"{still}ends with {_whitespace_name(passphrase[-1])}")
    found = f"; as read, it {' and '.join(edges)}" if edges else ""
    return (
        f"The passphrase came from the file {origin.detail}, read as is: one trailing newline "
        "stripped, every other character kept, whitespace included, so whitespace in the file "
        f"may be the cause{found}. If the whitespace is not part of the passphrase, remove it "
        "from the file."
    )


def _whitespace_name(character: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", " ": "a space", "\t": "a tab"}
    return names.get(character, f"whitespace (U+{ord(character):04X})")


# -- check ---------------------------------------------------------------------------------


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

    `locked`: another process holds the file, so it was not opened; `held_by` is
    that process when it can be known.
    """

    path: str
    exists: bool
    passphrase_verified: bool = False
    sessions: int | None = None
    size_bytes: int = 0
    locked: bool = False
    held_by: LockHolder | None = None


@dataclass
class CheckReport:
    """The result of `check_configuration`: settings, database, and every problem found."""

    config_file: str | None = None
    settings: list[SettingReport] = field(default_factory=list)
    database: DatabaseReport | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigurationWarning)
        settings = _checked_settings(config, report)
    for caught_warning in caught:
        if issubclass(caught_warning.category, ConfigurationWarning):
            report.warnings.append(str(caught_warning.message))
        else:
            warnings.warn_explicit(
                caught_warning.message, caught_warning.category,
                caught_warning.filename, caught_warning.lineno,
            )
    if settings is None:
        return report
    if not settings.path.is_absolute():
        report.warnings.append(_relative_path_warning(settings))
    try:
        embedder = build_embedder(settings)
    except ConfigurationError as exc:
        report.problems.extend(exc.problems)
        return report
    report.configuration_ok = True
    if open_database:
        report.database = _check_database(settings, embedder, report.problems)
    return report


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
    return settings


def _relative_path_warning(settings: CitadelSettings) -> str:
    # A TOML file's relative paths are already resolved against its directory, so only
    # an argument, a variable or the default can still depend on the working directory.
    return (
        f"path {settings.path} (from {settings.provenance('path').origin}) is relative, so it "
        f"resolves against the working directory: here {resolve_path(settings.path)}. A "
        "process started in another directory uses another file (and creates it, empty, "
        "unless create is false). Give an absolute path, or set path in the TOML file, "
        "where it resolves against the file's directory."
    )


def _where(settings: CitadelSettings, name: str) -> tuple[Origin, tuple[Origin, ...]]:
    provenance = settings.provenance(name)
    return provenance.origin, provenance.overrides


def _shown(settings: CitadelSettings, name: str) -> Any:
    if name == "key":
        return "set"
    value: Any = settings
    for part in name.split("."):
        value = getattr(value, part)
    if name == "embedder.options":
        # Option values may be credentials (an API key); only their names are shown.
        return sorted(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _check_database(
    settings: CitadelSettings, embedder: Embedder, problems: list[str]
) -> DatabaseReport:
    path = resolve_path(settings.path)
    if not os.path.exists(path) and not settings.create:
        problems.append(str(_no_database(settings, existing_only=False)))
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
        with _open_store(settings, embedder, existing_only=True) as store:
            sessions = len(store.session_ids())
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
            path, exists=True, size_bytes=_size(path), locked=True, held_by=exc.holder
        )
    except (CitadelSessionError, citadeldb.CitadelError, OSError) as exc:
        problems.append(str(exc))
        return DatabaseReport(path, exists=True, size_bytes=_size(path))
    return DatabaseReport(
        path, exists=True, passphrase_verified=True, sessions=sessions, size_bytes=_size(path)
    )


def _size(path: str) -> int:
    """Bytes of the file and its companions (``<path>.citadel-*``: keys, regions, ...)."""
    return sum(os.path.getsize(name) for name in database_files(path) if os.path.isfile(name))
