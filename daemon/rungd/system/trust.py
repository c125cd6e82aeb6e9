"""Whether a file may decide what runs: who owns it, and everything on its path.

What decides what a call runs or is given (the config, tool folders and files, the programs
they name, plugin files and modules, the credential store, ``allowed_signers``, the anchor
key, the compiled launcher) is trusted by **ownership**, the rule OpenSSH's ``StrictModes``,
sudo (for sudoers and its plugins) and cron (for crontabs) apply: the file, and every folder
on the way to it from ``/``, is owned by root or by the daemon's own user, and none of them is
writable by group or others. A sticky world-writable folder (``/tmp``) may be on the way, as
the sticky bit keeps others from replacing an entry in it that they do not own; the entry
below it must still be owned right. Symlinks are followed: a link is judged as an entry of
its folder (its owner matters under a sticky folder), and its target is then walked the same
way from where the link points.

Why a check of paths is enough, and no race: an untrusted user can change what a path names
only by writing a folder on it or the file itself, and the check refuses exactly those. What
passes can then be changed only by root or the daemon's user, who could change anything.
A call re-checks what it executes (:meth:`Trust.recheck`, the stat of each entry on the
path: a few microseconds), so a folder made writable after load stops the next call.

Settings that name a path for a program run as another user (``user =``) may also be owned by
that user (a home, a keyring): :func:`check` takes the owners that count.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import pwd
import stat
from collections.abc import Callable, Collection

from rungd.core.errors import ConfigError
from rungd.system.changetime import settled

# Links followed while walking one path, as the kernel's own limit (ELOOP past 40).
_MAX_LINKS = 40


class Untrusted(ConfigError):
    """A file that decides what runs is not owned right, or something on its path is not.

    Its message is one line: the path, the culprit's owner and mode, and the fix.

    Attributes:
        path: the path as it was named (a tool file, a program, the config...).
        culprit: the entry on the way that failed (the path itself or a folder above it).
    """

    def __init__(self, message: str, *, path: str, culprit: str) -> None:
        super().__init__(message)
        self.path = path
        self.culprit = culprit


def daemon_owners() -> frozenset[int]:
    """The owners whose files decide what runs: root and the daemon's own user."""
    return frozenset({0, os.geteuid()})


@dataclasses.dataclass(frozen=True)
class _Entry:
    path: str
    info: os.stat_result
    last: bool = False  # what the path names (not a folder on the way, nor a link to follow)


def _walk(path: str) -> list[_Entry]:
    """Every entry whose change would change what ``path`` names, from ``/`` to its target.

    Raises:
        OSError: an entry is missing or cannot be looked at (ENOENT, EACCES, ELOOP).
    """
    if not os.path.isabs(path):
        path = os.path.abspath(path)
    entries = [_Entry("/", os.lstat("/"))]
    pending = [part for part in path.split("/") if part]
    pending.reverse()  # a stack: the next part is on top
    current = "/"
    links = 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            # ``current`` is a real path (links already followed), so its parent is real too.
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        info = os.lstat(candidate)
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            entries.append(_Entry(candidate, info))
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed([p for p in target.split("/") if p]))
            continue
        entries.append(_Entry(candidate, info))
        current = candidate
    # Links were followed, so the walk ends on what the path names: its own final entry.
    entries[-1] = dataclasses.replace(entries[-1], last=True)
    return entries


