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
the restore stops before it writes anything. A last line with no newline is one a crash cut
short before its erasure started (each line is flushed before its erasure): it is skipped,
and cut off by the next append. Lines of other files (several files may
share one ledger beside their backups) are skipped. Dropping the newest lines is not
detectable from the ledger alone; docs/operations.md says where to keep it.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import LedgerError

_MAC_LABEL = b"citadeldb-openai-agents erasure ledger mac"
_FILE_LABEL = b"citadeldb-openai-agents erasure ledger file"
_OPS = {"session", "items"}


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


class ErasureLedger:
    """The ledger at `path` for the file whose salt is `salt` (held in the encrypted file)."""

    def __init__(self, path: str, salt: bytes) -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self._key = hmac.new(salt, _MAC_LABEL, hashlib.sha256).digest()
        self.file = hmac.new(salt, _FILE_LABEL, hashlib.sha256).hexdigest()[:16]
        self._lock = threading.Lock()
        # The chain's head as this process last wrote it, by the ledger's (inode, size) then:
        # an append finds it without reading the whole ledger unless another writer came between.
        self._head: tuple[tuple[int, int], int, str] | None = None

    def record_session(self, hid: str, through: int) -> int:
        """Records that every item of session `hid` up to `through` is erased; its entry's number."""
        return self._append({"op": "session", "session": hid, "through": through})

    def record_items(self, hid: str, items: list[tuple[int, int]]) -> int | None:
        """Records that these (atom, created) items of `hid` are erased; its entry's number."""
        if not items:
            return None
        return self._append({"op": "items", "session": hid, "items": [list(item) for item in items]})

    def entries(self) -> list[LedgerEntry]:
        """This file's entries, oldest first, each authenticated; `LedgerError` at the first that is not."""
        return [entry for entry, _ in self._read()]

    def _append(self, body: dict[str, Any]) -> int:
        """Written and flushed to disk before the erasure it records starts: an erasure the
        ledger cannot hold is refused (`LedgerError`), or a restore would bring it back."""
        try:
            with self._lock, self._locked() as descriptor:
                number, previous = self._next(descriptor)
                line = {"v": 1, "file": self.file, "n": number, "at": time.time_ns() // 1000, **body}
                line["prev"] = previous
                line["mac"] = self._mac(line)
                os.write(descriptor, (json.dumps(line, separators=(",", ":")) + "\n").encode())
                os.fsync(descriptor)
                self._head = (_identity(descriptor), number, line["mac"])
                return number
        except OSError as exc:
            raise LedgerError(
                f"cannot record the erasure in the erasure ledger {self.path} ({_why(exc, self.path)}); "
                "nothing was erased."
            ) from None

    def _next(self, descriptor: int) -> tuple[int, str]:
        """The number and previous MAC of the next entry: from the head this process wrote last,
        while the ledger is as it left it, else from reading (and checking) the whole ledger."""
        if self._head is not None and self._head[0] == _identity(descriptor):
            return self._head[1] + 1, self._head[2]
        last = self._read(descriptor, cut_torn=True)
        return (last[-1][0].number + 1, last[-1][1]) if last else (1, "")

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """The ledger opened for appending, never through a symlink, 0600, under an exclusive flock."""
        descriptor = os.open(
            self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600
        )
        try:
            try:
                import fcntl

                fcntl.flock(descriptor, fcntl.LOCK_EX)
            except ImportError:  # Windows: one owner per file appends anyway
                pass
            yield descriptor
        finally:
            os.close(descriptor)

    def _read(self, descriptor: int | None = None, cut_torn: bool = False) -> list[tuple[LedgerEntry, str]]:
        try:
            if descriptor is None:
                with open(self.path, "rb") as file:
                    data = file.read()
            else:
                os.lseek(descriptor, 0, os.SEEK_SET)
                data = b"".join(iter(lambda: os.read(descriptor, 1 << 20), b""))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise LedgerError(f"cannot read the erasure ledger {self.path}: {exc.strerror or exc}.") from None
        complete = data[: data.rfind(b"\n") + 1]
        if cut_torn and descriptor is not None and len(complete) < len(data):
            os.ftruncate(descriptor, len(complete))  # a line a crash cut short (see above)
        found: list[tuple[LedgerEntry, str]] = []
        for number, raw in enumerate(complete.splitlines(), 1):
            line = self._line(raw, number)
            if line is None:
                continue  # another file's line
            expected = (found[-1][0].number + 1, found[-1][1]) if found else (1, "")
            if (line["n"], line["prev"]) != expected:
                raise self._refused(number, "an entry before it is missing or out of order")
            found.append((_entry(line), line["mac"]))
        return found

    def _line(self, raw: bytes, number: int) -> dict[str, Any] | None:
        try:
            line = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise self._refused(number, "it is not JSON") from None
        if not isinstance(line, dict) or not isinstance(line.get("file"), str):
            raise self._refused(number, "it is not a ledger entry")
        if line["file"] != self.file:
            return None
        mac = line.get("mac")
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac(line)):
            raise self._refused(number, "its MAC does not match (changed, or written without the passphrase)")
        if not _valid(line):
            raise self._refused(number, "its fields are not those of an entry")
        return line

    def _mac(self, line: dict[str, Any]) -> str:
        body = {name: value for name, value in line.items() if name != "mac"}
        return hmac.new(self._key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()

    def _refused(self, number: int, why: str) -> LedgerError:
        return LedgerError(
            f"line {number} of the erasure ledger {self.path} cannot be trusted: {why}. Nothing was "
            "changed. Restore the ledger from where it is copied, or ask whoever changed it."
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
