"""Where embedders come from: the default, the adapter for the older protocol, and the providers.

A provider builds an embedder from the ``[embedder]`` table of the settings
(config.model.EmbedderSettings); `EMBEDDER_PROVIDERS` is where a new one plugs in.
`mock` wraps Citadel's own hashed bag-of-words embedder (no download, no network),
which is why this module, alone outside storage/, imports citadeldb.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any, Protocol

import citadeldb

from ..errors import ConfigurationError
from ..hints import closest
from .protocol import Embedder, LegacyEmbedderAdapter


class EmbedderTable(Protocol):
    """The ``[embedder]`` settings a provider reads (config.model.EmbedderSettings)."""

    provider: str
    dim: int | None
    factory: str | None
    options: dict[str, Any]
    model: str | None
    device: str | None


EmbedderBuilder = Callable[[EmbedderTable], Any]


DEFAULT_MOCK_DIM = 128


def default_embedder() -> Embedder:
    """The embedder used when none is given: Citadel's hashed bag-of-words, no download."""
    return citadeldb.MockEmbedder(dim=DEFAULT_MOCK_DIM)


def resolve_embedder(embedder: Any | None) -> Embedder:
    """Return an embedder Citadel accepts, adapting the older protocol.

    Raises `TypeError` naming every missing or malformed member.
    """
    if embedder is None:
        return default_embedder()
    missing = [name for name in ("dim", "metric", "model_id") if not hasattr(embedder, name)]
    has_cancellable = callable(getattr(embedder, "embed_with_cancel", None))
    has_legacy = callable(getattr(embedder, "embed", None))
    if not has_cancellable and not has_legacy:
        missing.append("embed_with_cancel(texts, cancel_token) (or the older embed(texts))")
    if missing:
        raise TypeError(
            f"{type(embedder).__name__} is not an embedder: it lacks {', '.join(missing)}. "
            "An embedder needs dim, metric, model_id and embed_with_cancel(texts, cancel_token); "
            "see citadeldb.MockEmbedder for the protocol."
        )
    _check_identity_types(embedder)
    if has_cancellable:
        checked: Embedder = embedder
        return checked
    return LegacyEmbedderAdapter(embedder)


def _check_identity_types(embedder: Any) -> None:
    problems = []
    dim = embedder.dim
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        problems.append(f"dim must be a positive int (got {dim!r})")
    for name in ("metric", "model_id"):
        value = getattr(embedder, name)
        if not isinstance(value, str) or not value:
            problems.append(f"{name} must be a non-empty str (got {value!r})")
    if problems:
        raise TypeError(f"{type(embedder).__name__} is not a valid embedder: {'; '.join(problems)}.")


_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _mock_embedder(table: EmbedderTable) -> Embedder:
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


def _imported_embedder(table: EmbedderTable) -> Embedder:
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
        problems.append(f"embedder.factory {table.factory!r} is not of the form package.module:callable")
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
    factory: Callable[..., Any] = target
    return factory


def _sentence_transformers_embedder(table: EmbedderTable) -> Embedder:
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
    from .local import DEFAULT_MODEL, SentenceTransformerEmbedder

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
