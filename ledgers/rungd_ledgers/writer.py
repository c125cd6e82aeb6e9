"""The ledger writer: durable appends, shared fsyncs, crash repair and rotation.

Group commit
------------
An append returns only once its record is on disk (written, then ``os.fsync``). An fsync
costs the same for one record as for fifty, so concurrent appends share them, with a
leader/follower scheme on one ``threading.Condition`` and no background thread:

1. ``append`` puts its record on the queue.
2. If no thread is writing, it becomes the leader: it takes everything queued, seals it
   (seq, time, prev, hash), releases the lock, writes the whole batch with one write and
   one fsync, takes the lock again, hands every record or error back and wakes everyone.
3. Otherwise it waits. Records queued while a leader is writing form the next batch, led
   by the first of their threads to wake.

No background thread means nothing to start, stop or lose on shutdown, an error raised in
the thread whose append failed, and no hop between threads for a lone append: a single
append costs one write and one fsync. The daemon calls ``append`` through
``trio.to_thread.run_sync``, so blocking here blocks a worker thread, never the event loop;
only ``append_now`` (records that need no fsync, written when nothing else is) runs on the
loop itself.

Files
-----
Records go to ``ledger-000001.jsonl``, ``ledger-000002.jsonl``, ...: once the current file
has passed ``rotate_bytes``, the next batch starts a new one, and the chain runs on across
files. Creating a file fsyncs the folder too, so the file's name survives a crash.

Reserve
-------
A full disk must not cost the records that finish what was started. The writer keeps
``reserve_bytes`` allocated past the end of the current file (``fallocate`` with
``FALLOC_FL_KEEP_SIZE``: the file's size does not change, its blocks are taken), topped up
after every batch. When the reserve cannot be made whole, appends that start new work
(``keep_reserve``) are refused, checked once per batch by its leader: the daemon then starts
nothing new, while records of calls already running still land in the reserve. A filesystem that cannot reserve (no fallocate) writes as before.

Failure
-------
When the write or fsync fails (``ENOSPC``, ``EIO``), every append of the batch raises
``LedgerUnavailable``, the file is truncated back to the end of the last durable record, and
seq and hash stay where they were, so the next append, once space is back, continues the
chain as if the failed batch had never been tried.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Final

import msgspec

from rungd_ledgers.chain import GENESIS, seal
from rungd_ledgers.errors import LedgerClosed, LedgerCorrupt, LedgerUnavailable
from rungd_ledgers.files import CHUNK_BYTES, MAX_LINE_BYTES, file_name, file_number, ledger_files
from rungd_ledgers.records import EVENTS, SCHEMA_VERSION, Record, decoder, encoder

DEFAULT_ROTATE_BYTES: Final = 64 * 1024 * 1024
# Room for the finished records of a few hundred running calls.
DEFAULT_RESERVE_BYTES: Final = 1024 * 1024
_FALLOC_FL_KEEP_SIZE: Final = 0x01

# Filled in when a record is sealed; a caller passing one is confused about who owns them.
_SEALED_FIELDS: Final = frozenset({"v", "seq", "time", "prev", "hash"})
# What sealing adds to a drafted record's line: seq, time, the two hashes and a newline.
_SEAL_BYTES = 256
_TAIL_SCAN_BYTES: Final = 64 * 1024
_APPEND_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
_FILE_MODE: Final = 0o640


class TornRepair(msgspec.Struct, frozen=True):
    """A partial last line that ``Ledger.open`` found, moved aside by the next write.

    A crash in the middle of a write leaves bytes with no newline after them. Their append
    never returned, so no caller was told they were recorded; but a disk that acknowledged
    an fsync it had not done leaves the same after the caller was told, and a program ran.
    Nobody can tell which, so the bytes are evidence for whoever settles what a crash left
    (the daemon's recovery): they stay in the ledger file until the first write after
    ``open`` (an append, ``flush`` or ``close``), which appends them, plus a newline, to
    ``moved_to`` (kept for a person to look at) and then truncates the ledger file back to
    ``offset``. A start-up that ends before writing anything finds them again.
    """

    file: str
    offset: int
    length: int
    moved_to: str


class _Ticket:
    """One append waiting for its batch to be written."""

    __slots__ = ("draft", "record", "error", "sync", "keep_reserve")

    def __init__(self, draft: Record, sync: bool = True, keep_reserve: bool = False) -> None:
        self.draft = draft
        self.sync = sync
        self.keep_reserve = keep_reserve
        self.record: Record | None = None
        self.error: LedgerUnavailable | None = None


class Ledger:
    """An open ledger folder, appended to by any number of threads.

    Build one with ``Ledger.open``. Only one ``Ledger`` may have a folder open at a time,
    in this process or any other: it holds an ``flock`` on the folder, because two writers
    would fork the hash chain.
    """

    def __init__(
        self,
        folder: Path,
        dir_fd: int,
        *,
        rotate_bytes: int,
        repair: TornRepair | None,
        last: Record | None,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        self._folder = folder
        self._dir_fd = dir_fd
        self._rotate_bytes = rotate_bytes
        self._reserve_bytes = reserve_bytes
        self._reserved_to = 0  # the file offset up to which blocks are allocated
        self._low = False
        self._repair = repair
        self._torn = repair  # still in the file: moved aside and cut off by the next write
        # (seq, hash) of the last record written: where the next batch chains on.
        self._head = (last.seq, last.hash) if last is not None else (0, GENESIS)
        self._head_time = last.time if last is not None else 0.0
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Ticket] = []
        self._writing = False
        self._closed = False
        # Past open(), only the leader touches the fields below, and only while _writing is set.
        self._fd = -1
        self._number = 0
        self._offset = 0
        self._needs_truncate = False
        self._unsynced = False  # bytes written by a batch that asked for no fsync
        # (offset, head, head time) as of the last fsync: what a failed fsync cuts back to.
        self._synced: tuple[int, tuple[int, str], float] = (0, self._head, self._head_time)

    @classmethod
    def open(cls, folder: str | os.PathLike[str], *, rotate_bytes: int = DEFAULT_ROTATE_BYTES,
             reserve_bytes: int = DEFAULT_RESERVE_BYTES) -> Ledger:
        """Open the ledger in ``folder``, creating the folder and its first file if needed.

        A partial last line left by a crash is reported (the ``repair`` property) and moved
        aside by the first write (see ``TornRepair``); the seq and hash of the last record
        before it are read back so the chain continues from them.

        Args:
            folder: the ledger folder, ``<state>/ledger``.
            rotate_bytes: once the current file has grown past this, the next batch of
                records starts a new file.
            reserve_bytes: space kept allocated past the end of the file for records
                that finish what was started (see "Reserve" above); 0 keeps none.

        Raises:
            LedgerUnavailable: another ``Ledger`` has the folder open.
            LedgerCorrupt: the last record cannot be decoded, so the chain cannot continue;
                ``verify`` tells what is wrong.
            OSError: the folder or its files cannot be created or read.
        """
        folder = Path(folder)
        if not folder.is_dir():
            folder.mkdir(parents=True)
            _fsync_path(folder.parent)
        with contextlib.ExitStack() as cleanup:
            dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            cleanup.callback(os.close, dir_fd)
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LedgerUnavailable(
                    f"{folder} is held by another writer (another rungd on the same state folder, or a tool "
                    "writing it); only one may write a ledger: stop the other one first"
                ) from None
            files = ledger_files(folder)
            torn = _torn_tail(files[-1]) if files else None
            ledger = cls(folder, dir_fd, rotate_bytes=rotate_bytes, repair=torn, last=_last_record(files, torn),
                         reserve_bytes=reserve_bytes)
            ledger._use_file(file_number(files[-1]) if files else 1)
            if torn is not None:
                # The records end where the torn bytes begin: the chain goes on from there,
                # once the first write has cut them off, as it cuts off a failed write's.
                ledger._offset = ledger._reserved_to = torn.offset
                ledger._synced = (torn.offset, ledger._head, ledger._head_time)
                ledger._needs_truncate = True
            ledger._reserve()
            cleanup.pop_all()
        return ledger

    @property
    def folder(self) -> Path:
        """The ledger folder."""
        return self._folder

    @property
    def last_seq(self) -> int:
        """The seq of the last record written, 0 for an empty ledger (it may wait for an fsync
        if it was appended with ``sync=False``)."""
        return self._head[0]

    @property
    def head(self) -> tuple[int, str, float]:
        """``(seq, hash, time)`` of the last record written; ``(0, GENESIS, 0.0)`` when empty.

        What an anchor publishes (see ``rungd_ledgers.anchors``), after :meth:`flush`: only a
        durable head may leave the host.
        """
        with self._cond:
            while self._writing:  # a batch being written moves seq, hash and time together
                self._cond.wait()
            return (*self._head, self._head_time)

    def _short_of_reserve(self) -> bool:
        """Whether new work should wait: the reserve past the end of the file cannot be made
        whole now, or the filesystem has less than another reserve's worth free. Tops the
        reserve up first (one ``fallocate`` of blocks mostly allocated already, and one
        ``fstatvfs``). Called by a batch's leader, which alone touches the file meanwhile."""
        if self._closed or self._reserve_bytes <= 0:
            return False
        self._reserve()
        if self._low:
            return True
        # The reserve is for finishing; new work needs room of its own beside it (its
        # own records, evidence, scratch): as much again, free on the filesystem.
        try:
            stats = os.fstatvfs(self._fd)
        except OSError:
            return False
        return stats.f_bavail * stats.f_frsize < self._reserve_bytes

    @property
    def repair(self) -> TornRepair | None:
        """The torn last line ``open`` found, if any (moved aside by the first write)."""
        return self._repair

    def append(self, event: str, call_id: str, tool: str, **fields: Any) -> Record:
        """Record one event and return once it is durable.

        Safe to call from many threads at once; concurrent calls share one write and one
        fsync (see the module docstring).

        Args:
            event: one of ``EVENTS``.
            call_id: the call the event belongs to.
            tool: the tool called.
            **fields: any other ``Record`` field: ``request_id``, ``outcome``, ``result``...

        Returns:
            The record as written, with ``seq``, ``time``, ``prev`` and ``hash`` filled in.

        Raises:
            LedgerUnavailable: the write or the fsync failed; nothing was recorded and a
                later append may succeed.
            LedgerClosed: ``close`` was called before this append.
            TypeError: a field that ``Record`` does not have, one the ledger fills in
                itself, or a value that cannot be encoded as JSON.
            ValueError: an unknown event, or a field value of the wrong type
                (``msgspec.ValidationError`` names the field).
        """
        return self.append_many([(event, call_id, tool, fields)])[0]

    def append_many(self, events: list[tuple[str, str, str, dict[str, Any]]], *, sync: bool = True,
                    keep_reserve: bool = False) -> list[Record]:
        """Record several events, in this order and next to each other, with one fsync.

        All or nothing: they join the same batch, so they are written together or not at
        all. Args, returns and errors are those of ``append``, one per event.

        Args:
            sync: False writes them (to the kernel: a crash of this process loses nothing)
                without waiting for an fsync; the next append that syncs makes them durable,
                being later in the same file. A machine crash before that may lose them.
            keep_reserve: the events start new work: refused (``LedgerUnavailable``, nothing
                written) while the reserve cannot be kept, so that what runs can always finish.
        """
        tickets = self._tickets(events, sync, keep_reserve)
        with self._cond:
            self._check_open()
            self._queue.extend(tickets)
            while any(t.record is None and t.error is None for t in tickets):
                if self._writing:
                    self._cond.wait()
                else:
                    self._lead()
        return self._answer(tickets)

    def append_now(self, events: list[tuple[str, str, str, dict[str, Any]]], *,
                   keep_reserve: bool = False) -> list[Record] | None:
        """``append_many(events, sync=False)`` if it can be done without waiting: no other
        batch or fsync under way, and no rotation or cut-back due (each may wait on the
        disk). Then it costs a ``write`` to the page cache and a ``fallocate`` topping the
        reserve up, in the calling thread: the daemon's loop calls it for reads' records, and
        hops to a worker thread only when this returns None. A failed write leaves the cut
        back to the last durable record (an fsync) to the next append, in a worker thread.

        Args and errors are those of ``append_many``.
        """
        tickets = self._tickets(events, False, keep_reserve)
        if not self._cond.acquire(blocking=False):
            return None
        try:
            self._check_open()
            if (self._writing or self._queue or self._needs_truncate or self._fd < 0
                    or self._offset >= self._rotate_bytes):
                return None
            self._queue.extend(tickets)
            self._lead(inline=True)
        finally:
            self._cond.release()
        return self._answer(tickets)

    @staticmethod
    def _tickets(events: list[tuple[str, str, str, dict[str, Any]]], sync: bool,
                 keep_reserve: bool) -> list[_Ticket]:
        return [_Ticket(_draft(event, call_id, tool, fields), sync, keep_reserve)
                for event, call_id, tool, fields in events]

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosed(f"the ledger in {self._folder} was closed; open it again to append")

    @staticmethod
    def _answer(tickets: list[_Ticket]) -> list[Record]:
        for ticket in tickets:
            if ticket.error is not None:
                raise ticket.error
        return [ticket.record for ticket in tickets if ticket.record is not None]

    @property
    def unsynced(self) -> bool:
        """Whether appends made with ``sync=False`` wait for an fsync (see :meth:`flush`)."""
        return self._unsynced

    def flush(self) -> None:
        """Make durable what appends with ``sync=False`` wrote: one fsync, if any is waiting;
        and move aside a torn last line ``open`` found, if no write has yet (see ``TornRepair``).

        Raises:
            LedgerUnavailable: the fsync failed; those records may be lost in a machine crash.
        """
        with self._cond:
            while self._writing:
                self._cond.wait()
            if self._closed or not (self._unsynced or self._needs_truncate):
                return
            self._writing = True  # appends queue meanwhile; the next one leads
        try:
            if self._needs_truncate:  # a failed write on the daemon's loop, or a torn tail, left it to us
                self._truncate_to_last_record()
                return
            os.fsync(self._fd)
            self._unsynced = False
            self._synced = (self._offset, self._head, self._head_time)
        except OSError as error:
            # The unsynced records may be gone from the page cache: cut them off (reads'
            # records only, which the README allows a crash to lose), so that nothing later
            # chains on bytes the disk may not hold.
            self._needs_truncate = True
            with contextlib.suppress(OSError):
                self._truncate_to_last_record()
            raise LedgerUnavailable(f"the ledger in {self._folder} could not be synced "
                                    f"({error.strerror or error})") from error
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def close(self) -> None:
        """Wait for appends already queued, then release the files and the folder lock."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            while self._writing or self._queue:
                self._cond.wait()
        with contextlib.suppress(OSError):
            if self._needs_truncate:  # a failed write on the daemon's loop, or a torn tail, left it to us
                self._truncate_to_last_record()
            elif self._unsynced:
                os.fsync(self._fd)
        os.close(self._fd)
        os.close(self._dir_fd)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _lead(self, *, inline: bool = False) -> None:
        """Write everything queued as one batch. Called, and returns, holding the lock.

        Args:
            inline: called from append_now: a failed write does not cut back (an fsync) here.
        """
        batch, self._queue = self._queue, []
        self._writing = True
        self._cond.release()
        try:
            self._commit(batch, inline=inline)
        finally:
            # If _commit raised something other than OSError (a bug), its exception goes to
            # this thread; the followers must still be answered or they would wait forever.
            for ticket in batch:
                if ticket.record is None and ticket.error is None:
                    ticket.error = LedgerUnavailable("the ledger writer failed; another append raised why")
            self._cond.acquire()
            self._writing = False
            self._cond.notify_all()

    def _commit(self, batch: list[_Ticket], *, inline: bool = False) -> None:
        """Seal, write and fsync a batch, then answer each of its tickets."""
        if any(ticket.keep_reserve for ticket in batch) and self._short_of_reserve():
            # Checked once per batch, by its leader: new work waits; what finishes goes on.
            for ticket in batch:
                if ticket.keep_reserve:
                    ticket.error = LedgerUnavailable("the disk holding the ledger is nearly full (its reserve "
                                                     "for finishing running calls cannot be kept)")
            batch = [ticket for ticket in batch if not ticket.keep_reserve]
            if not batch:
                return
        try:
            if self._needs_truncate:
                self._truncate_to_last_record()
            if self._offset >= self._rotate_bytes:
                self._use_file(self._number + 1)
            seq, prev = self._head
            now = time.time()
            records: list[Record] = []
            lines: list[bytes] = []
            for ticket in batch:
                seq += 1
                record, line = seal(ticket.draft, seq=seq, prev=prev, time=now)
                records.append(record)
                lines.append(line)
                prev = record.hash
            data = b"".join(lines)
            self._write_durably(data, sync=any(ticket.sync for ticket in batch), cut_back=not inline)
        except OSError as error:
            for ticket in batch:
                ticket.error = LedgerUnavailable(
                    f"the ledger in {self._folder} could not be written ({error.strerror or error}); "
                    "nothing was recorded; retry later, once the disk has space or works again"
                )
                ticket.error.__cause__ = error
            return
        self._offset += len(data)
        self._head = (seq, prev)
        self._head_time = now
        if not self._unsynced:
            self._synced = (self._offset, self._head, self._head_time)
        for ticket, record in zip(batch, records):
            ticket.record = record
        self._reserve()

    def _reserve(self) -> None:
        """Top the reserve past the end of the file up, or note that it cannot be."""
        if self._reserve_bytes <= 0 or self._reserved_to - self._offset >= self._reserve_bytes:
            self._low = False
            return
        # Topped up past the reserve by a step, so that most appends need no fallocate; on
        # a disk too full for the step, by the reserve alone.
        for length in (self._reserve_bytes + _RESERVE_STEP, self._reserve_bytes):
            try:
                _fallocate_keep_size(self._fd, self._offset, length)
            except OSError as error:
                # ENOSPC: the disk is nearly full. Anything else (EOPNOTSUPP, EINVAL): this
                # filesystem cannot reserve, and writes go on as they would without a reserve.
                self._low = error.errno == errno.ENOSPC
                if not self._low:
                    return
                continue
            self._reserved_to = self._offset + length
            self._low = False
            return

    def _write_durably(self, data: bytes, *, sync: bool = True, cut_back: bool = True) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            if sync:
                os.fsync(self._fd)  # also makes durable what earlier unsynced batches wrote
                self._unsynced = False
            else:
                self._unsynced = True
        except OSError:
            # Cut the file back to the last durable record. A partial write would otherwise
            # become a torn line in the middle of the file once the next batch lands after
            # it; and after a failed fsync the kernel may have dropped the dirty pages, so
            # bytes that look written may never reach the disk. A later batch rewrites them
            # and fsyncs its own bytes.
            self._needs_truncate = True
            # If even that fails, the next batch tries again before writing; the write
            # error is the one worth reporting. (Not here when called from the daemon's
            # loop: the next batch, in a worker thread, does it before writing.)
            if cut_back:
                with contextlib.suppress(OSError):
                    self._truncate_to_last_record()
            raise

    def _truncate_to_last_record(self) -> None:
        """Cut the file back to its last durable record (as of the last fsync that worked):
        records written since without an fsync (reads') go too, a torn tail ``open`` found
        goes once it is durably aside, and the chain goes on from that record."""
        offset, head, head_time = self._synced
        if self._torn is not None:
            _move_aside(self._folder, self._torn, self._dir_fd)
            self._torn = None
        os.ftruncate(self._fd, offset)  # also frees the reserve: the next batch retakes it
        os.fsync(self._fd)
        self._needs_truncate = False
        self._unsynced = False
        self._offset, self._head, self._head_time = offset, head, head_time
        self._reserved_to = offset

    def _use_file(self, number: int) -> None:
        """Append to ledger file ``number`` from now on, creating it durably if it is new."""
        fd = os.open(self._folder / file_name(number), _APPEND_FLAGS, _FILE_MODE)
        try:
            # The new file's name must be durable too, or a crash could lose the whole file.
            # Done even when the file already exists: an earlier attempt may have created it
            # and then failed this very fsync.
            os.fsync(self._dir_fd)
            offset = os.fstat(fd).st_size
        except OSError:
            os.close(fd)
            raise
        if self._fd >= 0:
            if self._unsynced:  # the chain goes on in the new file: the old one must be whole
                os.fsync(self._fd)
                self._unsynced = False
            with contextlib.suppress(OSError):  # give the old file's reserve back
                os.ftruncate(self._fd, self._offset)
            os.close(self._fd)
        self._fd, self._number, self._offset = fd, number, offset
        self._reserved_to = offset
        self._synced = (offset, self._head, self._head_time)


_RESERVE_STEP = 64 * 1024  # how far past the reserve it is topped up at once
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def _fallocate_keep_size(fd: int, offset: int, length: int) -> None:
    """Allocate ``length`` bytes of ``fd`` from ``offset`` without changing its size.

    Raises:
        OSError: ENOSPC when the filesystem has not that much room; EOPNOTSUPP when it
            cannot preallocate at all.
    """
    if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _draft(event: str, call_id: str, tool: str, fields: dict[str, Any]) -> Record:
    """Build and type-check a record that only lacks its place in the chain."""
    if event not in EVENTS:
        raise ValueError(f"unknown ledger event {event!r}; expected one of {', '.join(sorted(EVENTS))}")
    sealed = _SEALED_FIELDS & fields.keys()
    if sealed:
        raise TypeError(f"{', '.join(sorted(sealed))} are filled in by the ledger; leave them out")
    draft = Record(
        v=SCHEMA_VERSION, seq=0, time=0.0, event=event, call_id=call_id, tool=tool, prev=GENESIS, **fields
    )
    # Struct() does not check types; a round trip does. A bad value fails here, in the
    # caller's thread, instead of landing in the file where every reader would trip on it.
    encoded = encoder.encode(draft)
    if len(encoded) > MAX_LINE_BYTES - _SEAL_BYTES:
        # Every reader refuses a longer line, so the next start would stop at it as corrupt;
        # the daemon bounds what a record carries (logged inputs, results) far below this.
        raise ValueError(f"a {event} record of {len(encoded)} bytes is longer than a ledger line may be "
                         f"({MAX_LINE_BYTES})")
    return decoder.decode(encoded)


def _torn_tail(path: Path) -> TornRepair | None:
    """The partial last line of ``path``, if it has one (see ``TornRepair``)."""
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        if size == 0:
            return None
        file.seek(size - 1)
        if file.read(1) == b"\n":
            return None
        start = _line_start(file, size)
    return TornRepair(file=path.name, offset=start, length=size - start, moved_to=path.name + ".torn")


def _move_aside(folder: Path, torn: TornRepair, dir_fd: int) -> None:
    """Append a torn tail, plus a newline, to its ``.torn`` file, durably, before it is cut off."""
    with open(folder / torn.file, "rb") as source, open(folder / torn.moved_to, "ab") as aside:
        source.seek(torn.offset)
        # A chunk at a time: torn bytes can be any length, and are never held whole.
        shutil.copyfileobj(source, aside, CHUNK_BYTES)
        aside.write(b"\n")
        aside.flush()
        os.fsync(aside.fileno())
    os.fsync(dir_fd)


def _last_record(files: list[Path], torn: TornRepair | None) -> Record | None:
    """The last record in the newest file that has one (before its ``torn`` tail, if it has
    one), ``None`` for an empty ledger."""
    for path in reversed(files):
        with open(path, "rb") as file:
            end = torn.offset if torn is not None and path.name == torn.file else file.seek(0, os.SEEK_END)
            if end == 0:
                continue
            line = _last_line(file, end - 1)  # the records end with a newline: skip it
        if line is None:
            raise LedgerCorrupt(
                f"the last line of {path} is longer than any record (more than {MAX_LINE_BYTES} bytes), so the "
                "hash chain cannot continue; run `rungctl ledger verify` to see what is wrong"
            )
        try:
            return decoder.decode(line)
        except msgspec.DecodeError as error:
            raise LedgerCorrupt(
                f"the last record of {path} cannot be read ({error}), so the hash chain cannot "
                "continue; run `rungctl ledger verify` to see what is wrong"
            ) from error
    return None


def _last_line(file: BinaryIO, end: int) -> bytes | None:
    """The line that ends at ``end`` (its newline excluded), read back from there.

    Returns:
        The line, or ``None`` when it is longer than ``MAX_LINE_BYTES``: then no more than
        that was read, and nothing of it is held.
    """
    start = _line_start(file, end, floor=max(0, end - MAX_LINE_BYTES - 1))
    if end - start > MAX_LINE_BYTES:
        return None
    file.seek(start)
    return file.read(end - start)


def _line_start(file: BinaryIO, end: int, floor: int = 0) -> int:
    """The offset just past the last newline between ``floor`` and ``end``, ``floor`` if there
    is none: reading back stops there."""
    position = end
    while position > floor:
        start = max(floor, position - _TAIL_SCAN_BYTES)
        file.seek(start)
        newline = file.read(position - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return floor


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
