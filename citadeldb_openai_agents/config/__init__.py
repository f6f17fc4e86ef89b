"""Configuration: settings from TOML, ``CITADEL_*`` variables, key files, key commands, a
secrets directory and systemd credentials, with where each value came from; `from_config`
and `check`.

* model.py: `CitadelSettings`, the fields and their validation;
* sources.py: each source (environment, secrets directory, credentials, TOML file);
* provenance.py: where each value came from, and one load's problems;
* names.py: setting names and their variables; keyfile.py: reading a passphrase file;
* keycommand.py: running a command that prints the passphrase;
* taken.py: passphrase variables taken out of the environment, kept in the process;
* load.py: `from_config` and the other calls that start from the configuration (`status_from_config`...);
* check.py: the ``check`` command's report; notices.py: configuration warnings.
"""

from ..storage.files import database_files
from .check import CheckReport, DatabaseReport, SettingReport, check_configuration
from .keycommand import run_key_command
from .keyfile import new_passphrase, read_key_file, source_passphrase
from .load import (
    ConfigSource,
    build_embedder,
    from_config,
    load_settings,
    open_existing_store,
    reembed_from_config,
    repair_from_config,
    reread_passphrase,
    restore_from_config,
    status_from_config,
    verify_from_config,
)
from .model import CitadelSettings, EmbedderSettings
from .names import environment_variable
from .notices import configuration_warnings
from .provenance import Origin, Provenance
from .taken import forget_taken_variables

__all__ = [
    "CheckReport",
    "CitadelSettings",
    "ConfigSource",
    "DatabaseReport",
    "EmbedderSettings",
    "Origin",
    "Provenance",
    "SettingReport",
    "build_embedder",
    "check_configuration",
    "configuration_warnings",
    "database_files",
    "environment_variable",
    "forget_taken_variables",
    "from_config",
    "load_settings",
    "new_passphrase",
    "open_existing_store",
    "read_key_file",
    "reembed_from_config",
    "repair_from_config",
    "reread_passphrase",
    "restore_from_config",
    "run_key_command",
    "source_passphrase",
    "status_from_config",
    "verify_from_config",
]
