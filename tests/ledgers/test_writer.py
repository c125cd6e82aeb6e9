"""Ledger: durable appends, group commit, crash repair, rotation and the folder lock."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest

from rungd_ledgers import (
    GENESIS,
    Ledger,
    LedgerClosed,
    LedgerCorrupt,
    LedgerUnavailable,
    Record,
    iter_records,
    verify,
)
from rungd_ledgers.files import MAX_LINE_BYTES
from tests.ledgers.conftest import LONG_LINE_BYTES, append_long_line, peak_memory


def test_append_returns_the_sealed_record_and_reads_back_identical(ledger: Ledger, folder: Path) -> None:
    first = ledger.append(
        "received",
        "call-1",
        "demo.restart",
        request_id="req-1",
        caller_uid=1000,
        caller_pid=4242,
        input_digest="ab" * 32,
        inputs={"host": "db1"},
    )
    second = ledger.append(
        "finished",
        "call-1",
        "demo.restart",
        request_id="req-1",
        outcome="done",
        effect="changed",
        result={"status": "ok", "fields": {"host": "db1", "count": 3}},
    )

    assert (first.seq, first.prev, second.seq, second.prev) == (1, GENESIS, 2, first.hash)
    assert first.v == 1 and first.time > 0 and len(first.hash) == 64
    assert list(iter_records(folder)) == [first, second]
    assert ledger.last_seq == 2


def test_each_record_is_one_json_line_ending_with_its_hash(ledger: Ledger, folder: Path) -> None:
    record = ledger.append("received", "call-1", "demo.echo", note="hello")

    line = (folder / "ledger-000001.jsonl").read_bytes()

    assert line.endswith(b'"hash":"' + record.hash.encode() + b'"}\n')
    assert msgspec.json.decode(line)["note"] == "hello"


def test_reopening_continues_the_seq_and_the_chain(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        last = [ledger.append("received", f"call-{n}", "demo.echo") for n in range(3)][-1]

    with Ledger.open(folder) as ledger:
        assert ledger.last_seq == 3
        after = ledger.append("received", "call-3", "demo.echo")

    assert (after.seq, after.prev) == (4, last.hash)
    assert verify(folder).ok


@pytest.mark.parametrize("keep_reserve", [False, True], ids=["finishing", "new-work"])
def test_fifty_threads_get_gap_free_seqs_and_share_fsyncs(ledger: Ledger, folder: Path, keep_reserve: bool) -> None:
    # New work's records (keep_reserve) share fsyncs too: the reserve is checked once a batch.
    threads, per_thread = 50, 200
    results: list[list[Record]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def write(mine: list[Record], thread: int) -> None:
        try:
            for n in range(per_thread):
                mine += ledger.append_many([("received", f"call-{thread}-{n}", "demo.echo", {"request_id": f"{n}"})],
                                           keep_reserve=keep_reserve)
        except Exception as error:  # reported below; an exception in a thread is otherwise lost
            errors.append(error)

    workers = [threading.Thread(target=write, args=(results[n], n)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert errors == []
    records = [record for mine in results for record in mine]
    assert sorted(record.seq for record in records) == list(range(1, threads * per_thread + 1))
    # Each thread saw its own appends complete in order.
    assert all([r.seq for r in mine] == sorted(r.seq for r in mine) for mine in results)
    # A batch is sealed at one instant, so records sharing a time shared a write and an fsync.
    assert len({record.time for record in records}) < len(records)
    report = verify(folder)
    assert report.ok and report.records == threads * per_thread


def test_concurrent_appends_across_rotations_keep_one_chain(folder: Path) -> None:
    errors: list[BaseException] = []

    def write(ledger: Ledger, thread: int) -> None:
        try:
            for n in range(50):
                ledger.append("received", f"call-{thread}-{n}", "demo.echo", note="x" * 100)
        except Exception as error:  # reported below; an exception in a thread is otherwise lost
            errors.append(error)

    with Ledger.open(folder, rotate_bytes=20_000) as ledger:
        workers = [threading.Thread(target=write, args=(ledger, n)) for n in range(20)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    assert errors == []
    assert len(list(folder.glob("ledger-*.jsonl"))) > 5
    report = verify(folder)
    assert report.ok and report.records == 1000


def test_torn_last_line_is_moved_aside_on_open_and_earlier_records_kept(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        kept = [ledger.append("received", f"call-{n}", "demo.echo") for n in range(5)]
    path = folder / "ledger-000001.jsonl"
    good_size = path.stat().st_size
    torn = b'{"v":1,"seq":6,"time":17000'
    with open(path, "ab") as file:
        file.write(torn)

    with Ledger.open(folder) as ledger:
        repair = ledger.repair
        after = ledger.append("received", "call-5", "demo.echo")

    assert repair is not None
    assert (repair.file, repair.offset, repair.length) == (path.name, good_size, len(torn))
    assert (folder / repair.moved_to).read_bytes() == torn + b"\n"
    assert list(iter_records(folder)) == [*kept, after]
    assert (after.seq, after.prev) == (6, kept[-1].hash)
    assert verify(folder).ok


def test_a_complete_record_missing_only_its_newline_is_also_moved_aside(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        ledger.append("received", "call-0", "demo.echo")
        ledger.append("received", "call-1", "demo.echo")
    path = folder / "ledger-000001.jsonl"
    path.write_bytes(path.read_bytes()[:-1])  # the crash came between the record and its newline

    with Ledger.open(folder) as ledger:
        assert ledger.repair is not None
        assert ledger.last_seq == 1
        # Its append never returned, so the seq is free again.
        assert ledger.append("received", "call-2", "demo.echo").seq == 2
    assert verify(folder).ok


def test_a_torn_first_line_leaves_an_empty_ledger_that_starts_at_seq_one(folder: Path) -> None:
    folder.mkdir()
    (folder / "ledger-000001.jsonl").write_bytes(b'{"v":1,"seq":1,"ti')

    with Ledger.open(folder) as ledger:
        assert ledger.repair is not None and ledger.repair.offset == 0
        first = ledger.append("received", "call-0", "demo.echo")

    assert (first.seq, first.prev) == (1, GENESIS)
    assert verify(folder).ok


_OPEN_THEN_DIE = """
import os
import sys
from rungd_ledgers import Ledger
ledger = Ledger.open(sys.argv[1])
assert ledger.repair is not None
os._exit(0)  # as a daemon killed during its start-up: nothing written, nothing closed
"""


def test_a_torn_tail_stays_until_the_first_write_so_a_start_up_that_dies_first_finds_it_again(
    folder: Path,
) -> None:
    """Crash recovery decides from a torn tail what a call may have done (issue 27): that
    evidence must outlive a start-up that ends before recovery has written its decision."""
    with Ledger.open(folder) as ledger:
        kept = ledger.append("received", "call-0", "demo.echo")
    torn = b'{"v":1,"seq":2,"time":17000'
    with open(folder / "ledger-000001.jsonl", "ab") as file:
        file.write(torn)
    subprocess.run([sys.executable, "-c", _OPEN_THEN_DIE, str(folder)], check=True, timeout=60)

    with Ledger.open(folder) as ledger:
        repair = ledger.repair
        after = ledger.append("received", "call-1", "demo.echo")

    assert repair is not None and repair.length == len(torn)
    assert (folder / repair.moved_to).read_bytes() == torn + b"\n", "moved aside once, by the write"
    assert list(iter_records(folder)) == [kept, after]
    assert verify(folder).ok


def test_a_torn_tail_of_any_length_is_moved_aside_a_chunk_at_a_time(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        kept = ledger.append("received", "call-0", "demo.echo")
    path = folder / "ledger-000001.jsonl"
    good_size = path.stat().st_size
    append_long_line(path, newline=False)

    with peak_memory() as peak, Ledger.open(folder) as ledger:
        repair = ledger.repair
        after = ledger.append("received", "call-1", "demo.echo")

    assert repair is not None and (repair.offset, repair.length) == (good_size, LONG_LINE_BYTES)
    assert (folder / repair.moved_to).stat().st_size == LONG_LINE_BYTES + 1
    assert peak.bytes < 1 << 20, "the torn bytes were read into memory to be moved"
    assert list(iter_records(folder)) == [kept, after]


def test_a_last_line_longer_than_any_record_stops_open_as_corrupt(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        ledger.append("received", "call-0", "demo.echo")
    append_long_line(folder / "ledger-000001.jsonl", newline=True)

    with peak_memory() as peak, pytest.raises(LedgerCorrupt, match="longer than any record"):
        Ledger.open(folder)

    assert peak.bytes < MAX_LINE_BYTES + (1 << 20)


def test_a_clean_ledger_reports_no_repair(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        ledger.append("received", "call-0", "demo.echo")
    with Ledger.open(folder) as ledger:
        assert ledger.repair is None
    assert not list(folder.glob("*.torn"))


def test_rotation_starts_new_files_and_keeps_one_chain(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=1000) as ledger:
        records = [ledger.append("received", f"call-{n}", "demo.echo", note="x" * 100) for n in range(30)]

    files = sorted(path.name for path in folder.glob("ledger-*.jsonl"))
    assert len(files) >= 3 and files[0] == "ledger-000001.jsonl"
    assert all(path.stat().st_size < 1000 + 400 for path in folder.glob("ledger-*.jsonl"))
    second_file_first = msgspec.json.decode((folder / files[1]).read_bytes().splitlines()[0], type=Record)
    assert second_file_first.prev == records[second_file_first.seq - 2].hash
    assert list(iter_records(folder)) == records
    assert verify(folder).ok


def test_reopen_after_rotation_appends_to_the_newest_file(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=500) as ledger:
        for n in range(10):
            ledger.append("received", f"call-{n}", "demo.echo", note="x" * 100)
    newest = max(folder.glob("ledger-*.jsonl"))
    size = newest.stat().st_size

    with Ledger.open(folder, rotate_bytes=10_000) as ledger:
        ledger.append("received", "call-10", "demo.echo")

    assert newest.stat().st_size > size
    assert verify(folder).ok


def test_an_empty_newest_file_continues_the_chain_from_the_file_before(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        last = ledger.append("received", "call-0", "demo.echo")
    # A crash just after rotation created the next file and before anything was written.
    (folder / "ledger-000002.jsonl").touch()

    with Ledger.open(folder) as ledger:
        after = ledger.append("received", "call-1", "demo.echo")

    assert (after.seq, after.prev) == (2, last.hash)
    assert (folder / "ledger-000002.jsonl").read_bytes().count(b"\n") == 1
    assert verify(folder).ok


def test_unreadable_last_record_refuses_to_open(folder: Path) -> None:
    with Ledger.open(folder) as ledger:
        ledger.append("received", "call-0", "demo.echo")
    with open(folder / "ledger-000001.jsonl", "ab") as file:
        file.write(b"not json\n")

    with pytest.raises(LedgerCorrupt, match="ledger verify"):
        Ledger.open(folder)


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(folder: Path) -> None:
    with Ledger.open(folder):
        with pytest.raises(LedgerUnavailable, match="held by another writer"):
            Ledger.open(folder)
    with Ledger.open(folder) as again:
        assert again.last_seq == 0


def test_append_after_close_raises(folder: Path) -> None:
    ledger = Ledger.open(folder)
    ledger.close()
    ledger.close()  # closing twice is harmless

    with pytest.raises(LedgerClosed):
        ledger.append("received", "call-0", "demo.echo")


@pytest.mark.parametrize(
    ("event", "fields", "error", "words"),
    [
        ("started", {}, ValueError, "unknown ledger event 'started'"),
        ("received", {"colour": "red"}, TypeError, "colour"),
        ("received", {"seq": 9}, TypeError, "filled in by the ledger"),
        ("received", {"hash": "0" * 64}, TypeError, "filled in by the ledger"),
        ("received", {"caller_uid": "root"}, msgspec.ValidationError, "caller_uid"),
        ("received", {"approver_uid": "yesterday"}, msgspec.ValidationError, "approver_uid"),
        ("received", {"inputs": {"when": object()}}, TypeError, "object"),
    ],
)
def test_a_bad_append_fails_in_its_caller_and_writes_nothing(
    ledger: Ledger, folder: Path, event: str, fields: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        ledger.append(event, "call-0", "demo.echo", **fields)

    assert ledger.append("received", "call-1", "demo.echo").seq == 1
    assert verify(folder).ok


def test_append_many_writes_in_order_in_one_batch(tmp_path) -> None:
    from rungd_ledgers import Ledger, iter_records, verify

    with Ledger.open(tmp_path) as ledger:
        records = ledger.append_many([("received", "c1", "t", {}), ("dispatched", "c1", "t", {"request_id": "r"})])
    assert [r.event for r in records] == ["received", "dispatched"]
    assert [r.seq for r in records] == [1, 2]
    assert [r.event for r in iter_records(tmp_path)] == ["received", "dispatched"]
    assert verify(tmp_path).ok


_UNSYNCED_THEN_FLUSH = """
import sys
from pathlib import Path
from rungd_ledgers import Ledger
ledger = Ledger.open(Path(sys.argv[1]))
event = ("finished", "call-1", "demo.read", {"outcome": "done"})
ledger.append_many([event, event], sync=False)
ledger.append_many([event], sync=False)
assert ledger.unsynced
print("flushing", flush=True)
ledger.flush()
assert not ledger.unsynced
ledger.flush()
ledger.close()
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is missing: apt-get install strace")
def test_appends_without_sync_are_made_durable_by_one_flush_and_only_once(folder: Path) -> None:
    # Counted for real: strace lists every fsync the process makes after the appends.
    trace = folder.parent / "trace"
    subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,write", sys.executable, "-c",
                    _UNSYNCED_THEN_FLUSH, str(folder)], check=True, stdout=subprocess.DEVNULL, timeout=60)
    lines = trace.read_text().splitlines()
    marker = next(i for i, line in enumerate(lines) if "flushing" in line)
    # The descriptor the records were written to: the ledger file.
    fd = next(re.search(r"write\((\d+), \"\{", line).group(1) for line in lines if re.search(r"write\(\d+, \"\{", line))
    synced = [i for i, line in enumerate(lines) if f"fsync({fd})" in line]
    # Not synced by the appends; once by the flush; a second flush and the close find nothing.
    assert [i > marker for i in synced] == [True], lines
    assert len(list(iter_records(folder))) == 3


