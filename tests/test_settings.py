"""CitadelSettings and from_config(): every source, precedence, and the deploy mistakes caught."""

from __future__ import annotations

import asyncio
import itertools
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from citadeldb_openai_agents import (
    CitadelSettings,
    ConfigurationError,
    ConfigurationWarning,
    WrongPassphraseError,
    from_config,
)
from citadeldb_openai_agents.config import build_embedder, new_passphrase

PASSPHRASE = "correct horse battery staple 7f3a"
EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"


pytestmark = pytest.mark.usefixtures("clean_environment")


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def problems_of(excinfo: pytest.ExceptionInfo[ConfigurationError]) -> str:
    return "\n".join(excinfo.value.problems)


# -- each source -----------------------------------------------------------------------


def test_defaults_need_only_a_passphrase() -> None:
    settings = CitadelSettings(key=PASSPHRASE)

    assert settings.path == Path("agent_sessions.cdl")
    assert settings.ttl is None
    assert settings.embedder.provider == "mock"
    assert settings.session_limit is None
    assert settings.provenance("ttl").origin.kind == "default"
    assert settings.provenance("key").origin.kind == "argument"


def test_no_passphrase_at_all_is_an_error_naming_where_to_set_one() -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings()

    assert "CITADEL_KEY_FILE" in str(excinfo.value)
    assert "CITADEL_KEY" in str(excinfo.value)


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITADEL_PATH", "env.cdl")
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    monkeypatch.setenv("CITADEL_TTL", "15m")
    monkeypatch.setenv("CITADEL_EMBEDDER__DIM", "64")
    monkeypatch.setenv("CITADEL_SESSION_LIMIT", "20")
    monkeypatch.setenv("CITADEL_ARGON2_PROFILE", "iot")
    monkeypatch.setenv("CITADEL_SYNC_MODE", "normal")

    settings = CitadelSettings()

    assert settings.path == Path("env.cdl")
    assert settings.key.get_secret_value() == PASSPHRASE
    assert settings.ttl == 900
    assert settings.embedder.dim == 64
    assert settings.session_limit == 20
    assert (settings.argon2_profile, settings.sync_mode) == ("iot", "normal")
    assert str(settings.provenance("embedder.dim").origin) == "environment variable CITADEL_EMBEDDER__DIM"


def test_embedder_table_as_json_and_factory_options_from_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    monkeypatch.setenv("CITADEL_EMBEDDER", '{"provider": "import", "factory": "m:f"}')
    monkeypatch.setenv("CITADEL_EMBEDDER__OPTIONS__MODEL", "small")

    settings = CitadelSettings()

    assert settings.embedder.provider == "import"
    assert settings.embedder.options == {"model": "small"}


