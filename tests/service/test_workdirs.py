"""Work folders: a call starts in an empty folder of its own; one a call left empty and as it
was made is the next call's, anything else is removed before the call's caller hears."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest
import trio

from rungd.config import load_config
from rungd.service.engine.workdirs import MAX_SPARES, WorkFolders
from rungd.system.changetime import SETTLED_S
from rungd.system.folders import inode_flags
from rungd.testing import start_daemon, write_config
from tests.conftest import nest_folders


# A default ACL giving everyone everything (setfacl -d -m u::rwx,g::rwx,o::rwx), as the kernel
# takes it: version 2, then (tag, permissions, id) for the owner, the group and the others.
_OPEN_ACL = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, 7, 0xFFFFFFFF) for tag in (0x01, 0x04, 0x20))


def bind(source: Path, target: Path) -> None:
    """Mount ``source`` on ``target`` as a root program may; the test is skipped where it cannot."""
    bound = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"no bind mount here: {bound.stderr.decode().strip()}")


def folders(root: Path) -> WorkFolders:
    root.mkdir(mode=0o700)
    return WorkFolders(root, trio.CapacityLimiter(2))


async def test_an_empty_folder_is_kept_for_the_next_call_and_a_changed_one_removed(tmp_path) -> None:
    work = folders(tmp_path / "work")
    first = await work.take()
    first.mkdir(mode=0o700)  # as the program's new process makes it
    assert work.give_back(first) is None
    assert await work.take() == first and first.is_dir()  # kept, and handed out again

    left = {"a file": lambda p: (p / "out.txt").write_text("x"),
            "a folder": lambda p: (p / "sub").mkdir(),
            "its mode": lambda p: p.chmod(0o755),
            "a symlink": lambda p: (p.rmdir(), p.symlink_to(tmp_path)),
            # flags and ACLs a next call would inherit, where the filesystem has them
            "immutable": lambda p: subprocess.run(["chattr", "+i", str(p)], check=True),
            "a default ACL": lambda p: os.setxattr(p, "system.posix_acl_default", _OPEN_ACL)}
    for what, change in left.items():
        folder = await work.take()
        folder.mkdir(mode=0o700, exist_ok=True)
        try:
            change(folder)
        except (OSError, subprocess.CalledProcessError):
            assert what in ("immutable", "a default ACL"), what  # a filesystem without them
            assert work.give_back(folder) is None
            continue
        remove = work.give_back(folder)
        assert remove is not None, what
        await remove()
        assert not os.path.lexists(folder), what
        assert tmp_path.is_dir()  # a symlink is removed, never what it points at
    assert work.give_back(await work.take()) is None  # never made (its tool has a cwd of its own)


async def test_a_kept_folder_written_into_meanwhile_is_not_handed_out(tmp_path) -> None:
    # A process of another call (same user) may write into a kept folder: looked at again.
    work = folders(tmp_path / "work")
    kept = await work.take()
    kept.mkdir(mode=0o700)
    assert work.give_back(kept) is None
    (kept / "planted").write_text("x")
    again = await work.take()
    assert again != kept and not os.path.lexists(kept)
    again.mkdir(mode=0o700)
    try:
        os.setxattr(again, "user.note", b"left by a call")
    except OSError:
        return  # a filesystem without user xattrs: nothing to keep across calls
    assert work.give_back(again) is not None  # an attribute left on it: not kept


async def test_no_more_folders_are_kept_than_calls_ran_at_once_up_to_the_cap(tmp_path) -> None:
    work = folders(tmp_path / "work")
    taken = [await work.take() for _ in range(MAX_SPARES + 3)]
    assert len(set(taken)) == len(taken)
    for folder in taken:
        folder.mkdir(mode=0o700)
    removals = [work.give_back(folder) for folder in taken]
    assert removals[:MAX_SPARES] == [None] * MAX_SPARES
    for remove in removals[MAX_SPARES:]:
        assert remove is not None
        await remove()
    assert len(list((tmp_path / "work").iterdir())) == MAX_SPARES


def _user_xattrs(path: Path) -> bool:
    try:
        os.setxattr(path, "user.probe", b"x")
        os.removexattr(path, "user.probe")
        return True
    except OSError:
        return False


async def test_a_folder_judged_by_its_lstat_is_looked_at_again_after_any_change(tmp_path) -> None:
    # Once a look counts (the folder's change time is old enough), a kept folder is judged by
    # its lstat alone: every change after must still keep it from the next call.
    work = folders(tmp_path / "work")
    xattrs = _user_xattrs(tmp_path)
    changes = {"a file": lambda p: (p / "out.txt").write_text("x"),
               "a folder": lambda p: (p / "sub").mkdir(),
               "its mode": lambda p: p.chmod(0o755),
               "a symlink": lambda p: (p.rmdir(), p.symlink_to(tmp_path)),
               # only its change time moves: the lstat is otherwise the same
               **({"an attribute": lambda p: os.setxattr(p, "user.note", b"left by a call")} if xattrs else {})}
    kept = [await work.take() for _ in range(len(changes) + 1)]
    for folder in kept:
        folder.mkdir(mode=0o700)
        assert work.give_back(folder) is None
    await trio.sleep(SETTLED_S + 0.3)
    # Handed out and given back once more: these looks count now.
    again = [await work.take() for _ in kept]
    assert sorted(again) == sorted(kept)
    for folder in again:
        assert work.give_back(folder) is None
    # What another process of the same user does to the kept folders meanwhile:
    changed = dict(zip(changes, kept))
    for what, change in changes.items():
        change(changed[what])
    handed = await work.take()
    assert handed not in changed.values()
    assert handed.is_dir() and not any(handed.iterdir())
    for what, folder in changed.items():
        assert not os.path.lexists(folder), what
    assert tmp_path.is_dir()
    # ... and what a call's own program does to its folder is looked at when it is given back.
    if xattrs:
        os.setxattr(handed, "user.note", b"left by the call")
        assert work.give_back(handed) is not None


async def test_a_folder_a_program_mounted_into_is_left_whole_never_emptied_through_the_mount(tmp_path, caplog) -> None:
    # A program that may mount (root's) binds another folder of the host into its work
    # folder: removing the work folder must not empty that folder for it.
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("the host's")
    # The state folder reached through a link, as /var/lib/rungd may be: the mount table names
    # the mount by its real path.
    (tmp_path / "real").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "real")
    work = folders(tmp_path / "state" / "work")
    folder = await work.take()
    (folder / "inside").mkdir(parents=True)
    bind(precious, folder / "inside")
    try:
        remove = work.give_back(folder)
        assert remove is not None
        await remove()
        assert (precious / "keep.txt").read_text() == "the host's"
        assert folder.is_dir()  # left for the operator, and said so
        assert "mounted" in caplog.text and os.path.realpath(folder / "inside") in caplog.text
    finally:
        subprocess.run(["umount", str(folder / "inside")], check=True)
    remove = work.give_back(folder)  # unmounted: removed as any other
    assert remove is not None
    await remove()
    assert not os.path.lexists(folder)


async def test_what_a_call_leaves_is_removed_however_deep_and_locked_or_said(tmp_path, caplog) -> None:
    # Folders nested past what a recursive removal (or any path) reaches, a folder the
    # program took its rights from, files and folders it made immutable or append-only.
    work = folders(tmp_path / "work")
    folder = await work.take()
    folder.mkdir(mode=0o700)
    nest_folders(folder, 3000)
    (folder / "shut").mkdir()
    (folder / "shut" / "inside.txt").write_text("x")
    (folder / "shut").chmod(0o500)
    (folder / "locked").write_text("x")
    flagged = subprocess.run(["chattr", "+i", str(folder / "locked")], capture_output=True).returncode == 0
    (folder / "log").mkdir()
    (folder / "log" / "kept.txt").write_text("x")
    if flagged:
        subprocess.run(["chattr", "+a", str(folder / "log")], check=True)
    remove = work.give_back(folder)
    assert remove is not None
    await remove()
    assert not os.path.lexists(folder), caplog.text
    assert "left in place" not in caplog.text


async def test_start_up_sweeps_an_earlier_runs_folders_one_by_one_leaving_only_a_mounted_one(
        short_tmp, nursery, caplog) -> None:
    config = load_config(write_config(short_tmp, ""))
    work = config.state_dir / "work"
    (work / "call-feedfeedfeed").mkdir(parents=True)
    (work / "call-feedfeedfeed" / "credential").write_text("left by a crash")
    mounted = work / "call-0123456789ab" / "inside"
    mounted.mkdir(parents=True)
    precious = short_tmp / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("the host's")
    bind(precious, mounted)
    try:
        running = await start_daemon(nursery, config)
        assert not (work / "call-feedfeedfeed").exists()  # what could go went
        assert (precious / "keep.txt").read_text() == "the host's"
        assert mounted.is_dir() and "left in place" in caplog.text
        running.daemon.stop()
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


async def test_a_locked_file_a_call_linked_in_from_elsewhere_keeps_its_lock(tmp_path, caplog) -> None:
    # A hard link shares its inode: unlocking it to remove the link would unlock the file
    # elsewhere. (The kernel links no immutable file: the program links it, then locks it.)
    # The folder is left in place instead, and said.
    outside = tmp_path / "outside.txt"
    outside.write_text("the host's")
    work = folders(tmp_path / "work")
    folder = await work.take()
    folder.mkdir(mode=0o700)
    os.link(outside, folder / "link")
    if subprocess.run(["chattr", "+i", str(folder / "link")], capture_output=True).returncode != 0:
        pytest.skip("no inode flags on this filesystem")
    try:
        remove = work.give_back(folder)
        assert remove is not None
        await remove()
        fd = os.open(outside, os.O_RDONLY)
        try:
            assert inode_flags(fd) & 0x10  # still immutable
        finally:
            os.close(fd)
        assert folder.is_dir() and "left in place" in caplog.text
    finally:
        subprocess.run(["chattr", "-i", str(outside)], check=True)


async def test_a_folder_a_program_mounted_a_host_folder_over_is_never_handed_to_a_later_call(tmp_path, caplog) -> None:
    # An empty 0700 host folder of the same filesystem, bound over the work folder itself:
    # as made by every look but the mount's, and a later call's files would land in it.
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    work = folders(tmp_path / "work")
    folder = await work.take()
    folder.mkdir(mode=0o700)
    bind(host, folder)
    try:
        remove = work.give_back(folder)
        assert remove is not None
        await remove()
        assert folder.is_dir() and "mounted" in caplog.text  # left, and said
        assert await work.take() != folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
    assert not any(host.iterdir())
