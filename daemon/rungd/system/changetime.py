"""Whether a file or folder changed since it was looked at, from its ``lstat`` alone.

The kernel moves an inode's change time at every change to it: an entry made, removed or
renamed in a folder, its mode, owner or extended attributes set, the inode itself renamed.
So an ``lstat`` that shows the same inode with the same change time as at a look shows the
same thing the look saw, with one exception: timestamps are cut to the filesystem's
granularity (a second on some) and read from the kernel's coarse clock, so a change that
lands just after a look may carry the very change time the look saw. A look therefore stands
only when the change time it saw was over :data:`SETTLED_S` old (:func:`settled`): whatever
changes the inode after it carries a later change time.

This assumes the wall clock does not step back past a change time seen: a process that may
set the clock (CAP_SYS_TIME) could change an inode under a change time it had seen, and
restore its modification time. Such a process is root's, which could change what rungd runs
directly anyway.
"""

from __future__ import annotations

import os
import time

SETTLED_S = 2


def settled(info: os.stat_result) -> bool:
    """Whether a change after the ``lstat`` ``info`` (taken just now) is sure to move the
    change time it shows."""
    return time.time_ns() - info.st_ctime_ns > SETTLED_S * 1_000_000_000
