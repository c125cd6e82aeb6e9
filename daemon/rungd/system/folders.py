"""Removing a folder a program may have written into, whatever it left there.

A call's program may leave anything in its work folder: folders nested thousands deep (too
deep for ``shutil.rmtree``, which recurses, and for any path: the removal goes by
descriptors, one folder at a time), folders it took its own rights away from, files and
folders it made immutable or append-only (``chattr``), or a mount. The daemon gives back its
own rights and takes the inode flags off what it removes; it never goes down into a mount (a
program that may mount, root's, could bind another folder of the host into its work folder,
and the clean-up would empty that folder for it): a mount under the folder is found in
``/proc/self/mountinfo`` (a bind mount of the same filesystem shows in no ``st_dev``), and
such a folder is left whole. Whatever is left is said, never passed over in silence.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import struct
from collections.abc import Callable
from pathlib import Path

_OCTAL = re.compile(rb"\\([0-7]{3})")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# <linux/fs.h>: the inode flags (chattr), and those that keep an entry from going.
FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_LOCKS = 0x10 | 0x20  # FS_IMMUTABLE_FL, FS_APPEND_FL


def mounts_at_or_under(folder: str | os.PathLike[str]) -> list[str]:
    """The mount points of the daemon's mount namespace at ``folder`` or inside it."""
    top = os.path.realpath(folder)  # as the mount table names it
    try:
        with open("/proc/self/mountinfo", "rb") as table:
            lines = table.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 5:
            continue
        # The mount point, with space, tab, newline and backslash as octal escapes.
        point = os.fsdecode(_OCTAL.sub(lambda escape: bytes([int(escape[1], 8)]), fields[4]))
        if point == top or point.startswith(top.rstrip("/") + "/"):
            found.append(point)
    return found


def inode_flags(fd: int) -> int | None:
    """The inode flags of the file or folder open as ``fd``; None where the filesystem has none."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
    except OSError:
        return None


def remove_tree(folder: str | os.PathLike[str]) -> str | None:
    """Remove ``folder`` and everything in it (a link or a file in its place: that, never
    what it points at), unless a mount is at or under it.

    Returns:
        None when it is gone (or never was); else, in one line, what kept it (a mount, or
        what could not be removed and why). As much of it as could go is gone.
    """
    path = Path(folder)
    try:
        parent = os.open(path.parent, _DIR)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path.parent} could not be opened ({exc.strerror})"
    try:
        return _remove_in(parent, path)
    finally:
        os.close(parent)


def _remove_in(parent: int, path: Path) -> str | None:
    name = path.name
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):  # a file or a symlink in its place: that goes, not its target
        why = _removed(parent, name, os.unlink, inside=False)
        return None if why is None else f"{path} could not be removed ({why})"
    if _removed(parent, name, os.rmdir, inside=False) is None:  # empty: the common case
        return None
    if mounts := mounts_at_or_under(path):
        return f"{', '.join(mounts)} is mounted in it"
    try:
        fd = _open_folder(parent, name)
    except OSError as exc:
        return f"{path} could not be opened ({exc.strerror})"
    try:
        kept = _empty_out(fd, str(path))
    finally:
        os.close(fd)
    why = _removed(parent, name, os.rmdir, inside=False)
    return kept or (None if why is None else f"{path} could not be removed ({why})")


def _empty_out(top: int, name: str) -> str | None:
    """Remove everything in the folder open as ``top``, one folder at a time, deepest first,
    holding one descriptor at a time (a program can nest folders without end).

    Returns:
        Why something is left, or None.
    """
    device = os.fstat(top).st_dev
    fd = os.dup(top)
    # The folders gone down into, from top: each one's name, and its parent's identity to
    # check the way back up (what another root process moved meanwhile is left alone).
    path: list[tuple[str, tuple[int, int]]] = []
    left: set[tuple[int, int]] = set()  # folders that could not be emptied: not entered again
    kept: str | None = None
    try:
        while True:
            down = None
            for entry in list(os.scandir(fd)):
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISDIR(info.st_mode):
                    if (why := _removed(fd, entry.name, os.unlink)) is not None:
                        kept = kept or f"{name}/.../{entry.name} could not be removed ({why})"
                    continue
                if (info.st_dev, info.st_ino) in left:
                    continue
                if info.st_dev != device:
                    left.add((info.st_dev, info.st_ino))
                    kept = kept or f"{name}/.../{entry.name} is another filesystem's"
                    continue
                down = entry.name
                break
            if down is not None:
                try:
                    child = _open_folder(fd, down)
                except OSError as exc:
                    left.add((info.st_dev, info.st_ino))
                    kept = kept or f"{name}/.../{down} could not be opened ({exc.strerror})"
                    continue
                here = os.fstat(fd)
                path.append((down, (here.st_dev, here.st_ino)))
                os.close(fd)
                fd = child
                continue
            if not path:
                return kept
            # This folder is as empty as it can be made: up, and remove it.
            gone = os.fstat(fd)
            down, parent = path.pop()
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) != parent:
                return kept or f"a folder under {name} was moved while it was removed"
            if (why := _removed(fd, down, os.rmdir)) is not None:
                left.add((gone.st_dev, gone.st_ino))
                kept = kept or f"{name}/.../{down} could not be removed ({why})"
    finally:
        os.close(fd)


def _open_folder(parent: int, name: str) -> int:
    """Open folder ``name`` in ``parent``, giving the daemon back its right to (a program of
    the daemon's user may have taken it away)."""
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent, follow_symlinks=True)  # a folder, as just looked at
        return os.open(name, _DIR, dir_fd=parent)


def _removed(parent: int, name: str, remove: Callable[..., None], *, inside: bool = True) -> str | None:
    """Remove ``name`` from ``parent`` with ``remove`` (unlink or rmdir), once more after
    taking off inode flags that keep it and (``inside`` the folder being removed, never the
    folder holding it) giving back the daemon's right to write ``parent``; None when it is
    gone, else the kernel's reason."""
    try:
        remove(name, dir_fd=parent)
        return None
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EACCES):
            return exc.strerror
    if inside:
        with contextlib.suppress(OSError):
            os.fchmod(parent, 0o700)
        _unlock(parent)
    with contextlib.suppress(OSError):
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        # Never a device's open, nor a file linked elsewhere too: its flags are that file's.
        if stat.S_ISDIR(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_nlink == 1):
            entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
                            dir_fd=parent)
            try:
                _unlock(entry)
            finally:
                os.close(entry)
    try:
        remove(name, dir_fd=parent)
        return None
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror


def _unlock(fd: int) -> None:
    """Take the immutable and append-only flags off ``fd`` (CAP_LINUX_IMMUTABLE: root's)."""
    flags = inode_flags(fd)
    if flags is not None and flags & _LOCKS:
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags & ~_LOCKS))
