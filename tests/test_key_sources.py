"""Keys where operators keep them: a command that prints the passphrase (key_command), systemd's
credentials, every passphrase source listed by check, and CITADEL_KEY kept from child processes.

The commands are real programs: small scripts written into the test's directory and run.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from citadeldb_openai_agents import CitadelSettings, ConfigurationError, from_config
from citadeldb_openai_agents.config import (
    forget_taken_variables,
    keycommand,
    new_passphrase,
    reread_passphrase,
)
from citadeldb_openai_agents.config.taken import TAKEN

from conftest import Nobody

PASSPHRASE = "passphrase printed by a command 4d1e"
PLANTED = "planted secret on stdout 93ab"

pytestmark = pytest.mark.usefixtures("clean_environment")


def script(path: Path, body: str) -> Path:
    """An executable /bin/sh script at `path`."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o700)
    return path


def printing(tmp_path: Path, text: str = PASSPHRASE + "\n", name: str = "get-key") -> Path:
    """A command that prints `text` exactly (read from a file beside it, so it can change)."""
    (tmp_path / f"{name}.out").write_text(text)
    return script(tmp_path / name, f'cat "{tmp_path / name}.out"\n')


def check(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    env.pop("CREDENTIALS_DIRECTORY", None)
    env |= {"CITADEL_ARGON2_PROFILE": "iot", "CITADEL_PATH": str(tmp_path / "agent.cdl"), **variables}
    return subprocess.run(
        [sys.executable, "-m", "citadeldb_openai_agents", "check", *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def problems(**arguments: object) -> str:
    with pytest.raises(ConfigurationError) as caught:
        CitadelSettings(**arguments)  # type: ignore[arg-type]
    return str(caught.value)


# -- key_command -------------------------------------------------------------------------------


def test_the_passphrase_is_what_the_command_prints_and_opens_the_store(tmp_path: Path) -> None:
    command = printing(tmp_path)
    (tmp_path / "citadel.toml").write_text(
        f'path = "agent.cdl"\nargon2_profile = "iot"\nkey_command = ["{command}"]\n'
    )

    with from_config() as store:
        asyncio.run(store.session("user-1").add_items([{"role": "user", "content": "hello"}]))
    settings = CitadelSettings()

    assert settings.key.get_secret_value() == PASSPHRASE
    assert str(settings.provenance("key").origin) == f"key command {command}"
    assert settings.passphrase_source() == (
        f"the output of the command {command}, named by key_command in the TOML file {tmp_path / 'citadel.toml'}"
    )
    # The command ran to its end, so within the timeout it ran under (it took 0.013 s at most under
    # load, benchmarks/suite_under_load.py, 2026-12-08): a duration, not a clock's reading.
    assert settings.key_command_seconds is not None
    assert 0 < settings.key_command_seconds < keycommand.DEFAULT_TIMEOUT
    assert PASSPHRASE not in repr(settings) and PASSPHRASE not in str(settings)


@pytest.mark.parametrize("spelling", ["json", "words"])
def test_citadel_key_command_takes_a_json_list_or_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    script(tmp_path / "echo key", 'printf "%s\\n" "$1"\n')
    argv = [str(tmp_path / "echo key"), "two words"]
    given = json.dumps(argv) if spelling == "json" else f"'{argv[0]}' 'two words'"
    monkeypatch.setenv("CITADEL_KEY_COMMAND", given)

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == "two words"
    assert settings.key_command == argv


@pytest.mark.parametrize(
    ("printed", "expected"),
    [("p\n", "p"), ("p\r\n", "p"), ("p\n\n", "p\n"), (" p ", " p "), ("p", "p")],
)
def test_one_trailing_newline_is_stripped_as_from_a_key_file(
    tmp_path: Path, printed: str, expected: str
) -> None:
    settings = CitadelSettings(key_command=[str(printing(tmp_path, printed))])

    assert settings.key.get_secret_value() == expected


def test_a_failing_command_is_named_with_its_status_and_stderr_never_its_output(tmp_path: Path) -> None:
    failing = script(
        tmp_path / "vault", f'echo "{PLANTED}"\necho "permission denied" >&2\necho more >&2\nexit 3\n'
    )

    message = problems(key_command=[str(failing), "kv", "get"])

    assert f"the key command {failing} kv get failed with exit status 3" in message
    assert "permission denied" in message and "more" not in message
    assert PLANTED not in message


# How long the next test's command would run, and hold its output pipe open, if its timeout did not
# stop it and what it started: "stopped at its timeout" is well under that.
SLEEP_SECONDS = 120


def test_a_command_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    started_pid = tmp_path / "sleep.pid"
    body = f'echo "{PLANTED}"\nsleep {SLEEP_SECONDS} &\necho $! > "{started_pid}"\nwait\n'
    slow = script(tmp_path / "slow", body)

    started = time.monotonic()
    message = problems(key_command=[str(slow)], key_command_timeout="0.5s")

    # Stopped at its timeout: 0.54 s at most under load (benchmarks/suite_under_load.py,
    # 2026-12-08); a quarter of the sleep it would have waited for is 50x that.
    assert time.monotonic() - started < SLEEP_SECONDS / 4
    assert f"the key command {slow} did not finish within 0.5 s" in message
    assert "key_command_timeout" in message and PLANTED not in message
    assert gone(int(started_pid.read_text()))  # the sleep it started too, not left holding on


def gone(pid: int) -> bool:
    """Whether process `pid` has ended within SLEEP_SECONDS / 4, well before the sleep's own end (a
    killed process takes a moment to go: 0.0002 s at most under load, benchmarks/suite_under_load.py,
    2026-12-08)."""
    deadline = time.monotonic() + SLEEP_SECONDS / 4
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return True  # killed, waiting for init to reap it
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("exit 0\n", "printed nothing (exit status 0)"),
        ('printf "\\n"\n', "printed nothing"),
        ("printf '\\377\\376'\n", "printed what is not UTF-8 text"),
        ("kill -9 $$\n", "was killed by signal 9 (SIGKILL)"),
    ],
)
def test_a_command_that_gives_no_passphrase_says_why(tmp_path: Path, body: str, expected: str) -> None:
    message = problems(key_command=[str(script(tmp_path / "get-key", body))])

    assert expected in message
    assert "no passphrase is configured" not in message  # the command's problem, told once


def test_a_missing_program_is_named(tmp_path: Path) -> None:
    message = problems(key_command=["no-such-secret-tool", "read", "op://vault/item"])

    assert "the key command no-such-secret-tool read op://vault/item cannot be run" in message
    assert "no-such-secret-tool was not found" in message


def test_the_command_runs_with_stdin_from_dev_null_and_no_passphrase_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `cat` would wait on an inherited stdin (a pipe nobody closes, here) until its timeout.
    probe = script(tmp_path / "probe", 'cat\necho "${CITADEL_KEY:-none}"\n')
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        # 3 s: the probe took 0.037 s at most under load (benchmarks/suite_under_load.py, 2026-12-08).
        settings = CitadelSettings(key_command=[str(probe)], key_command_timeout=3)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)

    assert settings.key.get_secret_value() == "none"  # and CITADEL_KEY was never its to see


