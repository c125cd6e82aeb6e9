"""The calls' private work folders, under ``<state>/work``.

A call's program starts in a folder of its own, empty when the call starts and empty or gone
when its caller hears the result. Making a folder and removing it costs the filesystem's
journal a few hundred microseconds per call (an rmdir alone 0.15 ms, 1 ms at p99 on a quiet
host), so a folder a call leaves empty is kept for a next call instead: one look (it holds
nothing, and is still the daemon's own 0700 folder on the same filesystem) instead of an
rmdir and a mkdir, and one look again when it is handed out (a process of another call may
have written into it meanwhile). A folder left with anything in it, or changed, is removed in
a worker thread. Start-up removes every folder of an earlier run (``Daemon``).

A look is three system calls more than an ``lstat`` (its attributes, and a read of the folder
opened for it), so a folder looked at once is then judged by its ``lstat`` alone while that
stays the same since a look that stands (:mod:`rungd.system.changetime`).

Folders are named ``call-<random>``; a call's work folder is not named after the call, since a
later call may start in it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from rungd.system.changetime import settled
from rungd.system.folders import inode_flags, mount_id, remove_or_say

MAX_SPARES = 32  # as many as calls ran at once, up to this


class WorkFolders:
    """Hands out and takes back the work folders under ``root``.

    Args:
        root: ``<state>/work``, made by the caller.
        limiter: the worker threads that remove what a call left.
    """

    def __init__(self, root: Path, limiter: trio.CapacityLimiter) -> None:
        self.root = root
        self._limiter = limiter
        # Each kept folder with its lstat at its last look (None: that look does not stand).
        self._spares: list[tuple[Path, os.stat_result | None]] = []
        self._out: dict[Path, os.stat_result | None] = {}  # handed out, the same way
        self._device = os.stat(root).st_dev
        self._uid = os.geteuid()
        self._traits = _new_folder_traits(root)
        self._mount = _mount_of(root)

    async def take(self) -> Path:
        """An empty folder for a call (a kept one, looked at again), or the path of one to make
        (its program's new process makes it, 0700)."""
        while self._spares:
            folder, seen = self._spares.pop()
            info = _lstat(folder)
            if info is not None and (_unchanged(info, seen) or self._as_made(folder, info)):
                self._out[folder] = info if settled(info) else None
                return folder
            await trio.to_thread.run_sync(_remove, folder, limiter=self._limiter)
        return self.root / f"call-{os.urandom(6).hex()}"

    def give_back(self, folder: Path) -> Callable[[], Awaitable[None]] | None:
        """Take back a call's folder once its program and all its processes are gone.

        Returns:
            None when it is kept for a next call (empty and unchanged) or was never made;
            otherwise what removes it (and what was left in it), to await.
        """
        seen = self._out.pop(folder, None)
        try:
            info: os.stat_result | None = os.lstat(folder)
        except FileNotFoundError:
            return None  # the program started elsewhere (its tool's own cwd)
        except OSError:
            info = None
        if len(self._spares) < MAX_SPARES and info is not None and (
                _unchanged(info, seen) or self._as_made(folder, info)):
            self._spares.append((folder, info if settled(info) else None))
            return None
        return lambda: trio.to_thread.run_sync(_remove, folder, limiter=self._limiter)

    def _as_made(self, folder: Path, info: os.stat_result) -> bool:
        """Whether ``folder`` (whose ``lstat`` is ``info``) is as a call's new process makes
        it: the daemon's own empty 0700 folder on the state folder's filesystem, with the
        inode flags and extended attributes a new folder gets there (no chattr, ACL or user
        attribute a program set on it)."""
        if not (stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
                and info.st_uid == self._uid and info.st_dev == self._device):
            return False
        try:
            fd = os.open(folder, _DIR)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_ino != info.st_ino:
                return False  # replaced since its lstat
            if mount_id(fd) != self._mount:
                return False  # something mounted over it (of the same filesystem, st_dev says nothing)
            if self._traits is None or _traits(fd) != self._traits:
                return False
            with os.scandir(fd) as entries:
                return next(entries, None) is None
        except OSError:
            return False
        finally:
            os.close(fd)


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _traits(fd: int) -> tuple[int | None, dict[str, bytes]]:
    """What a folder carries beside its mode and owner that a program could set and a next
    call would inherit: its inode flags (chattr's immutable, append-only...) and its extended
    attributes (ACLs, user and trusted attributes), but for a security module's label.

    Raises:
        OSError: its attributes cannot be read.
    """
    attributes = {name: os.getxattr(fd, name) for name in os.listxattr(fd) if not name.startswith("security.")}
    return inode_flags(fd), attributes


def _mount_of(root: Path) -> int | None:
    fd = os.open(root, _DIR)
    try:
        return mount_id(fd)
    finally:
        os.close(fd)


def _new_folder_traits(root: Path) -> tuple[int | None, dict[str, bytes]] | None:
    """The inode flags and attributes a new folder gets in ``root`` (what it inherits there),
    from one made and removed now; None when none can be made there (then no folder is
    kept: each call's is made anew)."""
    probe = root / f".probe-{os.urandom(6).hex()}"
    try:
        os.mkdir(probe, 0o700)
    except OSError:
        return None
    try:
        fd = os.open(probe, _DIR)
        try:
            return _traits(fd)
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def _lstat(folder: Path) -> os.stat_result | None:
    try:
        return os.lstat(folder)
    except OSError:
        return None


def _unchanged(info: os.stat_result, seen: os.stat_result | None) -> bool:
    """Whether ``info`` shows the folder as it was when ``seen`` was taken, at a look that stands."""
    return seen is not None and (info.st_ino, info.st_dev, info.st_mode, info.st_uid, info.st_nlink,
                                 info.st_mtime_ns, info.st_ctime_ns) == (
        seen.st_ino, seen.st_dev, seen.st_mode, seen.st_uid, seen.st_nlink, seen.st_mtime_ns, seen.st_ctime_ns)


def _remove(folder: Path) -> None:
    remove_or_say(folder, "a call's work folder, which no later call uses")
