"""Removing what a program left in its folders (rungd.system.folders.remove_tree): never
through a mount, never raising, and never passing over what is left in silence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rungd.system.folders import inode_flags, remove_tree


def _chattr(flag: str, path: Path) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_a_wide_folder_of_folders_and_locked_ones_is_removed(tmp_path) -> None:
    top = tmp_path / "f"
    top.mkdir()
    for n in range(3000):
        (top / f"d{n}").mkdir()
    (top / "d7" / "inside").write_text("x")
    (top / "shut").mkdir(mode=0o000)
    _chattr("+i", top / "d9")
    assert remove_tree(top) is None
    assert not top.exists()


def test_a_locked_folder_under_a_mount_is_never_unlocked_through_it(tmp_path) -> None:
    # The folder mounted over carries the lock: removing it must not reach what is mounted.
    outside = tmp_path / "outside"
    outside.mkdir()
    top = tmp_path / "f"
    top.mkdir()
    if not (_chattr("+i", outside) and _chattr("+i", top)):
        pytest.skip("no inode flags on this filesystem")
    try:
        if subprocess.run(["mount", "--bind", str(outside), str(top)], capture_output=True).returncode != 0:
            pytest.skip("no bind mount here")
        try:
            kept = remove_tree(top)
            assert kept is not None and "mounted" in kept
            fd = os.open(outside, os.O_RDONLY)
            try:
                assert inode_flags(fd) & 0x10  # still immutable
            finally:
                os.close(fd)
        finally:
            subprocess.run(["umount", str(top)], check=True)
    finally:
        _chattr("-i", outside)
        _chattr("-i", top)


def test_out_of_descriptors_it_says_so_and_raises_nothing(tmp_path) -> None:
    (tmp_path / "f" / "a" / "b").mkdir(parents=True)
    script = f"""
import os, resource, sys
from rungd.system.folders import remove_tree
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
for fd in held[-2:]:
    os.close(fd)
print(repr(remove_tree({str(tmp_path / "f")!r})))
"""
    said = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    assert "could not" in said.stdout