# -- the passphrase rule: one source decides ------------------------------------------------------


def test_key_and_key_command_in_one_source_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    monkeypatch.setenv("CITADEL_KEY_COMMAND", json.dumps([str(printing(tmp_path))]))

    message = problems()

    assert (
        "set twice, by environment variable CITADEL_KEY and by environment variable CITADEL_KEY_COMMAND"
        in message
    )
    assert PASSPHRASE not in message


def test_a_higher_source_wins_and_an_overridden_command_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = tmp_path / "ran"
    command = script(tmp_path / "get-key", f'touch "{ran}"\necho other\n')
    (tmp_path / "citadel.toml").write_text(f'key_command = ["{command}"]\n')
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == PASSPHRASE and not ran.exists()
    assert settings.passphrase_sources() == [
        "the environment variable CITADEL_KEY",
        f"key_command in the TOML file {tmp_path / 'citadel.toml'}",
    ]


def test_citadel_key_command_beats_a_key_file_named_in_the_toml_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "citadel.toml").write_text('key_file = "missing.key"\nkey_command_timeout = 5\n')
    monkeypatch.setenv("CITADEL_KEY_COMMAND", str(printing(tmp_path)))

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == PASSPHRASE
    assert settings.key_command_timeout == 5  # from a lower source than the command's
    assert settings.provenance("key").origin.kind == "key command"


