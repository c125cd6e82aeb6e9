"""Watched folders: watchdog events bridged into Trio, and an index of complete files.

    watcher = Watcher()
    inbox = await watcher.open(state / "inbox")       # one scan now, events from then on
    entry = inbox.newest(re.compile(r"invoices-.*\\.csv"))
    await wait_for(lambda: None if target.exists() else "gone", [inbox], poll_s=1)
    watcher.close()

One watchdog observer thread serves every folder of a ``Watcher``. Its handler runs in
that thread and only updates the index under a lock; it never touches Trio objects
directly. Tasks waiting in Trio are woken through their run's token
(``TrioToken.run_sync_soon``), so the event loop never blocks on the filesystem and an
event storm costs a dict update, not a task switch.

A file enters the index as complete-eligible only when it is closed after writing or moved
into the folder: a bare create means a writer has just begun (watchdog #586, #313), so it
is recorded as being written and never offered as the newest export. Files present when a
folder is first opened are indexed from one scan; whether they are complete is for
``exports.wait_complete`` to decide, as for any file. After that first scan, asking for the
newest export of a folder of 50,000 files is a dictionary lookup.

Events are only a way to wake up early: every wait re-checks the filesystem itself and
also polls, so a lost event (an inotify queue overflow) costs latency, never correctness.

A watch survives its folder being replaced: each ``open`` compares the folder's identity
(device and inode) with the one indexed, and a folder deleted, moved away or recreated
gets a fresh watch and a fresh listing. Only regular files and symlinks are indexed; a
FIFO, socket or device someone put in the folder is never an export. Listings and
``stat`` calls run in worker threads of rung 3's own limiter (``safe``), never in the
event loop.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio
from watchdog.events import (
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from rungd.exchange import safe

T = TypeVar("T")
EVENTS = [FileClosedEvent, FileMovedEvent, FileCreatedEvent, FileDeletedEvent, DirMovedEvent, DirDeletedEvent]


@dataclasses.dataclass(frozen=True)
class Entry:
    """A file the index holds: its name, modification time (ns) and size when last seen."""

    name: str
    mtime_ns: int
    size: int


_Waiter = tuple[trio.lowlevel.TrioToken, trio.Event]


class FolderIndex(FileSystemEventHandler):
    """What is known about one watched folder, kept current by watchdog events.

    Attributes:
        path: the folder.
        scans: how many times the folder was listed in full (1 after ``open``, unless
            ``rescan`` was called).
        events: how many relevant events arrived.
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.scans = 0
        self.events = 0
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._writing: set[str] = set()
        self._newest: dict[tuple[str, str], Entry | None] = {}
        self._waiters: set[_Waiter] = set()
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder listed
        self.lost = False  # the folder itself was deleted or moved away
        self.watch: ObservedWatch | None = None

    # --- the observer thread ------------------------------------------------------------------

    def rescan(self) -> None:
        """List the folder in full (blocking; run it in a worker thread)."""
        entries = {}
        st = os.stat(self.path)
        identity = (st.st_dev, st.st_ino)
        with os.scandir(self.path) as it:
            for item in it:
                try:
                    if item.is_file(follow_symlinks=False) or item.is_symlink():
                        st = item.stat(follow_symlinks=False)
                        entries[item.name] = Entry(item.name, st.st_mtime_ns, st.st_size)
                except FileNotFoundError:
                    continue
        with self._lock:
            self._entries = entries
            self._writing.clear()
            self._newest.clear()
            self.identity = identity
            self.lost = False
            self.scans += 1
        self._wake()

    def dispatch(self, event: FileSystemEvent) -> None:
        """Called by watchdog in its thread for every event in this folder."""
        src = os.fsdecode(event.src_path)
        dest = os.fsdecode(event.dest_path) if event.dest_path else ""
        if isinstance(event, FileClosedEvent):
            self._complete(src)
        elif isinstance(event, FileCreatedEvent):
            self._begun(src)
        elif isinstance(event, FileMovedEvent):
            self._gone(src)
            self._complete(dest)
        elif isinstance(event, FileDeletedEvent):
            self._gone(src)
        elif isinstance(event, (DirMovedEvent, DirDeletedEvent)) and src == str(self.path):
            with self._lock:
                self._entries.clear()
                self._writing.clear()
                self._newest.clear()
                self.lost = True  # the next Watcher.open watches whatever folder has the name now
        else:
            return
        self.events += 1
        self._wake()

    def _mine(self, path: str) -> str | None:
        folder, _, name = path.rpartition("/")
        return name if folder == str(self.path) and name else None

    def _begun(self, path: str) -> None:
        if (name := self._mine(path)) is not None:
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    return  # a FIFO, socket or device is nobody's export being written
            except FileNotFoundError:
                return
            with self._lock:
                self._writing.add(name)

    def _complete(self, path: str) -> None:
        name = self._mine(path)
        if name is None:
            return
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return self._gone(path)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            return self._gone(path)
        entry = Entry(name, st.st_mtime_ns, st.st_size)
        with self._lock:
            self._writing.discard(name)
            self._entries[name] = entry
            for key, best in list(self._newest.items()):
                pattern, by = key
                if re.fullmatch(pattern, name) and (best is None or _newer(entry, best, by)):
                    self._newest[key] = entry

    def _gone(self, path: str) -> None:
        name = self._mine(path)
        if name is None:
            return
        with self._lock:
            self._writing.discard(name)
            if self._entries.pop(name, None) is not None:
                for key, best in list(self._newest.items()):
                    if best is not None and best.name == name:
                        del self._newest[key]  # recomputed from the index when next asked

    def _wake(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for token, event in waiters:
            try:
                token.run_sync_soon(event.set, idempotent=True)
            except trio.RunFinishedError:
                pass  # that run is over; its waiter is gone with it

    # --- any thread -----------------------------------------------------------------------------

    def newest(self, pattern: re.Pattern[str], *, by: str = "mtime") -> Entry | None:
        """The newest complete-eligible file whose name fully matches ``pattern``.

        Args:
            by: ``mtime`` (latest modification wins) or ``name`` (greatest name wins, for
                programs that put a timestamp in the name).
        """
        key = (pattern.pattern, by)
        with self._lock:
            if key not in self._newest:
                best = None
                for entry in self._entries.values():
                    if pattern.fullmatch(entry.name) and (best is None or _newer(entry, best, by)):
                        best = entry
                self._newest[key] = best
            return self._newest[key]

    def writing(self, pattern: re.Pattern[str]) -> list[str]:
        """Names matching ``pattern`` that were created and not yet closed or moved in."""
        with self._lock:
            return sorted(n for n in self._writing if pattern.fullmatch(n))

    def entry(self, name: str) -> Entry | None:
        with self._lock:
            return self._entries.get(name)

    def add_waiter(self, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters.add(waiter)

    def discard_waiter(self, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters.discard(waiter)


def _observer() -> BaseObserver:
    """A watchdog observer that reports a move from an unwatched folder as a move.

    Without full events inotify's unmatched IN_MOVED_TO (an export written elsewhere and
    renamed in: the atomic way) arrives as a bare create, which the index must not trust.
    """
    try:
        from watchdog.observers.inotify import InotifyObserver
    except ImportError:  # not Linux: the platform's observer, with its own move semantics
        return Observer()
    return InotifyObserver(generate_full_events=True)


def _newer(a: Entry, b: Entry, by: str) -> bool:
    if by == "name":
        return a.name > b.name
    return (a.mtime_ns, a.name) > (b.mtime_ns, b.name)


class Watcher:
    """One watchdog observer for every folder a plugin watches.

    The observer starts when the first folder is opened and stops when the Trio run that
    opened it ends (a system task closes it), or when ``close`` is called. Opening a folder
    again later starts a fresh one. Indexes of a closed watcher stop changing, so always
    get them from ``open``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._observer: BaseObserver | None = None
        self._folders: dict[Path, FolderIndex] = {}
        self._run: trio.lowlevel.TrioToken | None = None

    def __repr__(self) -> str:
        return f"Watcher({sorted(str(p) for p in self._folders)})"

    def open_blocking(self, path: Path) -> FolderIndex:
        """Watch ``path`` (an existing folder) and index it; the same index on later calls.

        The watch is set up before the scan, so nothing written in between is missed. A
        folder replaced since it was indexed (deleted and recreated, or moved away and
        another put in its place) is watched afresh and listed again, in the same index.
        Blocking (a ``stat``, and a full listing when new or replaced): from Trio, call
        ``open``.
        """
        path = Path(os.path.realpath(path))
        st = os.stat(path)
        with self._lock:
            index = self._folders.get(path)
            if index is not None and not index.lost and index.identity == (st.st_dev, st.st_ino):
                return index
            if self._observer is None:
                self._observer = _observer()
                self._observer.daemon = True
                self._observer.start()
            if index is None:
                index = FolderIndex(path)
                self._folders[path] = index
            elif index.watch is not None:
                # The old watch follows the old folder (or died with it): drop it, watch anew.
                try:
                    self._observer.unschedule(index.watch)
                except KeyError:
                    pass
            index.watch = self._observer.schedule(index, str(path), recursive=False, event_filter=EVENTS)
        index.rescan()
        return index

    def lookup(self, path: Path) -> FolderIndex | None:
        """The index of ``path`` if it is watched now (no I/O)."""
        with self._lock:
            return self._folders.get(Path(os.path.realpath(path)))

    async def open(self, path: Path) -> FolderIndex:
        """Watch and index ``path``: a ``stat`` in a worker thread to see it is still the
        folder indexed, and a listing when it is new or was replaced.

        Raises:
            ToolTimeout: the file system did not answer in time.

        Cancellation: the thread is abandoned (it only lists); a cancelled caller does not
        get the index, and a later call finishes the work or finds it done.
        """
        token = trio.lowlevel.current_trio_token()
        if self._run is not token:
            self._run = token
            trio.lowlevel.spawn_system_task(self._close_with_run, name="rungd.exchange.watch")
        return await safe.run(self.open_blocking, path, what="watch the folder")

    async def _close_with_run(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self._run = None
            self.close()

    def close(self) -> None:
        """Stop the observer thread (waits up to two seconds for it)."""
        with self._lock:
            observer, self._observer = self._observer, None
            self._folders.clear()
        if observer is not None:
            observer.stop()
            observer.join(timeout=2)


async def wait_for(check: Callable[[], T | None], folders: Sequence[FolderIndex], *, poll_s: float,
                   threaded: bool = True) -> T:
    """Wait until ``check()`` returns something other than None, and return it.

    ``check`` runs at once, after every event in any of ``folders``, and at least every
    ``poll_s`` seconds.

    Args:
        threaded: run ``check`` in a worker thread of rung 3's limiter (it looks at files
            someone else controls, so it never runs in the event loop); False only for a
            check that touches no file.

    Raises:
        ToolTimeout: a threaded check found the file system unresponsive.

    Cancellation: safe at any point; nothing is left registered.
    """
    token = trio.lowlevel.current_trio_token()
    while True:
        waiter = (token, trio.Event())
        for folder in folders:
            folder.add_waiter(waiter)
        try:
            # Registered before checking, so an event between the check and the wait wakes us.
            result = await safe.run(check, what="look at the watched folder") if threaded else check()
            if result is not None:
                return result
            with trio.move_on_after(poll_s):
                await waiter[1].wait()
        finally:
            for folder in folders:
                folder.discard_waiter(waiter)


async def changed(folders: Sequence[FolderIndex], timeout_s: float) -> bool:
    """Wait for the next event in any of ``folders``, at most ``timeout_s`` seconds.

    Returns:
        True if an event arrived, False on timeout.

    Cancellation: safe at any point.
    """
    start = [f.events + f.scans for f in folders]

    def moved() -> bool | None:
        return True if [f.events + f.scans for f in folders] != start else None

    with trio.move_on_after(timeout_s):
        return await wait_for(moved, folders, poll_s=timeout_s, threaded=False)
    return False