def test_a_store_opened_from_a_relative_path_in_the_environment_warns_where_it_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers started in two directories would use two files: each says which it uses, every open."""
    for directory in ("a", "b"):
        (tmp_path / directory).mkdir()
        monkeypatch.chdir(tmp_path / directory)
        monkeypatch.setenv("CITADEL_PATH", "agent.cdl")
        with pytest.warns(ConfigurationWarning) as caught:
            store = from_config(key=PASSPHRASE, argon2_profile="iot")
        store.close()
        (message,) = [str(w.message) for w in caught if w.category is ConfigurationWarning]
        assert "path agent.cdl (from environment variable CITADEL_PATH) is relative" in message
        assert f"here {tmp_path / directory / 'agent.cdl'}" in message
    monkeypatch.setenv("CITADEL_PATH", str(tmp_path / "a" / "agent.cdl"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigurationWarning)
        from_config(key=PASSPHRASE).close()  # an absolute path: nothing to warn about


def test_toml_file_in_the_working_directory_with_paths_relative_to_it(tmp_path: Path) -> None:
    write(tmp_path / "secret", PASSPHRASE + "\n")
    write(
        tmp_path / "citadel.toml",
        'path = "data/sessions.cdl"\nkey_file = "secret"\nttl = "24h"\nsession_limit = 50\n'
        '[embedder]\nprovider = "mock"\ndim = 32\n',
    )

    settings = CitadelSettings()

    assert settings.config_file == tmp_path / "citadel.toml"
    assert settings.path == tmp_path / "data" / "sessions.cdl"
    assert settings.key.get_secret_value() == PASSPHRASE
    assert settings.ttl == 86400
    assert settings.embedder.dim == 32
    assert settings.provenance("ttl").origin.kind == "TOML file"
    assert str(settings.provenance("key").origin) == f"key file {tmp_path / 'secret'}"


def test_toml_file_named_by_citadel_config_or_the_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "citadel.toml", "ttl = 1\n")
    write(tmp_path / "from_env.toml", "ttl = 2\n")
    write(tmp_path / "given.toml", "ttl = 3\n")
    monkeypatch.setenv("CITADEL_CONFIG", str(tmp_path / "from_env.toml"))

    assert CitadelSettings(key=PASSPHRASE).ttl == 2
    assert CitadelSettings(_config_file=tmp_path / "given.toml", key=PASSPHRASE).ttl == 3


def test_a_named_toml_file_that_does_not_exist_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CITADEL_CONFIG", str(tmp_path / "missing.toml"))

    with pytest.raises(ConfigurationError, match=r"missing\.toml"):
        CitadelSettings(key=PASSPHRASE)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (PASSPHRASE + "\n", PASSPHRASE),
        (PASSPHRASE + "\r\n", PASSPHRASE),
        (PASSPHRASE, PASSPHRASE),
        (" padded \n\n", " padded \n"),
    ],
)
def test_key_file_loses_one_trailing_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, expected: str
) -> None:
    monkeypatch.setenv("CITADEL_KEY_FILE", str(write(tmp_path / "key", content)))

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == expected
    assert settings.provenance("key").origin.kind == "key file"
    assert str(settings.provenance("key_file").origin) == "environment variable CITADEL_KEY_FILE"


def test_secrets_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    write(secrets / "citadel_key", PASSPHRASE + "\n")
    write(secrets / "citadel_ttl", "7d\n")
    monkeypatch.setenv("CITADEL_SECRETS_DIR", str(secrets))

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == PASSPHRASE
    assert settings.ttl == 7 * 86400
    assert str(settings.provenance("key").origin) == f"secrets directory {secrets / 'citadel_key'}"


def test_a_missing_secrets_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="nowhere"):
        CitadelSettings(key=PASSPHRASE, secrets_dir=tmp_path / "nowhere")


# -- precedence --------------------------------------------------------------------------

SOURCES = ["argument", "environment variable", "secrets directory", "TOML file"]


def set_ttl(source: str, seconds: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Set ttl through one source; return the arguments CitadelSettings needs for it."""
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    if source == "argument":
        return {"ttl": seconds}
    if source == "environment variable":
        monkeypatch.setenv("CITADEL_TTL", str(seconds))
    elif source == "secrets directory":
        write(secrets / "citadel_ttl", str(seconds))
    else:
        write(tmp_path / "citadel.toml", f"ttl = {seconds}\n")
    return {}


@pytest.mark.parametrize(("higher", "lower"), list(itertools.combinations(SOURCES, 2)))
def test_each_source_beats_the_ones_below_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, higher: str, lower: str
) -> None:
    arguments = set_ttl(higher, 100, tmp_path, monkeypatch)
    arguments |= set_ttl(lower, 200, tmp_path, monkeypatch)

    settings = CitadelSettings(key=PASSPHRASE, secrets_dir=tmp_path / "secrets", **arguments)

    assert settings.ttl == 100
    assert settings.provenance("ttl").origin.kind == higher
    assert [origin.kind for origin in settings.provenance("ttl").overrides] == [lower]


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_beats_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    arguments = set_ttl(source, 100, tmp_path, monkeypatch)

    settings = CitadelSettings(key=PASSPHRASE, secrets_dir=tmp_path / "secrets", **arguments)

    assert settings.ttl == 100


