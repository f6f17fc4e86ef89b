"""The operator commands, run as operators run them: each in a subprocess against a real file.

Refusals that need no second process (a missing --yes, a bad new passphrase, ...) call
`cli.main` in the test's process instead: the same entry point, without the Agents
SDK's few seconds of import per call.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from test_erasure import stored_ids

from citadeldb_openai_agents import CitadelSessionStore, EmbedderIdentity, WrongPassphraseError, from_config
from citadeldb_openai_agents.cli import main

PASSPHRASE = "correct horse battery staple 7f3a"
NEW_PASSPHRASE = "new passphrase after rotation 2b9d"
WRONG = "wrong passphrase 91c2e"
SECRETS = (PASSPHRASE, NEW_PASSPHRASE, WRONG)
TRANSCRIPT = [
    {"role": "user", "content": "My dog is called Mochi.", "z": 0, "a": 1},
    {"role": "assistant", "content": "Noted — Mochi ✓"},
]
OTHER = [{"role": "user", "content": "hello"}]


@pytest.fixture(autouse=True)
def no_terminal(clean_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process commands see no terminal, whatever runs pytest.
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """A file as a service leaves it: two sessions, written and closed by the library.

    Made with the fast KDF and without fsync (a test needs no durability), which the file keeps.
    """
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot", sync_mode="off") as store:
        asyncio.run(store.session("user-123").add_items(TRANSCRIPT))
        asyncio.run(store.session("user-456").add_items(OTHER))
    return path


def environment(path: Path, **variables: str | None) -> dict[str, str]:
    """The command's variables: the file, its passphrase, the fast KDF; None unsets one."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CITADEL_")}
    env |= {"CITADEL_PATH": str(path), "CITADEL_KEY": PASSPHRASE, "CITADEL_ARGON2_PROFILE": "iot"}
    env |= variables
    return {k: v for k, v in env.items() if v is not None}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "citadeldb_openai_agents", *args]


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command(*args),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,  # the slowest command (an import): 9.9 s under load (benchmarks/suite_under_load.py)
    )
    assert_readable(done.stdout, done.stderr)
    return done


def assert_readable(*outputs: str) -> None:
    """Every command, on success or failure: no passphrase, no traceback."""
    for output in outputs:
        for secret in SECRETS:
            assert secret not in output
        assert "Traceback" not in output


def run_here(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    path: Path,
    *args: str,
    **variables: str | None,
) -> tuple[int, str, str]:
    for name, value in environment(path, **variables).items():
        monkeypatch.setenv(name, value)
    for name, value in variables.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
    code = main(list(args))
    out, err = capsys.readouterr()
    assert_readable(out, err)
    return code, out, err


def on_terminal(
    *args: str, env: dict[str, str], prompt: bytes, replies: list[str]
) -> subprocess.CompletedProcess[str]:
    """Run a command whose stdin and controlling terminal are a pseudo-terminal, typing
    each reply once `prompt` shows on the terminal (getpass discards typed-ahead input)."""
    main_end, command_end = pty.openpty()

    def take_the_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        command(*args),
        env=env,
        stdin=command_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=take_the_terminal,
    )
    os.close(command_end)
    try:
        for reply in replies:
            shown = b""
            while not shown.endswith(prompt):
                # 2.8 s at most between outputs under load (benchmarks/suite_under_load.py)
                ready, _, _ = select.select([main_end], [], [], 60)
                assert ready, f"no prompt on the terminal; it shows {shown!r}"
                shown += os.read(main_end, 1024)
            os.write(main_end, reply.encode() + b"\n")
        # 1.6 s under load (benchmarks/suite_under_load.py, 2026-12-08)
        out, err = process.communicate(timeout=120)
    finally:
        os.close(main_end)
    assert_readable(out, err)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# -- sessions, export, erase ------------------------------------------------------------------


