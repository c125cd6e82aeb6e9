"""iter_records and follow, on files being written and rotated underneath them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rungd_ledgers import Ledger, LedgerCorrupt, Record, follow, iter_records
from rungd_ledgers.files import MAX_LINE_BYTES
from tests.ledgers.conftest import append_long_line, peak_memory


def append_many(ledger: Ledger, count: int, note: str = "") -> list[Record]:
    return [ledger.append("received", f"call-{n}", "demo.echo", note=note or None) for n in range(count)]


def test_iter_records_reads_every_file_in_order(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=600) as ledger:
        written = append_many(ledger, 25, note="x" * 80)

    assert len(list(folder.glob("ledger-*.jsonl"))) > 2
    assert list(iter_records(folder)) == written


@pytest.mark.parametrize("since_seq", [0, 1, 7, 24, 25, 40])
def test_iter_records_since_seq_starts_after_it(folder: Path, since_seq: int) -> None:
    with Ledger.open(folder, rotate_bytes=600) as ledger:
        written = append_many(ledger, 25, note="x" * 80)

    assert list(iter_records(folder, since_seq=since_seq)) == written[since_seq:]


def test_iter_records_skips_a_partial_last_line(ledger: Ledger, folder: Path) -> None:
    written = append_many(ledger, 3)
    with open(folder / "ledger-000001.jsonl", "ab") as file:
        file.write(b'{"v":1,"seq":4,')

    assert list(iter_records(folder)) == written


def test_iter_records_names_the_file_holding_a_bad_line(ledger: Ledger, folder: Path) -> None:
    append_many(ledger, 2)
    with open(folder / "ledger-000001.jsonl", "ab") as file:
        file.write(b"garbage\n")

    with pytest.raises(LedgerCorrupt, match="ledger-000001.jsonl"):
        list(iter_records(folder))


def test_iter_records_of_an_empty_folder_yields_nothing(tmp_path: Path) -> None:
    assert list(iter_records(tmp_path)) == []


class Follower:
    """Runs ``follow`` in a thread, collecting what it yields."""

    def __init__(self, folder: Path, since_seq: int = 0) -> None:
        self.records: list[Record] = []
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(folder, since_seq))
        self._thread.start()

    def _run(self, folder: Path, since_seq: int) -> None:
        try:
            for record in follow(folder, since_seq, poll_seconds=0.01, stop=self._stop):
                self.records.append(record)
        except Exception as error:  # reported by stop(); an exception in a thread is otherwise lost
            self.errors.append(error)

    def wait_for(self, condition: Callable[[list[Record]], bool], seconds: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        while not condition(self.records):
            assert time.monotonic() < deadline, f"follow yielded only seqs {[r.seq for r in self.records]}"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive()
        assert self.errors == []


def test_follow_yields_existing_then_new_records_across_rotation(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=600) as ledger:
        before = append_many(ledger, 5, note="x" * 80)
        follower = Follower(folder)
        try:
            follower.wait_for(lambda got: len(got) == 5)
            after = append_many(ledger, 20, note="y" * 80)
            follower.wait_for(lambda got: len(got) == 25)
        finally:
            follower.stop()

    assert len(list(folder.glob("ledger-*.jsonl"))) > 2
    assert follower.records == before + after


def test_follow_since_seq_skips_what_came_before(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=600) as ledger:
        written = append_many(ledger, 20, note="x" * 80)
        follower = Follower(folder, since_seq=15)
        try:
            follower.wait_for(lambda got: len(got) == 5)
            written.append(ledger.append("received", "call-20", "demo.echo"))
            follower.wait_for(lambda got: len(got) == 6)
        finally:
            follower.stop()

    assert follower.records == written[15:]


def test_follow_waits_for_a_half_written_line_to_be_completed(tmp_path: Path) -> None:
    # Write two records properly, then play them into another folder byte by byte, as a
    # slow writer would.
    source = tmp_path / "source"
    with Ledger.open(source) as ledger:
        written = append_many(ledger, 2)
    lines = (source / "ledger-000001.jsonl").read_bytes().splitlines(keepends=True)
    folder = tmp_path / "ledger"
    folder.mkdir()
    target = folder / "ledger-000001.jsonl"
    target.write_bytes(lines[0] + lines[1][:40])

    follower = Follower(folder)
    try:
        follower.wait_for(lambda got: len(got) == 1)
        time.sleep(0.1)  # ten polls with the half line there
        assert follower.records == written[:1]
        with open(target, "ab") as file:
            file.write(lines[1][40:])
        follower.wait_for(lambda got: len(got) == 2)
    finally:
        follower.stop()

    assert follower.records == written


def test_follow_waits_for_the_first_file_to_appear(folder: Path) -> None:
    folder.mkdir()
    follower = Follower(folder)
    try:
        time.sleep(0.05)
        with Ledger.open(folder) as ledger:
            written = append_many(ledger, 3)
        follower.wait_for(lambda got: len(got) == 3)
    finally:
        follower.stop()

    assert follower.records == written


def test_a_line_longer_than_any_record_is_corrupt_and_never_held_whole(ledger: Ledger, folder: Path) -> None:
    append_many(ledger, 3)
    append_long_line(folder / "ledger-000001.jsonl", newline=True)
    ledger.append("received", "call-after", "demo.echo")

    with peak_memory() as peak, pytest.raises(LedgerCorrupt, match="longer than any ledger record"):
        list(iter_records(folder))

    assert peak.bytes < MAX_LINE_BYTES + (1 << 20), "a reader held more of the line than any record can be"


def test_a_torn_last_line_of_any_length_is_skipped_without_being_held_whole(ledger: Ledger, folder: Path) -> None:
    written = append_many(ledger, 3)
    append_long_line(folder / "ledger-000001.jsonl", newline=False)

    with peak_memory() as peak:
        assert list(iter_records(folder)) == written

    assert peak.bytes < MAX_LINE_BYTES + (1 << 20)

