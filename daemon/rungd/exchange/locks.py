"""Who holds a file: our own lock, a legacy program's lock-file convention, an open handle.

Three ways a file can be taken, and what each means:

* ``OwnLock``: a filelock on a lock file of ours (outside the watched folder), held for a
  whole import, so two rungd calls, in this daemon or another, never write the same
  folder at once. A conflict names the call that holds it.
* A lock file next to the target, in the convention of the program a person uses:
  LibreOffice's ``.~lock.NAME#`` (its content names the user, the host and since when),
  ``NAME.lck`` and friends. Such a file means a person has the target open right now.
* An open handle on the target, seen through psutil: a program (an editor, the legacy
  program itself) has the file open. Only processes we may inspect are seen.

``holders`` runs the last two in a worker thread under rung 3's own limiter, bounded
(listing every process's open files can take tens of milliseconds on a busy host). A lock
candidate is never opened in a way that can block: it is ``lstat``-ed, and only a regular
file is read (non-blocking, no symlink followed). Anyone who can write the folder can
plant a FIFO named ``.~lock.NAME#``; it still means "held", but is never waited on.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import filelock
import psutil

from rungd.core.errors import Locked
from rungd.exchange import safe

LIBREOFFICE = ".~lock.{name}#"
LCK = "{name}.lck"
STEM_LCK = "{stem}.lck"
MS_OFFICE = "~${name}"
DEFAULT_CONVENTIONS = (LIBREOFFICE, LCK)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Something that holds a file: what it is (a lock file, an open handle) and who."""

    what: str
    who: str

    def text(self) -> str:
        return f"{self.who} ({self.what})"


def lock_file_names(target: Path, conventions: Sequence[str]) -> list[Path]:
    """The lock files the conventions would put next to ``target``."""
    return [target.with_name(c.format(name=target.name, stem=target.stem)) for c in conventions]


def lock_files(target: Path, conventions: Sequence[str], *, dir_fd: int | None = None) -> list[Holder]:
    """Holders announced by lock files next to ``target`` (cheap: a few ``lstat`` calls).

    Blocking only as ``lstat`` is: nothing is opened unless ``lstat`` saw a regular file,
    and then without following a symlink or waiting on a FIFO swapped in.

    Args:
        dir_fd: the folder ``target`` lies in, held open (names are then looked up in it).
    """
    found = []
    for path in lock_file_names(target, conventions):
        where: Path | str = path.name if dir_fd is not None else path
        mode = safe.kind_of(where, dir_fd=dir_fd)
        if mode is None:
            continue
        if not stat.S_ISREG(mode):
            # Whatever planted it, a lock-file name is taken: held, but never read or waited on.
            found.append(Holder(f"lock file {path.name}", f"{safe.describe(mode)} someone put there: a person "
                                                          "must remove it if nobody has the file open"))
            continue
        head = safe.read_head(where, 512, dir_fd=dir_fd) or b""
        found.append(Holder(f"lock file {path.name}", _who_from_lock(path, head)))
    return found


def _who_from_lock(path: Path, head: bytes) -> str:
    text = head.decode("utf-8", "replace").strip()
    if path.name.startswith(".~lock.") and text.count(",") >= 3:
        # LibreOffice: "<name>,<user>,<host>,<dd.mm.yyyy hh:mm>,<profile url>;"
        name, user, host, since, *_ = text.split(",")
        person = name or user
        return f"{person} on {host} since {since}" if host else person
    if text.isdigit():
        pid = int(text)
        try:
            process = psutil.Process(pid)
            return f"{process.name()} (pid {pid}, user {process.username()})"
        except psutil.Error:
            return f"process {pid} (no longer running: a stale lock a person must remove)"
    try:
        owner = path.owner()
    except (KeyError, OSError):
        owner = "an unknown user"
    return f"{owner}" + (f": {text[:80]!r}" if text else "")


def open_handles(target: Path, *, writers_only: bool = False) -> list[Holder]:
    """Processes with ``target`` open, as psutil sees them (blocking; slow on busy hosts).

    Args:
        writers_only: count only handles open for writing (an export still being written).
    """
    try:
        wanted = os.stat(target)
    except FileNotFoundError:
        return []
    real = os.path.realpath(target)
    found = []
    me = os.getpid()
    for process in psutil.process_iter(["pid", "name", "username"]):
        if process.pid == me:
            continue
        try:
            files = process.open_files()
        except (psutil.Error, OSError):
            continue
        for handle in files:
            if handle.path != real:
                continue
            mode = getattr(handle, "mode", "r")
            if writers_only and mode == "r":
                continue
            try:
                same = os.stat(handle.path).st_ino == wanted.st_ino
            except OSError:
                same = False
            if same:
                info = process.info
                found.append(Holder(f"open handle, mode {mode}",
                                    f"{info['name']} (pid {info['pid']}, user {info['username']})"))
                break
    return found


async def holders(targets: Sequence[Path], conventions: Sequence[str], *, handles: bool = True,
                  writers_only: bool = False, dir_fd: int | None = None) -> list[Holder]:
    """Everything holding any of ``targets``: lock files by convention, then open handles.

    Args:
        dir_fd: the held folder of ``targets[0]``; its lock files are looked up in it.

    Raises:
        ToolTimeout: the file system did not answer within ``safe.FILE_OP_S``.

    Cancellation: the work runs in a worker thread of rung 3's own limiter (only reads,
    so it is safe to abandon); a cancelled caller does not wait for it.
    """

    def look() -> list[Holder]:
        found = [h for i, t in enumerate(targets)
                 for h in lock_files(t, conventions, dir_fd=dir_fd if i == 0 else None)]
        if handles:
            found += [h for t in targets for h in open_handles(t, writers_only=writers_only)]
        return found

    return await safe.run(look, what="look for lock files and open handles")


def locked_error(target: Path, found: Sequence[Holder]) -> Locked:
    """The LOCKED error for ``target`` held by ``found``; nothing was written."""
    who = "; ".join(h.text() for h in found[:3])
    return Locked(
        f"{target.name} is in use: {who}",
        hint="nothing was written. A person or another program has the file open; retry after they close it "
        "(ask them to close it if this persists)",
        fields={"holders": [dataclasses.asdict(h) for h in found[:5]]},
    )


class OwnLock:
    """rungd's own lock on one import folder: a filelock held for the whole import.

    Args:
        path: the lock file. Keep it outside the watched folder, where the legacy program
            would see it.

    Each ``acquire`` takes a fresh lock on the file, so two calls in one daemon exclude
    each other just as two daemons do (a single filelock object would let its own holder
    in again).
    """

    _holders: ClassVar[dict[str, str]] = {}  # lock path -> call id, so a conflict names the holder

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: filelock.BaseFileLock | None = None

    def acquire(self, call_id: str) -> None:
        """Take the lock at once or raise.

        Raises:
            Locked: another call (named when it runs in this daemon) holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(self.path, timeout=0, thread_local=False)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            holder = self._holders.get(str(self.path))
            who = f"call {holder}" if holder else "another rungd process"
            raise Locked(
                f"{who} is importing into this folder right now",
                hint="nothing was written; retry when that call has finished",
                fields={"holders": [{"what": "rungd import lock", "who": who}]},
            ) from None
        self._lock = lock
        self._holders[str(self.path)] = call_id

    def release(self) -> None:
        """Let the next import in. Safe to call when not held."""
        lock, self._lock = self._lock, None
        if lock is not None:
            self._holders.pop(str(self.path), None)
            lock.release()