# -- systemd credentials ---------------------------------------------------------------------------


def credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str = PASSPHRASE + "\n") -> Path:
    """$CREDENTIALS_DIRECTORY as systemd makes it for LoadCredential=citadel_key:..."""
    directory = tmp_path / "credentials"
    directory.mkdir()
    (directory / "citadel_key").write_text(text)
    (directory / "citadel_key").chmod(0o400)
    (directory / "other_service_token").write_text("not ours")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(directory))
    return directory / "citadel_key"


def test_a_systemd_credential_is_the_passphrase_with_no_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credential = credentials(tmp_path, monkeypatch)

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == PASSPHRASE
    assert str(settings.provenance("key").origin) == f"systemd credential {credential}"


def test_the_credential_ranks_below_a_named_secrets_directory_and_above_the_toml_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credential = credentials(tmp_path, monkeypatch)
    (tmp_path / "citadel.toml").write_text('key_file = "missing.key"\n')
    assert CitadelSettings().provenance("key").origin.kind == "systemd credential"
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "citadel_key").write_text("from the secrets directory")
    (secrets / "citadel_key").chmod(0o600)
    monkeypatch.setenv("CITADEL_SECRETS_DIR", str(secrets))

    settings = CitadelSettings()

    assert settings.key.get_secret_value() == "from the secrets directory"
    assert settings.passphrase_sources() == [
        f"the file {secrets / 'citadel_key'} in the secrets directory",
        f"the systemd credential {credential}",
        f"key_file in the TOML file {tmp_path / 'citadel.toml'}",
    ]


def test_an_empty_credential_is_a_problem_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credential = credentials(tmp_path, monkeypatch, text="\n")

    message = problems()

    assert f"the key file {credential} is empty" in message and "systemd credential" in message


# -- check -----------------------------------------------------------------------------------------


def test_check_runs_the_command_and_says_so(tmp_path: Path) -> None:
    command = printing(tmp_path)

    done = check(tmp_path, CITADEL_KEY_COMMAND=json.dumps([str(command), "secret/agent"]))

    assert done.returncode == 0, done.stderr
    assert f"key command {command} secret/agent" in done.stdout
    assert "set (command ran in " in done.stdout
    assert PASSPHRASE not in done.stdout + done.stderr


def test_check_lists_every_passphrase_source_and_the_one_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credential = credentials(tmp_path, monkeypatch)
    command = printing(tmp_path)
    (tmp_path / "citadel.toml").write_text(f'key_command = ["{command}"]\n')

    done = check(
        tmp_path, "--no-open", CITADEL_KEY_FILE=str(credential), CREDENTIALS_DIRECTORY=str(credential.parent)
    )

    assert done.returncode == 0, done.stderr
    assert (
        "passphrase sources:\n"
        f"  used:        the key file {credential}, named by the environment variable CITADEL_KEY_FILE\n"
        f"  overridden:  the systemd credential {credential} (not read or run)\n"
        f"  overridden:  key_command in the TOML file {tmp_path / 'citadel.toml'} (not read or run)\n"
    ) in done.stdout


def test_check_shows_a_failing_command_without_its_output(tmp_path: Path) -> None:
    failing = script(tmp_path / "vault", f'echo "{PLANTED}"\necho "Error: permission denied" >&2\nexit 3\n')

    done = check(tmp_path, "--json", CITADEL_KEY_COMMAND=f"{failing} kv get -field=passphrase secret/agent")

    assert done.returncode == 1
    problem = json.loads(done.stdout)["problems"][0]
    assert f"{failing} kv get -field=passphrase secret/agent failed with exit status 3" in problem
    assert "Error: permission denied" in problem
    assert PLANTED not in done.stdout + done.stderr


# -- no passphrase inherited by a child process ----------------------------------------------------