_FLUSH_FAILS = """
import sys
from pathlib import Path
from rungd_ledgers import Ledger, LedgerUnavailable
ledger = Ledger.open(Path(sys.argv[1]))
ledger.append("finished", "call-w", "demo.write", outcome="done")
ledger.append_many([("finished", "call-r1", "demo.read", {}), ("finished", "call-r2", "demo.read", {})], sync=False)
print("flushing", flush=True)
try:
    ledger.flush()
except LedgerUnavailable:
    print("flush failed", flush=True)
ledger.append("finished", "call-w2", "demo.write", outcome="done")
ledger.close()
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is missing: apt-get install strace")
def test_a_failed_flush_cuts_the_unsynced_records_and_the_chain_goes_on_whole(folder: Path) -> None:
    # Count the fsyncs up to the flush in a dry run, then make exactly that one fail (EIO).
    dry = folder.parent / "dry"
    trace = folder.parent / "trace"
    subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,write", sys.executable, "-c",
                    _FLUSH_FAILS, str(dry)], check=True, stdout=subprocess.DEVNULL, timeout=60)
    lines = trace.read_text().splitlines()
    marker = next(i for i, line in enumerate(lines) if "flushing" in line)
    nth = sum("fsync(" in line for line in lines[:marker]) + 1
    run = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync", "-e",
                          f"inject=fsync:error=EIO:when={nth}", sys.executable, "-c", _FLUSH_FAILS, str(folder)],
                         check=True, capture_output=True, text=True, timeout=60)
    assert "flush failed" in run.stdout, run.stdout + run.stderr
    # The reads' records are gone (a crash could have lost them anyway); the writes' are
    # there, chained one after the other, and the whole ledger verifies.
    assert [record.call_id for record in iter_records(folder)] == ["call-w", "call-w2"]
    assert verify(folder).ok


def test_append_now_writes_in_the_calling_thread_without_fsync_or_declines_when_busy(folder: Path) -> None:
    ledger = Ledger.open(folder, rotate_bytes=10_000)
    try:
        event = ("received", "call-1", "demo.read", {})
        written = ledger.append_now([event, ("dispatched", "call-1", "demo.read", {})])
        assert [r.seq for r in written] == [1, 2] and ledger.unsynced
        # Another thread holds the writer (a batch or a flush under way): it does not wait.
        with ledger._cond:
            assert ledger.append_now([event]) is None
        # A rotation is due (it fsyncs the folder): left to append_many in a worker thread.
        ledger.append_many([("finished", "call-2", "demo.write", {"note": "x" * 10_000})])
        assert ledger.append_now([event]) is None
        assert [r.seq for r in ledger.append_many([event], sync=False)] == [4]
        assert [r.seq for r in ledger.append_now([event])] == [5]
    finally:
        ledger.close()
    assert [r.seq for r in iter_records(folder)] == [1, 2, 3, 4, 5] and verify(folder).ok


def test_new_work_is_refused_by_both_paths_when_the_reserve_cannot_be_kept(folder: Path) -> None:
    # A reserve larger than the filesystem can hold: new work must wait, on either path;
    # records that finish what runs are still written.
    ledger = Ledger.open(folder, reserve_bytes=1 << 62)
    try:
        event = ("received", "call-1", "demo.read", {})
        with pytest.raises(LedgerUnavailable, match="nearly full"):
            ledger.append_now([event], keep_reserve=True)
        with pytest.raises(LedgerUnavailable, match="nearly full"):
            ledger.append_many([event], keep_reserve=True)
        assert [r.event for r in ledger.append_now([("finished", "call-0", "demo.read", {})])] == ["finished"]
    finally:
        ledger.close()
    assert [r.event for r in iter_records(folder)] == ["finished"]


def test_the_reserve_stays_ahead_of_the_end_topped_up_in_steps(folder: Path) -> None:
    # Past every append's end, at least the reserve is allocated; it is topped up a step
    # at a time, not by an fallocate per append (a system call on every record).
    reserve = 256 * 1024
    ledger = Ledger.open(folder, reserve_bytes=reserve)
    try:
        event = ("received", "call-1", "demo.read", {})
        ledger.append_now([event])
        [path] = folder.glob("*.jsonl")
        allocated = path.stat().st_blocks * 512
        if allocated < reserve:
            pytest.skip("this filesystem does not preallocate")
        for _ in range(100):
            ledger.append_now([event])
        assert path.stat().st_blocks * 512 == allocated
        while path.stat().st_size + reserve <= allocated:
            ledger.append_now([("received", "call-1", "demo.read", {"note": "x" * 4000})])
        assert path.stat().st_blocks * 512 >= path.stat().st_size + reserve
    finally:
        ledger.close()
