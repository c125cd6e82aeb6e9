"""Evidence on request: a slice of a call's evidence for those who may see it, and pruning.

A call keeps the full, redacted stdout, stderr and rows of what it ran as evidence files
named ``<call_id>.<n>.<label>`` in ``<state>/evidence/`` (``CallContext.evidence_path``),
and its envelope lists their ids. This module reads them back and deletes them:

    EvidenceStore.read(request, caller)    a capped slice: bytes, lines, or lines holding a text
    EvidenceStore.prune()                  by age, then by total size, oldest first
    EvidenceStore.run()                    the housekeeping task: prune at start-up, then every so often

**Who may read.** The call's own caller, and operators (``rungd.service.gates.is_operator``). For
anyone else an id answers UNKNOWN_EVIDENCE, exactly as an id never written does, so the ids
of others cannot be probed. The owner comes from the call table while the daemon still
remembers the call, else from the ledger's ``received`` record (``LedgerOwners``: only the
ledger files written since the call began are searched, with a byte search, not a decode).

**Patterns.** ``grep`` is a literal substring matched on the stored bytes. No regular
expression ever runs on a caller's pattern, so none can backtrack; the search also stops
after ``GREP_BUDGET_S`` and says on which line to go on.

**Files.** An id must match a strict alphabet (``ID``: no ``/``, no ``..``, no leading dot)
before it names a path; the file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and read only if
``fstat`` says it is a regular file, so a symlink, FIFO or device planted under a valid id
reads as unknown and never blocks. All file work runs in worker threads under this store's
own limiters: never Trio's default one, never the ledger's.

**Pruned ids.** Before a file is deleted its id gets a tombstone in ``pruned.jsonl`` (id,
when, why), so it answers EVIDENCE_GONE rather than UNKNOWN_EVIDENCE. Tombstones are kept
for ``TOMBSTONE_RETENTIONS`` retention periods; after that, an id whose call the ledger
knows and which began before the retention still answers gone, derived from its age.
Evidence is stored redacted; nothing here can undo that.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Final, Literal

import msgspec
import trio
from rungd_ledgers.files import ledger_files
from rungd_ledgers.records import LineDecoder, Record

from rungd.config import Config
from rungd.core import moments
from rungd.core.contract import Caller
from rungd.service.engine.calls import CallTable
from rungd.core.errors import BadInput, EvidenceGone, UnknownEvidence
from rungd.service.gates import is_operator
from rungd.protocol import Evidence, EvidenceNext, EvidenceSlice
from rungd.runner.streams import not_kept_path

log = logging.getLogger("rungd.evidence")

#: ``<call_id>.<n>.<label>``: the call's id, the file's number in the call, and a label made
#: of dot-separated words (``stdout``, ``rows.csv``). Every part is non-empty, so no id is
#: ``..`` or holds it, and none has a path separator.
ID: Final = re.compile(r"(?P<call>[A-Za-z0-9_-]{1,64})\.(?P<n>[0-9]{1,6})\.(?P<label>[A-Za-z0-9_-]{1,40}(?:\.[A-Za-z0-9_-]{1,40}){0,3})")
# A call id the daemon minted (rungd.service.engine.calls.new_call_id): "c", milliseconds since the
# epoch in hex, 8 hex digits of randomness. The time is what lets us look in the right place.
_MINTED: Final = re.compile(r"c([0-9a-f]{9,12})[0-9a-f]{8}")

TOMBSTONES: Final = "pruned.jsonl"
TOMBSTONE_RETENTIONS: Final = 4
# A search stops after this long and says where to go on; a request never holds a thread longer.
GREP_BUDGET_S: Final = 1.0
# Lines longer than this are searched in their first piece of this size only.
LINE_PIECE: Final = 1 << 20
CHUNK: Final = 1 << 20
# Reads and prunes each have their own threads; neither waits behind the ledger, nor it behind them.
READ_THREADS: Final = 4
# Deletions per worker-thread hop: a shutdown waits for one batch at most.
PRUNE_BATCH: Final = 256
# A call id's time and its ledger file's mtime come from the same clock; this absorbs the
# time between minting the id and sealing the received record.
CLOCK_SLACK_S: Final = 5.0
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def call_id_of(evidence_id: str) -> str:
    """The call id an evidence id belongs to.

    Raises:
        BadInput: not an evidence id (a path, ``..``, a character outside the alphabet).
    """
    match = ID.fullmatch(evidence_id)
    if match is None:
        raise BadInput(
            f"{evidence_id[:80]!r} is not an evidence id",
            hint="pass an id exactly as an envelope's evidence list gives it: CALL_ID.N.LABEL, e.g. "
                 "c18f2a3b4c5d6e7f80.1.stdout (letters, digits, '_', '-' and single dots; never a path)",
        )
    return match.group("call")


def call_time(call_id: str) -> float | None:
    """When a daemon-minted call began (unix seconds), from its id; None for any other id."""
    match = _MINTED.fullmatch(call_id)
    return int(match.group(1), 16) / 1000 if match else None


class Tombstone(msgspec.Struct, frozen=True):
    """What is left of a pruned evidence file: its id, when it went, and why."""

    id: str
    at: float
    why: str


_tombstone_encoder = msgspec.json.Encoder()


class _NotKept(msgspec.Struct, frozen=True):
    """rungd's note beside an evidence file it cut (``runner.streams.not_kept_path``)."""

    bytes: int
    why: str
