"""Hostile files in rung 3's folders: FIFOs, sockets, devices, symlink loops and dangling
links where an export or a lock file belongs, and an import folder swapped mid-import.

Each case proves three things through the live daemon: the call ends in bounded time
(no hung loop, no thread left blocked), it says what happened with a clear code, and
nothing is written outside the tool's roots. The daemon runs in this test's own process,
so a blocking open in its event loop would freeze the test too: ``Unjam`` opens a planted
FIFO from the other side after a few seconds, so today's bug fails the timing assertion
instead of hanging the suite.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import record_loop_gaps
from tests.exchange.conftest import rungd_config_toml, xfer  # noqa: F401  (the fixtures)

HEADER = "sku,date,qty,price,status,name\n"
ROW = "SKU-1,2024-05-01,3,1.50,active,Widget\n"
BOUND_S = 2.5  # a call here takes well under a second; the unjam comes later




class Unjam:
    """Open planted FIFOs for writing after ``delay`` s, so a reader blocked on one wakes."""

    def __init__(self, delay: float = 4.0) -> None:
        self.delay = delay
        self.fifos: list[Path] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.done.wait(self.delay):
            return
        while not self.done.is_set():
            for fifo in list(self.fifos):
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a reader sees end-of-file
                except OSError:
                    pass
            self.done.wait(0.05)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


@pytest.fixture
def unjam() -> Iterator[Unjam]:
    helper = Unjam()
    yield helper
    helper.stop()


def plant(path: Path, kind: str, unjam: Unjam) -> Any:
    """Put a special file of ``kind`` at ``path``; returns what must stay open (a socket)."""
    if kind == "fifo":
        os.mkfifo(path)
        unjam.fifos.append(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        return server
    elif kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers (we run as root)
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "dangling":
        path.symlink_to(path.with_name("nothing-here"))
    return None


def export(folder: Path, name: str, age_s: float = 60) -> Path:
    path = folder / name
    path.write_text(HEADER + ROW)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


async def timed(daemon: Any, tool: str, inputs: dict[str, Any]) -> tuple[Any, float]:
    start = time.monotonic()
    envelope = await daemon.call(tool, inputs, request_id=None if tool == "xfer_stock_list" else uuid.uuid4().hex)
    return envelope, time.monotonic() - start


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
KINDS = ["fifo", "socket", pytest.param("device", marks=needs_root)]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_special_file_named_like_the_newest_export_is_never_opened(rungd_daemon, xfer, unjam, kind) -> None:
    export(xfer / "exports", "stock-a.csv")
    first = await rungd_daemon.call("xfer_stock_list", {})
    assert first.status == "ok", first.error  # the folder is watched from here on
    keep = plant(xfer / "exports" / "stock-z.csv", kind, unjam)  # newer, and seen by an event
    try:
        envelope, elapsed = await timed(rungd_daemon, "xfer_stock_list", {})
    finally:
        if keep is not None:
            keep.close()
    assert elapsed < BOUND_S, f"the read took {elapsed:.1f} s: something waited on the {kind}"
    assert envelope.status == "ok", envelope.error
    assert envelope.fields["export"] == "stock-a.csv"


@pytest.mark.parametrize("kind", ["loop", "dangling"])
async def test_a_symlink_loop_or_dangling_link_as_the_newest_export_is_not_a_file(rungd_daemon, xfer, unjam,
                                                                                   kind) -> None:
    export(xfer / "exports", "stock-a.csv")
    plant(xfer / "exports" / "stock-z.csv", kind, unjam)
    envelope, elapsed = await timed(rungd_daemon, "xfer_stock_list", {})
    assert elapsed < BOUND_S
    assert (envelope.status, envelope.error.code, envelope.next_action) == ("error", "NOT_A_FILE", "stop")
    assert "stock-z.csv" in envelope.error.message and "remove" in envelope.error.hint


async def test_a_fifo_as_an_exports_writer_lock_is_held_never_waited_on_in_the_loop(rungd_daemon, xfer,
                                                                                   unjam) -> None:
    export(xfer / "exports", "stock-a.csv")
    plant(xfer / "exports" / "stock-a.csv.lck", "fifo", unjam)
    gaps: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(record_loop_gaps, gaps, 0.05)
        envelope = await rungd_daemon.call("xfer_stock_list", {"complete": "lock"})
        nursery.cancel_scope.cancel()
    # The lock name is taken, so the export counts as being written until the deadline,
    # which says so; all along the event loop stayed free.
    assert envelope.error is not None and envelope.error.code == "STALE_EXPORT", envelope
    assert "a writer's lock file is beside it" in envelope.error.message
    assert max(gaps) < 1.0, f"the event loop stalled for {max(gaps):.1f} s on the FIFO"
    os.unlink(xfer / "exports" / "stock-a.csv.lck")
    again, elapsed = await timed(rungd_daemon, "xfer_stock_list", {"complete": "lock"})
    assert again.status == "ok" and elapsed < BOUND_S, again.error


@pytest.mark.parametrize("kind", ["fifo", "socket", pytest.param("device", marks=needs_root), "loop"])
async def test_a_special_file_as_a_legacy_lock_file_is_locked_at_once_and_leaks_no_thread(
        rungd_daemon, xfer, unjam, kind) -> None:
    keep = plant(xfer / "inbox" / ".~lock.batch-1.csv#", kind, unjam)
    default = trio.to_thread.current_default_thread_limiter()
    try:
        for i in range(3):
            envelope, elapsed = await timed(rungd_daemon, "xfer_items_import", {
                "name": "batch-1.csv", "rows": [{"sku": "S", "qty": 1}]})
            assert elapsed < BOUND_S, f"import {i} took {elapsed:.1f} s"
            assert (envelope.error.code, envelope.outcome) == ("LOCKED", "not_started"), envelope.error
            assert ".~lock.batch-1.csv#" in envelope.error.message
    finally:
        if keep is not None:
            keep.close()
    assert default.borrowed_tokens == 0, "a probe still holds a thread of Trio's default limiter"
    assert sorted(p.name for p in (xfer / "inbox").iterdir()) == [".~lock.batch-1.csv#"], "nothing was written"


async def test_an_import_folder_swapped_for_a_symlink_mid_import_writes_nothing_outside(
        rungd_daemon, xfer, short_tmp) -> None:
    outside = short_tmp / "root-owned"
    outside.mkdir()
    inbox = xfer / "inbox"

    async def swap() -> None:
        await trio.sleep(0.5)  # inside the first count (slow_count_s), after every path check
        os.rename(inbox, xfer / "inbox.old")
        inbox.symlink_to(outside)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(swap)
        envelope = await rungd_daemon.call("xfer_items_import", {
            "name": "batch-7.csv", "rows": [{"sku": "S", "qty": 1}], "slow_count_s": 1.0}, request_id="swap-1")
    assert list(outside.iterdir()) == [], f"written outside the roots: {list(outside.iterdir())}"
    # The write went to the folder that was checked and held, wherever it was moved.
    assert [p.name for p in (xfer / "inbox.old").iterdir()] == ["batch-7.csv"]
    assert envelope.error is not None and envelope.error.code == "TIMEOUT"  # nobody takes it there
