"""Where settings come from, one class per source: environment variables, the secrets
directory, systemd's credentials directory, the TOML file; and the layer that applies the passphrase rule and notes who
set what (provenance.py). `CitadelSettings.settings_customise_sources` orders them.

Each builds on pydantic-settings' own source where one exists, and reports a mistake
(an unknown variable, a table that is not JSON, a passphrase written into the TOML
file) as a problem to list, not an exception.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
)

from ..hints import closest
from .keyfile import read_key_file
from .names import CREDENTIALS_VARIABLE, ENV_PREFIX, OPTION_VARIABLES, environment_variable, nested_model
from .provenance import CREDENTIAL, ENVIRONMENT, SECRETS_DIRECTORY, TOML_FILE, LoadState, Origin
from .taken import kept_variable, take_variable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SHADOWED = "<a passphrase overridden by a higher source>"

# Relative paths in a TOML file are relative to that file, not to wherever the process starts.
_PATH_FIELDS = ("path", "key_file", "secrets_dir")
# Lists a variable may give as words rather than JSON (CITADEL_SHARDS=a,b,c; CITADEL_KEY_COMMAND=pass
# show agent), split by the setting's validator.
COMMA_SEPARATED = ("shards", "key_command")

# The passphrase variable: taken out of os.environ once read, so no child process inherits it.
KEY_VARIABLE = environment_variable("key")

# The file systemd's LoadCredential=citadel_key:... (or LoadCredentialEncrypted=) puts in the
# service's $CREDENTIALS_DIRECTORY.
CREDENTIAL_NAME = "citadel_key"


class Layer(PydanticBaseSettingsSource):
    """One level of precedence: its source's values, the passphrase rule, who set what."""

    def __init__(
        self,
        source: PydanticBaseSettingsSource,
        origin: Callable[[str], Origin],
        loading: LoadState,
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
        return f"Layer({self._source!r})"


class EnvironmentSource(EnvSettingsSource):
    """``CITADEL_*`` variables; an unknown one is a problem naming the closest valid name."""

    def __init__(self, settings_cls: type[BaseSettings], loading: LoadState) -> None:
        super().__init__(settings_cls)
        self._loading = loading

    def __call__(self) -> dict[str, Any]:
        valid = sorted(set(self.settings_cls.environment_variables()) - {OPTION_VARIABLES})  # type: ignore[attr-defined]
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

    def _load_env_vars(self) -> Mapping[str, str | None]:
        found = dict(super()._load_env_vars())
        passphrase = take_variable(KEY_VARIABLE)
        if passphrase:  # empty: unset, as for every variable (env_ignore_empty)
            found[KEY_VARIABLE.lower()] = passphrase
        return found

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        if field_name in COMMA_SEPARATED and isinstance(value, str) and not value.lstrip().startswith("["):
            return value  # CITADEL_SHARDS=a,b,c: split by the setting's validator
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError:  # a table given as JSON that does not parse: a problem to list
            self._loading.problems.append(self._bad_json(field_name))
            return None

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


class SecretsDirectorySource(SecretsSettingsSource):
    """pydantic-settings' secrets directory (Docker's /run/secrets, a Kubernetes secret volume).

    One file per setting, named like the variable in lower case: ``citadel_key``
    holds the passphrase and is read as a key file is.
    """

    def __init__(self, settings_cls: type[BaseSettings], loading: LoadState, directory: Any) -> None:
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
            return SHADOWED, key, is_complex
        try:
            return read_key_file(self._path(field_name)), key, is_complex
        except ValueError as exc:
            self._loading.problems.append(f"{exc} (in the secrets directory)")
            return None, key, is_complex

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError:  # a table given as JSON that does not parse: a problem to list
            self._loading.problems.append(self._bad_json(field_name))
            return None

    def _bad_json(self, field_name: str) -> str:
        return f"{self._path(field_name)} is not valid JSON; write the {field_name} table as a JSON object"

    def _path(self, field_name: str) -> Path:
        name = f"{ENV_PREFIX}{field_name}".lower()
        directory = Path(self.secrets_dir)  # type: ignore[arg-type]  # one directory, set in __init__
        return self.find_case_path(directory, name, self.case_sensitive) or directory / name

    def origin(self, name: str) -> Origin:
        return Origin(SECRETS_DIRECTORY, str(self._path(name.split(".")[0]).absolute()))


class CredentialsDirectorySource(PydanticBaseSettingsSource):
    """systemd's credentials: ``$CREDENTIALS_DIRECTORY/citadel_key``, put there by the unit's
    ``LoadCredential=`` or ``LoadCredentialEncrypted=``, holds the passphrase with no setting
    naming it. It is read as a key file is; another credential in the directory is ignored.
    """

    def __init__(self, settings_cls: type[BaseSettings], loading: LoadState) -> None:
        super().__init__(settings_cls)
        self._loading = loading
        directory = os.environ.get(CREDENTIALS_VARIABLE)
        self.path = Path(directory, CREDENTIAL_NAME).absolute() if directory else None

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ gives the one value

    def __call__(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        if self._loading.passphrase_origin is not None:
            return {"key": SHADOWED}  # overridden: noted, not read
        try:
            return {"key": read_key_file(self.path)}
        except ValueError as exc:
            self._loading.problems.append(f"{exc} (a systemd credential, in ${CREDENTIALS_VARIABLE})")
            return {}

    def origin(self, name: str) -> Origin:
        return Origin(CREDENTIAL, str(self.path))

    def __repr__(self) -> str:
        return f"CredentialsDirectorySource({self.path})"


class KeptVariableSource(PydanticBaseSettingsSource):
    """``CITADEL_KEY`` as it was when this process took it out of ``os.environ`` (taken.py), now
    unset: ranked below every other source, so it configures only what names no passphrase (a
    second `from_config()`), never one that now names a key file, a command or a credential."""

    def __init__(self, settings_cls: type[BaseSettings], loading: LoadState) -> None:
        super().__init__(settings_cls)
        self._loading = loading

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ gives the one value

    def __call__(self) -> dict[str, Any]:
        kept = kept_variable(KEY_VARIABLE)
        if not kept or self._loading.passphrase_origin is not None:
            return {}
        return {"key": kept}

    def origin(self, name: str) -> Origin:
        return Origin(ENVIRONMENT, KEY_VARIABLE)

    def __repr__(self) -> str:
        return "KeptVariableSource()"


class TomlFileSource(PydanticBaseSettingsSource):
    """The TOML file; a passphrase written into it and unknown keys are problems."""

    def __init__(self, settings_cls: type[BaseSettings], loading: LoadState) -> None:
        super().__init__(settings_cls)
        self._loading = loading
        self.file = loading.config_file
        self.values = self._load() if self.file is not None else {}

    def _load(self) -> dict[str, Any]:
        assert self.file is not None
        try:
            with self.file.open("rb") as handle:
                values: dict[str, Any] = tomllib.load(handle)
        except tomllib.TOMLDecodeError as exc:
            # tomllib's message gives the line and column, never the text there.
            self._loading.problems.append(f"{self.file} is not valid TOML: {exc}; fix the syntax there")
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
            nested = nested_model(model.model_fields[name])
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


def first_set(*values: Any) -> Any:
    return next((value for value in values if value not in (None, "")), None)
