"""The calls' private work folders, under ``<state>/work``.

A call's program starts in a folder of its own, empty when the call starts and empty or gone
when its caller hears the result. Making a folder and removing it costs the filesystem's
journal a few hundred microseconds per call (an rmdir alone 0.15 ms, 1 ms at p99 on a quiet
host), so a folder a call leaves empty is kept for a next call instead: one look (it holds
nothing, and is still the daemon's own 0700 folder on the same filesystem) instead of an
rmdir and a mkdir. A folder left with anything in it, or changed, is removed in a worker
thread. Start-up removes every folder of an earlier run (``Daemon``).

Spare folders are named ``call-N`` by the order they were first made; a call's work folder
is not named after the call, since a later call may start in it.
"""

from __future__ import annotations

import itertools
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
        self._numbers = itertools.count(1)
        self._device = os.stat(root).st_dev

    def take(self) -> Path:
        """An empty folder for a call (a kept one), or the path of one to make (its program's
        new process makes it, 0700)."""
        if self._spares:
            return self._spares.pop()
        return self.root / f"call-{next(self._numbers)}"

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
        if (info is not None and len(self._spares) < MAX_SPARES and stat.S_ISDIR(info.st_mode)
                and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
                and info.st_dev == self._device and _empty(folder)):
            self._spares.append(folder)
            return None
        return lambda: trio.to_thread.run_sync(_remove, folder, limiter=self._limiter)


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
