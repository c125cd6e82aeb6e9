"""IdempotencyIndex: what a replay of the ledger says about requests, running and held calls."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rungd_ledgers import Held, IdempotencyIndex, Ledger, LedgerCorrupt, Record, input_digest
from tests.ledgers.conftest import append_long_line

TOOL = "demo.restart"
DIGEST = input_digest(TOOL, {"host": "db1"})
RESULT = {"call_id": "call-1", "status": "ok", "outcome": "done", "fields": {"host": "db1"}}


def write(ledger: Ledger, event: str, call_id: str = "call-1", **fields: Any) -> Record:
    fields.setdefault("request_id", "req-1")
    return ledger.append(event, call_id, TOOL, **fields)


def rebuild(folder: Path, **options: Any) -> IdempotencyIndex:
    return IdempotencyIndex.rebuild(folder, **options)


def test_a_received_request_is_running(ledger: Ledger, folder: Path) -> None:
    received = write(ledger, "received", input_digest=DIGEST)

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None
    assert (entry.call_id, entry.input_digest, entry.state) == ("call-1", DIGEST, "running")
    assert entry.time == received.time and entry.result is None


def test_a_finished_request_is_done_with_its_first_result(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received", input_digest=DIGEST)
    write(ledger, "dispatched")
    write(ledger, "finished", outcome="done", effect="changed", result=RESULT)

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None and entry.state == "done" and entry.result == RESULT


def test_a_finished_request_with_unknown_outcome_is_unknown(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    write(ledger, "dispatched")
    write(ledger, "finished", outcome="unknown", code="INTERRUPTED", result={"status": "error"})

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None and entry.state == "unknown" and entry.result == {"status": "error"}


def test_a_request_that_never_started_frees_its_request_id(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    write(ledger, "finished", outcome="not_started", code="BUSY", result={"status": "error"})

    assert rebuild(folder).lookup(TOOL, "req-1") is None


def test_reconciled_existing_effect_makes_an_unknown_request_done(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    write(ledger, "finished", outcome="unknown", result={"status": "error"})
    write(ledger, "reconciled", outcome="done", effect="existing", result=RESULT)

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None and entry.state == "done" and entry.result == RESULT


def test_reconciled_without_a_result_keeps_the_first_one(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    write(ledger, "finished", outcome="unknown", result={"status": "error"})
    write(ledger, "reconciled", outcome="done", effect="existing")

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None and entry.state == "done" and entry.result == {"status": "error"}


def test_reconciled_effect_that_never_happened_drops_the_request(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    write(ledger, "finished", outcome="unknown")
    write(ledger, "reconciled", outcome="not_started", effect="none")

    assert rebuild(folder).lookup(TOOL, "req-1") is None


def test_an_inconclusive_reconcile_leaves_the_request_unknown(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    write(ledger, "finished", outcome="unknown")
    write(ledger, "reconciled", outcome="unknown")

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None and entry.state == "unknown"


def test_a_repeat_of_a_request_never_changes_the_first_calls_entry(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received", input_digest=DIGEST)
    write(ledger, "finished", outcome="done", result=RESULT)
    write(ledger, "received", "call-2", input_digest="ff" * 32)
    write(ledger, "finished", "call-2", outcome="unknown", result={"status": "error"})

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None
    assert (entry.call_id, entry.input_digest, entry.state) == ("call-1", DIGEST, "done")
    assert entry.result == RESULT


def test_a_second_finished_record_does_not_replace_the_first_result(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    write(ledger, "finished", outcome="done", result=RESULT)
    write(ledger, "finished", outcome="unknown", result={"status": "error"})

    entry = rebuild(folder).lookup(TOOL, "req-1")

    assert entry is not None and entry.state == "done" and entry.result == RESULT


def test_the_same_request_id_on_another_tool_is_another_key(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received")
    ledger.append("received", "call-2", "demo.other", request_id="req-1")

    index = rebuild(folder)
    mine, other = index.lookup(TOOL, "req-1"), index.lookup("demo.other", "req-1")

    assert mine is not None and mine.call_id == "call-1"
    assert other is not None and other.call_id == "call-2"


def test_calls_without_a_request_id_make_no_entry(ledger: Ledger, folder: Path) -> None:
    ledger.append("received", "call-1", TOOL)
    ledger.append("finished", "call-1", TOOL, outcome="done", result=RESULT)

    index = rebuild(folder)

    assert len(index) == 0
    assert index.last_seq == 2


def test_events_a_newer_daemon_added_are_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    folder.mkdir()
    base = {"v": 1, "time": 1.0, "call_id": "c", "tool": TOOL, "request_id": "r", "prev": ""}
    lines = [{**base, "seq": 1, "event": "received"}, {**base, "v": 2, "seq": 2, "event": "paused"}]
    (folder / "ledger-000001.jsonl").write_bytes(b"\n".join(map(msgspec.json.encode, lines)) + b"\n")

    index = rebuild(folder, now=3.0)

    entry = index.lookup(TOOL, "r")
    assert entry is not None and entry.state == "running"
    assert index.last_seq == 2


def test_a_line_longer_than_any_record_stops_the_replay_as_a_corrupt_line_does(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received", input_digest=DIGEST)
    append_long_line(folder / "ledger-000001.jsonl", newline=True)
    write(ledger, "dispatched")

    with pytest.raises(LedgerCorrupt, match="longer than any ledger record"):
        rebuild(folder)


def test_rebuild_drops_entries_older_than_the_retention(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received", "call-old", request_id="req-old")
    write(ledger, "dispatched", "call-old", request_id="req-old")
    time.sleep(0.05)
    cutoff_from_now = time.time()
    write(ledger, "received", "call-new", request_id="req-new")

    index = rebuild(folder, retention_seconds=3600, now=cutoff_from_now + 3600)

    assert index.lookup(TOOL, "req-old") is None
    assert index.lookup(TOOL, "req-new") is not None
    # Retention is for answering repeats; crash recovery still sees the unfinished call.
    assert [call.call_id for call in index.unfinished()] == ["call-old"]


def test_entries_are_kept_seven_days_by_default(ledger: Ledger, folder: Path) -> None:
    received = write(ledger, "received")

    assert rebuild(folder, now=received.time + 6.9 * 86400).lookup(TOOL, "req-1") is not None
    assert rebuild(folder, now=received.time + 7.1 * 86400).lookup(TOOL, "req-1") is None


def test_dispatched_but_unfinished_calls_are_listed(ledger: Ledger, folder: Path) -> None:
    write(ledger, "received", "call-1")
    write(ledger, "dispatched", "call-1")
    write(ledger, "answered", "call-1", note="confirmation Proceed?")
    write(ledger, "dispatched", "call-2", request_id=None)
    write(ledger, "dispatched", "call-3")
    write(ledger, "finished", "call-3", outcome="done")

    unfinished = rebuild(folder).unfinished()

    assert [(call.call_id, call.request_id) for call in unfinished] == [("call-1", "req-1"), ("call-2", None)]


def test_an_answered_record_alone_makes_no_call_unfinished(ledger: Ledger, folder: Path) -> None:
    write(ledger, "answered", "call-1", note="confirmation Proceed?")

    assert rebuild(folder).unfinished() == []


@pytest.mark.parametrize("decision", ["approved", "denied", "expired", "finished"])
def test_held_calls_are_listed_until_decided(ledger: Ledger, folder: Path, decision: str) -> None:
    write(ledger, "held", "call-1", inputs={"host": "db1"})
    still_held = write(ledger, "held", "call-2", request_id="req-2", caller_uid=1000)
    write(ledger, decision, "call-1", approver_uid=1001)

    assert rebuild(folder).held() == [
        Held(still_held.seq, "call-2", TOOL, "req-2", caller_uid=1000, time=still_held.time)
    ]


def test_applying_each_appended_record_matches_a_rebuild(ledger: Ledger, folder: Path) -> None:
    live = IdempotencyIndex()
    appended = [
        write(ledger, "received", "call-1", input_digest=DIGEST),
        write(ledger, "dispatched", "call-1"),
        write(ledger, "finished", "call-1", outcome="done", result=RESULT),
        write(ledger, "received", "call-2", request_id="req-2"),
        write(ledger, "held", "call-2", request_id="req-2"),
        write(ledger, "approved", "call-2", request_id="req-2"),
        write(ledger, "dispatched", "call-2", request_id="req-2"),
        write(ledger, "finished", "call-2", request_id="req-2", outcome="unknown"),
        write(ledger, "received", "call-3", request_id="req-3"),
        write(ledger, "held", "call-3", request_id="req-3"),
        write(ledger, "received", "call-4", request_id="req-4"),
        write(ledger, "dispatched", "call-4", request_id="req-4"),
    ]
    for record in appended:
        live.apply(record)

    rebuilt = rebuild(folder)

    assert len(live) == len(rebuilt) == 4
    for request_id in ("req-1", "req-2", "req-3", "req-4"):
        assert live.lookup(TOOL, request_id) == rebuilt.lookup(TOOL, request_id)
    assert live.unfinished() == rebuilt.unfinished() and [u.call_id for u in live.unfinished()] == ["call-4"]
    assert live.held() == rebuilt.held() and [h.call_id for h in live.held()] == ["call-3"]
    assert live.last_seq == rebuilt.last_seq == 12


def test_apply_out_of_order_across_calls_keeps_the_highest_seq(ledger: Ledger) -> None:
    first = write(ledger, "received", "call-1")
    second = write(ledger, "received", "call-2", request_id="req-2")
    index = IdempotencyIndex()

    index.apply(second)
    index.apply(first)

    assert index.last_seq == 2
    assert index.lookup(TOOL, "req-1") is not None and index.lookup(TOOL, "req-2") is not None


def test_prune_drops_old_entries_of_a_live_index(ledger: Ledger) -> None:
    index = IdempotencyIndex(retention_seconds=60)
    received = write(ledger, "received")
    index.apply(received)

    index.prune(now=received.time + 59)
    assert index.lookup(TOOL, "req-1") is not None
    index.prune(now=received.time + 61)
    assert index.lookup(TOOL, "req-1") is None
