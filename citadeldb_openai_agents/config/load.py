"""`from_config()`: settings to a store, and the other calls that start from the configuration.

Agent code says ``store = from_config()``; operators configure the rest (see
`CitadelSettings`) and run ``python -m citadeldb_openai_agents check`` (check.py),
which loads the settings exactly as `from_config` does. The other operator commands
open the store with `open_existing_store`, which never creates a file.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from ..embedders.protocol import Embedder
from ..embedders.providers import EMBEDDER_PROVIDERS
from ..errors import (
    ConfigurationError,
    ConfigurationWarning,
    CorruptDatabaseError,
    DatabaseNotFoundError,
    StorageError,
    WrongPassphraseError,
)
from ..hints import closest
from ..offline import file_status, reembed, repair_file, restore_backup, verify_file
from ..options import FIXED_PER_FILE, StoreOptions, coerce_session_settings
from ..results import IntegrityReport, Progress, ReembedSummary, RepairReport, RestoreReport, StatusReport
from ..session import CitadelSessionStore
from ..shards import read_ring_file
from ..storage.files import resolve_path
from .keycommand import run_key_command
from .keyfile import read_key_file
from .model import CitadelSettings
from .provenance import DEFAULT, FROM_FILES, KEY_COMMAND

ConfigSource = str | os.PathLike[str] | CitadelSettings | None


def from_config(config: ConfigSource = None, **overrides: Any) -> CitadelSessionStore:
    """Open the store the configuration describes.

    Args:
        config: A TOML file, a `CitadelSettings`, or None (then ``CITADEL_CONFIG``,
            else ``./citadel.toml`` when it exists, else variables and defaults only).
        **overrides: Settings that win over every other source (``ttl="1h"``, ...).

    Raises `ConfigurationError` listing every problem found in the configuration,
    and `DatabaseNotFoundError` naming the path and its source when the file does
    not exist and ``create`` is false (``from_config(create=False)``,
    ``CITADEL_CREATE=false``), `WrongPassphraseError` naming where the passphrase came
    from; other errors opening the file pass through. Calls that resolve to the same file
    in one process share one open database.
    """
    settings = load_settings(config, **overrides)
    return open_store(settings, build_embedder(settings))


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
    return open_store(settings, build_embedder(settings), existing_only=True)


def verify_from_config(
    config: ConfigSource = None, *, progress: Progress | None = None
) -> tuple[str, IntegrityReport]:
    """The configured file's path and `CitadelSessionStore.verify` report.

    A damaged file refuses to open for use (its open-time audit, or a page the open reads);
    it is then inspected with `verify_file`, which changes nothing, so the report names what
    is damaged. A file too damaged for even that (its header) raises `CorruptDatabaseError`,
    and one Citadel fails on otherwise `StorageError`, each advising what to do now that
    `verify` has run (not to run it).
    """
    settings = load_settings(config)
    try:
        with open_existing_store(settings) as store:
            return store.path, store.verify(progress=progress)
    except CorruptDatabaseError:
        pass  # refused for use: inspected below as it is
    except StorageError as exc:
        told: Exception = exc.advising(_VERIFY_FAILED)
        raise told from None
    path = resolve_path(settings.path)
    try:
        return path, verify_file(path, settings.key.get_secret_value())
    except WrongPassphraseError as exc:
        told = _told_for(settings, exc)
    except CorruptDatabaseError as exc:
        told = exc.advising(_TOO_DAMAGED)
    except StorageError as exc:
        told = exc.advising(_VERIFY_FAILED)
    raise told from None


def status_from_config(config: ConfigSource = None) -> StatusReport:
    """`file_status` of the configured file, with the configuration's ledger, shard and ring.

    Asked of the process that serves the file; read at rest when none does (never opened for
    use, never taken over). Its errors are told in the configuration's terms."""
    settings = load_settings(config)
    options = StoreOptions.of(
        **{option.name: getattr(settings, option.name) for option in fields(StoreOptions)}
    )
    if not os.path.exists(resolve_path(settings.path)):
        raise no_database(settings, existing_only=True)
    try:
        report = file_status(settings.path, settings.key.get_secret_value(), options=options)
    except WrongPassphraseError as exc:
        wrong = _told_for(settings, exc)
    else:
        ring, moving = (
            (settings.shards, None) if settings.ring_file is None else read_ring_file(settings.ring_file)
        )
        ledger = options.erasure_ledger  # absolute, as the store has it
        shards = None if ring is None else tuple(ring)
        return replace(report, ledger=ledger, shard=settings.shard, ring=shards, moving_from=moving)
    raise wrong from None


# What verify advises when it cannot inspect the file at all.
_TOO_DAMAGED = "verify cannot read it: restore the file and its companion files from a backup."
_VERIFY_FAILED = (
    "verify cannot read it: report this error with its message; if the file is damaged, restore "
    "it and its companion files from a backup."
)


def _session_settings(limit: int) -> Any:
    # The SDK is imported there, only now: it costs seconds the operator commands never need.
    return coerce_session_settings({"limit": limit})


