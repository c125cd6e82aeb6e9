"""Every call recorded, never done twice: the ledger and the idempotency index in the daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rungd_ledgers import iter_records, verify

from tests.conftest import TEST_PLUGINS
from rungd.client import Client
from rungd.system.proctree import tagged_pids
from rungd.testing import write_config

FAKE_TOOLS = f"""
[plugins]
files = ["{TEST_PLUGINS / 'fake_tools.py'}"]
"""


@pytest.fixture
def rungd_config_toml() -> str:
    return FAKE_TOOLS


def events(daemon, call_id: str) -> list[str]:
    return [r.event for r in iter_records(daemon.config.state_dir / "ledger") if r.call_id == call_id]


async def test_every_call_is_recorded_with_a_verifiable_chain(rungd_daemon) -> None:
    ok = await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    bad = await rungd_daemon.call("inventory_item_show", {"item": "-x"})
    assert events(rungd_daemon, ok.call_id) == ["received", "dispatched", "finished"]
    assert events(rungd_daemon, bad.call_id) == ["received", "rejected"]
    record = next(r for r in iter_records(rungd_daemon.config.state_dir / "ledger") if r.call_id == ok.call_id)
    assert record.inputs == {"item": "widget"}  # only the fields the tool marks safe to log
    assert record.caller_uid == os.getuid()
    assert verify(rungd_daemon.config.state_dir / "ledger").ok


async def test_repeated_write_returns_existing_and_runs_nothing(rungd_daemon) -> None:
    inputs = {"item": "widget", "count": 30}
    first = await rungd_daemon.call("inventory_count_set", inputs, request_id="req-1")
    assert (first.status, first.effect) == ("ok", "changed")
    again = await rungd_daemon.call("inventory_count_set", inputs, request_id="req-1")
    assert (again.status, again.effect, again.fields) == ("ok", "existing", first.fields)
    dispatched = [r for r in iter_records(rungd_daemon.config.state_dir / "ledger")
                  if r.event == "dispatched" and r.request_id == "req-1"]
    assert len(dispatched) == 1  # the program ran once


async def test_same_request_id_with_other_inputs_is_a_mismatch(rungd_daemon) -> None:
    await rungd_daemon.call("inventory_count_set", {"item": "widget", "count": 31}, request_id="req-2")
    env = await rungd_daemon.call("inventory_count_set", {"item": "widget", "count": 32}, request_id="req-2")
    assert (env.error.code, env.error.retry, env.next_action) == ("IDEMPOTENCY_MISMATCH", "no", "repair")
    show = await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    assert show.fields["count"] == 31


async def test_repeat_of_an_unknown_outcome_requires_reconcile(rungd_daemon) -> None:
    inputs = {"program": "stubborn"}
    first = await rungd_daemon.call("fake_write_spawn", inputs, request_id="req-3")
    assert (first.error.code, first.outcome) == ("TIMEOUT", "unknown")
    again = await rungd_daemon.call("fake_write_spawn", inputs, request_id="req-3")
    assert (again.error.code, again.error.retry, again.next_action) == (
        "RECONCILE_REQUIRED", "after_check", "reconcile")
    assert again.settle.tool == "fake_run"


async def test_not_started_outcome_frees_the_request_id(rungd_daemon) -> None:
    inputs = {"program": "busy", "args": ["--mode", "sleep", "--seconds", "30"]}
    first = await rungd_daemon.call("fake_write_short", inputs, request_id="req-4")
    assert (first.error.code, first.outcome) == ("TIMEOUT", "not_started")
    second = await rungd_daemon.call("fake_write_short", inputs, request_id="req-4")
    assert second.call_id != first.call_id
    assert second.error.code == "TIMEOUT"  # it ran again: nothing had happened the first time


def test_kill_9_mid_write_then_restart_gives_unknown_and_blocks_blind_retry(short_tmp: Path) -> None:
    config = write_config(short_tmp, FAKE_TOOLS)
    sock = short_tmp / "rungd.sock"

    def start() -> subprocess.Popen[bytes]:
        daemon = subprocess.Popen([sys.executable, "-m", "rungd.main", "serve", "--config", str(config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert daemon.poll() is None and time.monotonic() < deadline, "daemon did not start"
            time.sleep(0.05)
        return daemon

    daemon = start()
    try:
        with Client(sock) as client:
            pending = client.call("fake_write_slow", {"program": "stubborn"}, request_id="req-9", wait_s=0.5)
        assert pending.status == "pending"
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        assert tagged_pids(pending.call_id), "the stubborn child should outlive a daemon killed with -9"
        sock.unlink()
        daemon = start()
        with Client(sock) as client:
            status_after = client.call("fake_write_slow", {"program": "stubborn"}, request_id="req-9")
        assert (status_after.error.code, status_after.next_action) == ("RECONCILE_REQUIRED", "reconcile")
        assert not tagged_pids(pending.call_id), "recovery must kill the interrupted call's processes"
        ledger = short_tmp / "state" / "ledger"
        finished = [r for r in iter_records(ledger) if r.call_id == pending.call_id and r.event == "finished"]
        assert [(r.outcome, r.code) for r in finished] == [("unknown", "INTERRUPTED")]
        assert verify(ledger).ok
    finally:
        daemon.kill()
        daemon.wait()


async def test_rungctl_ledger_verify_and_tail(rungd_daemon) -> None:
    import trio

    env = await rungd_daemon.call("inventory_item_show", {"item": "gadget"})
    config = str(rungd_daemon.config.source)
    ok = await trio.run_process([sys.executable, "-m", "rungd.ctl", "ledger", "verify", "--config", config],
                                capture_stdout=True)
    assert b"ledger ok" in ok.stdout
    tail = await trio.run_process([sys.executable, "-m", "rungd.ctl", "tail", "--tool", "inventory_item_show",
                                   "--config", config], capture_stdout=True)
    assert env.call_id.encode() in tail.stdout and b"finished" in tail.stdout
    # An edited record breaks the chain, and verify says where.
    ledger_file = sorted((rungd_daemon.config.state_dir / "ledger").glob("*.jsonl"))[0]
    data = ledger_file.read_bytes()
    ledger_file.write_bytes(data.replace(b'"item":"gadget"', b'"item":"gidget"', 1))
    broken = await trio.run_process([sys.executable, "-m", "rungd.ctl", "ledger", "verify", "--config", config],
                                    capture_stdout=True, check=False)
    assert broken.returncode == 1
    assert b"BROKEN" in broken.stdout and b"edited" in broken.stdout


async def test_a_rejected_request_does_not_hold_its_request_id(rungd_daemon) -> None:
    bad = await rungd_daemon.call("inventory_count_set", {"item": "-rf", "count": 1}, request_id="req-5")
    assert bad.error.code == "BAD_INPUT"
    good = await rungd_daemon.call("inventory_count_set", {"item": "sprocket", "count": 1}, request_id="req-5")
    assert (good.status, good.effect) == ("ok", "changed")


async def test_rungctl_status_shows_the_whole_history(rungd_daemon) -> None:
    import trio

    env = await rungd_daemon.call("inventory_count_set", {"item": "gadget", "count": 2}, request_id="hist-1")
    config = str(rungd_daemon.config.source)
    done = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--config", config, "status", env.call_id],
                                  capture_stdout=True)
    lines = done.stdout.decode()
    for event in ("received", "dispatched", "finished"):
        assert event in lines
    as_json = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--config", config, "status", "--json",
                                      env.call_id], capture_stdout=True)
    parsed = __import__("json").loads(as_json.stdout)
    # The demo asks [y/N] before the change; the answer given on the caller's behalf is on record.
    assert [e["event"] for e in parsed["history"]] == ["received", "dispatched", "answered", "finished"]
    assert parsed["envelope"]["effect"] == "changed"
