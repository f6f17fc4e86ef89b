"""Where each setting's value came from: the origins, and the state of one settings load.

`LoadState` follows one `CitadelSettings` construction: which TOML file it reads,
every problem found (all reported at once), the passphrase rule (the highest source
that names ``key``, ``key_file`` or ``key_command`` decides it), and who set each value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

from ..hints import closest
from ..options import parse_duration
from .keycommand import DEFAULT_TIMEOUT, command_argv, run_key_command, shown
from .keyfile import read_key_file
from .names import CONFIG_VARIABLE, DEFAULT_CONFIG_FILE, nested_model

ARGUMENT = "argument"

ENVIRONMENT = "environment variable"

SECRETS_DIRECTORY = "secrets directory"

KEY_FILE = "key file"

KEY_COMMAND = "key command"

CREDENTIAL = "systemd credential"

# The passphrase came from a file, read again as it was when it changes (a key rotation).
FROM_FILES = (KEY_FILE, SECRETS_DIRECTORY, CREDENTIAL)

TOML_FILE = "TOML file"

DEFAULT = "default"

_KEY_FIELDS = ("key", "key_file", "key_command")


@dataclass(frozen=True)
class Origin:
    """Where a value came from: a kind of source (`ENVIRONMENT`, ...) and which one."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.detail}" if self.detail else self.kind


# Each kind of source in a sentence's words, given its detail and the setting it set: the one
# place that describes a source (a wrong passphrase names its own: `passphrase_source`).
_DESCRIBED: dict[str, Callable[[str, str], str]] = {
    ARGUMENT: lambda detail, setting: f"the {detail}= argument",
    ENVIRONMENT: lambda detail, setting: f"the environment variable {detail}",
    SECRETS_DIRECTORY: lambda detail, setting: f"the file {detail} in the secrets directory",
    KEY_FILE: lambda detail, setting: f"the key file {detail}",
    KEY_COMMAND: lambda detail, setting: f"the output of the command {detail}",
    CREDENTIAL: lambda detail, setting: f"the systemd credential {detail}",
    TOML_FILE: lambda detail, setting: f"{setting} in the TOML file {detail}",
}


def described(origin: Origin, setting: str) -> str:
    """Where `setting` came from, in words ("the environment variable CITADEL_KEY")."""
    describe = _DESCRIBED.get(origin.kind)
    return str(origin) if describe is None else describe(origin.detail, setting)


def passphrase_source(key: Origin, key_file: Origin, key_command: Origin = Origin(DEFAULT)) -> str:
    """Where the passphrase came from; a key file's or a command's with the source that named it."""
    if key.kind == KEY_FILE:
        return f"{described(key, 'key')}, named by {described(key_file, 'key_file')}"
    if key.kind == KEY_COMMAND:
        return f"{described(key, 'key')}, named by {described(key_command, 'key_command')}"
    return described(key, "key")


@dataclass(frozen=True)
class Provenance:
    """The source a setting's value came from, and the lower-precedence ones it overrode."""

    origin: Origin
    overrides: tuple[Origin, ...] = ()


class LoadState:
    """One `CitadelSettings` construction: the TOML file, the problems, and who set what."""

    def __init__(self, config_file: str | os.PathLike[str] | None, settings_cls: type[BaseSettings]) -> None:
        self.settings_cls = settings_cls
        self.problems: list[str] = []
        self.origins: dict[str, Origin] = {}
        self.overridden: dict[str, list[Origin]] = {}
        # The origin of whichever source decided the passphrase (key, key_file or key_command).
        self.passphrase_origin: Origin | None = None
        # Every source that names a passphrase, highest first, with the setting it names it by:
        # the first decides, the others are overridden (neither read nor run).
        self.passphrase_named: list[tuple[str, Origin]] = []
        # Set when key_command decided: it runs once every source is in (its timeout may be lower).
        self._key_command_named_by: Origin | None = None
        self.key_command_seconds: float | None = None
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
        for name in leaves(values, self.settings_cls):
            found = key_file_origin if name == "key" and key_file_origin else origin(name)
            if name in self.origins:
                self.overridden.setdefault(name, []).append(found)
            else:
                self.origins[name] = found

    def take_passphrase(self, values: dict[str, Any], origin: Callable[[str], Origin]) -> dict[str, Any]:
        """Apply the passphrase rule to one source's values: the highest source to name it wins."""
        given = [name for name in _KEY_FIELDS if values.get(name) is not None]
        if not given:
            return values
        self.passphrase_named.extend((name, origin(name)) for name in given)
        if self.passphrase_origin is not None:
            self.overridden.setdefault("key", []).append(origin(given[0]))
            return {name: value for name, value in values.items() if name not in _KEY_FIELDS}
        self.passphrase_origin = origin(given[0])
        if len(given) > 1:
            by = [f"by {origin(name)}" for name in given]
            self.problems.append(
                f"the passphrase is set {'twice' if len(by) == 2 else f'{len(by)} times'}, "
                f"{', '.join(by[:-1])} and {by[-1]}; keep only one (a *_FILE variable names a file "
                "holding the value, key_command a command that prints it)"
            )
            return {name: value for name, value in values.items() if name not in _KEY_FIELDS}
        if given == ["key_file"]:
            return self._read_key_file(values, origin("key_file"))
        if given == ["key_command"]:
            self._key_command_named_by = origin("key_command")
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

    def run_key_command(self, data: dict[str, Any]) -> dict[str, Any]:
        """Every source's values merged: the passphrase key_command prints, when it decided.

        A command or timeout the settings' validation will refuse is not run (the problem is
        reported there); a command that fails is a problem naming it, never its output.
        """
        named_by = self._key_command_named_by
        if named_by is None or data.get("key") is not None:
            return data
        try:
            argv = command_argv(data.get("key_command"))
            timeout = parse_duration(data.get("key_command_timeout", DEFAULT_TIMEOUT), "key_command_timeout")
        except ValueError:
            return data
        try:
            passphrase, self.key_command_seconds = run_key_command(argv, timeout or DEFAULT_TIMEOUT)
        except ValueError as exc:
            self.problems.append(f"{exc} (key_command from {named_by})")
            return data
        self.origins["key"] = Origin(KEY_COMMAND, shown(argv))
        return {**data, "key": passphrase}

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
                        "CITADEL_KEY, CITADEL_KEY_COMMAND (a command that prints it), key_file or "
                        "key_command in the TOML file, a citadel_key file in the secrets directory, "
                        "or a systemd credential named citadel_key (LoadCredential=)"
                    )
                continue
            if item["type"] == "extra_forbidden":
                model: type[BaseModel] = self.settings_cls
                if len(loc) > 1:
                    model = nested_model(model.model_fields[loc[0]]) or model
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


# The load under way in this context: sources are built by pydantic-settings, which knows nothing of it.
current_load: ContextVar[LoadState | None] = ContextVar("citadel_settings_loading", default=None)


def leaves(values: Mapping[str, Any], settings_cls: type[BaseSettings]) -> Iterator[str]:
    """The dotted names of the settings `values` sets (``embedder.dim`` for a nested one)."""
    for name, value in values.items():
        info = settings_cls.model_fields.get(name)
        if info is not None and nested_model(info) is not None:
            if isinstance(value, BaseModel):
                value = value.model_dump(exclude_unset=True)
            if isinstance(value, Mapping):
                yield from (f"{name}.{sub}" for sub in value)
                continue
        yield name