def reembed_from_config(config: ConfigSource = None, *, progress: Progress | None = None) -> ReembedSummary:
    """`reembed` the configured file with the configured embedder (the fix for a model change)."""
    settings = load_settings(config)
    try:
        return reembed(
            settings.path, settings.key.get_secret_value(), build_embedder(settings), progress=progress
        )
    except WrongPassphraseError as exc:
        wrong = _told_for(settings, exc)
    except DatabaseNotFoundError as exc:
        if not exc.creation_refused:
            raise
        raise no_database(settings, existing_only=True) from None
    raise wrong from None


def repair_from_config(
    config: ConfigSource = None, *, from_backup: str | os.PathLike[str] | None = None
) -> RepairReport:
    """`repair_file` on the configured file, with the configured embedder; `from_backup` with the
    configured `erasure_ledger` (and `ledger_mirror`), refused when none is set (every erasure
    since the backup would come back into the damaged sessions)."""
    settings = load_settings(config)
    if from_backup is not None and settings.erasure_ledger is None:
        raise ConfigurationError(
            [
                "erasure_ledger is not set: items taken from a backup without the erasure ledger would bring "
                "back what was erased since it was taken. Set erasure_ledger (CITADEL_ERASURE_LEDGER)"
            ],
            config_file=settings.config_file,
        )
    try:
        return repair_file(
            settings.path,
            settings.key.get_secret_value(),
            from_backup=from_backup,
            erasure_ledger=settings.erasure_ledger,
            ledger_mirror=settings.ledger_mirror,
            embedder=build_embedder(settings),
            argon2_profile=settings.argon2_profile,
            sync_mode=settings.sync_mode,
        )
    except WrongPassphraseError as exc:
        wrong = _told_for(settings, exc)
    raise wrong from None


def restore_from_config(
    backup: str | os.PathLike[str], config: ConfigSource = None, *, replace: bool = False, ledger: bool = True
) -> RestoreReport:
    """`restore_backup` to the configured file, erasing again what its `erasure_ledger` recorded.

    Without an ``erasure_ledger`` setting it is refused (every erasure since the backup would
    come back) unless `ledger` is False.
    """
    settings = load_settings(config)
    if ledger and settings.erasure_ledger is None:
        raise ConfigurationError(
            [
                "erasure_ledger is not set: a restore without the erasure ledger brings back every "
                "session erased since the backup was taken. Set erasure_ledger (CITADEL_ERASURE_LEDGER) "
                "to the ledger the service keeps, or pass --without-ledger to restore the backup as it is"
            ],
            config_file=settings.config_file,
        )
    try:
        return restore_backup(
            backup,
            settings.path,
            settings.key.get_secret_value(),
            erasure_ledger=settings.erasure_ledger if ledger else None,
            ledger_mirror=settings.ledger_mirror if ledger else None,
            embedder=build_embedder(settings),
            argon2_profile=settings.argon2_profile,
            sync_mode=settings.sync_mode,
            replace=replace,
        )
    except WrongPassphraseError as exc:
        wrong = _told_for(settings, exc)
    raise wrong from None


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
    embedder: Embedder = builder(table)
    return embedder


def relative_path_warning(settings: CitadelSettings) -> str:
    """Where a relative path resolved, and why a process started elsewhere uses another file."""
    # A TOML file's relative paths are already resolved against its directory, so only
    # an argument, a variable or the default can still depend on the working directory.
    return (
        f"path {settings.path} (from {settings.provenance('path').origin}) is relative, so it "
        f"resolves against the working directory: here {resolve_path(settings.path)}. A "
        "process started in another directory uses another file (and creates it, empty, "
        "unless create is false). Give an absolute path, or set path in the TOML file, "
        "where it resolves against the file's directory."
    )


def open_store(
    settings: CitadelSettings, embedder: Embedder, *, existing_only: bool = False, warn_relative: bool = True
) -> CitadelSessionStore:
    """The store, its errors told in the configuration's terms (which setting, which file).

    A missing file is created as the ``create`` setting says, never when `existing_only`
    (operator commands, check). A path that depends on the working directory warns
    (`ConfigurationWarning`) unless `warn_relative` is false (check reports it itself).
    """
    limit = settings.session_limit
    if warn_relative and not settings.path.is_absolute():
        # Every open, not only a creation: another process of the deployment may use another file.
        warnings.warn(relative_path_warning(settings), ConfigurationWarning, stacklevel=3)
    try:
        store = CitadelSessionStore(
            settings.path,
            settings.key.get_secret_value(),
            embedder=embedder,
            session_settings=None if limit is None else _session_settings(limit),
            create=settings.create and not existing_only,
            serve=settings.serve,
            adopt=left_to_the_owner(settings),
            shards=settings.shards,
            shard=settings.shard,
            ring_file=settings.ring_file,
            max_items=settings.max_items,
            owner_pattern=settings.owner_pattern,
            # Every field of the store's options value, by its name in the settings.
            **{option.name: getattr(settings, option.name) for option in fields(StoreOptions)},
        )
        store.follow_rotation(*_rotation_source(settings))
        return store
    except WrongPassphraseError as exc:
        wrong = _told_for(settings, exc)  # raised outside the handler: no frame of the store's below
    except DatabaseNotFoundError as exc:
        if not exc.creation_refused:
            raise
        raise no_database(settings, existing_only=existing_only) from None
    raise wrong from None