_tombstone_decoder = LineDecoder(Tombstone)
_not_kept_decoder = LineDecoder(_NotKept)
_record_decoder = LineDecoder(Record)


class LedgerOwners:
    """Who started a call, from its ``received`` record: for calls the daemon no longer holds.

    The call id carries the time the call began, and a ledger file last written before then
    cannot hold its record: only the files from there on are searched (two at most: the
    record is sealed as the call arrives, so it is in the first file written after that or in
    the one rotated to next). The search is a byte search for the record's opening, and only
    the one line found is decoded. Answers are cached (a bounded LRU), so asking again is free.

    Args:
        folder: the ledger folder.
        cache_size: how many answers to remember.
    """

    def __init__(self, folder: Path, cache_size: int = 4096) -> None:
        self.folder = folder
        self._cache: collections.OrderedDict[str, int | None] = collections.OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # worker threads share the cache

    def owner(self, call_id: str) -> int | None:
        """The caller uid of ``call_id``; None when the ledger does not know the call. Blocks."""
        with self._lock:
            if call_id in self._cache:
                self._cache.move_to_end(call_id)
                return self._cache[call_id]
        uid = self._search(call_id)
        with self._lock:
            self._cache[call_id] = uid
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return uid

    def _search(self, call_id: str) -> int | None:
        began = call_time(call_id)
        if began is None:
            return None  # not an id the daemon minted: no call of ours
        needle = b'"event":"received","call_id":"' + call_id.encode() + b'"'
        try:
            files = ledger_files(self.folder)
        except FileNotFoundError:
            return None
        searched = 0
        for path in files:
            try:
                if path.stat().st_mtime < began - CLOCK_SLACK_S:
                    continue  # last written before the call began
                found = _find_line(path, needle)
            except OSError:
                continue
            if found is not None:
                try:
                    return _record_decoder.decode(found).caller_uid
                except msgspec.DecodeError:
                    return None
            searched += 1
            if searched >= 2:
                break
        return None


def _find_line(path: Path, needle: bytes) -> bytes | None:
    """The whole line of ``path`` that holds ``needle`` at its first occurrence, or None."""
    with open(path, "rb") as file:
        base, tail = 0, b""
        while chunk := file.read(CHUNK):
            data = tail + chunk
            at = data.find(needle)
            if at >= 0:
                return _line_around(file, base + at)
            keep = len(needle) - 1
            tail = data[-keep:] if keep else b""
            base += len(data) - len(tail)
    return None


def _line_around(file: BinaryIO, at: int, reach: int = 1 << 16) -> bytes | None:
    start = max(0, at - reach)
    file.seek(start)
    data = file.read(2 * reach)
    rel = at - start
    begin = data.rfind(b"\n", 0, rel) + 1
    end = data.find(b"\n", rel)
    return data[begin:end] if end >= 0 else None


