"""Removing a folder a program may have written into, without reaching through a mount.

``shutil.rmtree`` follows no link, but it does go down into a mount: a program that may
mount (root's) could bind another folder of the host into its work folder, and the daemon's
clean-up would then empty that folder for it. A mount under the folder is found in
``/proc/self/mountinfo`` (a bind mount of the same filesystem shows in no ``st_dev``), and
such a folder is left whole for the operator.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_OCTAL = re.compile(rb"\\([0-7]{3})")


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


def remove_tree(folder: str | os.PathLike[str]) -> list[str]:
    """Remove ``folder`` and everything in it (a link or a file in its place: that, never
    what it points at), unless a mount is at or under it.

    Returns:
        The mount points that kept it in place; empty when it is gone (or never was).
    """
    path = Path(folder)
    try:
        path.rmdir()
        return []
    except FileNotFoundError:
        return []
    except NotADirectoryError:  # a file or a symlink in its place: that goes, not its target
        path.unlink(missing_ok=True)
        return []
    except OSError:
        pass
    if mounts := mounts_at_or_under(path):
        return mounts
    shutil.rmtree(path, ignore_errors=True)
    return []