def reread_passphrase(settings: CitadelSettings) -> str | None:
    """The passphrase read again from the source `settings` took it from, as it is now (after
    a key rotation): its key file, the secrets directory's or systemd's ``citadel_key``, or
    ``key_command`` run again. None when it came from ``CITADEL_KEY`` or a ``key=`` argument,
    which cannot change under a running process.

    Raises `ValueError` naming the source, never the passphrase, when it cannot be read now
    (a file gone or empty, a command failing).
    """
    origin = settings.provenance("key").origin
    if origin.kind in FROM_FILES:
        return read_key_file(origin.detail)
    if origin.kind == KEY_COMMAND and settings.key_command is not None:
        passphrase, _ = run_key_command(settings.key_command, settings.key_command_timeout)
        return passphrase
    return None


def _rotation_source(settings: CitadelSettings) -> tuple[Callable[[], str | None] | None, str]:
    """How the store reads its passphrase again after a rotation elsewhere: from a key file or a
    command, yes; from the environment or an argument, which cannot change under a running
    process, no."""
    if settings.provenance("key").origin.kind not in (*FROM_FILES, KEY_COMMAND):
        return None, settings.passphrase_source()
    return (lambda: reread_passphrase(settings)), settings.passphrase_source()


def _told_for(settings: CitadelSettings, exc: WrongPassphraseError) -> WrongPassphraseError:
    """A wrong passphrase told in the configuration's terms: where it came from, how a key file was read."""
    return exc.came_from(settings.passphrase_source(), _key_file_hint(settings))


def left_to_the_owner(settings: CitadelSettings) -> list[str]:
    """The settings fixed per file that the configuration does not set: a client adopts the owner's.

    An operator's command run with only the path and the passphrase then works beside a
    service configured with its TTL, sync mode and embedder; a value set anywhere (TOML,
    variable, argument) must agree with the owner's, and is refused if it does not.
    """

    def unset(name: str) -> bool:
        return settings.provenance(name).origin.kind == DEFAULT

    every = settings.setting_names()
    return [
        name
        for name in FIXED_PER_FILE  # "embedder" is a table: unset when every field of it is
        if all(unset(field) for field in every if field == name or field.startswith(f"{name}."))
    ]


def no_database(settings: CitadelSettings, *, existing_only: bool) -> DatabaseNotFoundError:
    """The store's refusal to create a file, naming where the path and the refusal came from."""
    if existing_only:
        refusal = "operator commands never create one"
        fix = "or pass --config; `python -m citadeldb_openai_agents init` creates it"
    else:
        refusal = f"create is false (from {settings.provenance('create').origin})"
        fix = "or set create = true (CITADEL_CREATE=true) to start a new, empty database there"
    relative = (
        ""
        if settings.path.is_absolute()
        else (f"; {settings.path} is relative, so it resolved against the working directory {os.getcwd()}")
    )
    return DatabaseNotFoundError(
        f"there is no database at {resolve_path(settings.path)} (path from "
        f"{settings.provenance('path').origin}{relative}); {refusal}. Correct CITADEL_PATH / "
        f"path, {fix}.",
        creation_refused=True,
    )


def _key_file_hint(settings: CitadelSettings) -> str:
    """Why a passphrase read from a file may be wrong, without a character of it.

    Returns "" when the passphrase did not come from a file. Its own frame is gone
    before the caller raises, so no traceback holds the passphrase it looks at.
    """
    origin = settings.provenance("key").origin
    if origin.kind not in FROM_FILES:
        return ""
    passphrase = settings.key.get_secret_value()
    if not any(character.isspace() for character in passphrase):
        return (
            f"The file {origin.detail} was read as is (one trailing newline stripped; it holds no "
            "whitespace): check that it holds this database's passphrase."
        )
    edges = []
    if passphrase[0].isspace():
        edges.append(f"starts with {_whitespace_name(passphrase[0])}")
    if passphrase[-1].isspace():
        still = "still " if passphrase[-1] in "\r\n" else ""
        edges.append(f"{still}ends with {_whitespace_name(passphrase[-1])}")
    found = f"; as read, it {' and '.join(edges)}" if edges else ""
    return (
        f"The file {origin.detail} was read as is: one trailing newline stripped, every other "
        "character kept, whitespace included, so whitespace in the file may be the cause"
        f"{found}. If the whitespace is not part of the passphrase, remove it from the file."
    )


def _whitespace_name(character: str) -> str:
    names = {"\n": "a newline", "\r": "a carriage return", " ": "a space", "\t": "a tab"}
    return names.get(character, f"whitespace (U+{ord(character):04X})")
