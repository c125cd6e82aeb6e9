"""Retention: whole old files are deleted after a pruned record names them, and verify still
proves the chain that is left; files deleted any other way are caught."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rungd_ledgers import IdempotencyIndex, Ledger, LedgerCorrupt, iter_records, prune, verify
from rungd_ledgers.files import ledger_files
from tests.ledgers.conftest import append_long_line

DAY = 86400.0


def fill(ledger: Ledger, count: int, *, first_call: str = "c") -> None:
    for number in range(count):
        ledger.append("received", f"{first_call}-{number}", "tool_a", request_id=f"r-{number}",
                      note="x" * 40)
        ledger.append("finished", f"{first_call}-{number}", "tool_a", request_id=f"r-{number}",
                      outcome="done", effect="changed", result={"status": "ok"})


def test_old_files_are_pruned_and_verify_proves_the_files_left(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=4096) as ledger:
        fill(ledger, 60)
        files_before = ledger_files(folder)
        assert len(files_before) >= 4
        later = time.time() + 100 * DAY
        result = prune(ledger, now=later, keep_seconds=30 * DAY, max_total_bytes=None,
                       protect_since=later - 7 * DAY)
        fill(ledger, 2, first_call="after")
    assert result.record is not None and result.record.event == "pruned"
    gone = [item.name for item in result.record.pruned]
    assert gone == [path.name for path in files_before[:-1]], "every file but the one being written"
    assert ledger_files(folder)[0].name == files_before[-1].name
    report = verify(folder)
    assert report.ok, report.problem
    assert report.first_seq == result.record.pruned[-1].last_seq + 1
    assert [item.name for item in report.pruned] == gone
    assert next(iter(iter_records(folder))).seq == report.first_seq
    # The daemon's start-up replay and the next writer both work on a pruned ledger.
    IdempotencyIndex.rebuild(folder)
    with Ledger.open(folder) as reopened:
        reopened.append("received", "again", "tool_a")
    assert verify(folder).ok


def test_a_file_deleted_by_hand_is_an_unvouched_start(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=4096) as ledger:
        fill(ledger, 30)
    ledger_files(folder)[0].unlink()
    report = verify(folder)
    assert report.problem is not None and report.problem.kind == "unvouched_start"
    assert "no pruned record names the file" in report.problem.explanation


def test_a_file_deleted_by_hand_after_a_prune_is_still_caught(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=4096) as ledger:
        fill(ledger, 60)
        newest_kept = ledger_files(folder)[-3]
        later = time.time() + 100 * DAY
        # Keep the last three files by size: total after pruning must fit three files.
        sizes = [path.stat().st_size for path in ledger_files(folder)]
        prune(ledger, now=later, keep_seconds=None, max_total_bytes=sum(sizes[-3:]) + 1, protect_since=later)
    assert verify(folder).ok
    assert ledger_files(folder)[0] == newest_kept
    newest_kept.unlink()
    problem = verify(folder).problem
    assert problem is not None and problem.kind == "unvouched_start"


def test_the_size_bound_prunes_oldest_first_until_the_rest_fits(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=4096) as ledger:
        fill(ledger, 60)
        files = ledger_files(folder)
        total = sum(path.stat().st_size for path in files)
        result = prune(ledger, now=time.time(), keep_seconds=None, max_total_bytes=total // 2,
                       protect_since=time.time() + 1)
    assert result.record is not None
    assert result.total_bytes <= total // 2
    assert [item.name for item in result.record.pruned] == [path.name for path in files[:len(result.record.pruned)]]
    assert verify(folder).ok


def test_records_inside_the_idempotency_retention_are_never_pruned(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=4096) as ledger:
        fill(ledger, 30)
        count = len(ledger_files(folder))
        result = prune(ledger, now=time.time(), keep_seconds=None, max_total_bytes=1,
                       protect_since=time.time() - 7 * DAY)
    assert result.record is None
    assert "idempotency retention" in result.kept_because
    assert len(ledger_files(folder)) == count


def test_a_file_holding_a_live_call_is_kept_with_every_file_after_it(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=4096) as ledger:
        ledger.append("dispatched", "c-still-running", "tool_a", request_id="r-live")
        fill(ledger, 30)
        count = len(ledger_files(folder))
        live = IdempotencyIndex.rebuild(folder, now=time.time()).live_call_ids()
        assert "c-still-running" in live
        later = time.time() + 100 * DAY
        result = prune(ledger, now=later, keep_seconds=DAY, max_total_bytes=None, protect_since=later,
                       live_calls=live)
    assert result.record is None
    assert "still running, held or unknown" in result.kept_because
    assert len(ledger_files(folder)) == count


def test_a_damaged_old_file_stops_the_prune_as_corrupt_and_nothing_is_deleted(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=4096) as ledger:
        fill(ledger, 30)
        files_before = ledger_files(folder)
        append_long_line(files_before[0], newline=True)  # its last line is now far past any record
        later = time.time() + 100 * DAY

        with pytest.raises(LedgerCorrupt, match=files_before[0].name):
            prune(ledger, now=later, keep_seconds=30 * DAY, max_total_bytes=None, protect_since=later)

    assert ledger_files(folder) == files_before