def test_nested_values_merge_across_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "citadel.toml", '[embedder]\nprovider = "mock"\ndim = 32\n')
    monkeypatch.setenv("CITADEL_EMBEDDER__DIM", "64")

    settings = CitadelSettings(key=PASSPHRASE)

    assert (settings.embedder.provider, settings.embedder.dim) == ("mock", 64)
    assert settings.provenance("embedder.provider").origin.kind == "TOML file"


def test_citadel_key_beats_a_key_file_named_in_the_toml_file_which_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "citadel.toml", 'key_file = "does-not-exist"\n')
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == PASSPHRASE
    assert settings.key_file is None
    assert [o.kind for o in settings.provenance("key").overrides] == ["TOML file"]


def test_citadel_key_file_beats_the_secrets_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    write(secrets / "citadel_key", "from the secrets directory")
    monkeypatch.setenv("CITADEL_KEY_FILE", str(write(tmp_path / "key", PASSPHRASE)))
    monkeypatch.setenv("CITADEL_SECRETS_DIR", str(secrets))

    assert CitadelSettings().key.get_secret_value() == PASSPHRASE


def test_the_secrets_directory_beats_a_key_file_in_the_toml_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    write(secrets / "citadel_key", PASSPHRASE)
    write(tmp_path / "citadel.toml", 'key_file = "other"\nsecrets_dir = "secrets"\n')

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == PASSPHRASE
    assert settings.provenance("key").origin.kind == "secrets directory"


def test_an_argument_beats_citadel_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITADEL_KEY_FILE", str(write(tmp_path / "key", "from the file")))

    assert CitadelSettings(key=PASSPHRASE).key.get_secret_value() == PASSPHRASE


# -- the mistakes caught -----------------------------------------------------------------


def test_both_citadel_key_and_citadel_key_file_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    monkeypatch.setenv("CITADEL_KEY_FILE", str(write(tmp_path / "key", PASSPHRASE)))

    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings()

    assert "CITADEL_KEY and by environment variable CITADEL_KEY_FILE" in str(excinfo.value)
    assert PASSPHRASE not in str(excinfo.value)


def test_both_key_and_key_file_as_arguments_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="set twice"):
        CitadelSettings(key=PASSPHRASE, key_file=write(tmp_path / "key", PASSPHRASE))


@pytest.mark.parametrize("line", [f'key = "{PASSPHRASE}"', f"key = '''{PASSPHRASE}'''"])
def test_a_passphrase_in_the_toml_file_is_refused(tmp_path: Path, line: str) -> None:
    write(tmp_path / "citadel.toml", line + "\n")

    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings(key="another")

    message = str(excinfo.value)
    assert "CITADEL_KEY" in message and "CITADEL_KEY_FILE" in message and "key_file" in message
    assert PASSPHRASE not in message


def test_invalid_toml_names_the_line_and_never_quotes_it(tmp_path: Path) -> None:
    write(tmp_path / "citadel.toml", f"ttl = 60\nkey = {PASSPHRASE}\n")

    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings(key="another")

    assert "line 2" in str(excinfo.value)
    assert "staple" not in str(excinfo.value)


@pytest.mark.parametrize(
    ("toml", "line"),
    [('path = "app.cdl"\nkey_file = "secret\n', "line 2, column 19"), ("ttl = \n", "line 1, column 7")],
)
def test_a_toml_syntax_error_is_reported_alone_but_other_sources_still_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, line: str
) -> None:
    write(tmp_path / "citadel.toml", toml)
    monkeypatch.setenv("CITADEL_TLL", "60")
    monkeypatch.setenv("CITADEL_SYNC_MODE", "sometimes")

    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings()

    # The key_file the file would have named is missing for that reason alone: no
    # "no passphrase is configured" to send the operator after the wrong problem.
    syntax, unknown, bad_value = excinfo.value.problems
    assert syntax.startswith(f"{tmp_path / 'citadel.toml'} is not valid TOML: ")
    assert f"(at {line})" in syntax
    assert unknown.startswith("unknown environment variable CITADEL_TLL.")
    assert bad_value.startswith("sync_mode (from environment variable CITADEL_SYNC_MODE)")


