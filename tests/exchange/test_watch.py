"""The watch index, against real watchdog (inotify) events on real folders."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest
import trio
from rungd.core.errors import BadInput
from rungd.exchange.paths import OutsideRoots, Roots, checked_name
from rungd.exchange.watch import Watcher, changed, wait_for

EXPORT = re.compile(r"export-\d+\.csv")


async def eventually(check, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.01)


async def test_a_folder_of_many_files_is_listed_once_and_then_kept_by_events(tmp_path: Path) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    for i in range(5000):
        (folder / f"export-{i:05d}.csv").write_text("x")
        (folder / f"other-{i:05d}.txt").write_text("x")
    old = time.time() - 100
    for i in range(5000):
        os.utime(folder / f"export-{i:05d}.csv", (old + i / 100, old + i / 100))
    watcher = Watcher()
    try:
        index = await watcher.open(folder)
        assert index.newest(EXPORT).name == "export-04999.csv"
        (folder / "export-99999.csv").write_text("new")  # created, written, closed: complete
        await eventually(lambda: index.newest(EXPORT).name == "export-99999.csv")
        os.rename(folder / "export-99999.csv", folder / "moved.tmp")  # moved out: gone from the index
        await eventually(lambda: index.newest(EXPORT).name == "export-04999.csv")
        for _ in range(100):
            index.newest(EXPORT)
        assert index.scans == 1
    finally:
        watcher.close()


async def test_a_file_only_created_is_not_offered_until_closed_or_moved_in(tmp_path: Path) -> None:
    watcher = Watcher()
    try:
        index = await watcher.open(tmp_path)
        f = open(tmp_path / "export-1.csv", "w")
        try:
            f.write("half")
            f.flush()
            await eventually(lambda: index.writing(EXPORT) == ["export-1.csv"])
            assert index.newest(EXPORT) is None
        finally:
            f.close()
        await eventually(lambda: index.newest(EXPORT) is not None)
        assert index.writing(EXPORT) == []

        (tmp_path / ".tmp-2").write_text("whole")
        os.rename(tmp_path / ".tmp-2", tmp_path / "export-2.csv")
        await eventually(lambda: index.newest(EXPORT).name == "export-2.csv")

        elsewhere = tmp_path.parent / f"{tmp_path.name}-staging"
        elsewhere.mkdir()
        (elsewhere / "export-3.csv").write_text("written elsewhere, renamed in")
        os.rename(elsewhere / "export-3.csv", tmp_path / "export-3.csv")
        await eventually(lambda: index.newest(EXPORT).name == "export-3.csv")
        os.rename(tmp_path / "export-3.csv", elsewhere / "export-3.csv")  # and out again
        await eventually(lambda: index.newest(EXPORT).name == "export-2.csv")
    finally:
        watcher.close()


async def test_waits_wake_on_events_well_before_their_poll(tmp_path: Path) -> None:
    watcher = Watcher()
    try:
        index = await watcher.open(tmp_path)

        async def write_later() -> None:
            await trio.sleep(0.2)
            (tmp_path / "export-7.csv").write_text("x")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_later)
            started = time.monotonic()
            found = await wait_for(lambda: index.newest(EXPORT), [index], poll_s=30)
            assert found.name == "export-7.csv"
            assert time.monotonic() - started < 5
        assert not await changed([index], 0.05)
    finally:
        watcher.close()


async def test_the_watcher_stops_when_the_trio_run_that_opened_it_ends(tmp_path: Path) -> None:
    def watchdog_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if type(t).__module__.startswith("watchdog")}

    watcher = Watcher()
    before = watchdog_threads()

    async def a_daemons_life() -> None:
        await watcher.open(tmp_path)
        assert watcher.lookup(tmp_path) is not None
        assert watchdog_threads() > before

    await trio.to_thread.run_sync(trio.run, a_daemons_life)  # a whole other run, as a daemon is
    assert watcher.lookup(tmp_path) is None
    assert watchdog_threads() == before


def test_names_are_plain_and_match_the_pattern() -> None:
    pattern = re.compile(r"batch-[0-9]+\.csv")
    assert checked_name("batch-1.csv", pattern, field="name") == "batch-1.csv"
    for bad in ("../batch-1.csv", "x/batch-1.csv", ".", "..", "", "batch-1.csv\x00", "batch-a.csv"):
        with pytest.raises(BadInput):
            checked_name(bad, pattern, field="name")


def test_symlinks_out_of_a_root_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "inbox").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    roots = Roots(root)
    assert roots.folder(root / "inbox") == root / "inbox"
    (root / "linked").symlink_to(outside)
    with pytest.raises(OutsideRoots):
        roots.folder(root / "linked")
    (root / "inbox" / "a.csv").symlink_to(outside / "a.csv")
    with pytest.raises(OutsideRoots):
        roots.child(root / "inbox", "a.csv")
    (root / "inbox" / "b.csv").symlink_to(root / "inbox" / "real.csv")  # inside: fine
    assert roots.child(root / "inbox", "b.csv").name == "b.csv"
