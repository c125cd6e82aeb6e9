"""A full disk under a live daemon, for real: its state folder on a small tmpfs filled to
the last byte while a call runs. New work is refused with LEDGER_UNAVAILABLE; the running
call still records how it finished; repeats are answered from memory."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import trio
from rungd_ledgers import iter_records

from rungd.config import load_config
from rungd.testing import start_daemon, write_config
from tests.ledgers.test_full_disk import fill
from tests.security.test_callers import MARKS


@pytest.fixture
def small_state(short_tmp: Path):
    state = short_tmp / "state"
    state.mkdir()
    if os.getuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs root and mount")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


async def test_a_full_disk_refuses_new_work_and_loses_no_finish(nursery, short_tmp, small_state) -> None:
    log = short_tmp / "marks.log"
    plugin = short_tmp / "marks.py"
    plugin.write_text(textwrap.dedent(MARKS.format(log=str(log))))
    config = load_config(write_config(short_tmp, f'[ledger]\nreserve_bytes = 262144\n\n'
                                                 f'[plugins]\nfiles = ["{plugin}"]\n'))
    daemon = await start_daemon(nursery, config)
    first = await daemon.call("mark_item_add", {"item": "before"}, request_id="w0")
    assert first.effect == "changed"
    running = await daemon.call("mark_item_add", {"item": "running", "pause": 2}, request_id="w1", wait_s=0.2)
    assert running.status == "pending"

    fill(small_state / "filler")
    refused = await daemon.call("mark_item_add", {"item": "new"}, request_id="w2")
    assert refused.error is not None, (refused, os.statvfs(small_state).f_bavail)
    assert (refused.error.code, refused.outcome, refused.next_action) == (
        "LEDGER_UNAVAILABLE", "not_started", "retry_later")
    repeat = await daemon.call("mark_item_add", {"item": "before"}, request_id="w0")
    assert (repeat.status, repeat.effect) == ("ok", "existing")  # answered from memory

    done = await daemon.run(lambda c: c.wait(running.call_id, 10))
    assert (done.status, done.effect) == ("ok", "changed")
    finished = [r for r in iter_records(small_state / "ledger") if r.call_id == running.call_id]
    assert [r.event for r in finished][-1] == "finished"  # durable, from the reserve
    assert log.read_text().split() == ["before", "running"]  # w2 never ran

    (small_state / "filler").unlink()
    await trio.sleep(0)
    again = await daemon.call("mark_item_add", {"item": "new"}, request_id="w2")
    assert (again.status, again.effect) == ("ok", "changed")
    daemon.daemon.stop()
    # The outage the ledger could not record while it lasted is in it now (issue 31): counted
    # by the daemon, written once the ledger took records again, and a metric.
    (outage,) = [r for r in iter_records(small_state / "ledger") if r.event == "ledger_outage"]
    assert "1 append(s) refused" in outage.note, outage.note
    from rungd.service.health import compute, prometheus_text
    assert "rungd_ledger_outages_total 1\n" in prometheus_text(compute(small_state / "ledger", 0.0))
