"""Crash recovery at start-up: what a run that crashed left open is settled before serving,
and nothing that may have run is ever run again by a repeat."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from rungd_ledgers import Ledger, iter_records, verify

from rungd.service.audit import Audit
from rungd.config import load_config
from rungd.service.engine.recovery import recover
from rungd.testing import start_daemon, write_config
from tests.service.test_reliability import journal_tools


async def test_a_dispatched_record_torn_by_a_crash_makes_a_repeat_reconcile_never_rerun(
    short_tmp: Path
) -> None:
    """Issue 27: a write ran, and the disk kept its received record but only half of its
    dispatched one (an fsync acknowledged and not done, then power lost). Nothing proves it
    was not dispatched, so recovery finishes it unknown, and a repeat must not run it again."""
    tools, effects = journal_tools(short_tmp)
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n'))
    async with trio.open_nursery() as first_run:
        first = await start_daemon(first_run, config)
        done = await first.call("journal_entry_add", {"entry": "r1", "pause": 0.0}, request_id="req-1")
        first.daemon.stop()
    assert (done.status, done.effect) == ("ok", "changed"), done
    ledger = short_tmp / "state" / "ledger"
    path = ledger / "ledger-000001.jsonl"
    data = path.read_bytes()
    dispatched = next(line for line in data.splitlines(keepends=True)
                      if b'"event":"dispatched"' in line and done.call_id.encode() in line)
    path.write_bytes(data[:data.index(dispatched) + len(dispatched) // 2])

    async with trio.open_nursery() as second_run:
        second = await start_daemon(second_run, config)
        repeat = await second.call("journal_entry_add", {"entry": "r1", "pause": 0.0}, request_id="req-1")
        second.daemon.stop()

    assert effects.read_text() == "r1\n", "the program ran a second time"
    assert repeat.error is not None and (repeat.error.code, repeat.next_action) == ("RECONCILE_REQUIRED",
                                                                                     "reconcile"), repeat
    finished = [r for r in iter_records(ledger) if r.call_id == done.call_id and r.event == "finished"]
    assert [(r.outcome, r.code) for r in finished] == [("unknown", "INTERRUPTED")]
    assert "torn last line" in (finished[0].note or "")
    assert verify(ledger).ok


@pytest.mark.parametrize(("torn", "approved_ends"), [(False, ("not_started", "INTERRUPTED")),
                                                      (True, ("unknown", "INTERRUPTED"))])
def test_a_torn_tail_leaves_a_call_approved_and_not_dispatched_unknown(
    tmp_path: Path, torn: bool, approved_ends: tuple[str, str]
) -> None:
    """An approved call is dispatched in a batch of its own, far from its received record:
    a torn tail may be that dispatched record as much as one written with its received."""
    folder = tmp_path / "ledger"
    with Ledger.open(folder) as ledger:
        for call in ("approved", "waiting"):
            ledger.append_many([("received", call, "demo_write", {"request_id": call}),
                                ("held", call, "demo_write", {"request_id": call})])
        ledger.append("approved", "approved", "demo_write", request_id="approved")
    if torn:
        with open(folder / "ledger-000001.jsonl", "ab") as file:
            file.write(b'{"v":1,"seq":6,"time":1.5,"event":"dispatched","call_id":"appr')
    audit = Audit(folder, retention_s=86400, rotate_bytes=1 << 20)
    try:
        recover(audit, {})
    finally:
        audit.close()

    finished = {r.call_id: (r.outcome, r.code) for r in iter_records(folder) if r.event == "finished"}
    # A call still waiting for approval was never dispatched either way: that needs its approval first.
    assert finished == {"approved": approved_ends, "waiting": ("not_started", "APPROVAL_EXPIRED")}
    assert verify(folder).ok
