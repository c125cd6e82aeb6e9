"""Fixtures for the ledger tests: a ledger folder, an open ledger, a tiny real filesystem;
and helpers for damage: a line far longer than any record, and the memory reading it took."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from rungd_ledgers import Ledger
from rungd_ledgers.files import MAX_LINE_BYTES

# Twice the longest line a reader keeps: long enough to show a reader that holds all of it.
LONG_LINE_BYTES = 2 * MAX_LINE_BYTES


def append_long_line(path: Path, length: int = LONG_LINE_BYTES, *, newline: bool) -> None:
    """Append a line of ``length`` NUL bytes, with its newline or torn: what a crash leaves
    when a file's size reached the disk and its blocks did not, and longer than any record.
    The NULs are a hole, so nothing but the size is written."""
    with open(path, "ab") as file:
        file.truncate(file.seek(0, os.SEEK_END) + length)
        if newline:
            file.seek(0, os.SEEK_END)
            file.write(b"\n")


class Peak:
    """The most memory Python held at once inside ``peak_memory()``, once it has ended."""

    bytes = 0


@contextlib.contextmanager
def peak_memory() -> Iterator[Peak]:
    """Measure the most memory (traced by ``tracemalloc``) held at once within the block."""
    peak = Peak()
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Where the ledger lives; ``Ledger.open`` creates it."""
    return tmp_path / "ledger"


@pytest.fixture
def ledger(folder: Path) -> Iterator[Ledger]:
    with Ledger.open(folder) as opened:
        yield opened


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs, so a full disk is a full disk and not a mock of one."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("filling a disk for real needs the mount command, and it is not installed")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(
            "filling a disk for real needs a 64 KiB tmpfs, and mounting one was refused "
            f"(root with CAP_SYS_ADMIN is needed): {mounted.stderr.strip()}"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