def test_a_missing_passphrase_is_still_reported_when_the_toml_file_parses(tmp_path: Path) -> None:
    write(tmp_path / "citadel.toml", 'path = "app.cdl"\n')

    with pytest.raises(ConfigurationError, match="no passphrase is configured"):
        CitadelSettings()


@pytest.mark.parametrize(
    ("toml", "unknown", "suggestion"),
    [
        ("tll = 60\n", "'tll'", "ttl"),
        ("sesion_limit = 5\n", "'sesion_limit'", "session_limit"),
        ('[embedder]\nprovder = "mock"\n', "'provder'", "provider"),
    ],
)
def test_an_unknown_toml_key_is_named_with_the_closest_valid_one(
    tmp_path: Path, toml: str, unknown: str, suggestion: str
) -> None:
    write(tmp_path / "citadel.toml", toml)

    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings(key=PASSPHRASE)

    assert unknown in str(excinfo.value)
    assert f"Did you mean {suggestion}?" in str(excinfo.value)


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("CITADEL_TLL", "CITADEL_TTL"),
        ("CITADEL_KEYFILE", "CITADEL_KEY_FILE"),
        ("CITADEL_EMBEDDER__PROVDER", "CITADEL_EMBEDDER__PROVIDER"),
    ],
)
def test_an_unknown_variable_is_named_with_the_closest_valid_one(
    monkeypatch: pytest.MonkeyPatch, variable: str, suggestion: str
) -> None:
    monkeypatch.setenv(variable, "x")

    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings(key=PASSPHRASE)

    assert excinfo.value.problems == [problem for problem in excinfo.value.problems if variable in problem]
    assert f"Did you mean {suggestion}?" in str(excinfo.value)


def test_variables_read_by_other_commands_are_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "empty.toml", "")
    monkeypatch.setenv("CITADEL_CONFIG", str(tmp_path / "empty.toml"))
    monkeypatch.setenv("CITADEL_NEW_KEY", "next")
    monkeypatch.setenv("CITADEL_NEW_KEY_FILE", "next.key")

    assert CitadelSettings(key=PASSPHRASE).ttl is None


def test_an_unknown_argument_is_named_with_the_closest_valid_one() -> None:
    with pytest.raises(ConfigurationError, match="Did you mean ttl"):
        CitadelSettings(key=PASSPHRASE, tll=5)


def test_every_problem_is_reported_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "citadel.toml", 'tll = 60\nkey = "in the file"\nsync_mode = "sometimes"\n')
    monkeypatch.setenv("CITADEL_TLL", "60")
    monkeypatch.setenv("CITADEL_TTL", "soon")
    monkeypatch.setenv("CITADEL_KEY_FILE", str(tmp_path / "missing.key"))

    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings()

    problems = excinfo.value.problems
    assert len(problems) == 6, problems
    for fragment in ["'tll'", "contains the passphrase", "CITADEL_TLL", "'soon'", "missing.key", "sync_mode"]:
        assert any(fragment in problem for problem in problems), fragment


@pytest.mark.parametrize(
    ("ttl", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("24h", 86400),
        ("7d", 604800),
        ("3600", 3600),
        (2.5, 2.5),
        ("1.5h", 5400),
        (" 10 S ", 10),
    ],
)
def test_ttl_takes_seconds_or_a_duration(ttl: object, seconds: float) -> None:
    assert CitadelSettings(key=PASSPHRASE, ttl=ttl).ttl == seconds


