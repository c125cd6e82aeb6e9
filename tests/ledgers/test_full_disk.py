"""A full disk, for real: a 64 KiB tmpfs filled to the last byte."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from rungd_ledgers import Ledger, LedgerUnavailable, iter_records, verify

# Records of one size: a record that did not fit will not fit when tried again either.
NOTE = "n" * 700


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem has no byte left, in big blocks then small ones."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for block in (65536, 4096, 512):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as error:
                assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)


def append_until_full(ledger: Ledger) -> int:
    """Append until the ledger file's last page is full too; return how many fitted."""
    for fitted in range(100):
        try:
            ledger.append("received", f"call-fill-{fitted}", "demo.echo", note=NOTE)
        except LedgerUnavailable:
            return fitted
    raise AssertionError("the disk never filled up")


def test_full_disk_fails_every_waiting_append_and_leaves_nothing_torn(small_fs: Path) -> None:
    folder = small_fs / "ledger"
    with Ledger.open(folder) as ledger:
        ledger.append("received", "call-0", "demo.echo", note=NOTE)
        fill(small_fs / "filler")
        append_until_full(ledger)
        path = folder / "ledger-000001.jsonl"
        size, last_seq = path.stat().st_size, ledger.last_seq
        failures: list[Exception] = []
        successes: list[int] = []

        def write(n: int) -> None:
            try:
                successes.append(ledger.append("received", f"call-waiting-{n}", "demo.echo", note=NOTE).seq)
            except LedgerUnavailable as error:
                failures.append(error)

        writers = [threading.Thread(target=write, args=(n,)) for n in range(20)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()

        assert successes == [] and len(failures) == 20
        assert "could not be written" in str(failures[0])
        assert isinstance(failures[0].__cause__, OSError) and failures[0].__cause__.errno == errno.ENOSPC
        assert path.stat().st_size == size
        assert path.read_bytes().endswith(b"\n")
        assert ledger.last_seq == last_seq
        assert verify(folder).ok

        (small_fs / "filler").unlink()
        after = ledger.append("received", "call-after", "demo.echo", note=NOTE)

    assert after.seq == last_seq + 1
    assert [record.seq for record in iter_records(folder)] == list(range(1, last_seq + 2))
    report = verify(folder)
    assert report.ok and report.records == last_seq + 1
    assert not list(folder.glob("*.torn"))


def test_a_record_that_half_fits_is_cut_back_out(small_fs: Path) -> None:
    folder = small_fs / "ledger"
    with Ledger.open(folder) as ledger:
        ledger.append("received", "call-0", "demo.echo")
        fill(small_fs / "filler")
        path = folder / "ledger-000001.jsonl"
        size = path.stat().st_size

        # Bigger than what is left of the file's page: the first part is written, the rest is not.
        with pytest.raises(LedgerUnavailable):
            ledger.append("received", "call-big", "demo.echo", note="b" * 8000)

        assert path.stat().st_size == size
        small = ledger.append("received", "call-small", "demo.echo")

    assert small.seq == 2
    assert verify(folder).ok
