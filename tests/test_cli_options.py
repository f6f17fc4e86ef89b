"""The command line's options that apply to every command: --version, and --config and --json
before the command as well as after it (as git and docker accept theirs); every command that
prints a report has --json."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_operator_cli import PASSPHRASE, run_here

from citadeldb_openai_agents import CitadelSessionStore, __version__
from citadeldb_openai_agents.cli.main import _parser

# The two commands that print no report: a demo's conversation, and a server's log.
NO_REPORT = {"demo", "serve"}


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot") as store:
        asyncio.run(store.session("user-123").add_items([{"role": "user", "content": "hi"}]))
    return path


@pytest.fixture
def config(database: Path) -> Path:
    """A TOML file naming the database, for --config (CITADEL_PATH is unset in each test)."""
    path = database.parent / "prod.toml"
    path.write_text(f'path = "{database}"\n')
    return path


def test_version_prints_the_packages_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"python -m citadeldb_openai_agents {__version__}\n"


def test_config_and_json_before_the_command_count_as_after_it(
    database: Path, config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    after = run_here(
        capsys, monkeypatch, database, "sessions", "--config", str(config), "--json", CITADEL_PATH=None
    )
    before = run_here(
        capsys, monkeypatch, database, "--config", str(config), "--json", "sessions", CITADEL_PATH=None
    )
    assert before == after and after[0] == 0
    assert [entry["session_id"] for entry in json.loads(before[1])] == ["user-123"]


def test_an_option_a_command_lacks_is_refused_before_it_too(
    database: Path, config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for args, message in (
        (["--config", str(config), "demo"], "demo reads no configuration"),
        (["--json", "serve"], "serve prints no report"),
        (["--config", str(config), "sessions", "--config", "other.toml"], "--config given twice"),
    ):
        with pytest.raises(SystemExit) as exited:
            run_here(capsys, monkeypatch, database, *args)
        assert exited.value.code == 2 and message in capsys.readouterr().err


def test_every_command_that_prints_a_report_has_json() -> None:
    subcommands = next(action for action in _parser()._actions if action.dest == "command")
    lacking = {
        name
        for name, parser in subcommands.choices.items()  # type: ignore[union-attr]
        if "json" not in {action.dest for action in parser._actions}
    }
    assert lacking == NO_REPORT


def test_init_backup_rotate_key_and_reembed_report_as_json(
    database: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def report(*args: str, **variables: str | None) -> dict[str, object]:
        code, out, err = run_here(capsys, monkeypatch, database, "--json", *args, **variables)
        assert code == 0, err
        parsed: dict[str, object] = json.loads(out)
        return parsed

    made = report("init", CITADEL_PATH=str(tmp_path / "new.cdl"))
    assert made["created"] is True and made["files"] == {
        name: "600"
        for name in (
            "new.cdl",
            *(f"new.cdl.citadel-{part}" for part in ("atomkeys", "audit", "keys", "regions")),
        )
    }
    assert report("init")["created"] is False
    copied = report("backup", str(tmp_path / "copy.cdl"))
    assert copied["files"][0] == {
        "path": str(tmp_path / "copy.cdl"),
        "bytes": (tmp_path / "copy.cdl").stat().st_size,
    }  # type: ignore[index]
    (tmp_path / "new.key").write_text("a new passphrase for the test\n")
    (tmp_path / "new.key").chmod(0o600)
    rotated = report("rotate-key", "--new-key-file", str(tmp_path / "new.key"))
    assert rotated == {
        "database": str(database),
        "changed": True,
        "verified": True,
        "key_source": "environment variable CITADEL_KEY",
    }
    again = report("reembed", CITADEL_KEY="a new passphrase for the test")
    assert again["items"] == 1 and again["regions"] == 3
