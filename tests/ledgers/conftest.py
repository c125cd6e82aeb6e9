"""Fixtures for the ledger tests: a ledger folder, an open ledger, a tiny real filesystem."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rungd_ledgers import Ledger


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
