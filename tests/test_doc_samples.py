"""The commands' sample outputs in docs/operations.md, configuration.md and migrating.md are what they print.

Each sample is replayed in a directory set up as the page says (its citadel.toml, the
sessions it shows), the command run through the CLI's entry point as the page runs it
(its variables set), and its output (stdout and stderr, in order) compared with the
page's, line by line. Only what cannot repeat is masked: the directory (the page's
`/srv/agent`, `/tmp/mig`, `/srv/agent-app`), times, a file's size and an erasure's receipt id. A page line that is
"..." stands for any lines; one ending in "..." matches any line it begins, and the rest
of the output is not shown. Samples left out: the prompt of an interactive erase (its
receipt is checked, run with --yes), `ls -l`, moves (their file sizes and times run
through a long receipt), and outputs that name a pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from agents import SQLiteSession

from citadeldb_openai_agents import CitadelSessionStore, from_config
from citadeldb_openai_agents.cli import main

DOCS = Path(__file__).resolve().parent.parent / "docs"
OPERATIONS, CONFIGURATION = DOCS / "operations.md", DOCS / "configuration.md"
MIGRATING = DOCS / "migrating.md"
PASSPHRASE = "operations page sample passphrase 5e1c"
MOCHI = [
    {"role": "user", "content": "My dog is called Mochi."},
    {"role": "assistant", "content": "Noted: your dog is called Mochi."},
    {"role": "user", "content": "What is my dog called?"},
    {"role": "assistant", "content": "Your dog is called Mochi."},
]
TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(\+00:00)?")
SIZE = re.compile(r"\d+ bytes \([\d.]+ [KMG]?i?B\)")
RECEIPT = re.compile(r"\b[0-9a-f]{32}\b")  # an erasure's receipt id, random


def sample(command: str, nth: int = 0, page: Path = OPERATIONS) -> tuple[list[str], int]:
    """The output the page shows after its `nth` ``$ command`` line, and the exit status it
    shows (an ``echo $?`` after it) or implies (1 after an ``error:`` line, else 0)."""
    lines = page.read_text().splitlines()
    starts = [number for number, line in enumerate(lines) if line == f"$ {command}"]
    assert len(starts) > nth, f"{page.name} no longer shows `$ {command}`"
    shown: list[str] = []
    for line in lines[starts[nth] + 1 :]:
        if line.startswith("$ ") or line.startswith("```"):
            break
        shown.append(line)
    rest = lines[starts[nth] + 1 + len(shown) :]
    if rest[:1] == ["$ echo $?"]:
        return shown, int(rest[1])
    return shown, 1 if any(line.startswith("error:") for line in shown) else 0


def run(command: str, stdin: str = "") -> tuple[list[str], int]:
    """Run `[VAR=value ...] python -m citadeldb_openai_agents ARGS` in this process: its output
    lines and its status."""
    words = shlex.split(command)
    variables = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        variables[name] = value
    assert words[:3] == ["python", "-m", "citadeldb_openai_agents"], command
    raw = io.BytesIO()  # one stream for both, written through: the order they print in
    output = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    with (
        contextlib.redirect_stdout(output),
        contextlib.redirect_stderr(output),
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr("sys.stdin", io.StringIO(stdin))
        for name, value in variables.items():
            patch.setenv(name, value)
        try:
            status = main(words[3:])
        except SystemExit as exited:  # a usage error ends as argparse ends its own
            status = int(exited.code or 0)
    return raw.getvalue().decode().splitlines(), status


def masked(lines: list[str], here: Path | None = None, there: str = "") -> list[str]:
    """Lines with times and sizes masked, and the test's directory written as the page's (a
    table's columns are as wide as its longest value: runs of spaces count as two)."""
    if here is not None:
        lines = [line.replace(str(here), there) for line in lines]
    return [
        re.sub(" {2,}", "  ", RECEIPT.sub("<receipt>", SIZE.sub("<size>", TIME.sub("<time>", line))))
        for line in lines
    ]


def as_shown(printed: list[str], shown: list[str]) -> bool:
    """Whether the printed lines are the shown ones, "..." standing for what the page left out."""
    at = 0
    for number, line in enumerate(shown):
        if line.strip() == "...":
            following = shown[number + 1] if number + 1 < len(shown) else None
            if following is None:
                return True
            while at < len(printed) and printed[at] != following:
                at += 1
            continue
        if line.endswith("..."):
            return at < len(printed) and printed[at].startswith(line[:-3].rstrip())
        if at >= len(printed) or printed[at] != line:
            return False
        at += 1
    return at == len(printed)


def assert_as_shown(command: str, here: Path, there: str, nth: int = 0, page: Path = OPERATIONS) -> None:
    """The command's output, run in `here`, is what the page shows it print (run in `there`)."""
    shown, status = sample(command, nth, page)
    printed, code = run(command.removesuffix(" < /dev/null"))
    printed, shown = masked(printed, here, there), masked(shown)
    assert as_shown(printed, shown), f"`{command}` prints, against {page.name}:\n" + "\n".join(printed)
    assert code == status, (command, code)


@pytest.fixture
def srv(clean_environment: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The page's /srv/agent: its citadel.toml, and the three sessions `sessions` lists."""
    (tmp_path / "citadel.toml").write_text('path = "agent.cdl"\nkey_file = "citadel.key"\nttl = "30d"\n')
    (tmp_path / "citadel.key").write_text(PASSPHRASE + "\n")
    (tmp_path / "citadel.key").chmod(0o600)
    with CitadelSessionStore(
        tmp_path / "agent.cdl", PASSPHRASE, ttl=30 * 86400, argon2_profile="iot"
    ) as store:
        asyncio.run(store.session("user-123").add_items(MOCHI))
        asyncio.run(store.session("user-456").add_items([{"role": "user", "content": "hi"}]))
        asyncio.run(store.session("user-789").add_items([{"role": "user", "content": "hello"}]))
    return tmp_path


def test_the_sessions_export_and_erase_samples_are_what_the_commands_print(srv: Path) -> None:
    for command in (
        "python -m citadeldb_openai_agents sessions",
        "python -m citadeldb_openai_agents export user-123",
        "python -m citadeldb_openai_agents export user-123 --out user-123.jsonl",
        "python -m citadeldb_openai_agents export nobody",
        "python -m citadeldb_openai_agents export user-123 --format sqlite",
    ):
        assert_as_shown(command, srv, "/srv/agent")
    assert not (srv / "user-123").exists()
    # The page answers the prompt (its first two lines) with y; --yes prints the same receipt.
    shown, _ = sample("python -m citadeldb_openai_agents erase user-123")
    printed, code = run("python -m citadeldb_openai_agents erase user-123 --yes")
    assert (masked(printed, srv, "/srv/agent"), code) == (masked(shown[2:]), 0)
    for command, nth in (
        ("python -m citadeldb_openai_agents export user-123", 1),
        ("python -m citadeldb_openai_agents erase user-456 --yes --json", 0),
        ("python -m citadeldb_openai_agents erase user-789 nobody --yes", 0),
        ("python -m citadeldb_openai_agents rotate-key < /dev/null", 0),
    ):
        assert_as_shown(command, srv, "/srv/agent", nth)
    # The page's rotate-key, asked on a terminal; then the old key file no longer opens the file.
    with CitadelSessionStore(srv / "agent.cdl", PASSPHRASE) as store:
        store.rotate_key(PASSPHRASE, "the new passphrase of the page")
    assert_as_shown("python -m citadeldb_openai_agents sessions", srv, "/srv/agent", 3)
    (srv / "citadel.key").write_text("the new passphrase of the page\n")
    assert_as_shown("python -m citadeldb_openai_agents sessions", srv, "/srv/agent", 4)


def test_the_import_and_leaving_samples_are_what_the_commands_print(
    clean_environment: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's /tmp/mig: an SDK file with two sessions and six items, imported, then exported."""
    (tmp_path / "citadel.toml").write_text(f'path = "{tmp_path / "agent.cdl"}"\n')
    monkeypatch.setenv("CITADEL_KEY", PASSPHRASE)
    monkeypatch.setenv("CITADEL_ARGON2_PROFILE", "iot")
    transcript = [
        {"role": "user", "content": "Remember: my dog is called Mochi."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What is my dog called?"},
        {"role": "assistant", "content": "Mochi."},
    ]
    for session_id, items in (("user-123", transcript), ("user-456", MOCHI[:2])):
        sdk = SQLiteSession(session_id, str(tmp_path / "old.db"))
        asyncio.run(sdk.add_items(items))  # type: ignore[arg-type]
        sdk.close()
    for command, nth in (("import old.db", 0), ("import old.db --create", 0), ("import old.db", 1)):
        assert_as_shown(f"python -m citadeldb_openai_agents {command}", tmp_path, "/tmp/mig", nth)
    assert_as_shown(
        "python -m citadeldb_openai_agents export --format sqlite --all --out out.db", tmp_path, "/tmp/mig"
    )
    reader = "print(asyncio.run(SQLiteSession('user-123', 'out.db').get_items()))"
    shown, _ = sample(f'python -c "import asyncio; from agents import SQLiteSession; {reader}"')
    assert [str(asyncio.run(SQLiteSession("user-123", str(tmp_path / "out.db")).get_items()))] == shown
    assert_as_shown("python -m citadeldb_openai_agents export --all --out exported", tmp_path, "/tmp/mig")
    assert_as_shown(
        "python -m citadeldb_openai_agents export --format sqlite --all --out out.db", tmp_path, "/tmp/mig", 1
    )


@pytest.fixture
def agent_app(clean_environment: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """docs/configuration.md's /srv/agent-app: its citadel.toml, key file and a database of three sessions."""
    app = tmp_path / "srv" / "agent-app"
    (app / "secrets").mkdir(parents=True)
    (app / "data").mkdir()
    (app / "citadel.toml").write_text(
        'path = "data/agent_sessions.cdl"\nkey_file = "secrets/citadel_key"\nttl = "30d"\n'
        'session_limit = 100\n\n[embedder]\nprovider = "mock"\ndim = 128\n'
    )
    (app / "secrets" / "citadel_key").write_text(PASSPHRASE + "\n")
    (app / "secrets" / "citadel_key").chmod(0o600)
    monkeypatch.chdir(app)
    monkeypatch.setenv("CITADEL_ARGON2_PROFILE", "iot")  # not on the page: the rows below say unset
    with from_config() as store:
        for name in ("user-123", "user-456", "user-789"):
            asyncio.run(store.session(name).add_items(MOCHI[:2]))
    monkeypatch.delenv("CITADEL_ARGON2_PROFILE")
    return tmp_path / "srv"


def test_the_check_samples_are_what_check_prints(agent_app: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for command, nth in (
        ("CITADEL_TTL=7d python -m citadeldb_openai_agents check", 0),
        (
            "CITADEL_TLL=7d CITADEL_KEY_FILE=/run/secrets/citadel_key python -m citadeldb_openai_agents check",
            0,
        ),
    ):
        assert_as_shown(command, agent_app, "/srv", nth, CONFIGURATION)
    monkeypatch.chdir(agent_app)  # /srv: the relative path resolves there
    relative = (
        "CITADEL_PATH=agent_sessions.cdl CITADEL_KEY_FILE=/srv/agent-app/secrets/citadel_key "
        "python -m citadeldb_openai_agents check"
    )
    shown, status = sample(relative, 0, CONFIGURATION)
    printed, code = run(relative.replace("/srv", str(agent_app)))
    assert as_shown(masked(printed, agent_app, "/srv"), masked(shown)), "\n".join(printed)
    assert code == status
    monkeypatch.chdir(agent_app / "agent-app")  # line 2 ends inside a string, at column 32
    (agent_app / "agent-app" / "citadel.toml").write_text(
        'path = "data/agent_sessions.cdl"\nkey_file = "secrets/citadel_key\n'
    )
    assert_as_shown("python -m citadeldb_openai_agents check", agent_app, "/srv", 1, CONFIGURATION)


def test_the_migration_samples_are_what_the_commands_print(
    clean_environment: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/migrating.md's /srv/agent: the committed 2.x fixture as old.cdl, and a citadel.toml for the new file."""
    fixtures = Path(__file__).resolve().parent / "legacy_files"
    for path in fixtures.glob("default.cdl*"):
        shutil.copy2(path, tmp_path / path.name.replace("default.cdl", "old.cdl"))
    manifest = json.loads((fixtures / "manifest.json").read_text())
    (tmp_path / "old.key").write_text(manifest["default.cdl"]["key"] + "\n")
    (tmp_path / "citadel.toml").write_text('path = "agent.cdl"\nkey_file = "citadel.key"\n')
    (tmp_path / "citadel.key").write_text(PASSPHRASE + "\n")
    for name in ("old.key", "citadel.key"):
        (tmp_path / name).chmod(0o600)
    monkeypatch.setenv("CITADEL_ARGON2_PROFILE", "iot")
    refused = (
        "CITADEL_PATH=/srv/agent/old.cdl CITADEL_KEY_FILE=old.key python -m citadeldb_openai_agents sessions"
    )
    shown, status = sample(refused, page=MIGRATING)
    printed, code = run(refused.replace("/srv/agent", str(tmp_path)))
    assert as_shown(masked(printed, tmp_path, "/srv/agent"), masked(shown)), printed
    assert code == status == 1
    importing = "python -m citadeldb_openai_agents import old.cdl --source-key-file old.key"
    for command in (f"{importing} --dry-run", f"{importing} --create"):
        assert_as_shown(command, tmp_path, "/srv/agent", page=MIGRATING)
    assert_as_shown("python -m citadeldb_openai_agents sessions", tmp_path, "/srv/agent", page=MIGRATING)
    assert_as_shown(f"{importing} --erase-source", tmp_path, "/srv/agent", page=MIGRATING)