@pytest.mark.parametrize("ttl", ["0", 0, -5, "-5m", "abc", "5w", "inf", "nan", True, "1h30m", ""])
def test_bad_ttls_are_refused_with_the_accepted_forms(ttl: object) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        CitadelSettings(key=PASSPHRASE, ttl=ttl)

    assert "90s, 15m, 24h, 7d" in str(excinfo.value)


def test_a_bad_ttl_names_its_source(tmp_path: Path) -> None:
    write(tmp_path / "citadel.toml", "ttl = -1\n")

    with pytest.raises(ConfigurationError, match="TOML file"):
        CitadelSettings(key=PASSPHRASE)


def test_a_key_file_others_can_read_gets_a_warning(tmp_path: Path) -> None:
    shared = write(tmp_path / "key", PASSPHRASE, mode=0o644)

    with pytest.warns(ConfigurationWarning, match="chmod 600") as record:
        CitadelSettings(key_file=shared)

    assert all(PASSPHRASE not in str(warning.message) for warning in record)


def test_a_private_key_file_gets_no_warning(tmp_path: Path) -> None:
    private = write(tmp_path / "key", PASSPHRASE, mode=0o600)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CitadelSettings(key_file=private)


@pytest.mark.parametrize("content", ["", "\n"])
def test_an_empty_key_file_is_an_error_naming_it(tmp_path: Path, content: str) -> None:
    empty = write(tmp_path / "empty.key", content)

    with pytest.raises(ConfigurationError, match=f"{empty} is empty"):
        CitadelSettings(key_file=empty)


def test_a_missing_key_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"nowhere\.key does not exist"):
        CitadelSettings(key_file=tmp_path / "nowhere.key")


def test_the_passphrase_never_shows_in_a_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)

    settings = CitadelSettings()

    assert PASSPHRASE not in repr(settings) and PASSPHRASE not in str(settings)


# -- from_config ---------------------------------------------------------------------------


def test_from_config_opens_the_store_the_settings_describe(tmp_path: Path) -> None:
    write(tmp_path / "key", PASSPHRASE + "\n")
    write(
        tmp_path / "citadel.toml",
        'path = "app.cdl"\nkey_file = "key"\nttl = "1h"\nsession_limit = 7\n'
        'argon2_profile = "iot"\n[embedder]\ndim = 32\n',
    )

    with from_config() as store:
        assert store.path == str(tmp_path / "app.cdl")
        assert store.ttl == 3600
        assert store.session_settings is not None and store.session_settings.limit == 7
        assert store.embedder_identity.dim == 32


async def test_from_config_calls_on_one_file_share_the_open_database(tmp_path: Path) -> None:
    config = write(tmp_path / "app.toml", 'argon2_profile = "iot"\n')

    with (
        from_config(config, key=PASSPHRASE) as first,
        from_config(CitadelSettings(_config_file=config, key=PASSPHRASE)) as second,
    ):
        await first.session("user-123").add_items([{"role": "user", "content": "hi"}])

        assert second.session_ids() == ["user-123"]


def test_from_config_overrides_win_over_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    monkeypatch.setenv("CITADEL_TTL", "1h")

    with from_config(ttl="2h", argon2_profile="iot") as store:
        assert store.ttl == 7200


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """A file made with PASSPHRASE, and a citadel.toml naming it."""
    with from_config(key=PASSPHRASE, path=tmp_path / "app.cdl", argon2_profile="iot"):
        pass
    write(tmp_path / "citadel.toml", 'path = "app.cdl"\n')
    return tmp_path / "app.cdl"


