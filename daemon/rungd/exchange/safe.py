"""File work on paths other users can influence: never blocking the loop, never following a swap.

Anyone who can write an export or import folder can put a FIFO, a socket, a device node,
a symlink loop or a dangling symlink where rung 3 expects a file, or swap a folder for a
symlink between a check and a write. So every file operation here follows four rules:

* **Look before opening, without following or blocking**: ``lstat`` first; only a regular
  file (or a symlink the caller accepts) is ever opened.
* **Open so that opening cannot block or follow**: ``O_NONBLOCK`` (a FIFO swapped in after
  the ``lstat`` opens at once instead of waiting for a writer), ``O_NOFOLLOW`` where no
  final symlink is expected, then ``fstat`` the descriptor: what was opened, not the name,
  must be a regular file. ``O_NONBLOCK`` is cleared again for the reads that follow.
* **Folders are walked, not named**: ``open_folder`` opens ``/`` and then each component
  of a root with ``O_DIRECTORY|O_NOFOLLOW`` relative to the one before (openat), so a
  component swapped for a symlink fails instead of leading elsewhere; files are created,
  renamed and removed relative to that descriptor (``dir_fd=``).
* **Slow work runs in worker threads under rung 3's own limiter**, never Trio's default
  one (the ledger must never wait behind a folder a user made slow), each wait bounded
  (``run``): a stuck file system is TIMEOUT with a hint, not a hung call.

Errors a caller sees: ``NotAFile`` (NOT_A_FILE) for a special file where a file belongs,
``OutsideRoots`` (OUTSIDE_ROOTS) for a folder that leads out of the roots, ``ToolTimeout``
(TIMEOUT) for a file system that did not answer in time.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from rungd.core.contract import ErrorRule
from rungd.core.errors import ToolError, ToolTimeout
from rungd.exchange.paths import OutsideRoots, Roots

T = TypeVar("T")

NOT_A_FILE_CODE = "NOT_A_FILE"
NOT_A_FILE = ErrorRule(
    NOT_A_FILE_CODE,
    "no",
    "stop",
    "the operator must remove that special file (FIFO, socket, device, symlink loop or folder) from the "
    "tool's folder; nothing was read or written",
    "a name the tool reads or writes is not a regular file (a FIFO, socket, device, folder or symlink loop)",
)
# Worker threads for rung 3 file work, per Trio run. Lock probes, listings and parsing
# share them; the ledger and everything else use other limiters.
THREADS = 8
FILE_OP_S = 10.0  # one probe, listing or open: a local file system answers in milliseconds
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY

_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("rungd.exchange.limiter")


class NotAFile(ToolError):
    """A special file sits where a regular file belongs. Code NOT_A_FILE; nothing was touched."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(NOT_A_FILE_CODE, message, hint=NOT_A_FILE.hint, retry="no", next_action="stop",
                         **kwargs)


def limiter() -> trio.CapacityLimiter:
    """Rung 3's own thread limiter for the current Trio run (created on first use).

    Per run, not per process: a token held by a thread abandoned in one run must never
    starve another run (tests start many).
    """
    try:
        return _LIMITER.get()
    except LookupError:
        made = trio.CapacityLimiter(THREADS)
        _LIMITER.set(made)
        return made


async def run(fn: Callable[..., T], *args: Any, what: str, abandon: bool = True,
              timeout_s: float = FILE_OP_S) -> T:
    """Run blocking file work ``fn(*args)`` in a worker thread under rung 3's limiter, bounded.

    Args:
        fn: the work; it must not touch Trio objects.
        what: what it does, for the TIMEOUT message ("list the export folder").
        abandon: stop waiting on cancellation. Only for work whose result may be lost
            safely: probes and listings, never anything returning a descriptor.
        timeout_s: how long the file system may take. Waiting for a thread token counts.

    Raises:
        ToolTimeout: the work did not finish in ``timeout_s`` (with ``abandon``; the
            thread finishes on its own and then frees its token).

    Cancellation: with ``abandon`` the caller returns at once and the thread's result is
    dropped; without it the caller waits for the thread, as ``trio.to_thread`` does.
    """
    with trio.move_on_after(timeout_s if abandon else float("inf")) as scope:
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=abandon, limiter=limiter())
    assert scope.cancelled_caught
    raise ToolTimeout(
        f"the file system did not {what} within {timeout_s:.0f} s",
        hint="a folder of the tool is on a slow or hung file system; the operator should check its mount; "
        "retry later",
        retry="yes",
        next_action="retry_later",
    )


def describe(mode: int) -> str:
    """What kind of file ``mode`` is, in words for a message."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def not_a_file(name: str, mode: int | None) -> NotAFile:
    kind = describe(mode) if mode is not None else "a symlink loop"
    return NotAFile(f"{name!r} in the tool's folder is {kind}, not a regular file")


def open_regular(path: Path | str, *, dir_fd: int | None = None, follow: bool = False) -> int:
    """Open a regular file for reading without ever blocking; return the descriptor.

    Args:
        path: the file (a plain name when ``dir_fd`` is given).
        dir_fd: the folder to open it in.
        follow: accept a final symlink (to a regular file); otherwise a symlink is refused.

    Raises:
        NotAFile: it is (or, with ``follow``, leads to) anything but a regular file, or a
            symlink loop.
        FileNotFoundError: it does not exist (or a followed symlink dangles).
    """
    name = os.path.basename(path)
    try:
        ahead = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise not_a_file(name, None) from None
        raise
    if not stat.S_ISREG(ahead.st_mode):
        raise not_a_file(name, ahead.st_mode)
    try:
        fd = os.open(path, READ_FLAGS | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise not_a_file(name, None) from None  # swapped for a symlink since the stat
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_a_file(name, st.st_mode)  # swapped for a special file since the stat
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_head(path: Path, size: int, *, dir_fd: int | None = None) -> bytes | None:
    """The first ``size`` bytes of a regular file, or None if it is anything else.

    Never blocks on a FIFO and never follows a symlink: a lock file's content is a hint
    about who holds it, never worth waiting for.
    """
    try:
        fd = open_regular(path, dir_fd=dir_fd)
    except (NotAFile, OSError):
        return None
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def kind_of(path: Path | str, *, dir_fd: int | None = None) -> int | None:
    """``lstat``'s mode of ``path`` (never following or opening it); None if it is absent."""
    try:
        return os.lstat(path, dir_fd=dir_fd).st_mode
    except FileNotFoundError:
        return None


def is_regular(path: Path | str, *, follow: bool = True) -> bool:
    """Whether ``path`` is a regular file (through a symlink with ``follow``); a loop or a
    dangling link is not."""
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=follow).st_mode)
    except OSError:
        return False


def open_folder(roots: Roots, folder: Path) -> int:
    """``roots.walk(folder)``: the folder held by a descriptor, reached with no symlink followed."""
    return roots.walk(folder)