def test_init_creates_the_database_from_the_configuration_and_prints_what_it_made(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    env = environment(path, CITADEL_CREATE="false")  # init is the explicit creation: create does not apply
    refused = run("sessions", env=env)
    assert refused.returncode == 1 and "no database" in refused.stderr

    made = run("init", env=env)

    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert lines[0] == f"created {path}"
    for name in ("agent.cdl", "agent.cdl.citadel-keys", "agent.cdl.citadel-audit"):
        assert any(line.split() == [name, "mode", "600"] for line in lines), made.stdout
    assert (
        "argon2 profile: iot" in made.stdout
        and "embedder:       mock-fnv1a-bow-v1 (dim 128, cosine)" in made.stdout
    )
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in tmp_path.iterdir())
    listed = run("sessions", env=env)
    assert listed.returncode == 0, listed.stderr

    again = run("init", env=env)
    assert again.returncode == 0
    assert again.stdout.strip() == f"{path} exists already: nothing was created, the passphrase opens it"
    wrong = run("init", env=environment(path, CITADEL_KEY="not the passphrase"))
    assert wrong.returncode == 1 and "wrong passphrase" in wrong.stderr


def test_sessions_lists_every_session_with_its_count_and_write_times(database: Path) -> None:
    table = run("sessions", env=environment(database))

    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "ITEMS", "FIRST", "WRITE", "(UTC)", "LAST", "WRITE", "(UTC)"]
    assert lines[1].split()[:2] == ["user-123", "2"] and lines[2].split()[:2] == ["user-456", "1"]
    assert lines[-1] == f"2 sessions, 3 items in {database}"


