"""Users of the original package, citadeldb-openai-agents 2.x, come over.

The files read here were written by that package itself (tests/legacy_files/make.py, in a
virtual environment of its own); manifest.json records what it returned for each session.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import citadeldb
import pytest
from test_operator_cli import PASSPHRASE, run, run_here
from test_secrets import secrets_in_frames

from citadeldb_openai_agents import (
    CitadelSession,
    CitadelSessionStore,
    CorruptDatabaseError,
    EmbedderMismatchError,
    ImportSourceError,
    OriginalLayoutError,
    OriginalSourceError,
    ReplacedApiError,
    SessionNotEmptyError,
    WrongPassphraseError,
    import_file,
    import_original,
)
from citadeldb_openai_agents.storage.inventory import region_rows
from citadeldb_openai_agents.storage.records import SEGMENT_PREFIX

FIXTURES = Path(__file__).resolve().parent / "legacy_files"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
SOURCE_KEY = MANIFEST["default.cdl"]["key"]
REGIONS = [(name, region) for name, file in MANIFEST.items() for region in file["regions"]]
SOON = 2.0  # seconds: test_an_items_own_expiry_and_the_stores_ttl_the_earlier_wins
EXPIRED_IN_DEFAULT = 6  # one item of 'ttl-mixed' and the five of 'all-expired' (make.py)


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    """A copy of the committed files (opening one appends to its audit log)."""
    directory = tmp_path / "legacy"
    directory.mkdir()
    for name in os.listdir(FIXTURES):
        if ".cdl" in name:
            shutil.copy2(FIXTURES / name, directory / name)
    return directory


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return tmp_path / "agent.cdl"


def digests(path: Path) -> dict[str, str]:
    """Every file of a Citadel database but its audit log, which Citadel appends to on each open."""
    return {
        name.name: hashlib.sha256(name.read_bytes()).hexdigest()
        for name in sorted(path.parent.glob(path.name + "*"))
        if not name.name.endswith("-audit")
    }


def open_target(path: Path) -> CitadelSessionStore:
    return CitadelSessionStore(path, PASSPHRASE, argon2_profile="iot", sync_mode="off")


def expected(name: str, region: str) -> dict[str, Any]:
    return dict(MANIFEST[name]["regions"][region]["sessions"])


# -- recognised -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default.cdl", "custom.cdl"])
def test_opening_an_original_file_names_it_and_the_import_command_and_changes_nothing(
    legacy: Path, name: str
) -> None:
    path = legacy / name
    before = digests(path)
    with pytest.raises(OriginalLayoutError) as raised:
        CitadelSessionStore(path, SOURCE_KEY)
    assert not isinstance(raised.value, CorruptDatabaseError)
    message = str(raised.value)
    regions = MANIFEST[name]["regions"]
    for region, content in regions.items():
        items = sum(len(session["items"]) for session in content["sessions"].values())
        assert f"region {region!r}, {items:,} items" in message
        assert raised.value.regions[region] == items
    assert f"written by citadeldb-openai-agents 2.x: region '{sorted(regions)[0]}'" in message
    assert f"python -m citadeldb_openai_agents import {path}" in message
    assert ("--source-region" in message) == (len(regions) > 1)
    assert "nothing was changed" in message and "Coming from citadeldb-openai-agents 2.x" in message
    assert "damaged" not in message and "backup" not in message
    # The original's README form, its embedder given: the same answer, before the embedder matters.
    with pytest.raises(OriginalLayoutError):
        CitadelSession("user-123", path, key=SOURCE_KEY, embedder=citadeldb.MockEmbedder(dim=384))
    assert digests(path) == before


def test_the_cli_and_check_report_an_original_file_with_the_command(
    legacy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = legacy / "default.cdl"
    before = digests(path)
    code, out, err = run_here(capsys, monkeypatch, path, "sessions", CITADEL_KEY=SOURCE_KEY)
    assert code == 1 and "written by citadeldb-openai-agents 2.x: region 'sessions', 1,070 items" in err
    code, out, err = run_here(capsys, monkeypatch, path, "check", CITADEL_KEY=SOURCE_KEY)
    assert code == 1
    assert "written by citadeldb-openai-agents 2.x" in out + err
    assert f"python -m citadeldb_openai_agents import {path}" in out + err
    # No operator command takes it for damage or for a file of ours, repair least of all.
    for command in (
        ["verify"],
        ["repair", "--yes"],
        ["rotate-key"],
        ["purge"],
        ["reembed"],
        ["backup", str(path.parent / "copy.cdl")],
        ["owner", "set", "plain", "--owner", "alice"],
    ):
        code, out, err = run_here(
            capsys, monkeypatch, path, *command, CITADEL_KEY=SOURCE_KEY, CITADEL_NEW_KEY="a new key 0f3a"
        )
        assert code == 1 and "written by citadeldb-openai-agents 2.x: region 'sessions'" in err, (
            command,
            err,
        )
        assert "damaged" not in err and "backup" not in err.replace("--source-key", ""), (command, err)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(p.name for p in FIXTURES.glob("*.cdl*"))
    assert digests(path) == before


# -- imported whole ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "region"), REGIONS)
def test_each_committed_file_imports_item_by_item_as_its_manifest_records(
    legacy: Path, target: Path, name: str, region: str
) -> None:
    source = legacy / name
    before = digests(source)
    sessions = expected(name, region)
    with open_target(target) as store:
        report = import_original(store, source, SOURCE_KEY, region=region)
        assert report.region == region and report.source == str(source)
        assert report.written == sum(len(session["items"]) for session in sessions.values())
        assert report.expired == (EXPIRED_IN_DEFAULT if name == "default.cdl" else 0)
        assert store.session_ids() == sorted(sessions)
        for session_id, content in sessions.items():
            # Verbatim and in order: function calls, tool outputs, multi-part content, key order.
            held = store.export(session_id)
            assert held == content["items"], session_id
            assert [list(item) for item in held] == [list(item) for item in content["items"]]
    assert digests(source) == before, "the source is read, never written"
    # Each item kept its expiry: the target's rows carry the source's times, no more, no less.
    kept = sorted(at for s in sessions.values() for at in s["expires_at"] if at is not None)
    assert sorted(at for at in item_expiries(target) if at is not None) == kept


def item_expiries(path: Path) -> list[int | None]:
    """The expiry of every item row in a file of ours, read from its pages."""
    db = citadeldb.connect(str(path), key=PASSPHRASE, region_keys=True)
    try:
        names = [
            entry.name for entry in db.memory_maintenance().regions() if entry.name.startswith(SEGMENT_PREFIX)
        ]
        return [at for rows in region_rows(db, names, "item").values() for at in rows.values()]
    finally:
        db.close()


def test_popped_cleared_expired_and_unicode_sessions_come_over_as_the_original_returned_them(
    legacy: Path, target: Path
) -> None:
    with open_target(target) as store:
        import_original(store, legacy / "default.cdl", SOURCE_KEY)
        ids = store.session_ids()
        assert {"usuário-ção", "用户-42", "emoji-🦉", "Bob", "bob"} <= set(ids)
        assert "cleared" not in ids and "all-expired" not in ids
        assert len(store.export("popped")) == 8  # 10 written, 2 popped
        assert store.export("cleared-then-reused") == [{"content": "after the clear", "role": "user"}]
        mixed = store.export("ttl-mixed")
        assert {"content": "this one expires", "role": "user"} not in mixed
        assert mixed[-1] == {"content": "after the expired one", "role": "user"}
        assert len(store.export("big")) == 1000


def test_an_items_own_expiry_and_the_stores_ttl_the_earlier_wins(tmp_path: Path) -> None:
    # Citadel compares expiries with its own wall clock, which cannot be injected. The item due
    # "soon" must still be there for the first export: the import and the export took 0.14 s at
    # most under load (benchmarks/suite_under_load.py --runs 1 --command -- python -m pytest -q
    # -s tests/test_original_files.py -k earlier_wins, 2026-12-08); it is due SOON (14x) later.
    # The checks that the items are gone wait past their expiries, however slow the writes.
    items = [{"role": "user", "content": f"item {n}"} for n in range(4)]
    with CitadelSessionStore(tmp_path / "a.cdl", PASSPHRASE, argon2_profile="iot") as plain:
        soon_at = time.time() + SOON
        soon, later = int(soon_at * 1_000_000), int((time.time() + 3600) * 1_000_000)
        plain.import_items("s", items, expires_at=[None, later, soon, None])
        assert plain.export("s") == items
        with pytest.raises(ValueError, match="3 expiries for 4 items"):
            plain.import_items("t", items, expires_at=[None, None, None])
    with CitadelSessionStore(tmp_path / "b.cdl", PASSPHRASE, argon2_profile="iot", ttl=1.0) as short:
        short.import_items("s", items, expires_at=[None, later, later, None])
    imported = time.time()  # the store's TTL counted from a moment inside the import: 1 s past it
    time.sleep(max(0.0, max(soon_at, imported + 1.0) + 0.05 - time.time()))
    with CitadelSessionStore(tmp_path / "a.cdl", PASSPHRASE) as plain:
        assert plain.export("s") == [items[0], items[1], items[3]], "the item's own expiry ended it"
    with CitadelSessionStore(tmp_path / "b.cdl", PASSPHRASE, ttl=1.0) as short:
        assert short.summary("s") is None, "the store's TTL ended them all first"


def test_a_rerun_writes_nothing_and_a_grown_source_brings_only_what_is_new(
    legacy: Path, target: Path
) -> None:
    source = legacy / "default.cdl"
    with open_target(target) as store:
        first = import_original(store, source, SOURCE_KEY)
        again = import_original(store, source, SOURCE_KEY)
        assert again.written == 0 and sum(s.already_held for s in again.sessions) == first.written
        assert store.export("plain") == expected("default.cdl", "sessions")["plain"]["items"]
    # The 2.x application wrote on after the import: two more items, as the original writes them.
    new = [
        {"role": "user", "content": "asked after the import"},
        {"role": "assistant", "content": "answered"},
    ]
    db = citadeldb.connect(str(source), key=SOURCE_KEY, region_keys=True)
    memory = db.memory()
    memory.create_encrypted_region("sessions", citadeldb.MockEmbedder(dim=32))
    memory.remember_batch(
        "sessions", [{"kind": "item", "text": "x", "payload": {"sid": "plain", "item": item}} for item in new]
    )
    db.close()
    del memory, db
    with open_target(target) as store:
        grown = import_original(store, source, SOURCE_KEY)
        assert grown.written == 2
        plain = next(s for s in grown.sessions if s.session_id == "plain")
        assert (plain.written, plain.already_held) == (2, 15)
        assert store.export("plain") == expected("default.cdl", "sessions")["plain"]["items"] + [
            dict(sorted(item.items())) for item in new
        ]


def test_a_session_holding_other_items_is_refused_before_anything_is_written(
    legacy: Path, target: Path
) -> None:
    with open_target(target) as store:
        asyncio.run(store.session("bob").add_items([{"role": "user", "content": "mine"}]))
        with pytest.raises(SessionNotEmptyError, match=r"session 'bob' in .* already holds other items"):
            import_original(store, legacy / "default.cdl", SOURCE_KEY)
        assert store.session_ids() == ["bob"]
        dry = import_original(store, legacy / "default.cdl", SOURCE_KEY, dry_run=True)
        assert dry.dry_run and dry.refused == ["bob"] and store.session_ids() == ["bob"]
        appended = import_original(store, legacy / "default.cdl", SOURCE_KEY, mode="append")
        assert store.export("bob")[1:] == expected("default.cdl", "sessions")["bob"]["items"]
        assert appended.written == 1070
    # Before the target exists: a dry run plans against nothing; a real import needs a store.
    empty = import_original(None, legacy / "default.cdl", SOURCE_KEY, dry_run=True)
    assert empty.refused == [] and [s.written for s in empty.sessions] == [s.items for s in empty.sessions]
    with pytest.raises(ValueError, match="dry_run=True"):
        import_original(None, legacy / "default.cdl", SOURCE_KEY)


# -- the command ------------------------------------------------------------------------


def test_the_import_command_dry_run_import_rerun_and_receipt(
    legacy: Path,
    target: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = legacy / "default.cdl"
    key_file = tmp_path / "source-key"
    key_file.write_text(SOURCE_KEY + "\n")
    key_file.chmod(0o600)
    before = digests(source)
    given = ("import", str(source), "--create", "--source-key-file", str(key_file))
    code, out, err = run_here(capsys, monkeypatch, target, *given, "--dry-run")
    assert code == 0, err
    assert out.startswith("dry run, nothing was written: would import 11 sessions, 1070 items from")
    assert "6 items had expired and would not be imported" in out and "  big: 1000 items\n" in out
    # A dry run writes nothing, so even with --create it makes no target: it plans against none.
    assert f"into {target} (not made yet: nothing is held there)" in out
    assert not list(tmp_path.glob(target.name + "*"))
    code, out, err = run_here(capsys, monkeypatch, target, *given)
    assert code == 0, err
    assert "imported 11 sessions, 1070 items" in out and "the source is unchanged" in out
    code, out, err = run_here(capsys, monkeypatch, target, *given, "--json")
    assert code == 0, err
    receipt = json.loads(out)
    assert receipt["region"] == "sessions" and receipt["expired"] == EXPIRED_IN_DEFAULT
    assert all(s["written"] == 0 and s["already_held"] == s["items"] for s in receipt["sessions"])
    code, out, err = run_here(capsys, monkeypatch, target, *given)
    assert "every item was already here from an earlier run: nothing was written" in out
    assert "plain: 15 items, already imported: none was written" in out
    assert digests(source) == before
    assert SOURCE_KEY not in out + err


def test_the_source_passphrase_comes_from_a_variable_never_an_argument(
    legacy: Path,
    target: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = str(legacy / "custom.cdl")
    code, out, err = run_here(capsys, monkeypatch, target, "import", source, "--create")
    assert code == 1 and "no passphrase for" in err and "CITADEL_SOURCE_KEY_FILE" in err
    both = {"CITADEL_SOURCE_KEY": SOURCE_KEY, "CITADEL_SOURCE_KEY_FILE": str(tmp_path / "k")}
    code, out, err = run_here(capsys, monkeypatch, target, "import", source, "--create", **both)
    assert code == 1 and "set twice" in err
    code, out, err = run_here(
        capsys,
        monkeypatch,
        target,
        "import",
        source,
        "--create",
        CITADEL_SOURCE_KEY="nope",
        CITADEL_SOURCE_KEY_FILE=None,
    )
    assert code == 1 and "wrong passphrase for" in err and "it came from CITADEL_SOURCE_KEY" in err
    code, out, err = run_here(
        capsys, monkeypatch, target, "import", source, "--create", CITADEL_SOURCE_KEY=SOURCE_KEY
    )
    assert (
        code == 1 and "several regions" in err and "'billing' (30 items)" in err and "--source-region" in err
    )
    code, out, err = run_here(
        capsys,
        monkeypatch,
        target,
        "import",
        source,
        "--source-region",
        "BILLING",
        CITADEL_SOURCE_KEY=SOURCE_KEY,
    )
    assert code == 0, err
    assert "imported 3 sessions, 30 items" in out and "region 'billing'" in out
    code, out, err = run_here(
        capsys,
        monkeypatch,
        target,
        "import",
        source,
        "--source-region",
        "nope",
        CITADEL_SOURCE_KEY=SOURCE_KEY,
    )
    assert code == 1 and "no region 'nope'" in err and "'support'" in err
    assert SOURCE_KEY not in out + err


def test_the_command_in_its_own_process_with_a_registered_variable(legacy: Path, target: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CITADEL_")}
    environment |= {"CITADEL_PATH": str(target), "CITADEL_KEY": PASSPHRASE, "CITADEL_ARGON2_PROFILE": "iot"}
    environment |= {"CITADEL_SOURCE_KEY": SOURCE_KEY}
    done = run("import", str(legacy / "default.cdl"), "--create", env=environment)
    assert done.returncode == 0, done.stderr
    assert "imported 11 sessions" in done.stdout and "unknown" not in done.stderr.lower()
    assert SOURCE_KEY not in done.stdout + done.stderr


def test_what_is_not_a_2x_file_is_refused_by_name(legacy: Path, target: Path, tmp_path: Path) -> None:
    with open_target(target) as store:
        with pytest.raises(OriginalSourceError, match="import_original"):
            import_file(store, legacy / "default.cdl")
        with pytest.raises(ImportSourceError, match="no file"):
            import_original(store, tmp_path / "missing.cdl", SOURCE_KEY)
        (tmp_path / "notes.txt").write_text("hello")
        with pytest.raises(ImportSourceError, match="not a Citadel file"):
            import_original(store, tmp_path / "notes.txt", SOURCE_KEY)
        with pytest.raises(ImportSourceError, match="the file being imported into"):
            import_original(store, target, PASSPHRASE)
        ours = tmp_path / "ours.cdl"
        open_target(ours).close()
        asyncio.run(_one_item(ours))
        with pytest.raises(ImportSourceError, match="It is a file of this package"):
            import_original(store, ours, PASSPHRASE)
        with pytest.raises(WrongPassphraseError) as wrong:
            import_original(store, legacy / "default.cdl", "not the passphrase")
        assert "import_original's key= argument" in str(wrong.value)
        assert not secrets_in_frames(wrong.value, holds=lambda value: value == "not the passphrase")
        assert store.session_ids() == []


async def _one_item(path: Path) -> None:
    with open_target(path) as store:
        await store.session("x").add_items([{"role": "user", "content": "hi"}])


def test_a_damaged_source_is_refused_not_imported_short(
    legacy: Path, target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import test_damage

    monkeypatch.setattr(test_damage, "KEY", SOURCE_KEY)
    source = legacy / "custom.cdl"
    test_damage.damage_atom(source, "support", 4, "item")  # Citadel's fetch now skips it silently
    with open_target(target) as store:
        with pytest.raises(
            ImportSourceError, match=r"1 of the 30 items of region 'support' .* cannot be read"
        ):
            import_original(store, source, SOURCE_KEY, region="support")
        assert store.session_ids() == []
        assert import_original(store, source, SOURCE_KEY, region="billing").written == 30


# -- erased after a verified import ------------------------------------------------------


def test_erase_source_forgets_every_atom_expired_ones_too_after_the_import_reads_back(
    legacy: Path,
    target: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = legacy / "default.cdl"
    code, out, err = run_here(
        capsys,
        monkeypatch,
        target,
        "import",
        str(source),
        "--create",
        "--erase-source",
        CITADEL_SOURCE_KEY=SOURCE_KEY,
    )
    assert code == 0, err
    assert (
        "erased the source's region 'sessions' after the import read back whole: 1076 atoms (6 of them expired)"
        in out
    )
    assert "AES-256-KW" in out and "none left" in out
    db = citadeldb.connect(str(source), key=SOURCE_KEY, region_keys=True)
    try:
        assert region_rows(db, ["sessions"], "item") == {"sessions": {}}, (
            "not even an expired atom's row is left"
        )
        assert db.memory_maintenance().fetch("sessions", "item") == []
    finally:
        db.close()
    with open_target(target) as store:
        assert len(store.session_ids()) == 11 and len(store.export("big")) == 1000


def test_the_source_is_not_erased_when_the_import_does_not_read_back_whole(
    legacy: Path, target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = legacy / "default.cdl"
    before = digests(source)
    export = CitadelSessionStore.export

    def one_short(self: CitadelSessionStore, session_id: str, **kwargs: Any) -> list[Any]:
        items = export(self, session_id, **kwargs)
        return items[:-1] if session_id == "big" else items

    with open_target(target) as store:
        monkeypatch.setattr(CitadelSessionStore, "export", one_short)
        with pytest.raises(
            ImportSourceError, match=r"session 'big' did not read back .* the source was not erased"
        ):
            import_original(store, source, SOURCE_KEY, erase_source=True)
    assert digests(source) == before


# -- code written for 2.x ---------------------------------------------------------------


async def test_the_original_readme_calls_work_and_the_rest_name_their_replacement(tmp_path: Path) -> None:
    path = tmp_path / "agent.cdl"
    embedder = citadeldb.MockEmbedder(dim=384)
    session = CitadelSession("user-123", path, key=PASSPHRASE, embedder=embedder)
    await session.add_items([{"role": "user", "content": "my dog is called Mochi"}])
    assert await session.search("dog", limit=3) == [{"role": "user", "content": "my dog is called Mochi"}]
    assert session.store.session_ids() == ["user-123"]
    store = session.store
    for call in (
        lambda: store.items("user-123"),
        lambda: store.append("user-123", []),
        lambda: store.erase([1]),
    ):
        with pytest.raises(ReplacedApiError, match=r"citadeldb-openai-agents 2\.x's API; here") as raised:
            call()
        assert "Coming from citadeldb-openai-agents 2.x" in str(raised.value)
    assert isinstance(raised.value, TypeError) and "store.erase_session(session_id)" in str(raised.value)
    with pytest.raises(ReplacedApiError, match="--source-region support"):
        CitadelSession("user-123", path, key=PASSPHRASE, embedder=embedder, region="support")
    with pytest.raises(ReplacedApiError, match="region="):
        CitadelSessionStore(path, PASSPHRASE, region="sessions")
    session.close()
    with pytest.raises(EmbedderMismatchError, match="embedded with another model"):
        CitadelSession("user-123", path, key=PASSPHRASE, embedder=citadeldb.MockEmbedder(dim=64))


# -- the committed files are what the original package writes ---------------------------


@pytest.mark.slow
def test_the_original_package_still_writes_what_the_manifest_records() -> None:
    """Regenerate the files in the original package's own environment and compare manifests."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(FIXTURES / "make.py"), "--check"], capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout + done.stderr
