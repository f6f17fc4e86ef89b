"""The erasure ledger: every erasure of a file, recorded outside it, so a restore can replay it.

A backup taken before an erasure still holds what was erased; `restore` puts the backup
in place and erases again what the ledger names. One JSON line per erasure:

* ``{"op": "session", "session": HID, "through": T}``: every item of the session written
  at or before T (µs, Citadel's creation time of the newest item it erased): erase,
  clear, a move's source;
* ``{"op": "items", "session": HID, "items": [[ATOM, T], ...]}``: those items (an atom id
  with its creation time: ids are reused after a restore, the pair is not): pop, a partial
  clear, compaction's replaced items;

A purge needs no entry: an item's expiry is stored with it, so it has expired in any backup
too, and a restore purges before it verifies.

HID is the session's region-name stem (an HMAC of its id under the file's salt), so the
ledger names no session in the clear and confirms no guess without the passphrase. Each
line carries the file's fingerprint, its number in the file's chain, the MAC of the line
before it and its own MAC (HMAC-SHA256 under a key derived from the salt): a line changed,
forged, dropped or reordered by someone without the passphrase is refused when read, and
the restore stops before it writes anything. Lines of other files (several files may share
one ledger beside their backups) are skipped, but a line of this file whose ``file`` field
was changed is recognised (its MAC matches with this file's fingerprint put back) and refused.

The newest lines cannot be told missing from the ledger alone, so the file keeps the chain's
head (`LedgerHead`: the newest entry's number and MAC) in its own encrypted records, written
in the commit that announces the erasure (storage/segments.py): a ledger, or both copies of
it, that falls short of that head is refused when read and when appended to, naming the
entry that is missing. A last line with no newline is one a crash cut short before its
erasure started (each line is flushed before its erasure): beyond the head it is dropped,
and cut off by the next append; short of it, it is an entry the file recorded, and refused.

An optional mirror (`mirror`, another volume) gets every line too: an erasure is refused when
either copy cannot be written, a read uses the longer authentic chain of the two and reports
where they disagree, and an append first gives the shorter copy the lines it lacks. The
mirror is what protects a restore over a lost or damaged file, whose head is gone with it.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import LedgerError

_MAC_LABEL = b"citadeldb-openai-agents erasure ledger mac"
_FILE_LABEL = b"citadeldb-openai-agents erasure ledger file"
_OPS = {"session", "items"}


class LedgerHead(NamedTuple):
    """The newest entry of a file's chain: its number and its MAC (kept in the file itself)."""

    number: int
    mac: str


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded erasure of this file (see the module's docstring)."""

    number: int
    at: int  # when it was recorded, µs since the epoch
    op: str
    session: str
    through: int | None = None
    items: frozenset[tuple[int, int]] = frozenset()

    def erases(self, atom: int, created: int) -> bool:
        """Whether this entry erased the session's item `atom` written at `created` (µs)."""
        if self.op == "session":
            return self.through is not None and created <= self.through
        return (atom, created) in self.items


@dataclass
class _Chain:
    """One copy's entries for this file, as read: each with its MAC and its line's bytes."""

    path: str
    entries: list[tuple[LedgerEntry, str, bytes]] = field(default_factory=list)
    lines: int = 0  # complete lines, this file's and others'
    torn: bool = False  # a last line with no newline follows them
    complete: int = 0  # bytes up to the last newline

    def head(self) -> LedgerHead | None:
        return LedgerHead(len(self.entries), self.entries[-1][1]) if self.entries else None

    def macs(self) -> list[str]:
        return [mac for _, mac, _ in self.entries]


@dataclass(frozen=True)
class LedgerReading:
    """The entries a read trusts (the longer authentic chain), and what its copies disagree on."""

    entries: list[LedgerEntry]
    head: LedgerHead | None
    source: str  # the copy they were read from
    disagreements: tuple[str, ...] = ()


class ErasureLedger:
    """The ledger at `path` (and `mirror`) for the file whose salt is `salt`.

    `head` gives the chain's head as the file records it (None: none yet): reads and appends require
    the ledger to reach it, and an append refuses a rollback (`rolled_back`); no `head`: neither.
    """

    def __init__(
        self,
        path: str,
        salt: bytes,
        *,
        mirror: str | None = None,
        head: Callable[[], LedgerHead | None] | None = None,
    ) -> None:
        key = hmac.new(salt, _MAC_LABEL, hashlib.sha256).digest()
        self.file = hmac.new(salt, _FILE_LABEL, hashlib.sha256).hexdigest()[:16]
        self.copies = [_Copy(path, key, self.file)]
        if mirror is not None and os.path.abspath(os.path.expanduser(mirror)) != self.copies[0].path:
            self.copies.append(_Copy(mirror, key, self.file))
        self.path = self.copies[0].path
        # Given the file's head, an append also refuses a file older than the ledger (rolled_back).
        self._head = head or (lambda: None)
        self._knows_head = head is not None
        self._lock = threading.Lock()

    @property
    def mirror(self) -> str | None:
        return self.copies[1].path if len(self.copies) > 1 else None

    def record_session(self, hid: str, through: int) -> LedgerHead:
        """Records that every item of session `hid` up to `through` is erased; the new head."""
        return self._append({"op": "session", "session": hid, "through": through})

    def record_items(self, hid: str, items: list[tuple[int, int]]) -> LedgerHead | None:
        """Records that these (atom, created) items of `hid` are erased; the new head."""
        if not items:
            return None
        return self._append({"op": "items", "session": hid, "items": [list(item) for item in items]})

    def entries(self) -> list[LedgerEntry]:
        """This file's entries, oldest first, each authenticated; `LedgerError` at the first that
        is not, or when no copy reaches the head the file recorded."""
        return self.read().entries

    def read(self, at_least: LedgerHead | None = None, *, reach_head: bool = True) -> LedgerReading:
        """The longer authentic chain of the copies, required to reach the file's head (and
        `at_least`, another copy of the file's: a live file's, over which a backup is restored);
        `reach_head` False: not required (an open looking for a rollback, which a cut ledger is not)."""
        chains: list[_Chain] = []
        refused: list[LedgerError] = []
        for copy in self.copies:
            try:
                chains.append(copy.read())
            except LedgerError as exc:
                refused.append(exc)
        if not chains:
            raise refused[0]
        best = max(chains, key=lambda chain: len(chain.entries))  # the first copy on a tie
        notes = [str(exc) for exc in refused] + _disagreements(chains, best)
        for head in (self._head(), at_least) if reach_head else ():
            _require(best, head, chains)
        return LedgerReading([e for e, _, _ in best.entries], best.head(), best.path, tuple(notes))

    def _append(self, body: dict[str, Any]) -> LedgerHead:
        """Written and flushed to every copy before the erasure it records starts: an erasure the
        ledger cannot hold is refused (`LedgerError`), or a restore would bring it back."""
        with self._lock, ExitStack() as stack:
            descriptors = [(copy, stack.enter_context(copy.locked())) for copy in self.copies]
            chains = [copy.tail(descriptor) for copy, descriptor in descriptors]
            best = max(chains, key=lambda chain: len(chain.entries))
            if _disagreements(chains, best, only_conflicts=True):
                raise LedgerError(
                    f"the erasure ledger's copies disagree ({'; '.join(_disagreements(chains, best))}); "
                    "nothing was erased. Compare them and keep the authentic one (verify names it)."
                )
            _require(best, self._head(), chains)
            if self._knows_head and (
                rollback := rolled_back(len(best.entries), self._head(), "the database")
            ):
                raise rollback
            head = best.head()
            line: dict[str, Any] = {"v": 1, "file": self.file, "n": (head.number if head else 0) + 1}
            line.update(at=time.time_ns() // 1000, **body, prev=head.mac if head else "")
            line["mac"] = self.copies[0].mac(line)
            raw = (json.dumps(line, separators=(",", ":")) + "\n").encode()
            for (copy, descriptor), chain in zip(descriptors, chains, strict=True):
                missing = b"".join(
                    entry_line + b"\n" for _, _, entry_line in best.entries[len(chain.entries) :]
                )
                copy.write(descriptor, chain, missing + raw)
            for copy, descriptor in descriptors:
                copy.remember(descriptor, best.entries, raw[:-1], line)
            return LedgerHead(line["n"], line["mac"])


class _Copy:
    """One file holding the ledger: read, locked and appended to, never through a symlink."""

    def __init__(self, path: str, key: bytes, file: str) -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self._key, self._file = key, file
        # The chain as this process last wrote it, by the copy's (inode, size) then: an append
        # finds it without reading the whole ledger unless another writer came between.
        self._known: tuple[tuple[int, int], _Chain] | None = None

    @contextmanager
    def locked(self) -> Iterator[int]:
        """The copy opened for appending, 0600, under an exclusive flock."""
        try:
            descriptor = os.open(
                self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600
            )
        except OSError as exc:
            raise self._unwritable(exc) from None
        try:
            try:
                import fcntl

                fcntl.flock(descriptor, fcntl.LOCK_EX)
            except ImportError:  # Windows: one owner per file appends anyway
                pass
            yield descriptor
        finally:
            os.close(descriptor)

    def tail(self, descriptor: int) -> _Chain:
        """The copy's chain: the one this process wrote last while the copy is as it left it."""
        if self._known is not None and self._known[0] == _identity(descriptor):
            return self._known[1]
        return self.read(descriptor)

    def write(self, descriptor: int, chain: _Chain, data: bytes) -> None:
        try:
            if chain.torn:
                os.ftruncate(descriptor, chain.complete)  # a line a crash cut short, beyond the head
            os.write(descriptor, data)
            os.fsync(descriptor)
        except OSError as exc:
            raise self._unwritable(exc) from None

    def remember(
        self, descriptor: int, entries: list[tuple[LedgerEntry, str, bytes]], raw: bytes, line: dict[str, Any]
    ) -> None:
        chain = _Chain(self.path, [*entries, (_entry(line), line["mac"], raw)])
        self._known = (_identity(descriptor), chain)

    def _unwritable(self, exc: OSError) -> LedgerError:
        return LedgerError(
            f"cannot record the erasure in the erasure ledger {self.path} ({_why(exc, self.path)}); "
            "nothing was erased."
        )

    def read(self, descriptor: int | None = None) -> _Chain:
        try:
            if descriptor is None:
                with open(self.path, "rb") as file:
                    data = file.read()
            else:
                os.lseek(descriptor, 0, os.SEEK_SET)
                data = b"".join(iter(lambda: os.read(descriptor, 1 << 20), b""))
        except FileNotFoundError:
            return _Chain(self.path)
        except OSError as exc:
            raise LedgerError(f"cannot read the erasure ledger {self.path}: {exc.strerror or exc}.") from None
        complete = data[: data.rfind(b"\n") + 1]
        lines = complete.splitlines()
        chain = _Chain(self.path, lines=len(lines), torn=len(complete) < len(data), complete=len(complete))
        for number, raw in enumerate(lines, 1):
            line = self._line(raw, number)
            if line is None:
                continue  # another file's line
            expected = (len(chain.entries) + 1, chain.entries[-1][1] if chain.entries else "")
            if (line["n"], line["prev"]) != expected:
                raise self._refused(number, "an entry before it is missing or out of order")
            chain.entries.append((_entry(line), line["mac"], raw))
        return chain

    def _line(self, raw: bytes, number: int) -> dict[str, Any] | None:
        try:
            line = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise self._refused(number, "it is not JSON") from None
        if not isinstance(line, dict) or not isinstance(line.get("file"), str):
            raise self._refused(number, "it is not a ledger entry")
        mac = line.get("mac")
        if not isinstance(mac, str):
            raise self._refused(number, "it has no MAC")
        if line["file"] != self._file:
            if hmac.compare_digest(mac, self.mac({**line, "file": self._file})):
                raise self._refused(number, "it is this file's entry with its file field changed")
            return None
        if not hmac.compare_digest(mac, self.mac(line)):
            raise self._refused(number, "its MAC does not match (changed, or written without the passphrase)")
        if not _valid(line):
            raise self._refused(number, "its fields are not those of an entry")
        return line

    def mac(self, line: dict[str, Any]) -> str:
        body = {name: value for name, value in line.items() if name != "mac"}
        return hmac.new(self._key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()

    def _refused(self, number: int, why: str) -> LedgerError:
        return LedgerError(
            f"line {number} of the erasure ledger {self.path} cannot be trusted: {why}. Nothing was "
            "changed. Restore the ledger from where it is copied, or ask whoever changed it."
        )


def _disagreements(chains: list[_Chain], best: _Chain, only_conflicts: bool = False) -> list[str]:
    """Where the copies differ from the longest: a copy that lacks its newest entries, or one
    whose entries are other ones (both authentic: two writers, or a copy of another time)."""
    notes = []
    for chain in chains:
        if chain is best:
            continue
        mine = chain.macs()
        if mine != best.macs()[: len(mine)]:
            first = next(n for n, (a, b) in enumerate(zip(mine, best.macs(), strict=False), 1) if a != b)
            notes.append(f"{chain.path} and {best.path} hold different entries from entry {first} on")
        elif len(mine) < len(best.entries) and not only_conflicts:
            notes.append(
                f"{chain.path} ends at entry {len(mine)}, {best.path} at entry {len(best.entries)}: "
                f"the entries after {len(mine)} are read from {best.path}"
            )
    return notes


def _require(best: _Chain, head: LedgerHead | None, chains: list[_Chain]) -> None:
    """Refuse a ledger short of the head the file recorded (lines removed, emptied, deleted, an
    older copy, or a last line with its newline taken away), naming what is missing."""
    if head is None:
        return
    have = len(best.entries)
    if have >= head.number and best.entries[head.number - 1][1] == head.mac:
        return
    where = " or ".join(chain.path for chain in chains)
    if have >= head.number:
        why = f"its entry {head.number} is not the one the file recorded (a ledger of another time)"
    else:
        torn = f", and its line {best.lines + 1} has no newline (cut short)" if best.torn else ""
        why = (
            f"it ends at entry {have} (line {best.lines}{torn}), but the file recorded entry {head.number}: "
            f"{head.number - have} of the file's erasures {'is' if head.number - have == 1 else 'are'} "
            "missing from it (lines removed, the ledger "
            "emptied, deleted or replaced by an older copy)"
        )
    raise LedgerError(
        f"the erasure ledger {where} cannot be trusted: {why}. Nothing was changed: a restore "
        "would bring erased sessions back. Put back the copy that holds every entry (the mirror, "
        "or where the ledger is copied to), then run the command again."
    )


def rolled_back(entries: int, head: LedgerHead | None, database: str) -> LedgerError | None:
    """The error for a file more than one entry behind its ledger: one is a crash's (the line
    written, the erasure never announced), more is a file put back from an older copy, which
    served as it is would show what was erased since (issue 59). None otherwise."""
    recorded = 0 if head is None else head.number
    if entries <= recorded + 1:
        return None
    return LedgerError(
        f"{database} is older than its erasure ledger: the ledger holds this file's erasures {recorded + 1} "
        f"to {entries}, and the file records {f'entry {recorded}' if recorded else 'none of them'} (its "
        f"parts were put back from an older copy). Served as it is, it would show what those "
        f"{entries - recorded} erasures erased; nothing was served or changed. Erase them again with "
        "`python -m citadeldb_openai_agents repair --yes` (it replays the ledger's entries on the file), "
        "or put back the file's newest parts."
    )


def _why(exc: OSError, path: str) -> str:
    """What stopped an append, and its fix: a symlink is refused on purpose (whoever can point it
    elsewhere could send the records astray), so "make it writable" would be the wrong advice."""
    if exc.errno == errno.ELOOP and os.path.islink(path):
        target = os.readlink(path)
        return (
            f"it is a symbolic link (to {target}), and the ledger is never written through one: point "
            "erasure_ledger at the real file"
        )
    if exc.errno == errno.EISDIR:
        return "it is a directory: point erasure_ledger at a file in it"
    return f"{exc.strerror or exc}: make its directory exist and writable by this process, or unset erasure_ledger"


def _identity(descriptor: int) -> tuple[int, int]:
    status = os.fstat(descriptor)
    return status.st_ino, status.st_size


def _valid(line: dict[str, Any]) -> bool:
    """Authenticated lines are ours, but the fields are checked all the same (format drift)."""
    ints = all(isinstance(line.get(name), int) for name in ("n", "at"))
    if not (ints and isinstance(line.get("prev"), str) and line.get("op") in _OPS):
        return False
    if not isinstance(line.get("session"), str):
        return False
    if line["op"] == "session":
        return isinstance(line.get("through"), int)
    items = line.get("items")
    return isinstance(items, list) and all(
        isinstance(item, list) and len(item) == 2 and all(isinstance(part, int) for part in item)
        for item in items
    )


def _entry(line: dict[str, Any]) -> LedgerEntry:
    items = frozenset((atom, created) for atom, created in line.get("items", []))
    return LedgerEntry(line["n"], line["at"], line["op"], line["session"], line.get("through"), items)
