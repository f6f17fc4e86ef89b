"""`python -m citadeldb_openai_agents check`, run as operators run it: in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSettings, from_config

PASSPHRASE = "correct horse battery staple 7f3a"
WRONG = "wrong passphrase 91c2e"


pytestmark = pytest.mark.usefixtures("clean_environment")


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "citadeldb_openai_agents", "check", *args]


def environment(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CITADEL_")}
    return env | variables


def check(*args: str, cwd: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args),
        cwd=cwd,
        env=environment(**variables),
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def deployed(tmp_path: Path) -> Path:
    """A directory as an operator leaves it: citadel.toml, a key file, a database with one session."""
    write(tmp_path / "citadel.key", PASSPHRASE + "\n")
    write(
        tmp_path / "citadel.toml",
        'path = "app.cdl"\nkey_file = "citadel.key"\nargon2_profile = "iot"\nttl = "7d"\n',
    )
    with from_config(tmp_path / "citadel.toml") as store:
        asyncio.run(store.session("user-123").add_items([{"role": "user", "content": "hello"}]))
    return tmp_path


def test_a_usable_configuration_exits_0_with_every_value_and_its_source(deployed: Path) -> None:
    result = check(cwd=deployed, CITADEL_SESSION_LIMIT="20")

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"key file {deployed / 'citadel.key'}" in out
    assert "environment variable CITADEL_SESSION_LIMIT" in out
    assert f"TOML file {deployed / 'citadel.toml'}" in out
    assert "passphrase: verified" in out
    assert "sessions:   1" in out
    assert re.search(r"^  ttl +7d +TOML file", out, re.MULTILINE), out  # as written, not 604800 s


def test_json_reports_sessions_and_the_size_of_the_file_and_its_companions(deployed: Path) -> None:
    result = check("--json", cwd=deployed)

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["settings"]["key"] == {
        "value": "set",
        "source": "key file",
        "detail": str(deployed / "citadel.key"),
        "overrides": [],
    }
    assert report["settings"]["ttl"]["value"] == 7 * 86400
    database = report["database"]
    assert (database["passphrase_verified"], database["sessions"]) == (True, 1)
    files = [deployed / "app.cdl", *deployed.glob("app.cdl.citadel-*")]
    assert len(files) > 1
    assert database["size_bytes"] == sum(f.stat().st_size for f in files)


def test_a_wrong_passphrase_exits_1(deployed: Path) -> None:
    (deployed / "citadel.toml").write_text('path = "app.cdl"\n')

    result = check("--json", cwd=deployed, CITADEL_KEY=WRONG)

    assert result.returncode == 1
    assert any("wrong passphrase" in p for p in json.loads(result.stdout)["problems"])


def test_every_configuration_problem_is_listed_and_exits_1(tmp_path: Path) -> None:
    write(tmp_path / "citadel.toml", "tll = 60\n")

    result = check(cwd=tmp_path, CITADEL_KEY=PASSPHRASE, CITADEL_SYNC_MOD="off", CITADEL_TTL="0")

    assert result.returncode == 1
    for fragment in ["Did you mean ttl?", "Did you mean CITADEL_SYNC_MODE?", "not a positive duration"]:
        assert fragment in result.stderr


def test_no_open_checks_the_settings_and_leaves_the_disk_alone(tmp_path: Path) -> None:
    result = check("--no-open", cwd=tmp_path, CITADEL_KEY=PASSPHRASE)

    assert result.returncode == 0, result.stderr
    assert "database" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_database_not_created_yet_is_usable_and_not_created_by_check(tmp_path: Path) -> None:
    result = check("--json", cwd=tmp_path, CITADEL_KEY=PASSPHRASE)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["database"]["exists"] is False
    assert list(tmp_path.iterdir()) == []


def running_service(deployed: Path, **variables: str) -> Iterator[subprocess.Popen[str]]:
    service = "import sys\nfrom citadeldb_openai_agents import from_config\nstore = from_config()\n"
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            service + "print('serving', flush=True)\nsys.stdin.readline()\nstore.close()\n",
        ],
        cwd=deployed,
        env={**environment(), **variables},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "serving\n"
    yield process
    process.communicate("\n", timeout=60)


@pytest.fixture
def held(deployed: Path) -> Iterator[subprocess.Popen[str]]:
    """The running service, keeping the deployed database to itself (serve = false)."""
    yield from running_service(deployed, CITADEL_SERVE="false")


@pytest.fixture
def served(deployed: Path) -> Iterator[subprocess.Popen[str]]:
    """The running service, serving the deployed database to other processes (the default)."""
    yield from running_service(deployed)


def test_a_file_the_service_serves_is_checked_through_it(
    deployed: Path, served: subprocess.Popen[str]
) -> None:
    text, as_json = check(cwd=deployed), check("--json", cwd=deployed)

    assert text.returncode == as_json.returncode == 0, text.stderr
    assert f"held by process {served.pid}, serving; passphrase verified through the owner" in text.stdout
    report = json.loads(as_json.stdout)["database"]
    assert (report["served_by"], report["passphrase_verified"], report["locked"]) == (served.pid, True, False)


def test_a_wrong_passphrase_is_caught_through_the_service(
    deployed: Path, served: subprocess.Popen[str]
) -> None:
    write(deployed / "key.txt", "not the passphrase\n")
    wrong = check(cwd=deployed, CITADEL_KEY_FILE=str(deployed / "key.txt"))
    assert wrong.returncode == 1 and "does not accept it" in wrong.stderr


def test_a_file_held_by_the_service_says_the_configuration_is_valid_and_names_the_holder(
    deployed: Path, held: subprocess.Popen[str]
) -> None:
    text, as_json = check(cwd=deployed), check("--json", cwd=deployed)

    assert text.returncode == as_json.returncode == 1  # the passphrase was not verified
    assert f"held by another process, PID {held.pid}" in text.stdout
    assert "not opened, so the passphrase was not verified" in text.stdout
    [problem] = json.loads(as_json.stdout)["problems"]
    for output in (text.stderr, problem):
        assert "the configuration is valid" in output
        assert f"{deployed / 'app.cdl'} is held by another process, PID {held.pid}" in output
        assert "the passphrase could not be verified" in output
        assert "check --no-open` checks the configuration alone" in output
    report = json.loads(as_json.stdout)
    assert (report["ok"], report["configuration_ok"]) == (False, True)
    assert report["database"]["locked"] is True
    assert report["database"]["held_by"]["pid"] == held.pid
    assert report["database"]["passphrase_verified"] is False
    assert check("--no-open", cwd=deployed).returncode == 0


def test_a_relative_path_is_warned_about_with_where_it_resolves(deployed: Path) -> None:
    text = check(cwd=deployed, CITADEL_PATH="app.cdl")
    as_json = check("--json", cwd=deployed, CITADEL_PATH="app.cdl")

    assert text.returncode == as_json.returncode == 0, text.stderr
    warning = (
        "path app.cdl (from environment variable CITADEL_PATH) is relative, so it resolves "
        f"against the working directory: here {deployed / 'app.cdl'}"
    )
    assert f"warning: {warning}" in text.stderr
    assert text.stderr.count(warning) == 1, text.stderr  # check's own, not the opening's again
    assert any(warning in w for w in json.loads(as_json.stdout)["warnings"])


def test_a_relative_path_in_the_toml_file_is_shown_resolved_against_it_without_a_warning(
    deployed: Path,
) -> None:
    result = check("--json", "--no-open", cwd=deployed)  # citadel.toml says path = "app.cdl"

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["path"]["value"] == str(deployed / "app.cdl")
    assert report["warnings"] == []


def test_create_false_with_no_database_is_a_problem_naming_the_path_and_both_sources(
    tmp_path: Path,
) -> None:
    result = check(
        cwd=tmp_path, CITADEL_KEY=PASSPHRASE, CITADEL_PATH=str(tmp_path / "typo.cdl"), CITADEL_CREATE="false"
    )

    assert result.returncode == 1
    assert re.search(r"\n  create +false +environment variable CITADEL_CREATE\n", result.stdout)
    assert "does not exist, and create is false" in result.stdout
    assert (
        f"there is no database at {tmp_path / 'typo.cdl'} (path from environment variable "
        "CITADEL_PATH); create is false (from environment variable CITADEL_CREATE)" in result.stderr
    )
    assert list(tmp_path.iterdir()) == []


def test_a_toml_syntax_error_is_reported_without_its_follow_on_problems(tmp_path: Path) -> None:
    write(tmp_path / "citadel.toml", 'path = "app.cdl"\nkey_file = "citadel.key\n')

    text = check(cwd=tmp_path, CITADEL_TLL="60")
    as_json = check("--json", cwd=tmp_path, CITADEL_TLL="60")

    assert text.returncode == as_json.returncode == 1
    problems = json.loads(as_json.stdout)["problems"]
    assert len(problems) == 2, problems
    assert f"{tmp_path / 'citadel.toml'} is not valid TOML" in problems[0]
    assert "(at line 2, column 24)" in problems[0]
    assert "Did you mean CITADEL_TTL?" in problems[1]
    assert "not usable, 2 problems" in text.stderr and "passphrase" not in text.stderr


def test_a_usage_error_exits_2(tmp_path: Path) -> None:
    result = check("--no-such-flag", cwd=tmp_path)

    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_help_documents_every_variable(tmp_path: Path) -> None:
    result = check("--help", cwd=tmp_path)

    assert result.returncode == 0
    for variable in CitadelSettings.environment_variables():
        assert variable in result.stdout, variable


# Every path through check, errors included; the output format alternates between them.
LEAK_SCENARIOS = {
    "valid, key in a variable": ({"CITADEL_KEY": PASSPHRASE}, ""),
    "valid, key file readable by others": ({"CITADEL_KEY_FILE": "citadel.key"}, ""),
    "wrong passphrase": ({"CITADEL_KEY": WRONG}, ""),
    "both key sources": ({"CITADEL_KEY": PASSPHRASE, "CITADEL_KEY_FILE": "citadel.key"}, ""),
    "passphrase in the TOML file": ({}, f'key = "{PASSPHRASE}"\n'),
    "passphrase unquoted in the TOML file": ({}, f"key = {PASSPHRASE}\n"),
    "bad values with the key set": (
        {"CITADEL_KEY": PASSPHRASE, "CITADEL_TTL": "never", "CITADEL_KYE": PASSPHRASE},
        'argon2_profile = "fast"\n',
    ),
    "a bad factory": (
        {
            "CITADEL_KEY": PASSPHRASE,
            "CITADEL_EMBEDDER__PROVIDER": "import",
            "CITADEL_EMBEDDER__FACTORY": "nope:make",
        },
        "",
    ),
}


def copy_deployment(source: Path, target: Path, toml: str) -> None:
    target.mkdir()
    for path in [source / "citadel.key", source / "app.cdl", *source.glob("app.cdl.citadel-*")]:
        (target / path.name).write_bytes(path.read_bytes())
    (target / "citadel.key").chmod(0o644)  # the permission warning's path too
    (target / "citadel.toml").write_text('path = "app.cdl"\n' + toml)


def test_the_passphrase_never_appears_in_any_output(deployed: Path) -> None:
    runs = []
    for number, (name, (variables, toml)) in enumerate(LEAK_SCENARIOS.items()):
        directory = deployed / f"scenario-{number}"
        copy_deployment(deployed, directory, toml)
        args = ("--json",) if number % 2 else ()
        # Started together: each run pays an interpreter start-up.
        process = subprocess.Popen(
            command(*args),
            cwd=directory,
            env=environment(**variables),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        runs.append((name, process))
    exit_codes = {}
    for name, process in runs:
        out, err = process.communicate(timeout=120)
        exit_codes[name] = process.returncode
        for secret in (PASSPHRASE, WRONG, "staple", "91c2e"):
            assert secret not in out and secret not in err, name
        assert "Traceback" not in err, (name, err)
    assert exit_codes == {name: 0 if name.startswith("valid") else 1 for name in LEAK_SCENARIOS}


def test_a_ledger_with_no_copy_off_the_databases_filesystem_is_warned_about(deployed: Path) -> None:
    """Issue 59: whoever can delete or roll back the database can empty a ledger beside it; only a
    copy on another volume stands against that. /dev/shm (tmpfs) stands in for another volume."""
    ledger = str(deployed / "erasures.jsonl")
    beside = check(cwd=deployed, CITADEL_ERASURE_LEDGER=ledger)
    assert beside.returncode == 0, beside.stderr
    assert (
        f"warning: the erasure_ledger {ledger} is on the same filesystem as the database "
        f"{deployed / 'app.cdl'}: whoever can delete or roll back the database there can empty the "
        "ledger too"
    ) in beside.stderr
    assert "set ledger_mirror (CITADEL_LEDGER_MIRROR) to a file on another volume" in beside.stderr
    mirror = str(deployed / "mirror.jsonl")
    both = check(cwd=deployed, CITADEL_ERASURE_LEDGER=ledger, CITADEL_LEDGER_MIRROR=mirror)
    assert f"and its ledger_mirror {mirror} are on the same filesystem" in both.stderr
    assert "move ledger_mirror to a file on another volume" in both.stderr
    elsewhere = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        away = check(
            cwd=deployed, CITADEL_ERASURE_LEDGER=ledger, CITADEL_LEDGER_MIRROR=str(elsewhere / "m.jsonl")
        )
        assert away.returncode == 0 and "same filesystem" not in away.stderr, away.stderr
    finally:
        shutil.rmtree(elsewhere)
