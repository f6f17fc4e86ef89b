"""`verify` is exact (issue 42, point 6): it never advises running itself, names every damaged page
that holds data by bytes an operator can find, says what lies past the high-water mark, and counts
audit entries from 1.

Measured on citadeldb 2.7.0: the file is a 512-byte header, then pages of 8208 bytes counted from 0
(page N is bytes 512 + 8208 N to 512 + 8208 N + 8207, Citadel's own "page:N"); `stats()` gives the
high-water mark (pages 0 to mark - 1 are the used range). Citadel authenticates every page the current
and previous commit reach; a free page below the mark is read by nothing and rewritten whole before
reuse. `verify_audit_log()`'s `chain_break_at` is the broken entry's own sequence field, read from
the altered bytes; `entries_verified` counts the entries before the break.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import citadeldb
import pytest

from citadeldb_openai_agents import CitadelSessionStore, CorruptDatabaseError, verify_file
from citadeldb_openai_agents.cli import main

KEY = "correct horse battery staple"
SESSIONS = {
    name: [{"role": "user", "content": f"{name} says {n}"} for n in range(12)] for name in ("ann", "bo", "cy")
}


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed file of three sessions, written four items at a time (so it has free pages)."""
    path = tmp_path_factory.mktemp("original") / "agent.cdl"
    with CitadelSessionStore(path, KEY, argon2_profile="iot", sync_mode="off") as store:
        for session_id, items in SESSIONS.items():
            for start in range(0, len(items), 4):
                asyncio.run(store.session(session_id).add_items(items[start : start + 4]))
    return path


def copy_of(original: Path, directory: Path) -> Path:
    directory.mkdir(parents=True)
    for file in original.parent.iterdir():
        shutil.copy(file, directory / file.name)
    return directory / original.name


def invert(path: Path, offset: int, size: int = 64) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        original = file.read(size)
        file.seek(offset)
        file.write(bytes(byte ^ 0xFF for byte in original))


def high_water_mark(path: Path) -> int:
    db = citadeldb.connect(str(path), key=KEY, region_keys=True)
    try:
        return int(db.stats()["high_water_mark"])
    finally:
        db.close()


def verify(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, path: Path, *args: str
) -> tuple[int, str, str]:
    monkeypatch.setenv("CITADEL_PATH", str(path))
    monkeypatch.setenv("CITADEL_KEY", KEY)
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def reads_back_whole(path: Path) -> bool:
    with CitadelSessionStore(path, KEY) as store:
        held = {sid: asyncio.run(store.session(sid).get_items()) for sid in SESSIONS}
        return held == SESSIONS and store.verify().ok


# -- 1. no advice to run itself -----------------------------------------------------------------


def refusing_page(original: Path, directory: Path, *, connect: bool) -> int:
    """A page whose damage makes the store refuse to open the file (the open reads it); with
    `connect`, one that stops even `verify_file` (Citadel reads it to open the file at all)."""
    for page in range(high_water_mark(original)):
        path = copy_of(original, directory / f"page-{page}")
        invert(path, 512 + 8208 * page + 100)
        try:
            verify_file(path, KEY) if connect else CitadelSessionStore(path, KEY).close()
        except CorruptDatabaseError:
            return page
    raise AssertionError("no such page")


