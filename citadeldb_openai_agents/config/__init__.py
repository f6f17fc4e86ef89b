"""Configuration: settings from TOML, ``CITADEL_*`` variables, key files and a secrets
directory, with where each value came from; `from_config` and `check`.

* model.py: `CitadelSettings`, the fields and their validation;
* sources.py: each source (environment, secrets directory, TOML file);
* provenance.py: where each value came from, and one load's problems;
* names.py: setting names and their variables; keyfile.py: reading a passphrase file;
* load.py: `from_config` and the other calls that start from the configuration;
* check.py: the ``check`` command's report; notices.py: configuration warnings.
"""

from ..storage.files import database_files
from .check import CheckReport, DatabaseReport, SettingReport, check_configuration
from .keyfile import new_passphrase, read_key_file, source_passphrase
from .load import (
    ConfigSource,
    build_embedder,
    from_config,
    load_settings,
    open_existing_store,
    reembed_from_config,
    repair_from_config,
    restore_from_config,
    verify_from_config,
)
from .model import CitadelSettings, EmbedderSettings
from .names import environment_variable
from .notices import configuration_warnings
from .provenance import Origin, Provenance

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
    "from_config",
    "load_settings",
    "new_passphrase",
    "open_existing_store",
    "read_key_file",
    "reembed_from_config",
    "repair_from_config",
    "restore_from_config",
    "source_passphrase",
    "verify_from_config",
]
