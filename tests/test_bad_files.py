"""Bad files: a wrong passphrase, damaged pages, lost companion files, things that are not Citadel files.

Each gives a package error that names the file and the fix, never an engine
traceback, and none makes things worse: the files are left as they were, so the
fix the message gives (restore from a backup, put the companion file back) works.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from citadeldb_openai_agents import (
    CitadelSession,
    CitadelSessionError,
    CitadelSessionStore,
    CorruptDatabaseError,
    DatabaseNotFoundError,
    WrongPassphraseError,
)

from conftest import KEY

PAGE = 8192  # Citadel 2.7.0's page size (measured): a flip mid-page damages one page
AUDIT = ".citadel-audit"  # an append-only log of opens: the one file an open may extend


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def without_audit(files: dict[str, str]) -> dict[str, str]:
    return {name: digest for name, digest in files.items() if not name.endswith(AUDIT)}


def flip(path: Path, offset: int, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def conversation(session_id: str, turns: int) -> list[dict]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": f"{session_id} says {n}"}
        for n in range(turns)
    ]


@pytest.fixture
async def original(tmp_path: Path) -> tuple[Path, dict[str, list[dict]], Path]:
    """A closed file with three sessions, and a backup of it made by the store."""
    path = tmp_path / "original" / "agent.cdl"
    path.parent.mkdir()
    held = {sid: conversation(sid, turns) for sid, turns in (("alice", 40), ("bob", 120), ("carol", 7))}
    with CitadelSessionStore(path, KEY, argon2_profile="iot") as store:
        for sid, items in held.items():
            for start in range(0, len(items), 20):
                await store.session(sid).add_items(items[start : start + 20])
        (tmp_path / "backup").mkdir()
        store.backup(tmp_path / "backup" / "agent.cdl")
    return path, held, tmp_path / "backup" / "agent.cdl"


def copy_of(path: Path, directory: Path) -> Path:
    directory.mkdir(parents=True)
    for file in path.parent.iterdir():
        shutil.copy(file, directory / file.name)
    return directory / path.name


def restore(backup: Path, path: Path) -> None:
    for file in backup.parent.iterdir():
        if file.name.startswith(backup.name):
            shutil.copy(file, path.parent / file.name.replace(backup.name, path.name, 1))


async def read_everything(path: Path, held: dict[str, list[dict]], damaged_page: int | None = None) -> None:
    """Every call a user makes, each checked against what was written.

    `verify` must call every item authentic, and report no damaged page but
    `damaged_page` (a page no call reads, which changes nothing a user sees).
    """
    with CitadelSessionStore(path, KEY) as store:
        assert store.session_ids() == sorted(held)
        for sid, items in held.items():
            session = store.session(sid)
            assert await session.get_items() == items
            assert await session.get_items(limit=3) == items[-3:]
            found = await session.search("says")  # every item says it: the top 5 are found
            assert len(found) == 5 and all(item in items for item in found), (sid, found)
        await store.session("new").add_items([{"content": "written after the damage"}])
        await store.session("new").pop_item()
        report = store.verify()
    assert report.item_verdicts == {"authentic": sum(map(len, held.values()))}
    assert report.audit_break_at is None
    assert all(error.startswith(f"page:{damaged_page} ") for error in report.page_errors), report
    assert report.ok == (not report.page_errors), report


def assert_names_file_and_fix(error: BaseException, path: Path) -> None:
    message = str(error)
    assert str(path) in message
    assert "verify" in message and "backup" in message
    assert KEY not in message


# -- wrong passphrase ------------------------------------------------------------------

WRONG = ["not the passphrase", KEY + "\n", KEY.upper(), " " + KEY, KEY[:-1]]


@pytest.mark.parametrize(
    "wrong", WRONG, ids=["other", "trailing-newline", "upper", "leading-space", "prefix"]
)
async def test_a_wrong_passphrase_leaves_every_file_byte_identical(original, wrong: str) -> None:
    path, held, _ = original
    before = snapshot(path.parent)
    with pytest.raises(WrongPassphraseError, match="wrong passphrase"):
        CitadelSessionStore(path, wrong)
    with pytest.raises(WrongPassphraseError):
        CitadelSession("alice", path, wrong)
    assert snapshot(path.parent) == before, "a failed open must not touch any file, the audit log included"
    await read_everything(path, held)


# -- damaged pages ---------------------------------------------------------------------


async def sweep_damaged_pages(original, tmp_path: Path, samples: int | None) -> dict[str, list[int]]:
    """Damage one page at a time (`samples` pages spread over those the file uses, or all);
    use each copy fully.

    A page Citadel reads fails its MAC check, at open or on the first call that reads it:
    that must surface as `CorruptDatabaseError`, and restoring the backup over the damaged
    files, in the same process, must bring everything back. A page no call reads (free or
    not yet used) must change nothing a user sees.
    """
    path, held, backup = original
    with CitadelSessionStore(path, KEY) as store:
        pages = store.verify().pages_checked
    outcomes: dict[str, list[int]] = {"reported": [], "unread": []}
    step = 1 if samples is None else max(1, pages // samples)
    for page in range(0, pages, step):
        damaged = copy_of(path, tmp_path / f"page-{page}")
        flip(damaged, page * PAGE + PAGE // 2)
        try:
            await read_everything(damaged, held, damaged_page=page)
        except CorruptDatabaseError as error:
            assert_names_file_and_fix(error, damaged)
            outcomes["reported"].append(page)
            restore(backup, damaged)
            await read_everything(damaged, held)
        else:
            outcomes["unread"].append(page)
    return outcomes


async def test_a_damaged_page_is_reported_and_a_restore_brings_everything_back(
    original, tmp_path: Path
) -> None:
    outcomes = await sweep_damaged_pages(original, tmp_path, samples=8)
    assert len(outcomes["reported"]) >= 2, outcomes


@pytest.mark.slow
async def test_every_damaged_page_is_reported_or_harmless(original, tmp_path: Path) -> None:
    outcomes = await sweep_damaged_pages(original, tmp_path, samples=None)
    assert len(outcomes["reported"]) >= 10, outcomes


def write_sqlite(path: Path) -> None:
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE t (x)")
    connection.commit()
    connection.close()


NOT_CITADEL = {
    "empty": lambda p: p.write_bytes(b""),
    "ten-bytes": lambda p: p.write_bytes(b"0123456789"),
    "random": lambda p: p.write_bytes(os.urandom(3 * PAGE)),
    "text": lambda p: p.write_text("a text file\n" * 1000),
    "sqlite": write_sqlite,
}


@pytest.mark.parametrize("make", NOT_CITADEL.values(), ids=NOT_CITADEL.keys())
def test_a_file_that_is_not_a_citadel_database(tmp_path: Path, make) -> None:
    path = tmp_path / "agent.cdl"
    make(path)
    before = snapshot(tmp_path)
    with pytest.raises(CorruptDatabaseError) as caught:
        CitadelSessionStore(path, KEY)
    assert_names_file_and_fix(caught.value, path)
    assert without_audit(snapshot(tmp_path)) == before


async def test_damaged_header_is_reported_at_open(original) -> None:
    path, held, backup = original
    flip(path, 0, 64)
    with pytest.raises(CorruptDatabaseError) as caught:
        CitadelSessionStore(path, KEY)
    assert_names_file_and_fix(caught.value, path)
    restore(backup, path)
    await read_everything(path, held)


# -- companion files -------------------------------------------------------------------


@pytest.mark.parametrize("companion", [".citadel-keys", ".citadel-regions", ".citadel-atomkeys"])
async def test_a_missing_companion_file_is_named_and_putting_it_back_loses_nothing(
    original, companion: str
) -> None:
    path, held, _ = original
    lost = Path(f"{path}{companion}")
    kept_aside = lost.read_bytes()
    lost.unlink()
    before = snapshot(path.parent)
    with pytest.raises(DatabaseNotFoundError) as caught:
        CitadelSessionStore(path, KEY)
    message = str(caught.value)
    assert str(lost) in message and "missing" in message and "backup" in message
    assert KEY not in message
    # Citadel would treat every region as erased if it went on (measured for -regions).
    assert without_audit(snapshot(path.parent)) == without_audit(before)
    lost.write_bytes(kept_aside)
    await read_everything(path, held)


async def test_companion_files_without_their_database(original) -> None:
    path, held, _ = original
    kept_aside = path.read_bytes()
    path.unlink()
    before = snapshot(path.parent)
    with pytest.raises(DatabaseNotFoundError) as caught:
        CitadelSessionStore(path, KEY)
    assert str(path) in str(caught.value) and "backup" in str(caught.value)
    assert snapshot(path.parent) == before and not path.exists()
    path.write_bytes(kept_aside)
    await read_everything(path, held)


def test_a_directory_given_as_the_file(tmp_path: Path) -> None:
    with pytest.raises(DatabaseNotFoundError, match="is a directory") as caught:
        CitadelSessionStore(tmp_path, KEY)
    assert isinstance(caught.value, CitadelSessionError)
    assert list(tmp_path.iterdir()) == []
