"""The names settings go by: fields, dotted names, and the environment variables that spell them."""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ENV_PREFIX = "CITADEL_"

CONFIG_VARIABLE = "CITADEL_CONFIG"

DEFAULT_CONFIG_FILE = "citadel.toml"

# Set by systemd for a unit with LoadCredential=: its citadel_key file holds the passphrase.
CREDENTIALS_VARIABLE = "CREDENTIALS_DIRECTORY"

# Read by commands rather than by CitadelSettings (rotate-key's new passphrase), so valid names.
OTHER_VARIABLES = {
    CONFIG_VARIABLE: "the TOML file to read (default: ./citadel.toml when it exists)",
    CREDENTIALS_VARIABLE: "set by systemd (LoadCredential=citadel_key:...): its citadel_key file holds "
    "the passphrase, ranked with the secrets directory (below it)",
    "CITADEL_NEW_KEY": "the new passphrase for the rotate-key command",
    "CITADEL_NEW_KEY_FILE": "a file holding the new passphrase for the rotate-key command",
    "CITADEL_SOURCE_KEY": "the passphrase of a citadeldb-openai-agents 2.x file to import",
    "CITADEL_SOURCE_KEY_FILE": "a file holding the passphrase of a citadeldb-openai-agents 2.x file to import",
}

OPTION_VARIABLES = f"{ENV_PREFIX}EMBEDDER__OPTIONS__<NAME>"


def environment_variable(name: str) -> str:
    """A setting's variable: ``ttl`` is CITADEL_TTL, ``embedder.dim`` CITADEL_EMBEDDER__DIM."""
    return ENV_PREFIX + name.upper().replace(".", "__")


def setting_fields(cls: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    for name, info in cls.model_fields.items():
        nested = nested_model(info)
        if nested is None:
            yield name, info
        else:
            for sub, sub_info in nested.model_fields.items():
                yield f"{name}.{sub}", sub_info


def nested_model(info: FieldInfo) -> type[BaseModel] | None:
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
