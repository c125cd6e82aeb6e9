"""Crash recovery at start-up: what a run that crashed left open is settled before serving,
and nothing that may have run is ever run again by a repeat."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from rungd_ledgers import Ledger, iter_records, verify

from rungd.audit import Audit
from rungd.engine.recovery import recover
from rungd.testing import STUB_DESCRIPTION, serve_tool_file

JOURNAL = """
[program]
name = "journal"
command = "{program}"

[tools.journal_entry_add]
side_effect = "reversible"
argv = ["{{entry}}"]
log_fields = ["entry"]
[tools.journal_entry_add.description]
{description}
[tools.journal_entry_add.inputs.entry]
description = "The entry."
example = "r1"
pattern = "^r[0-9]+$"
[tools.journal_entry_add.verify]
tool = "journal_entry_check"
inputs = {{ entry = "{{entry}}" }}
expect = {{ found = "{{entry}}" }}
wait_s = 0

[tools.journal_entry_check]
argv = ["--check", "{{entry}}"]
[tools.journal_entry_check.description]
{description}
[tools.journal_entry_check.inputs.entry]
description = "The entry."
example = "r1"
pattern = "^r[0-9]+$"
[tools.journal_entry_check.parse]
kind = "regex"
pattern = '^found: (?P<found>\\S+)$'
fields = {{ found = "string" }}
"""


def journal(short_tmp: Path, fake_program, effects: Path) -> str:
    """A tool file whose write appends its entry to ``effects``: one line per run."""
    program = fake_program("journal", f"""
        import sys
        if sys.argv[1] == "--check":
            try:
                found = sys.argv[2] in open({str(effects)!r}).read().split()
            except FileNotFoundError:
                found = False
            print("found: " + (sys.argv[2] if found else "none"))
        else:
            with open({str(effects)!r}, "a") as log:
                log.write(sys.argv[1] + "\\n")
    """)
    return JOURNAL.format(program=program, description=STUB_DESCRIPTION)


async def test_a_dispatched_record_torn_by_a_crash_makes_a_repeat_reconcile_never_rerun(
    short_tmp: Path, fake_program
) -> None:
    """Issue 27: a write ran, and the disk kept its received record but only half of its
    dispatched one (an fsync acknowledged and not done, then power lost). Nothing proves it
    was not dispatched, so recovery finishes it unknown, and a repeat must not run it again."""
    effects = short_tmp / "effects.log"
    tools = journal(short_tmp, fake_program, effects)
    async with trio.open_nursery() as first_run:
        first = await serve_tool_file(first_run, short_tmp, tools, name="journal.toml")
        done = await first.call("journal_entry_add", {"entry": "r1"}, request_id="req-1")
        first.daemon.stop()
    assert (done.status, done.effect) == ("ok", "changed"), done
    ledger = short_tmp / "state" / "ledger"
    path = ledger / "ledger-000001.jsonl"
    data = path.read_bytes()
    dispatched = next(line for line in data.splitlines(keepends=True)
                      if b'"event":"dispatched"' in line and done.call_id.encode() in line)
    path.write_bytes(data[:data.index(dispatched) + len(dispatched) // 2])

    async with trio.open_nursery() as second_run:
        second = await serve_tool_file(second_run, short_tmp, tools, name="journal.toml")
        repeat = await second.call("journal_entry_add", {"entry": "r1"}, request_id="req-1")
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