READ_AS_IS = (
    "read as is: one trailing newline stripped, every other character kept, whitespace "
    "included, so whitespace in the file may be the cause"
)


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (PASSPHRASE + "\n\n", "; as read, it still ends with a newline."),
        (" " + PASSPHRASE + "\n", "; as read, it starts with a space."),
        ("\t" + PASSPHRASE + " \r\n", "; as read, it starts with a tab and ends with a space."),
        ("not the passphrase\n", ". If the whitespace"),  # nothing at the edges to point at
    ],
)
@pytest.mark.parametrize("source", ["CITADEL_KEY_FILE", "secrets directory"])
def test_a_wrong_passphrase_from_a_file_says_how_the_file_was_read(
    database: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    content: str,
    found: str,
    source: str,
) -> None:
    if source == "CITADEL_KEY_FILE":
        key_file = write(tmp_path / "citadel.key", content)
        monkeypatch.setenv("CITADEL_KEY_FILE", str(key_file))
    else:
        (tmp_path / "secrets").mkdir()
        key_file = write(tmp_path / "secrets" / "citadel_key", content)
        monkeypatch.setenv("CITADEL_SECRETS_DIR", str(tmp_path / "secrets"))

    with pytest.raises(WrongPassphraseError) as caught:
        from_config()

    message = str(caught.value)
    assert message.startswith(f"wrong passphrase for {database}")
    assert f"The file {key_file} was {READ_AS_IS}{found}" in message
    assert PASSPHRASE not in message and "not the passphrase" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_wrong_passphrase_without_whitespace_from_a_file_gets_no_whitespace_hint(
    database: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = write(tmp_path / "citadel.key", "wrong-passphrase\n")
    monkeypatch.setenv("CITADEL_KEY_FILE", str(key_file))

    with pytest.raises(WrongPassphraseError) as caught:
        from_config()

    message = str(caught.value)
    assert f"The file {key_file} was read as is (" in message
    assert "holds no whitespace" in message and "may be the cause" not in message
    assert "wrong-passphrase" not in message


def test_a_wrong_passphrase_from_a_variable_gets_no_key_file_hint(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE + "\n")

    with pytest.raises(WrongPassphraseError) as caught:
        from_config()

    assert "read as is" not in str(caught.value)
    assert "(it came from the environment variable CITADEL_KEY)" in str(caught.value)


# -- embedders -----------------------------------------------------------------------------

FACTORY_MODULE = """
import citadeldb

def make(dim=16):
    return citadeldb.MockEmbedder(dim=dim)

def not_an_embedder():
    return object()

def broken(**options):
    raise RuntimeError("the model server is down")

NOT_CALLABLE = 42
"""


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "my_embedders.py").write_text(FACTORY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_embedders"
    sys.modules.pop("my_embedders", None)


def embedder_settings(**table: object) -> CitadelSettings:
    return CitadelSettings(key=PASSPHRASE, embedder=table)


def test_import_provider_calls_the_factory_with_the_options(factories: str) -> None:
    settings = embedder_settings(provider="import", factory=f"{factories}:make", options={"dim": 24})

    assert build_embedder(settings).dim == 24


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_package.embedders:make", "cannot import no_such_package.embedders"),
        ("my_embedders:mkae", "has no attribute 'mkae'. Did you mean make?"),
        ("my_embedders:not_an_embedder", "not an embedder: object is not an embedder"),
        ("my_embedders:NOT_CALLABLE", "not a callable"),
        ("my_embedders:broken", "raised RuntimeError: the model server is down"),
        ("my_embedders.make", "not of the form package.module:callable"),
    ],
)
def test_embedder_factory_errors_name_the_cause(factories: str, factory: str, message: str) -> None:
    settings = embedder_settings(provider="import", factory=factory)

    with pytest.raises(ConfigurationError, match=message.replace(".", r"\.").replace("?", r"\?")):
        build_embedder(settings)


def test_import_provider_without_a_factory_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match=r"needs embedder\.factory"):
        build_embedder(embedder_settings(provider="import"))


def test_an_unknown_provider_is_named_with_the_closest_valid_one() -> None:
    with pytest.raises(ConfigurationError, match="Did you mean mock"):
        build_embedder(embedder_settings(provider="mokc"))


