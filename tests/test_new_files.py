"""A new database is never silent: created only where allowed, and logged with its absolute path.

A relative path resolves against the working directory, so a process started elsewhere
would otherwise start an empty database there while the conversations sit in another.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSessionStore, DatabaseNotFoundError, from_config

from conftest import KEY

LOGGER = "citadeldb_openai_agents"

pytestmark = pytest.mark.usefixtures("clean_environment")  # the working directory is tmp_path


def created(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.INFO and r.getMessage().startswith("created ")
    ]


def test_creating_a_file_is_logged_with_its_absolute_path(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    CitadelSessionStore("agent.cdl", KEY, argon2_profile="iot").close()

    assert created(caplog) == [f"created a new Citadel database at {tmp_path / 'agent.cdl'}"]


def test_opening_an_existing_file_logs_nothing(tmp_path: Path, caplog) -> None:
    CitadelSessionStore("agent.cdl", KEY, argon2_profile="iot").close()
    caplog.set_level(logging.INFO, logger=LOGGER)

    CitadelSessionStore(tmp_path / "agent.cdl", KEY).close()
    with CitadelSessionStore(tmp_path / "agent.cdl", KEY), CitadelSessionStore("agent.cdl", KEY):
        pass  # the second one joins the open file

    assert created(caplog) == []


def test_from_config_logs_the_file_it_creates(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)

    with from_config(key=KEY, path="sessions.cdl", argon2_profile="iot"):
        pass

    assert created(caplog) == [f"created a new Citadel database at {tmp_path / 'sessions.cdl'}"]


def test_create_false_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(DatabaseNotFoundError) as caught:
        CitadelSessionStore("agent.cdl", KEY, create=False)

    assert str(caught.value).startswith(
        f"there is no database at {tmp_path / 'agent.cdl'} (agent.cdl is relative, so it resolved "
        "against the working directory), and create=False forbids creating one."
    )
    assert "pass create=True" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_create_false_opens_an_existing_file(tmp_path: Path) -> None:
    CitadelSessionStore("agent.cdl", KEY, argon2_profile="iot").close()

    with CitadelSessionStore("agent.cdl", KEY, create=False) as store:
        assert store.session_ids() == []


def test_from_config_create_false_names_the_absolute_path_and_both_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CITADEL_PATH", "sessions.cdl")

    with pytest.raises(DatabaseNotFoundError) as caught:
        from_config(key=KEY, create=False)

    message = str(caught.value)
    assert message.startswith(
        f"there is no database at {tmp_path / 'sessions.cdl'} (path from environment variable "
        f"CITADEL_PATH; sessions.cdl is relative, so it resolved against the working directory "
        f"{tmp_path}); create is false (from argument create)."
    )
    assert "set create = true (CITADEL_CREATE=true)" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("variables", "toml", "source"),
    [
        ({"CITADEL_CREATE": "false"}, "", "environment variable CITADEL_CREATE"),
        ({}, "create = false\n", "TOML file"),
    ],
)
def test_a_create_false_setting_refuses_a_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], toml: str, source: str
) -> None:
    (tmp_path / "citadel.toml").write_text('path = "sessions.cdl"\n' + toml)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(DatabaseNotFoundError, match=f"create is false \\(from {source}"):
        from_config(key=KEY)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["citadel.toml"]
