"""Where a file-exchange tool may touch the disk: declared roots, and names checked against a pattern.

A tool declares its roots once (the export folder, the import folder, the processed folder)
and every path it touches is checked against them after symlinks are resolved:

    roots = Roots(state / "exports", state / "inbox")
    folder = roots.folder(state / "inbox", create=True)
    target = roots.child(folder, checked_name(batch_name, NAME, field="batch"))

Inputs never carry a path, only a name: ``checked_name`` refuses anything that is not a
plain file name matching the tool's pattern (BAD_INPUT). A symlink that leads out of the
roots, whether it is the folder, the file, or a link inside them, is refused with
OUTSIDE_ROOTS: someone put it there, and following it would let a tool read or write
anywhere the daemon can.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

from rungd.core.contract import ErrorRule
from rungd.core.errors import BadInput, ToolError

OUTSIDE_ROOTS_CODE = "OUTSIDE_ROOTS"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NAME_MAX = 255
OUTSIDE_ROOTS = ErrorRule(
    OUTSIDE_ROOTS_CODE,
    "no",
    "stop",
    "the operator must remove the symlink or fix the tool's folders; nothing was read or written",
    "a path the tool would touch lies outside its declared roots (usually a symlink out of a root)",
)


class OutsideRoots(ToolError):
    """A path resolves outside every declared root. Code OUTSIDE_ROOTS; nothing was touched."""

    def __init__(self, message: str, **kwargs: object) -> None:
        super().__init__(OUTSIDE_ROOTS_CODE, message, hint=OUTSIDE_ROOTS.hint, retry="no",
                         next_action="stop", **kwargs)  # type: ignore[arg-type]


def checked_name(value: str, pattern: re.Pattern[str], *, field: str) -> str:
    """Return ``value`` if it is a plain file name that fully matches ``pattern``.

    Args:
        value: the name as the caller sent it.
        pattern: the tool's pattern for names in this folder.
        field: the input's name, for the error message.

    Raises:
        BadInput: the name is empty, holds a path separator or NUL, is ``.`` or ``..``, or
            does not match the pattern. The hint quotes the pattern.
    """
    plain = value not in ("", ".", "..") and "/" not in value and "\x00" not in value
    # No file system takes a longer name, and the pattern never sees unbounded input.
    if not plain or len(value.encode("utf-8", "surrogatepass")) > NAME_MAX or pattern.fullmatch(value) is None:
        raise BadInput(
            f"{field}: {value[:80]!r} is not an accepted name",
            hint=f"{field} must be a plain name matching {pattern.pattern!r}, never a path",
        )
    return value


class Roots:
    """The folders a tool may touch, resolved once when the tool is built.

    Args:
        *paths: the roots. They need not exist yet; they are resolved as far as they do.
    """

    def __init__(self, *paths: Path) -> None:
        if not paths:
            raise ValueError("Roots needs at least one folder")
        self.paths = tuple(Path(os.path.realpath(p)) for p in paths)

    def __repr__(self) -> str:
        return f"Roots({', '.join(str(p) for p in self.paths)})"

    def contains(self, path: Path) -> bool:
        """Whether ``path``, with every symlink resolved, lies inside a root (or is one)."""
        return self._inside(Path(os.path.realpath(path)))

    def check(self, path: Path) -> Path:
        """Return ``path`` if it resolves inside a root.

        Raises:
            OutsideRoots: it (or a symlink on its way) leads outside every root.
        """
        if not self.contains(path):
            raise OutsideRoots(f"{path.name!r} leads outside the tool's folders")
        return path

    def check_open(self, fd: int, path: Path) -> None:
        """Check what an open file descriptor really is, after the fact.

        A path checked and then opened can be swapped in between (a symlink raced into
        place); the descriptor cannot. Its /proc link names the file actually opened.

        Raises:
            OutsideRoots: the open file lies outside every root.
        """
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not self._inside(real):
            raise OutsideRoots(f"{path.name!r} led outside the tool's folders when it was opened")

    def folder(self, path: Path, *, create: bool = False) -> Path:
        """Return the folder ``path`` after checking it lies inside a root.

        Args:
            create: make it (and missing parents) when it does not exist yet; the check is
                repeated afterwards, so a symlink raced into place is still refused.

        Raises:
            OutsideRoots: it resolves outside every root.
        """
        if create:
            os.close(self.walk(path, create=True))
        return self.check(path)

    def walk(self, folder: Path, *, create: bool = False) -> int:
        """Open ``folder`` by walking to it from ``/`` with no symlink followed; return its
        descriptor (the caller closes it).

        The path as it resolves now must lie inside a root; the walk then follows it one
        component at a time with ``O_NOFOLLOW``, so a component swapped for a symlink since
        fails instead of leading elsewhere. What is held afterwards is that folder, wherever
        it is moved: files created relative to the descriptor land in it and nowhere else.

        Args:
            create: make each missing component, relative to its held parent, so nothing is
                ever made outside the roots, not even an empty folder.

        Raises:
            OutsideRoots: it resolves outside every root, or a component on the way is (now)
                a symlink or not a folder, or vanished while it was made.
            FileNotFoundError: it does not exist (and ``create`` is false).
        """
        real = Path(os.path.realpath(folder))
        if not self._inside(real):
            raise OutsideRoots(f"{folder.name!r} leads outside the tool's folders")
        fd = os.open("/", DIR_FLAGS)
        try:
            for part in real.parts[1:]:
                if create:
                    with contextlib.suppress(FileExistsError):
                        try:
                            os.mkdir(part, 0o755, dir_fd=fd)
                        except FileNotFoundError:  # the parent held was removed meanwhile
                            raise OutsideRoots(f"{folder.name!r}: a folder on its way vanished") from None
                try:
                    step = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise OutsideRoots(f"{folder.name!r} was swapped for a symlink or a file while it was "
                                           "used; nothing was written there") from None
                    raise
                os.close(fd)
                fd = step
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _inside(self, real: Path) -> bool:
        return any(real == root or real.is_relative_to(root) for root in self.paths)

    def child(self, folder: Path, name: str) -> Path:
        """The file ``name`` inside ``folder``, refused if it is a symlink out of the roots.

        ``name`` must already have passed ``checked_name``; this only adds the root check.

        Raises:
            OutsideRoots: the file exists as a symlink that leads outside every root.
        """
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
        return self.check(folder / name)