def test_sessions_json_gives_iso_times_in_utc(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, _ = run_here(capsys, monkeypatch, database, "sessions", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [(row["session_id"], row["items"]) for row in rows] == [("user-123", 2), ("user-456", 1)]
    assert rows[0]["first_write"] <= rows[0]["last_write"]
    assert rows[0]["first_write"].endswith("+00:00")


def test_export_then_erase_then_export_shows_nothing(database: Path) -> None:
    env = environment(database)
    exported = run("export", "user-123", env=env)
    erased = run("erase", "user-123", "--yes", env=env)
    again = run("export", "user-123", env=env)

    assert exported.returncode == 0, exported.stderr
    lines = exported.stdout.splitlines()
    assert [json.loads(line) for line in lines] == TRANSCRIPT
    assert list(json.loads(lines[0])) == ["role", "content", "z", "a"]
    assert "Noted — Mochi ✓" in lines[1]
    assert erased.returncode == 0, erased.stderr
    assert f"erased session 'user-123' from {database}" in erased.stdout
    assert "items erased:       2" in erased.stdout
    assert "algorithm:          AES-256-KW" in erased.stdout
    assert "readback confirmed: yes" in erased.stdout
    assert again.returncode == 1
    assert again.stdout == ""
    assert "error: no session 'user-123'" in again.stderr


def test_export_out_writes_a_file_only_its_owner_reads_and_never_overwrites(
    database: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "user-123.jsonl"
    code, stdout, _ = run_here(capsys, monkeypatch, database, "export", "user-123", "--out", str(out))
    assert code == 0
    assert f"exported 2 items of session 'user-123' to {out}" in stdout
    assert [json.loads(line) for line in out.read_text("utf-8").splitlines()] == TRANSCRIPT
    assert out.stat().st_mode & 0o777 == 0o600

    code, _, err = run_here(capsys, monkeypatch, database, "export", "user-456", "--out", str(out))
    assert code == 1 and "refusing to overwrite" in err
    assert [json.loads(line) for line in out.read_text("utf-8").splitlines()] == TRANSCRIPT


def test_erase_prints_a_json_receipt_per_session(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, _ = run_here(capsys, monkeypatch, database, "erase", "user-123", "user-456", "--yes", "--json")
    assert code == 0
    receipts = json.loads(out)
    assert [(r["session_id"], r["items_erased"], r["readback_confirmed"]) for r in receipts] == [
        ("user-123", 2, True),
        ("user-456", 1, True),
    ]
    assert receipts[0]["algorithm"].startswith("AES-256-KW")
    assert receipts[0]["database"] == str(database)
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.sessions() == []


def atom_ids(path: Path, session_id: str) -> list[int]:
    """The ids of a session's stored items (Citadel's atoms), read before the command runs."""
    with CitadelSessionStore(path, PASSPHRASE) as store:
        store.export(session_id)  # a reopened file's regions are attached as they are read
        return [atom for ids in stored_ids(store, session_id).values() for atom in ids]


UNCONFIRMED = (
    "error: the readback did not confirm the erasure of 'user-123': the keys were destroyed, "
    "but Citadel did not read every item back as missing. Keep this receipt and run "
    "`python -m citadeldb_openai_agents verify`."
)


def test_erase_exits_1_and_says_what_to_do_when_the_readback_still_finds_an_item(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    readback_still_finds,
) -> None:
    readback_still_finds(atom_ids(database, "user-123")[0])
    code, out, err = run_here(capsys, monkeypatch, database, "erase", "user-123", "--yes")

    assert code == 1
    assert f"erased session 'user-123' from {database}" in out
    assert "items erased:       2" in out
    assert "readback confirmed: NO" in out and "readback confirmed: yes" not in out
    assert err.strip() == UNCONFIRMED
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.session_ids() == ["user-456"]


def test_erase_prints_every_receipt_when_one_readback_does_not_confirm(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    readback_still_finds,
) -> None:
    readback_still_finds(atom_ids(database, "user-123")[-1])
    code, out, err = run_here(capsys, monkeypatch, database, "erase", "user-123", "user-456", "--yes")

    assert code == 1
    receipts = out.split("erased session ")[1:]
    assert [receipt.split(" from ")[0] for receipt in receipts] == ["'user-123'", "'user-456'"]
    assert "readback confirmed: NO" in receipts[0]
    assert "readback confirmed: yes" in receipts[1] and "items erased:       1" in receipts[1]
    assert err.strip() == UNCONFIRMED


def test_erase_json_carries_readback_confirmed_false_for_the_unconfirmed_session(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    readback_still_finds,
) -> None:
    readback_still_finds(atom_ids(database, "user-123")[-1])
    code, out, err = run_here(
        capsys, monkeypatch, database, "erase", "user-123", "user-456", "--yes", "--json"
    )

    assert code == 1
    assert '"readback_confirmed": false' in out
    receipts = json.loads(out)
    assert [(r["session_id"], r["items_erased"], r["readback_confirmed"]) for r in receipts] == [
        ("user-123", 2, False),
        ("user-456", 1, True),
    ]
    assert err.strip() == UNCONFIRMED


def test_erase_checks_every_id_first_and_erases_nothing_if_one_is_unknown(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = run_here(capsys, monkeypatch, database, "erase", "user-123", "nobody", "--yes")
    assert code == 1 and out == ""
    assert "error: no session 'nobody'" in err and "nothing was erased" in err
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert [s.session_id for s in store.sessions()] == ["user-123", "user-456"]


def test_erase_without_a_terminal_needs_yes(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run_here(capsys, monkeypatch, database, "erase", "user-123")
    assert code == 1
    assert "stdin is not a terminal; pass --yes" in err
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.export("user-123") == TRANSCRIPT


class Terminal(io.StringIO):
    """What an operator types at a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("typed", "erased"), [("y\n", True), ("n\n", False), ("", False)])
def test_erase_asks_on_a_terminal_and_erases_only_on_yes(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    typed: str,
    erased: bool,
) -> None:
    monkeypatch.setattr(sys, "stdin", Terminal(typed))
    code, out, err = run_here(capsys, monkeypatch, database, "erase", "user-123")

    assert f"Erase 1 session from {database}: 'user-123' (2 items)?" in err and "[y/N]" in err
    assert code == (0 if erased else 1)
    assert ("items erased:       2" in out) is erased
    assert ("nothing was erased" in err) is not erased
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert ("user-123" in store.session_ids()) is not erased


# -- purge ------------------------------------------------------------------------------------


def test_purge_erases_expired_items_and_prints_how_many(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    with CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot", sync_mode="off", ttl=0.001) as store:
        asyncio.run(store.session("short-lived").add_items(TRANSCRIPT))
    # The items expired a millisecond after their write, long before the command starts.
    purged = run("purge", env=environment(path, CITADEL_TTL="7d"))

    assert purged.returncode == 0, purged.stderr
    assert purged.stdout == f"erased 2 expired items from {path}\n"
    with CitadelSessionStore(path, PASSPHRASE) as store:
        assert store.purge_expired() == 0


# -- rotate-key -------------------------------------------------------------------------------


def test_rotate_then_reopen_with_each_passphrase(database: Path) -> None:
    rotated = run("rotate-key", env=environment(database, CITADEL_NEW_KEY=NEW_PASSPHRASE))

    assert rotated.returncode == 0, rotated.stderr
    assert "passphrase changed and verified" in rotated.stdout
    assert "environment variable CITADEL_KEY" in rotated.stdout  # where to put the new one
    with pytest.raises(WrongPassphraseError):
        CitadelSessionStore(database, PASSPHRASE)
    with CitadelSessionStore(database, NEW_PASSPHRASE) as store:
        assert store.export("user-123") == TRANSCRIPT
        assert store.export("user-456") == OTHER


@pytest.mark.parametrize("option", [True, False])
def test_rotate_key_reads_the_new_passphrase_from_a_file(
    database: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    option: bool,
) -> None:
    key_file = tmp_path / "new.key"
    key_file.write_text(NEW_PASSPHRASE + "\n")
    key_file.chmod(0o600)
    if option:
        code, _, err = run_here(capsys, monkeypatch, database, "rotate-key", "--new-key-file", str(key_file))
    else:
        code, _, err = run_here(
            capsys, monkeypatch, database, "rotate-key", CITADEL_NEW_KEY_FILE=str(key_file)
        )
    assert code == 0, err
    with CitadelSessionStore(database, NEW_PASSPHRASE) as store:
        assert store.export("user-123") == TRANSCRIPT


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({}, "no new passphrase: pass --new-key-file PATH"),
        ({"CITADEL_NEW_KEY": ""}, "the new passphrase (from CITADEL_NEW_KEY) is empty"),
        ({"CITADEL_NEW_KEY": PASSPHRASE}, "is the current one"),
        ({"CITADEL_NEW_KEY": NEW_PASSPHRASE, "CITADEL_NEW_KEY_FILE": "new.key"}, "set twice"),
        ({"CITADEL_NEW_KEY_FILE": "missing.key"}, "missing.key does not exist"),
        ({"CITADEL_NEW_KEY": NEW_PASSPHRASE, "CITADEL_KEY": WRONG}, "wrong passphrase"),
    ],
)
def test_rotate_key_refusals_change_nothing(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    message: str,
) -> None:
    code, out, err = run_here(capsys, monkeypatch, database, "rotate-key", **variables)
    assert code == 1 and out == ""
    assert message in err
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.export("user-123") == TRANSCRIPT


def test_rotate_key_asks_twice_on_the_terminal_without_echo(database: Path) -> None:
    rotated = on_terminal(
        "rotate-key",
        env=environment(database),
        prompt=b"passphrase: ",
        replies=[NEW_PASSPHRASE, NEW_PASSPHRASE],
    )

    assert rotated.returncode == 0, rotated.stderr
    with CitadelSessionStore(database, NEW_PASSPHRASE) as store:
        assert store.export("user-123") == TRANSCRIPT


def test_rotate_key_refuses_two_different_answers_at_the_prompt(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = iter([NEW_PASSPHRASE, "a typo"])
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    code, _, err = run_here(capsys, monkeypatch, database, "rotate-key")
    assert code == 1 and "the two passphrases differ; nothing was changed" in err


# -- backup -----------------------------------------------------------------------------------


def test_backup_then_restore_then_read(database: Path, tmp_path: Path) -> None:
    (tmp_path / "backups").mkdir()
    dest = tmp_path / "backups" / "agent.cdl"
    env = environment(database)
    backed_up = run("backup", str(dest), env=env)
    assert backed_up.returncode == 0, backed_up.stderr
    written = [Path(line.split()[0]) for line in backed_up.stdout.splitlines() if line.startswith("  ")]
    assert written[0] == dest and len(written) >= 3
    assert all(name.name.startswith("agent.cdl.citadel-") for name in written[1:])

    # The disk is lost: every file of the database goes, the backup's files come back.
    for lost in [database, *tmp_path.glob("agent.cdl.citadel-*")]:
        lost.unlink()
    for name in written:
        shutil.copy(name, tmp_path / name.name)
    with CitadelSessionStore(database, PASSPHRASE) as restored:
        assert restored.export("user-123") == TRANSCRIPT
        assert restored.export("user-456") == OTHER


def test_backup_refuses_an_existing_destination_or_a_missing_directory(
    database: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = tmp_path / "taken.cdl"
    Path(f"{taken}.citadel-keys").write_text("someone else's")
    code, _, err = run_here(capsys, monkeypatch, database, "backup", str(taken))
    assert code == 1 and "refusing to overwrite" in err and not taken.exists()

    code, _, err = run_here(capsys, monkeypatch, database, "backup", str(tmp_path / "no" / "x.cdl"))
    assert code == 1 and "does not exist" in err


# -- verify -----------------------------------------------------------------------------------


def tampered_copy(database: Path, tmp_path: Path, offset: int = 4096 + 512) -> Path:
    """A backup of the file with 64 bytes inverted at `offset`.

    The default is inside Citadel's first page after its 4 KiB header: damage there is
    found by the integrity check, not by opening the file (measured on citadeldb 2.7.0).
    """
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "agent.cdl"
    with CitadelSessionStore(database, PASSPHRASE) as store:
        store.backup(copy)
    with copy.open("r+b") as file:
        file.seek(offset)
        original = file.read(64)
        file.seek(offset)
        file.write(bytes(byte ^ 0xFF for byte in original))
    return copy


def test_verify_an_intact_file_exits_0(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, _ = run_here(capsys, monkeypatch, database, "verify")
    assert code == 0
    assert "page errors:   none" in out
    assert "items:         3 authentic" in out
    assert re.search(
        r"audit log:     \d+ entr(y|ies) verified, each chained to the one before \(entries cut from its end do not show here\)",
        out,
    )
    assert "OK: no damage or tampering found." in out


def test_verify_finds_an_altered_audit_log(database: Path, tmp_path: Path) -> None:
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "agent.cdl"
    with CitadelSessionStore(database, PASSPHRASE) as store:
        store.backup(copy)  # the backup's audit log holds at least the backup's own entry
    log = Path(f"{copy}.citadel-audit")
    altered = bytearray(log.read_bytes())
    altered[len(altered) // 2] ^= 0x01
    log.write_bytes(bytes(altered))
    verified = run("verify", "--json", env=environment(copy))
    report = json.loads(verified.stdout)
    assert verified.returncode == 1 and report["ok"] is False and report["audit_break_at"] is not None
    assert report["page_errors"] == [] and report["item_verdicts"] == {"authentic": 3}
    text = run("verify", env=environment(copy))
    assert "chain broken at entry" in text.stdout and "the audit log altered" in text.stderr


def test_verify_a_tampered_copy_exits_1_with_a_report(database: Path, tmp_path: Path) -> None:
    verified = run("verify", env=environment(tampered_copy(database, tmp_path)))

    assert verified.returncode == 1
    assert f"database:      {tmp_path / 'copy' / 'agent.cdl'}" in verified.stdout
    assert "page errors:   1" in verified.stdout
    assert "contents were altered" in verified.stdout
    assert "verify: FAILED" in verified.stderr and "from a backup" in verified.stderr


def test_verify_json_reports_the_damage(
    database: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, _ = run_here(capsys, monkeypatch, tampered_copy(database, tmp_path), "verify", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False and len(report["page_errors"]) == 1
    assert report["item_verdicts"] == {"authentic": 3}


def test_verify_a_file_too_damaged_to_open_exits_1_with_a_readable_message(
    database: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copy = tampered_copy(database, tmp_path, offset=0)
    code, _, err = run_here(capsys, monkeypatch, copy, "verify")
    assert code == 1
    assert f"error: {copy} is damaged" in err
    assert "restore the file and its companion files from a backup" in err


# -- errors shared by every command -----------------------------------------------------------


def service_holding(database: Path, *, serve: bool) -> subprocess.Popen[str]:
    """A service process holding the file (serving it to others, or keeping it to itself)."""
    return holding(
        database,
        "import os, sys\n"
        "from citadeldb_openai_agents import CitadelSessionStore\n"
        "store = CitadelSessionStore(sys.argv[1], os.environ['HOLDER_KEY'], serve=sys.argv[2] == 'yes')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
        "store.close()\n",
        "yes" if serve else "no",
    )


def holding(database: Path, script: str, *args: str) -> subprocess.Popen[str]:
    """`script` run on the file with its passphrase in HOLDER_KEY, once it says it is ready."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(database), *args],
        env=environment(database, HOLDER_KEY=PASSPHRASE),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
    return holder


def stop(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    # 0.76 s at most under load (benchmarks/suite_under_load.py, 2026-12-08)
    holder.wait(timeout=60)


def test_operator_commands_work_through_the_process_that_serves_the_file(
    database: Path, tmp_path: Path
) -> None:
    holder = service_holding(database, serve=True)
    try:
        env = environment(database)
        listed = run("sessions", env=env)
        exported = run("export", "user-456", env=env)
        verified = run("verify", "--json", env=env)
        backed_up = run("backup", str(tmp_path / "copy.cdl"), env=env)
        purged = run("purge", env=env)
        erased = run("erase", "user-123", "--yes", "--json", env=env)
        checked = run("check", env=env)
        rotated = run("rotate-key", env={**env, "CITADEL_NEW_KEY": NEW_PASSPHRASE})
        reembedded = run("reembed", env=env)
    finally:
        stop(holder)

    assert listed.returncode == 0 and "user-123" in listed.stdout and "user-456" in listed.stdout
    assert exported.returncode == 0 and json.loads(exported.stdout) == OTHER[0]
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True
    assert backed_up.returncode == 0 and (tmp_path / "copy.cdl").exists()
    assert purged.returncode == 0 and "erased 0 expired items" in purged.stdout
    assert erased.returncode == 0
    [receipt] = json.loads(erased.stdout)
    assert (receipt["session_id"], receipt["items_erased"], receipt["readback_confirmed"]) == (
        "user-123",
        2,
        True,
    )
    assert checked.returncode == 0
    assert f"held by process {holder.pid}, serving; passphrase verified through the owner" in checked.stdout
    # rotate-key through the owner (docs/operations.md, "rotate-key on a served file").
    assert rotated.returncode == 0 and "passphrase changed and verified" in rotated.stdout, rotated.stderr
    assert reembedded.returncode == 1 and "one process owns a Citadel file at a time" in reembedded.stderr
    with CitadelSessionStore(database, NEW_PASSPHRASE) as store:
        assert store.session_ids() == ["user-456"]


def test_a_file_held_by_another_process_explains_who_owns_it(database: Path) -> None:
    holder = service_holding(database, serve=False)
    try:
        erased = run("erase", "user-123", "--yes", env=environment(database))
    finally:
        stop(holder)

    assert erased.returncode == 1
    assert f"PID {holder.pid}" in erased.stderr and "serve = false there" in erased.stderr
    assert "one process owns a Citadel file at a time" in erased.stderr
    assert "stop the service that owns the file" in erased.stderr
    assert "store.erase_sessions(session_ids)" in erased.stderr
    with CitadelSessionStore(database, PASSPHRASE) as store:
        assert store.export("user-123") == TRANSCRIPT


def test_a_missing_database_is_reported_and_not_created(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = tmp_path / "typo.cdl"
    code, _, err = run_here(capsys, monkeypatch, missing, "sessions")
    assert code == 1
    assert f"error: there is no database at {missing}" in err
    assert "environment variable CITADEL_PATH" in err
    assert list(tmp_path.iterdir()) == []


def test_configuration_problems_are_all_listed_and_exit_1(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = run_here(capsys, monkeypatch, database, "verify", CITADEL_KEY=None, CITADEL_TTL="soon")
    assert code == 1 and out == ""
    assert "error: the configuration is not usable (2 problems)" in err
    assert "check` shows every setting" in err


def test_config_names_the_toml_file_as_check_does(
    database: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "etc").mkdir()
    toml = tmp_path / "etc" / "citadel.toml"
    toml.write_text(f'path = "{database}"\nargon2_profile = "iot"\n')
    code, out, _ = run_here(
        capsys,
        monkeypatch,
        database,
        "sessions",
        "--json",
        "--config",
        str(toml),
        CITADEL_PATH=None,
    )
    assert code == 0
    assert [row["session_id"] for row in json.loads(out)] == ["user-123", "user-456"]


def test_a_key_file_others_can_read_is_warned_about_and_still_used(
    database: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key_file = tmp_path / "citadel.key"
    key_file.write_text(PASSPHRASE + "\n")
    key_file.chmod(0o644)
    code, _, err = run_here(
        capsys, monkeypatch, database, "sessions", CITADEL_KEY=None, CITADEL_KEY_FILE=str(key_file)
    )
    assert code == 0
    assert err.startswith("warning: ") and str(key_file) in err


def test_a_wrong_passphrase_exits_1(
    database: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = run_here(capsys, monkeypatch, database, "sessions", CITADEL_KEY=WRONG)
    assert code == 1 and out == ""
    assert "error: wrong passphrase for" in err


@pytest.mark.parametrize("args", [["export"], ["erase"], ["backup"], ["sessions", "--bogus"]])
def test_a_usage_error_exits_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2


# -- settings fixed per file: adopted when unset, refused when they disagree -----------------

# A service configured as env-only deployments are: a TTL, sync_mode "off", its own embedder.
CONFIGURED_SERVICE = (
    "import asyncio, os, sys, citadeldb\n"
    "from citadeldb_openai_agents import CitadelSessionStore\n"
    "store = CitadelSessionStore(sys.argv[1], os.environ['HOLDER_KEY'], ttl=30 * 86400,\n"
    "    sync_mode='off', embedder=citadeldb.MockEmbedder(dim=64), argon2_profile='iot')\n"
    "asyncio.run(store.session('alice').add_items([{'role': 'user', 'content': 'hi'}]))\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
    "store.close()\n"
)


def test_an_operator_command_adopts_the_settings_it_does_not_set_and_refuses_one_that_disagrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "service.cdl"
    holder = holding(database, CONFIGURED_SERVICE)
    try:
        env = environment(database)  # the path and the passphrase only
        checked = run("check", env=env)
        checked_json = run("check", "--json", env=env)
        listed = run("sessions", env=env)
        disagreeing = run("sessions", env={**env, "CITADEL_TTL": "1h"})
        # The same through the API: from_config leaves the unset ones to the owner.
        for name, value in env.items():
            if name.startswith("CITADEL_"):
                monkeypatch.setenv(name, value)
        with from_config() as store:
            assert store.served_by == holder.pid
            assert store.ttl == 30 * 86400
            assert store.adopted == {
                "ttl": 30 * 86400,
                "sync_mode": "off",
                "embedder": EmbedderIdentity("mock-fnv1a-bow-v1", 64, "cosine"),
            }
            assert store.embedder_identity.dim == 64
        with from_config(ttl="30d") as store:  # set, and agreeing: not adopted, not refused
            assert set(store.adopted) == {"sync_mode", "embedder"}
    finally:
        stop(holder)
    assert checked.returncode == 0, checked.stderr
    assert f"held by process {holder.pid}, serving" in checked.stdout
    assert "ttl: 30d, the owner's (not set here, so adopted)" in checked.stdout
    assert re.search(r"^  ttl +the owner's: 30d +default$", checked.stdout, re.MULTILINE)
    assert "sync_mode: off, the owner's (not set here, so adopted)" in checked.stdout
    assert "embedder: mock-fnv1a-bow-v1 (dim 64, cosine), the owner's" in checked.stdout
    assert json.loads(checked_json.stdout)["database"]["adopted"] == {
        "ttl": 30 * 86400,
        "sync_mode": "off",
        "embedder": {"model_id": "mock-fnv1a-bow-v1", "dim": 64, "metric": "cosine"},
    }
    assert listed.returncode == 0 and "alice" in listed.stdout, listed.stderr
    assert disagreeing.returncode == 1
    assert "ttl: this process has ttl 1h, the owner has ttl 30d" in disagreeing.stderr
