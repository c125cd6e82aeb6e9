"""Removing a folder a program may have written into, whatever it left there.

A call's program may leave anything in its work folder: folders nested thousands deep (too
deep for ``shutil.rmtree``, which recurses, and for any path: the removal goes by
descriptors, one folder at a time), folders it took its own rights away from, files and
folders it made immutable or append-only (``chattr``), or a mount. The daemon gives back its
own rights and takes the inode flags off what it removes; it never goes down into a mount (a
program that may mount, root's, could bind another folder of the host into its work folder,
and the clean-up would empty that folder for it): a mount under the folder is found in
``/proc/self/mountinfo`` before anything is unlocked or entered (a bind mount of the same
filesystem shows in no ``st_dev``), and such a folder is left whole; one mounted meanwhile
is told by its mount id. Whatever is left is said, never passed over in silence.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import struct
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("rungd.folders")

_OCTAL = re.compile(rb"\\([0-7]{3})")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# <linux/fs.h>: the inode flags (chattr), and those that keep an entry from going.
_FS_IOC_GETFLAGS = 0x80086601
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
        return struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4))[0]
    except OSError:
        return None


def remove_or_say(folder: str | os.PathLike[str], whose: str) -> None:
    """:func:`remove_tree`, and a warning for the operator naming what is left, if anything
    is (``whose``: what the folder is, for the warning)."""
    if (kept := remove_tree(folder)) is not None:
        log.warning("%s (%s) is left in place: %s; hint: the operator must unmount or unlock what it names "
                    "(chattr -i), then remove it", folder, whose, kept)


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
    except OSError as exc:
        return f"{path} could not be looked at ({exc.strerror})"
    # A file or a symlink in its place: that goes, not its target.
    remove = os.rmdir if stat.S_ISDIR(info.st_mode) else os.unlink
    if _attempt(remove, parent, name) is None:  # an empty folder: the common case
        return None
    # Before anything is unlocked or entered: what is under a mount is another folder's.
    if mounts := mounts_at_or_under(path):
        return f"{', '.join(mounts)} is mounted in it"
    kept = None
    if remove is os.rmdir:
        try:
            fd = _open_folder(parent, name)
            try:
                kept = _empty_out(fd, str(path))
            finally:
                os.close(fd)
        except OSError as exc:  # out of descriptors, an I/O error
            return f"{path} could not be emptied ({exc.strerror})"
    why = _removed(parent, name, remove, inside=False)
    return kept or (None if why is None else f"{path} could not be removed ({why})")


def _empty_out(top: int, name: str) -> str | None:
    """Remove everything in the folder open as ``top``, one folder at a time, deepest first,
    holding one descriptor at a time (a program can nest folders without end), and listing
    each folder once (a program can make a hundred thousand in one).

    Returns:
        Why something is left, or None.

    Raises:
        OSError: a folder could not be listed or gone back up from (out of descriptors, EIO).
    """
    device, mount = os.fstat(top).st_dev, mount_id(top)
    fd = os.dup(top)
    # The folders gone down into, from top: each one's name, its parent's identity to check
    # the way back up (what another root process moved meanwhile is left alone), and the
    # subfolders of the parent still to go down into.
    path: list[tuple[str, tuple[int, int], list[str]]] = []
    kept: str | None = None
    try:
        todo, kept = _files_removed(fd, name, device)
        while True:
            if todo:
                down = todo.pop()
                try:
                    child = _open_folder(fd, down)
                except OSError as exc:
                    kept = kept or f"{name}/.../{down} could not be opened ({exc.strerror})"
                    continue
                if mount is not None and mount_id(child) != mount:  # mounted meanwhile
                    os.close(child)
                    kept = kept or f"{name}/.../{down} is another mount's"
                    continue
                here = os.fstat(fd)
                path.append((down, (here.st_dev, here.st_ino), todo))
                os.close(fd)
                fd = child
                todo, why = _files_removed(fd, name, device)
                kept = kept or why
                continue
            if not path:
                return kept
            # This folder is as empty as it can be made: up, and remove it.
            down, parent, todo = path.pop()
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) != parent:
                return kept or f"a folder under {name} was moved while it was removed"
            if (why := _removed(fd, down, os.rmdir)) is not None:
                kept = kept or f"{name}/.../{down} could not be removed ({why})"
    finally:
        os.close(fd)


def _files_removed(fd: int, name: str, device: int) -> tuple[list[str], str | None]:
    """Remove what is in the folder open as ``fd`` but its subfolders: their names, and why
    something else is left (None: nothing is).

    Raises:
        OSError: the folder could not be listed.
    """
    folders: list[str] = []
    kept: str | None = None
    with os.scandir(fd) as entries:
        listed = list(entries)
    for entry in listed:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            if (why := _removed(fd, entry.name, os.unlink)) is not None:
                kept = kept or f"{name}/.../{entry.name} could not be removed ({why})"
        elif info.st_dev != device:
            kept = kept or f"{name}/.../{entry.name} is another filesystem's"
        elif _attempt(os.rmdir, fd, entry.name) is not None:  # an empty one needs no going down into
            folders.append(entry.name)
    return folders, kept


def mount_id(fd: int) -> int | None:
    """The id of the mount ``fd`` is on (a bind mount of the same filesystem has its own)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
            for line in info:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _open_folder(parent: int, name: str) -> int:
    """Open folder ``name`` in ``parent``, giving the daemon back its right to (a program of
    the daemon's user may have taken it away): the mode is set on the folder found, never
    through a link put in its place meanwhile."""
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except PermissionError:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
            return os.open(f"/proc/self/fd/{handle}", _DIR & ~os.O_NOFOLLOW)
        finally:
            os.close(handle)


def _removed(parent: int, name: str, remove: Callable[..., None], *, inside: bool = True) -> str | None:
    """Remove ``name`` from ``parent`` with ``remove`` (unlink or rmdir), once more after
    taking off inode flags that keep it and (``inside`` the folder being removed, never the
    folder holding it) giving back the daemon's right to write ``parent``; None when it is
    gone, else the kernel's reason."""
    failure = _attempt(remove, parent, name)
    if failure is None or failure.errno not in (errno.EPERM, errno.EACCES):
        return None if failure is None else failure.strerror
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
    failure = _attempt(remove, parent, name)
    return None if failure is None else failure.strerror


def _attempt(remove: Callable[..., None], parent: int, name: str) -> OSError | None:
    """``remove`` ``name`` in ``parent``; what failed, if anything did (gone already is gone)."""
    try:
        remove(name, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None


def _unlock(fd: int) -> None:
    """Take the immutable and append-only flags off ``fd`` (CAP_LINUX_IMMUTABLE: root's)."""
    flags = inode_flags(fd)
    if flags is not None and flags & _LOCKS:
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags & ~_LOCKS))
