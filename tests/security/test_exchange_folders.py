"""Folders rung 3 makes are made inside its roots or not at all, even when a parent is
swapped for a symlink between the check and the making."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rungd.exchange.paths import OutsideRoots, Roots


def test_a_folder_is_made_with_its_missing_parents_inside_the_root(tmp_path: Path) -> None:
    roots = Roots(tmp_path / "root")
    made = roots.folder(tmp_path / "root" / "a" / "b", create=True)
    assert made.is_dir() and (tmp_path / "root" / "a").is_dir()


def test_a_parent_swapped_for_a_symlink_out_of_the_roots_makes_nothing_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inbox").mkdir(parents=True)
    outside.mkdir()
    roots = Roots(root)
    roots.check(root / "inbox" / "new")  # what the caller checked...
    (root / "inbox").rmdir()
    os.symlink(outside, root / "inbox")  # ...then swapped, before the folder is made
    with pytest.raises(OutsideRoots):
        roots.folder(root / "inbox" / "new", create=True)
    assert list(outside.iterdir()) == []  # not even an empty folder out there