@pytest.mark.parametrize("where", ["header", "a page the open reads", "a page the connect reads"])
def test_verify_never_advises_running_verify(
    where: str,
    original: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The header: the file cannot be read at all. A page the open reads: the store refuses the file,
    which used to print Citadel's error and "Run ... verify"; it is inspected instead, and named."""
    page = 0 if where == "header" else refusing_page(original, tmp_path / "probe", connect="connect" in where)
    path = copy_of(original, tmp_path / "copy")
    invert(path, 0 if where == "header" else 512 + 8208 * page + 100)
    code, out, err = verify(capsys, monkeypatch, path)
    assert code == 1
    assert "citadeldb_openai_agents verify" not in out + err, out + err
    assert "restore the file and its companion files" in (out + err).lower()
    first = 512 + 8208 * page
    if where == "header":
        assert f"error: {path} is damaged" in err
    elif "connect" in where:  # no report: the error names the page by its bytes
        assert f"error: {path} is damaged" in err
        assert f"page {page} (bytes {first}-{first + 8207}) failed MAC verification" in err, err
    else:
        assert f"page {page} (bytes {first}-{first + 8207}) failed its authentication tag" in out, out


def test_verify_meeting_an_unknown_citadel_failure_says_what_to_do_not_to_run_verify(
    original: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every store call that meets this failure advises running verify; verify itself must not.
    from citadeldb_openai_agents.config import load
    from citadeldb_openai_agents.storage.translate import translate_open_error

    path = copy_of(original, tmp_path / "copy")
    failure = translate_open_error(citadeldb.CitadelError("an engine failure no rule names"), str(path))
    assert "citadeldb_openai_agents verify" in str(failure)

    def fails(*_: Any) -> Any:
        raise failure

    monkeypatch.setattr(load, "verify_file", fails)
    monkeypatch.setattr(
        load, "open_existing_store", lambda _: (_ for _ in ()).throw(CorruptDatabaseError("refused"))
    )
    code, out, err = verify(capsys, monkeypatch, path)
    assert code == 1 and "an engine failure no rule names" in err
    assert "citadeldb_openai_agents verify" not in out + err and "report this error" in err, err


def test_a_damage_error_keeps_its_cause_and_advice_across_the_owners_socket() -> None:
    from citadeldb_openai_agents.errors import RUN_VERIFY, StorageError
    from citadeldb_openai_agents.serving.protocol import error_from_wire, error_to_wire

    for sent in (
        CorruptDatabaseError("x.cdl is damaged.", RUN_VERIFY),
        StorageError("Citadel failed.", "Retry."),
    ):
        received = error_from_wire(*error_to_wire(sent)[1:])
        assert (type(received), received.cause, received.advice, str(received)) == (  # type: ignore[attr-defined]
            type(sent),
            sent.cause,
            sent.advice,
            str(sent),
        )


# -- 2. every page in use that holds data fails verify, named by its bytes ------------------------


def test_each_page_below_the_mark_that_holds_data_fails_verify_naming_its_bytes(
    original: Path, tmp_path: Path
) -> None:
    """Each page of the used range in turn, 64 bytes inverted mid-page: `verify_file` fails naming that
    page (or cannot open the file, naming it), or the page is free, and then the file reads back
    whole (nothing read it)."""
    mark = high_water_mark(original)
    named, free = [], []
    for page in range(mark):
        path = copy_of(original, tmp_path / f"page-{page}")
        first = 512 + 8208 * page
        invert(path, first + 4000)
        try:
            report = verify_file(path, KEY)
        except CorruptDatabaseError as error:  # a page Citadel reads to open the file at all
            assert f"page {page} (bytes {first}-{first + 8207}) failed" in str(error), error
            named.append(page)
            continue
        assert report.layout is not None and report.layout.page_span(page) == (first, first + 8207)
        if page in report.damaged_pages:
            assert not report.ok and report.damaged_pages == [page], report
            named.append(page)
        else:
            assert report.ok and report.damaged_pages == [], report
            assert reads_back_whole(path), f"page {page} held data and verify called it intact"
            free.append(page)
    assert len(named) > 2 * len(free), (named, free)  # most of the range holds data


@pytest.mark.parametrize("which", ["first", "last"])
def test_a_page_is_the_bytes_verify_names(
    which: str,
    original: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page's first byte and its last byte are damage to that page and to no other: the stated
    convention (page N is bytes 512 + 8208 N to 512 + 8208 N + 8207) is the one Citadel checks."""
    reference = verify_file(original, KEY)
    assert reference.layout is not None
    page = next(p for p in (2, 4, 6, 8) if page_holds_data(original, tmp_path / f"probe-{p}", p))
    first, last = reference.layout.page_span(page)
    path = copy_of(original, tmp_path / "copy")
    invert(path, first if which == "first" else last, size=1)
    code, out, _ = verify(capsys, monkeypatch, path)
    assert code == 1
    assert f"page {page} (bytes {first}-{last}) failed its authentication tag" in out, out
    assert "page N is bytes 512+8208*N to 512+8208*N+8207 of agent.cdl, counted from 0" in out
    code, out, _ = verify(capsys, monkeypatch, path, "--json")
    assert json.loads(out)["damaged_pages"] == [{"page": page, "first_byte": first, "last_byte": last}]


def page_holds_data(original: Path, directory: Path, page: int) -> bool:
    path = copy_of(original, directory)
    invert(path, 512 + 8208 * page + 4000)
    return page in verify_file(path, KEY).damaged_pages


# -- 3. past the mark: said to be unused ------------------------------------------------------------


def test_bytes_past_the_high_water_mark_are_reported_unused(
    original: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mark = high_water_mark(original)
    path = copy_of(original, tmp_path / "copy")
    size = path.stat().st_size
    end = 512 + 8208 * mark
    offsets = [end, end + 8208 * 10, size - 64]
    for offset in offsets:
        invert(path, offset)
    code, out, _ = verify(capsys, monkeypatch, path)
    assert code == 0, out
    assert f"in use:        pages 0-{mark - 1}, below the high-water mark {mark} (bytes 0-{end - 1})" in out
    found = re.search(
        r"past the mark: bytes (\d+)-(\d+) \(pages (\d+)-(\d+).*\): unused, they hold no data", out
    )
    assert found, out
    assert (int(found[1]), int(found[2]), int(found[3])) == (end, size - 1, mark)
    assert all(int(found[1]) <= offset <= int(found[2]) for offset in offsets)
    # The first verify recorded its result in the layout record (for status): a commit, so the
    # mark moved; the second reports the file as that left it.
    mark = high_water_mark(path)
    end, size = 512 + 8208 * mark, path.stat().st_size
    code, out, _ = verify(capsys, monkeypatch, path, "--json")
    layout: dict[str, Any] = json.loads(out)["layout"]
    assert layout["unused_bytes"] == [end, size - 1] and layout["pages_in_use"] == [0, mark - 1]


# -- 4. audit entries counted from 1 -------------------------------------------------------------


def audit_entries(log: bytes) -> list[int]:
    """Where each entry of a citadeldb 2.7.0 audit log starts (each begins with b"RTNE")."""
    return [found.start() for found in re.finditer(b"RTNE", log)]


@pytest.mark.parametrize("within", [20, 30], ids=["its-sequence-field", "its-body"])
def test_an_audit_break_names_the_entry_counted_from_1(
    within: int,
    original: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Byte 20 of an entry is in its sequence field: Citadel's `chain_break_at` then reads 2**32 + n."""
    path = copy_of(original, tmp_path / "copy")
    for _ in range(2):
        high_water_mark(path)  # each open appends an entry to the log: it holds at least 3
    log = Path(f"{path}.citadel-audit")
    data = bytearray(log.read_bytes())
    starts = audit_entries(bytes(data))
    assert len(starts) >= 3
    data[starts[2] + within] ^= 0x01  # the third entry
    log.write_bytes(bytes(data))
    assert verify_file(path, KEY).audit_break_at == 3
    code, out, _ = verify(capsys, monkeypatch, path)
    assert code == 1
    assert "chain broken at entry 3 (entries counted from 1; entries 1-2 verified)" in out, out
    code, out, _ = verify(capsys, monkeypatch, path, "--json")
    report = json.loads(out)
    assert report["audit_break_at"] == 3 and report["audit_entries"] == 2


def test_a_report_through_the_owner_keeps_its_layout_and_pages(original: Path, tmp_path: Path) -> None:
    """A client's `verify` gets the report over the owner's socket: the new fields cross it too."""
    from dataclasses import asdict

    from citadeldb_openai_agents.serving.operations import VERIFY

    path = copy_of(original, tmp_path / "copy")
    invert(path, 512 + 8208 * refusing_page(original, tmp_path / "probe", connect=False) + 100)
    report = verify_file(path, KEY)
    assert report.layout is not None and report.damaged_pages
    assert VERIFY.result(json.loads(json.dumps(asdict(report)))) == report