def _name(uid: int) -> str:
    """``alice`` for a known uid, ``uid 1234`` for one no account has."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _owner(uid: int) -> str:
    """``alice (uid 1000)``, or ``uid 1234`` alone for one no account has."""
    name = _name(uid)
    return name if name.startswith("uid ") else f"{name} (uid {uid})"


def _problem(entry: _Entry, owners: Collection[int]) -> tuple[str, str] | None:
    """What is wrong with one entry, and the fix; None when it is owned right."""
    info = entry.info
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in owners:
        allowed = " or ".join(_name(uid) for uid in sorted(owners))
        return (f"{entry.path} is owned by {_owner(info.st_uid)}, not {allowed} "
                f"(mode {mode:04o})",
                f"chown root {entry.path}")
    if stat.S_ISLNK(info.st_mode):
        return None  # a link's own mode means nothing; its folder and owner decide who can replace it
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        return None  # what a device gives is the kernel's (/dev/null is 0666): its folder decides the rest
    writable = mode & 0o022
    if not writable:
        return None
    if stat.S_ISDIR(info.st_mode) and not entry.last and mode & stat.S_ISVTX:
        return None  # a sticky folder on the way (/tmp): others cannot replace what they do not own
    who = " and ".join(name for bit, name in ((0o020, "group"), (0o002, "others")) if writable & bit)
    return f"{entry.path} is writable by {who} (mode {mode:04o})", f"chmod go-w {entry.path}"


def check(path: str | os.PathLike[str], what: str, *, owners: Collection[int] | None = None) -> None:
    """Refuse ``path`` unless it and every folder on its way are owned right (module docstring).

    Args:
        path: the file or folder as named (a link is followed, and judged on the way).
        what: what it is, for the message: ``"tool file"``, ``"program"``, ``"config"``...
        owners: the uids that may own it; root and the daemon's user by default.

    Raises:
        Untrusted: one line naming the path, the culprit's owner and mode, and the fix.
        OSError: the path or a folder on it is missing or cannot be looked at.
    """
    _judge(_walk(os.fspath(path)), os.fspath(path), what, daemon_owners() if owners is None else owners)


def check_operand(path: str | os.PathLike[str], what: str, *, owners: Collection[int] | None = None) -> None:
    """As :func:`check`, for a path a tool fixes in its program's arguments (a script, SQL or
    job file, a folder it works in, a file it makes).

    What the path names is judged as :func:`check` judges a file, with two differences: a
    folder is judged as a folder on the way (``df /tmp`` names a sticky folder, which is
    fine), and a path not made yet is judged by the nearest folder above it that exists (who
    could make it first). Once made, the next check judges what was made.

    Raises:
        Untrusted: as :func:`check`.
        OSError: an entry on the way cannot be looked at.
    """
    _judge(_walk_operand(os.fspath(path)), os.fspath(path), what, daemon_owners() if owners is None else owners)


def _walk_operand(path: str) -> list[_Entry]:
    """The walk :func:`check_operand` judges (see there)."""
    try:
        entries = _walk(path)
    except FileNotFoundError:
        entries = _walk(_nearest_existing(path))
        return [dataclasses.replace(entries[-1], last=False) if i == len(entries) - 1 else e
                for i, e in enumerate(entries)]
    if stat.S_ISDIR(entries[-1].info.st_mode):
        entries[-1] = dataclasses.replace(entries[-1], last=False)
    return entries


def _judge(entries: list[_Entry], path: str, what: str, owners: Collection[int]) -> None:
    for entry in entries:
        found = _problem(entry, owners)
        if found is not None:
            problem, fix = found
            where = "" if entry.path == path else f" (on its path: {entry.path})"
            raise Untrusted(
                f"bad ownership or modes for {what} {path}{where}: {problem}; hint: {fix}, "
                "or move it where only root (or rungd's user) can write",
                path=path, culprit=entry.path,
            )


class Trust:
    """A cache of paths found trusted, re-checked cheaply at each call.

    :meth:`recheck` stats each entry of the walk it remembers (no link is read again): when an
    entry is the same inode with the same change time, its owner and mode are what they were;
    anything else walks the path again in full. A call's cost is one ``lstat`` per entry. A
    walk is remembered only when no entry on it changed in the last seconds: a change just
    after it could carry the same change time (:mod:`rungd.system.changetime`).
    """

    def __init__(self, owners: Collection[int] | None = None) -> None:
        self._owners = frozenset(daemon_owners() if owners is None else owners)
        self._walks: dict[str, list[_Entry]] = {}

    def recheck(self, path: str, what: str) -> None:
        """As :func:`check`, answered from the cache when nothing on the way changed.

        Raises:
            Untrusted: as :func:`check`.
            OSError: as :func:`check`.
        """
        self._recheck(path, what, _walk, path)

    def operand(self, path: str, what: str) -> None:
        """As :func:`check_operand`, answered from the cache as :meth:`recheck` is. A path
        not made yet is remembered by the folder that would hold it, whose change time moves
        when anything is made in it.

        Raises:
            Untrusted: as :func:`check_operand`.
            OSError: as :func:`check_operand`.
        """
        self._recheck(path, what, _walk_operand, f"operand:{path}")

    def _recheck(self, path: str, what: str, walk: Callable[[str], list[_Entry]], key: str) -> None:
        known = self._walks.get(key)
        if known is not None and all(_same(entry) for entry in known):
            return
        entries = walk(path)
        _judge(entries, path, what, self._owners)
        if all(settled(entry.info) for entry in entries):
            self._walks[key] = entries
        else:  # changed a moment ago: walked again until a look stands (rungd.system.changetime)
            self._walks.pop(key, None)

    def program(self, name: str, search_path: str) -> None:
        """Refuse to run ``name`` unless what the kernel will execute is trusted.

        A name with a ``/`` is checked as it is. A bare name is found as the launcher finds
        it (``search_path``, the child's ``PATH``): every folder searched before it is
        checked too, since whoever could write one of them could put a program of that name
        in front of the one checked.

        Raises:
            Untrusted: the program, or a folder on its way or searched before it.
            OSError: a program with a ``/`` cannot be looked at (the start then fails as
                the kernel says).
        """
        if "/" in name:
            self.recheck(name, "program")
            return
        for folder in search_path.split(":"):
            folder = folder or "."
            try:
                self.recheck(folder, f"folder on PATH searched for {name}")
            except FileNotFoundError:
                # Not there: whoever may write the nearest folder above it could make it.
                self.recheck(_nearest_existing(folder), f"folder above {folder}, on PATH searched for {name}")
                continue
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                self.recheck(candidate, "program")
                return


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _same(entry: _Entry) -> bool:
    try:
        now = os.lstat(entry.path)
    except OSError:
        return False
    then = entry.info
    return (now.st_ino, now.st_dev, now.st_ctime_ns) == (then.st_ino, then.st_dev, then.st_ctime_ns)