@dataclasses.dataclass(frozen=True)
class Want:
    """One ``evidence`` request, checked: which part of the file, and the byte cap."""

    mode: Literal["bytes", "lines", "grep"]
    cap: int
    offset: int = 0
    length: int | None = None
    line: int = 1
    count: int | None = None
    grep: bytes = b""

    @classmethod
    def of(cls, request: Evidence, cap: int) -> Want:
        """Raises: BadInput: a byte range together with lines or a pattern."""
        if request.max_bytes is not None:
            cap = min(cap, request.max_bytes)
        by_bytes = request.offset is not None or request.length is not None
        if by_bytes and (request.line is not None or request.count is not None or request.grep is not None):
            raise BadInput(
                "give one of: a byte range (offset, length), a line range (line, count), or a text to find (grep)",
                hint=f'e.g. {{"type": "evidence", "evidence_id": "{request.evidence_id[:80]}", "line": 1, "count": 50}}',
            )
        if request.grep is not None:
            return cls("grep", cap, line=request.line or 1, count=request.count, grep=request.grep.encode())
        if request.line is not None or request.count is not None:
            return cls("lines", cap, line=request.line or 1, count=request.count)
        return cls("bytes", cap, offset=request.offset or 0, length=request.length)


@dataclasses.dataclass
class PruneReport:
    """What one prune did."""

    by_age: int = 0
    by_size: int = 0
    freed_bytes: int = 0
    kept_bytes: int = 0
    over_bound: bool = False  # running calls' files alone keep the total above the bound


@dataclasses.dataclass(frozen=True)
class _File:
    name: str
    call_id: str
    mtime: float
    size: int