def test_from_config_reports_a_bad_factory_before_opening_anything(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        from_config(key=PASSPHRASE, embedder={"provider": "import", "factory": "nope:make"})

    assert not (tmp_path / "agent_sessions.cdl").exists()


# -- the example file ------------------------------------------------------------------------


def test_the_example_file_documents_every_variable_and_key() -> None:
    text = EXAMPLE.read_text()

    for variable in CitadelSettings.environment_variables():
        assert variable in text, variable
    for name in CitadelSettings.setting_names():
        assert f"{name.split('.')[-1]} =" in text, name


def test_the_example_file_loads_as_it_stands() -> None:
    settings = CitadelSettings(_config_file=EXAMPLE, key=PASSPHRASE)

    assert settings.config_file == EXAMPLE


def test_a_table_that_is_not_json_is_listed_with_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CITADEL_KEY", "k")
    monkeypatch.setenv("CITADEL_EMBEDDER", "{not json")
    with pytest.raises(ConfigurationError, match="CITADEL_EMBEDDER is not valid JSON"):
        CitadelSettings()
    monkeypatch.delenv("CITADEL_EMBEDDER")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "citadel_embedder").write_text("{not json")
    monkeypatch.setenv("CITADEL_SECRETS_DIR", str(secrets))
    with pytest.raises(ConfigurationError, match="citadel_embedder is not valid JSON"):
        CitadelSettings()


# -- a passphrase variable unset after it was read (config/taken.py) ----------------------------


def test_citadel_key_unset_since_it_was_read_gives_way_to_whatever_source_is_set_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a test suite does it (monkeypatch.setenv/delenv per configuration), in one process:
    CITADEL_KEY is taken out of os.environ when read, and once unset it counts only where no
    other source gives a passphrase."""
    monkeypatch.setenv("CITADEL_ARGON2_PROFILE", "iot")
    with monkeypatch.context() as first:
        first.setenv("CITADEL_KEY", PASSPHRASE)
        first.setenv("CITADEL_PATH", str(tmp_path / "first.cdl"))
        with from_config() as store:  # children never inherit it: test_key_sources checks that
            asyncio.run(store.session("user-1").add_items([{"role": "user", "content": "hello"}]))
    key_file = write(tmp_path / "other.key", "the key file's passphrase\n")
    with monkeypatch.context() as second:  # CITADEL_KEY is unset now; a key file is named
        second.setenv("CITADEL_KEY_FILE", str(key_file))
        settings = CitadelSettings()
        assert settings.key.get_secret_value() == "the key file's passphrase"
        assert settings.provenance("key").origin.kind == "key file"
    toml = write(tmp_path / "deploy.toml", f'key_file = "{key_file}"\n')
    with monkeypatch.context() as third:  # a TOML file names one
        third.setenv("CITADEL_CONFIG", str(toml))
        assert CitadelSettings().key.get_secret_value() == "the key file's passphrase"
    printer = write(tmp_path / "print-key", "#!/bin/sh\necho 'the command passphrase'\n", mode=0o700)
    with monkeypatch.context() as fourth:  # a key command
        fourth.setenv("CITADEL_KEY_COMMAND", str(printer))
        assert CitadelSettings().key.get_secret_value() == "the command passphrase"
    with monkeypatch.context() as fifth:  # nothing else set: the kept value still opens the file
        fifth.setenv("CITADEL_PATH", str(tmp_path / "first.cdl"))
        settings = CitadelSettings()
        assert str(settings.provenance("key").origin) == "environment variable CITADEL_KEY"
        with from_config(settings) as store:
            assert store.session_ids() == ["user-1"]
    # The rotation's and the import's variables follow the same rule.
    with monkeypatch.context() as rotation:
        rotation.setenv("CITADEL_NEW_KEY", "new one")
        assert new_passphrase() == ("new one", "CITADEL_NEW_KEY")
    with monkeypatch.context() as rotation:
        rotation.setenv("CITADEL_NEW_KEY_FILE", str(key_file))
        assert new_passphrase() == ("the key file's passphrase", f"CITADEL_NEW_KEY_FILE {key_file}")