def test_citadel_key_is_not_inherited_by_child_processes_and_a_second_load_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    monkeypatch.setenv("CITADEL_ARGON2_PROFILE", "iot")
    monkeypatch.setenv("CITADEL_PATH", str(tmp_path / "agent.cdl"))

    with from_config() as store:
        asyncio.run(store.session("user-1").add_items([{"role": "user", "content": "hello"}]))
    child = subprocess.run(
        [sys.executable, "-c", "import os; print('CITADEL_KEY' in os.environ)"],
        capture_output=True,
        text=True,
        check=True,
    )

    assert child.stdout == "False\n"
    assert PASSPHRASE not in repr(TAKEN)
    with from_config() as store:  # the same process: the passphrase it took is still there
        assert store.session_ids() == ["user-1"]


# A service as nobody, given CITADEL_KEY: it loads its settings, starts a tool (a child process),
# and waits; what its tool inherited and what /proc shows of it are printed by the other side.
SERVICE = """
import os, subprocess, sys
from citadeldb_openai_agents import CitadelSettings
CitadelSettings()
tool = subprocess.run([sys.executable, "-c", "import os; print('CITADEL_KEY' in os.environ)"],
                      capture_output=True, text=True)
print("taken", "CITADEL_KEY" in os.environ, "tool inherits", tool.stdout.strip(), flush=True)
sys.stdin.read()
"""
PEEK = """
import sys
print(("CITADEL_KEY=" + sys.argv[2]).encode() in open(f"/proc/{sys.argv[1]}/environ", "rb").read())
"""


def test_what_a_process_of_the_same_user_still_reads_once_citadel_key_is_taken(nobody: Nobody) -> None:
    """docs/reliability.md's threat model, as two processes of one user (nobody) show it: the
    service's tool does not inherit CITADEL_KEY once the settings took it, but another process of
    the same user reads it in /proc/<pid>/environ, which keeps the environment the service began with."""
    service = subprocess.Popen(
        [nobody.python, "-c", SERVICE],
        env={**nobody.env, "CITADEL_KEY": PASSPHRASE, "CITADEL_ARGON2_PROFILE": "iot"},
        user=nobody.user.pw_uid,
        group=nobody.user.pw_gid,
        cwd="/tmp",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None
        assert service.stdout.readline().split() == ["taken", "False", "tool", "inherits", "False"]
        peeked = nobody.run(PEEK, str(service.pid), PASSPHRASE)
        assert peeked.returncode == 0, peeked.stderr
        assert peeked.stdout.strip() == "True"  # the kernel's copy: what no process can change
    finally:
        service.kill()
        service.communicate(timeout=30)


def test_a_passphrase_taken_is_forgotten_on_request_and_replaced_when_set_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CITADEL_KEY", "first")
    assert CitadelSettings().key.get_secret_value() == "first"
    monkeypatch.setenv("CITADEL_KEY", "second")
    assert CitadelSettings().key.get_secret_value() == "second"

    forget_taken_variables()

    assert "no passphrase is configured" in problems()


def test_the_new_key_variable_is_taken_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITADEL_NEW_KEY", PASSPHRASE)

    assert new_passphrase() == (PASSPHRASE, "CITADEL_NEW_KEY")
    assert "CITADEL_NEW_KEY" not in os.environ
    assert new_passphrase() == (PASSPHRASE, "CITADEL_NEW_KEY")


# -- reading the passphrase again (a key rotation while serving) ------------------------------------


def test_reread_runs_the_command_again_reads_the_file_again_and_not_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = printing(tmp_path)
    from_command = CitadelSettings(key_command=[str(command)])
    key_file = tmp_path / "citadel.key"
    key_file.write_text("old\n")
    key_file.chmod(0o600)
    from_file = CitadelSettings(key_file=key_file)
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    from_environment = CitadelSettings()

    (tmp_path / "get-key.out").write_text("rotated\n")
    key_file.write_text("rotated too\n")

    assert reread_passphrase(from_command) == "rotated"
    assert reread_passphrase(from_file) == "rotated too"
    assert reread_passphrase(from_environment) is None
    assert reread_passphrase(CitadelSettings(key="given")) is None
    (tmp_path / "get-key.out").write_text("")
    with pytest.raises(ValueError, match="printed nothing"):
        reread_passphrase(from_command)