class EvidenceStore:
    """The evidence folder of one daemon: reading slices of it, and keeping it within bounds.

    Args:
        config: the daemon's configuration (``[evidence]``, the state folder, the operators).
        calls: the daemon's call table (``rungd.service.engine.calls.CallTable``): who made a call
            it still remembers, and which calls are still running.
        max_frame: the frame limit; a reply's text stays well within it.
    """

    def __init__(self, config: Config, calls: CallTable, *, max_frame: int) -> None:
        self.config = config
        self.settings = config.evidence
        self.folder = config.state_dir / "evidence"
        self.calls = calls
        self.owners = LedgerOwners(config.state_dir / "ledger")
        # Text decoded with replacement may take three bytes for one byte stored.
        self.cap = max(16, min(self.settings.reply_bytes, (max_frame - 1024) // 3))
        self._read_limiter = trio.CapacityLimiter(READ_THREADS)
        self._prune_limiter = trio.CapacityLimiter(1)
        self._pruning = trio.Lock()  # one prune at a time, or two would tombstone the same file
        #: Set once the start-up prune has run (whatever it found), for whoever must know the
        #: folder is within bounds: a health check, a test.
        self.pruned_once = trio.Event()
        # Bytes of evidence calls finished with since the last prune: past an eighth of the
        # cap, the next prune is due at once, not at the next prune_every_s (a caller whose
        # calls print much would fill the disk, and the ledger would refuse every call).
        self._written = 0
        self._due = trio.Event()
        self._prefix = f"{self.folder}/"
        self._tombstone_lock = threading.Lock()
        self._lines_cache: collections.OrderedDict[tuple[int, ...], int] = collections.OrderedDict()
        self._lines_lock = threading.Lock()

    # --- reading --------------------------------------------------------------------------

    async def read(self, request: Evidence, caller: Caller) -> EvidenceSlice:
        """The part of one evidence file that ``request`` asks for, capped.

        Args:
            request: the evidence id and which part of the file.
            caller: who asks (the socket peer).

        Returns:
            The slice, with the file's size and line count, ``truncated`` when the cap (or the
            search's time bound) cut it short, and ``next`` while the file goes on.

        Raises:
            BadInput: not an evidence id, or a byte range mixed with lines or a pattern.
            UnknownEvidence: no such evidence, not this caller's, or not a regular file.
            EvidenceGone: it existed and was pruned (to its caller and operators only).

        Cancellation: the file work is not abandoned; it is bounded (one capped read, or a
        search that stops after ``GREP_BUDGET_S``), so a cancelled request ends soon after.
        """
        call_id = call_id_of(request.evidence_id)
        want = Want.of(request, self.cap)
        # The call table belongs to the loop: read it here, not in the worker thread.
        call = self.calls.get(call_id)
        known_owner = call.caller.uid if call is not None else None
        operator = is_operator(caller, self.config)
        job = functools.partial(self._read, request.evidence_id, call_id, caller.uid, operator, known_owner, want)
        return await trio.to_thread.run_sync(job, limiter=self._read_limiter)

    def _read(self, evidence_id: str, call_id: str, uid: int, operator: bool, known_owner: int | None,
              want: Want) -> EvidenceSlice:
        def may_see() -> bool:
            if operator:
                return True
            owner = known_owner if known_owner is not None else self.owners.owner(call_id)
            return owner is not None and owner == uid

        try:
            fd = os.open(self.folder / evidence_id, _OPEN_FLAGS)
        except FileNotFoundError:
            gone = self._gone(evidence_id, call_id)
            if gone is not None and may_see():
                raise gone from None
            raise _unknown() from None
        except OSError as exc:  # ELOOP: a symlink; EACCES: not ours. Either way, not evidence.
            log.warning("evidence %s cannot be opened: %s", evidence_id, exc.strerror or exc)
            raise _unknown() from None
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                log.warning("evidence %s is not a regular file (mode %o); refused", evidence_id, info.st_mode)
                raise _unknown()
            if not may_see():
                raise _unknown()
            size = info.st_size
            lines = self._line_count(file, info)
            if want.mode == "bytes":
                part = _bytes(evidence_id, file, size, lines, want)
            elif want.mode == "lines":
                part = _lines(evidence_id, file, size, lines, want)
            else:
                part = _grep(evidence_id, file, size, lines, want)
        return self._with_not_kept(part)

    def _with_not_kept(self, part: EvidenceSlice) -> EvidenceSlice:
        """``part`` with what the file's call did not keep, from rungd's note beside it."""
        try:
            fd = os.open(not_kept_path(self.folder / part.evidence_id), _OPEN_FLAGS)
        except OSError:
            return part  # kept whole (or a note that cannot be read: the envelope said evidence_cut)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return part
            try:
                note = _not_kept_decoder.decode(file.read(1024))
            except msgspec.DecodeError:
                log.warning("evidence %s: its not-kept note is damaged; ignored", part.evidence_id)
                return part
        return msgspec.structs.replace(part, not_kept=note.bytes, not_kept_why=note.why)

    def _line_count(self, file: BinaryIO, info: os.stat_result) -> int:
        # Counting is a pass over the file; a file being read page by page is counted once.
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        with self._lines_lock:
            if key in self._lines_cache:
                return self._lines_cache[key]
        count, last, done = 0, b"", 0
        file.seek(0)
        while done < info.st_size and (chunk := file.read(min(CHUNK, info.st_size - done))):
            count += chunk.count(b"\n")
            last, done = chunk[-1:], done + len(chunk)
        if done and last != b"\n":
            count += 1  # a last line without its newline is a line
        with self._lines_lock:
            self._lines_cache[key] = count
            while len(self._lines_cache) > 128:
                self._lines_cache.popitem(last=False)
        return count

    def _gone(self, evidence_id: str, call_id: str) -> EvidenceGone | None:
        """Why a missing id is gone: its tombstone, or its call's age; None if it never was."""
        stone = self._tombstone(evidence_id)
        hint = ("evidence is kept for evidence.retention_days and within evidence.max_total_bytes; the ledger "
                f"still has the call (rungctl tail --call {call_id})")
        if stone is not None:
            return EvidenceGone(f"evidence {evidence_id} was pruned at {_when(stone.at)}: {stone.why}", hint=hint)
        began = call_time(call_id)
        retention_s = self.settings.retention_days * 86400
        if began is not None and began < time.time() - retention_s and self.owners.owner(call_id) is not None:
            return EvidenceGone(
                f"evidence {evidence_id} is gone: its call began at {_when(began)}, before the "
                f"{self.settings.retention_days:g}-day retention (evidence.retention_days)", hint=hint)
        return None

    def _tombstone(self, evidence_id: str) -> Tombstone | None:
        needle = b'{"id":"' + evidence_id.encode() + b'",'
        try:
            line = _find_line(self.folder / TOMBSTONES, needle)
        except FileNotFoundError:
            return None
        if line is None:
            return None
        try:
            return _tombstone_decoder.decode(line)
        except msgspec.DecodeError:
            return None

    # --- pruning --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Prune at once, then every ``evidence.prune_every_s``, or sooner when calls wrote
        much (:meth:`finished`), until cancelled.

        Reports ``started`` before the first prune: serving never waits for it. A prune that
        fails (a folder that cannot be read) is logged and tried again next time.

        Cancellation: stops between batches of deletions; a batch begun is finished.
        """
        task_status.started()
        while True:
            self._written, self._due = 0, trio.Event()
            try:
                await self.prune()
            except OSError as exc:
                log.error("evidence prune failed: %s; it runs again in %g s", exc, self.settings.prune_every_s)
            self.pruned_once.set()
            with trio.move_on_after(self.settings.prune_every_s):
                await self._due.wait()

    def finished(self, evidence: list[str]) -> None:
        """Count the evidence a call ended with (a stat of each file), and make the next prune
        due at once when calls wrote more than an eighth of ``evidence.max_total_bytes`` since
        the last one."""
        for evidence_id in evidence:
            with contextlib.suppress(OSError):
                self._written += os.lstat(self._prefix + evidence_id).st_size
        if self._written > self.settings.max_total_bytes // 8:
            self._due.set()

    async def prune(self, now: float | None = None) -> PruneReport:
        """Delete evidence older than the retention, then the oldest until the total fits.

        Files of calls still running (or held) are never deleted, nor those of a call that
        began after this prune did. Each deleted id gets a tombstone first.

        Args:
            now: the time ages are measured from (tests); ``time.time()`` by default.

        Returns:
            What was deleted and what is kept.

        Raises:
            OSError: the evidence folder cannot be listed.

        Cancellation: stops between batches of ``PRUNE_BATCH`` deletions; every file
        deleted has its tombstone.
        """
        async with self._pruning:
            return await self._prune(time.time() if now is None else now)

    async def _prune(self, now: float) -> PruneReport:
        began = time.time()
        running = {call.call_id for call in self.calls if call.envelope is None}

        def protected(file: _File) -> bool:
            # A call that began after the snapshot of running calls is running too. Ids
            # carry whole milliseconds, hence the margin.
            started = call_time(file.call_id)
            return file.call_id in running or (started is not None and started >= began - 0.002)

        files = await trio.to_thread.run_sync(self._list, limiter=self._prune_limiter)
        doomed, report = _plan(files, now, self.settings.retention_days * 86400, self.settings.max_total_bytes,
                               protected)
        for at in range(0, len(doomed), PRUNE_BATCH):
            batch = doomed[at:at + PRUNE_BATCH]
            await trio.to_thread.run_sync(self._delete, batch, now, limiter=self._prune_limiter)
        await trio.to_thread.run_sync(self._compact_tombstones, now, limiter=self._prune_limiter)
        if doomed:
            log.info("evidence pruned: %d file(s) by age, %d by size, %d bytes freed; %d bytes kept",
                     report.by_age, report.by_size, report.freed_bytes, report.kept_bytes)
        if report.over_bound:
            log.warning("evidence holds %d bytes, above evidence.max_total_bytes (%d): the rest belongs to calls "
                        "still running, and goes once they end", report.kept_bytes, self.settings.max_total_bytes)
        return report

    def _list(self) -> list[_File]:
        files = []
        with os.scandir(self.folder) as entries:
            for entry in entries:
                match = ID.fullmatch(entry.name)
                if match is None:
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(info.st_mode):  # a FIFO or link planted here is not ours to count
                    files.append(_File(entry.name, match.group("call"), info.st_mtime, info.st_size))
        return files

    def _delete(self, batch: list[tuple[_File, str]], now: float) -> None:
        # Tombstones first: an id whose file is gone always has one to answer with.
        lines = b"".join(_tombstone_encoder.encode(Tombstone(f.name, now, why)) + b"\n" for f, why in batch)
        with self._tombstone_lock:
            fd = os.open(self.folder / TOMBSTONES, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, lines)
                os.fsync(fd)
            finally:
                os.close(fd)
        for file, _ in batch:
            for path in (self.folder / file.name, not_kept_path(self.folder / file.name)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def _compact_tombstones(self, now: float) -> None:
        """Drop tombstones older than ``TOMBSTONE_RETENTIONS`` retentions; their ids still
        answer gone from their call's age."""
        path = self.folder / TOMBSTONES
        horizon = now - TOMBSTONE_RETENTIONS * self.settings.retention_days * 86400
        with self._tombstone_lock:
            try:
                with open(path, "rb") as file:
                    first = file.readline()
                    try:
                        if _tombstone_decoder.decode(first).at >= horizon:
                            return  # oldest first: nothing to drop
                    except msgspec.DecodeError:
                        pass
                    file.seek(0)
                    kept = [line for line in file if _young(line, horizon)]
            except FileNotFoundError:
                return
            staging = path.with_name(f".{TOMBSTONES}.tmp")
            with open(staging, "wb") as out:
                out.writelines(kept)
                out.flush()
                os.fsync(out.fileno())
            os.replace(staging, path)


def _young(line: bytes, horizon: float) -> bool:
    try:
        return _tombstone_decoder.decode(line).at >= horizon
    except msgspec.DecodeError:
        return False  # a torn line holds nothing worth keeping


def _plan(files: list[_File], now: float, retention_s: float, max_total: int,
          protected: Callable[[_File], bool]) -> tuple[list[tuple[_File, str]], PruneReport]:
    """Which files go, oldest first, and why: first by age, then by total size."""
    report = PruneReport()
    files = sorted(files, key=lambda f: (f.mtime, f.name))
    total = sum(f.size for f in files)
    doomed: list[tuple[_File, str]] = []
    gone: set[str] = set()
    days = retention_s / 86400
    for file in files:
        if file.mtime < now - retention_s and not protected(file):
            doomed.append((file, f"older than the {days:g}-day retention (evidence.retention_days)"))
            gone.add(file.name)
            total -= file.size
            report.by_age += 1
            report.freed_bytes += file.size
    for file in files:
        if total <= max_total:
            break
        if file.name in gone or protected(file):
            continue
        doomed.append((file, f"the evidence folder passed its size bound of {max_total} bytes "
                             "(evidence.max_total_bytes); the oldest went first"))
        total -= file.size
        report.by_size += 1
        report.freed_bytes += file.size
    report.kept_bytes = total
    report.over_bound = total > max_total
    return doomed, report


# --- slices ------------------------------------------------------------------------------


def _bytes(evidence_id: str, file: BinaryIO, size: int, lines: int, want: Want) -> EvidenceSlice:
    start = min(want.offset, size)
    stop = size if want.length is None else min(size, start + want.length)
    take = min(stop - start, want.cap)
    file.seek(start)
    if take < stop - start:
        # Peek past the cut so it can move back to the start of a character.
        data = file.read(take + 3)
        data = data[:_char_boundary(data, take)]
    else:
        data = file.read(take)
    end = start + len(data)
    return EvidenceSlice(evidence_id=evidence_id, text=data.decode("utf-8", "replace"), size=size, lines=lines,
                         offset=start, end=end, truncated=end < stop,
                         next=EvidenceNext(offset=end) if end < size else None)


def _lines(evidence_id: str, file: BinaryIO, size: int, lines: int, want: Want) -> EvidenceSlice:
    start = _line_start(file, want.line, size)
    file.seek(start)
    out, pos, number, got = bytearray(), start, want.line, 0
    truncated, going_on = False, None
    while pos < size and (want.count is None or got < want.count):
        raw = file.readline(min(want.cap + 1, size - pos))
        if not raw:
            break
        if len(out) + len(raw) > want.cap:
            truncated = True
            if not out:  # one line longer than the cap: its first part, then on by bytes
                piece = raw[:_char_boundary(raw, want.cap)]
                out, pos = bytearray(piece), pos + len(piece)
                going_on = EvidenceNext(offset=pos)
            else:
                going_on = EvidenceNext(line=number)
            break
        out += raw
        pos += len(raw)
        number, got = number + 1, got + 1
    if going_on is None and pos < size:
        going_on = EvidenceNext(line=number)
    return EvidenceSlice(evidence_id=evidence_id, text=bytes(out).decode("utf-8", "replace"), size=size,
                         lines=lines, offset=start, end=pos, first_line=want.line, truncated=truncated,
                         next=going_on)


def _grep(evidence_id: str, file: BinaryIO, size: int, lines: int, want: Want) -> EvidenceSlice:
    start = _line_start(file, want.line, size)
    file.seek(start)
    deadline = time.monotonic() + GREP_BUDGET_S
    out, pos, number, matches = bytearray(), start, want.line, 0
    truncated, going_on = False, None
    while pos < size:
        if want.count is not None and matches >= want.count:
            going_on = EvidenceNext(line=number)
            break
        if time.monotonic() > deadline:
            truncated, going_on = True, EvidenceNext(line=number)
            break
        raw = file.readline(min(LINE_PIECE, size - pos))
        if not raw:
            break
        pos += len(raw)
        whole = raw.endswith(b"\n")
        while not whole and pos < size:  # the rest of an over-long line is not searched
            rest = file.readline(min(LINE_PIECE, size - pos))
            if not rest:
                break
            pos += len(rest)
            whole = rest.endswith(b"\n")
        body = raw.rstrip(b"\n")
        if want.grep in body:
            entry = b"%d:%s\n" % (number, body)
            if len(out) + len(entry) > want.cap:
                truncated = True
                if not out:  # one matching line longer than the cap: its first part
                    out += entry[:_char_boundary(entry, want.cap)]
                    matches += 1
                    going_on = EvidenceNext(line=number + 1) if pos < size else None
                else:
                    going_on = EvidenceNext(line=number)
                break
            out += entry
            matches += 1
        number += 1
    return EvidenceSlice(evidence_id=evidence_id, text=bytes(out).decode("utf-8", "replace"), size=size,
                         lines=lines, offset=start, end=pos, first_line=want.line, matches=matches,
                         truncated=truncated, next=going_on)


def _line_start(file: BinaryIO, line: int, size: int) -> int:
    """The byte offset where line ``line`` (from 1) begins; ``size`` when the file is shorter."""
    need, pos = line - 1, 0
    file.seek(0)
    while need and pos < size:
        chunk = file.read(min(CHUNK, size - pos))
        if not chunk:
            break
        found = chunk.count(b"\n")
        if found < need:
            need, pos = need - found, pos + len(chunk)
            continue
        at = -1
        for _ in range(need):
            at = chunk.index(b"\n", at + 1)
        return pos + at + 1
    return pos if not need else size


def _char_boundary(data: bytes, cut: int) -> int:
    """``cut``, moved back so it does not split a UTF-8 character (never to 0)."""
    at = cut
    while 0 < at < len(data) and cut - at < 3 and data[at] & 0xC0 == 0x80:
        at -= 1
    return at if at > 0 and data[at:at + 1] and data[at] & 0xC0 != 0x80 else cut


def _unknown() -> UnknownEvidence:
    return UnknownEvidence(
        "no evidence with that id is known to you",
        hint="use an id from your call's envelope (its evidence list), as given; evidence is shown only to the "
             "call's own caller and to operators",
    )


def _when(at: float) -> str:
    return moments.utc_iso(at)  # a tombstone's time: an edited one is told as itself
