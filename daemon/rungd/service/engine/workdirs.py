"""The calls' private work folders, under ``<state>/work``.

A call's program starts in a folder of its own, empty when the call starts and empty or gone
when its caller hears the result. Making a folder and removing it costs the filesystem's
journal a few hundred microseconds per call (an rmdir alone 0.15 ms, 1 ms at p99 on a quiet
host), so a folder a call leaves empty is kept for a next call instead: one look (it holds
nothing, and is still the daemon's own 0700 folder on the same filesystem) instead of an
rmdir and a mkdir, and one look again when it is handed out (a process of another call may
have written into it meanwhile). A folder left with anything in it, or changed, is removed in
a worker thread. Start-up removes every folder of an earlier run (``Daemon``).

Folders are named ``call-<random>``; a call's work folder is not named after the call, since a
later call may start in it.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

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
        self._spares: list[Path] = []
        self._device = os.stat(root).st_dev

    async def take(self) -> Path:
        """An empty folder for a call (a kept one, looked at again), or the path of one to make
        (its program's new process makes it, 0700)."""
        while self._spares:
            folder = self._spares.pop()
            if self._as_made(folder):
                return folder
            await trio.to_thread.run_sync(_remove, folder, limiter=self._limiter)
        return self.root / f"call-{os.urandom(6).hex()}"

    def give_back(self, folder: Path) -> Callable[[], Awaitable[None]] | None:
        """Take back a call's folder once its program and all its processes are gone.

        Returns:
            None when it is kept for a next call (empty and unchanged) or was never made;
            otherwise what removes it (and what was left in it), to await.
        """
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            return None  # the program started elsewhere (its tool's own cwd)
        except OSError:
            info = None
        if len(self._spares) < MAX_SPARES and info is not None and self._as_made(folder, info):
            self._spares.append(folder)
            return None
        return lambda: trio.to_thread.run_sync(_remove, folder, limiter=self._limiter)

    def _as_made(self, folder: Path, info: os.stat_result | None = None) -> bool:
        """Whether ``folder`` is as a call's new process makes it: the daemon's own empty 0700
        folder on the state folder's filesystem, with no user or trusted extended attribute.

        Args:
            info: its ``lstat``, if the caller made it just now.
        """
        try:
            info = info or os.lstat(folder)
            if not (stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
                    and info.st_uid == os.geteuid() and info.st_dev == self._device):
                return False
            # A program can set user (and, as root, trusted) attributes; security.selinux and
            # ACLs come with the folder on some hosts and say nothing of what a call did.
            if any(name.startswith(("user.", "trusted.")) for name in os.listxattr(folder, follow_symlinks=False)):
                return False
        except OSError:
            return False
        return _empty(folder)


def _empty(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _remove(folder: Path) -> None:
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
    except NotADirectoryError:  # the program put a file or a symlink in its place: that goes, not its target
        folder.unlink(missing_ok=True)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
