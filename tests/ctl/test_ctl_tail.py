"""rungctl tail and ledger verify on a ledger written here, with times the test chooses:
what journalctl users expect (-n, --since, -f from the end, filters) and one clear line
for a broken chain."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from rungd_ledgers import GENESIS, SCHEMA_VERSION, Ledger, Record
from rungd_ledgers.chain import seal

from rungd.ctl.ledger import parse_since

LONG_TOOL = "ledgerbook_customer_credit_limit_raise_for_quarter_end"
ISO_WITH_ZONE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"


def write_ledger(folder: Path, events: list[dict[str, Any]], now: float | None = None) -> Path:
    """A sound ledger file with one record per event, at the times given (``ago`` seconds
    before ``now``, by default when the test runs: a suite may run minutes after it loaded)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time() if now is None else now
    prev, lines = GENESIS, []
    for seq, fields in enumerate(events, start=1):
        fields = dict(fields)
        ago = fields.pop("ago")
        draft = Record(v=SCHEMA_VERSION, seq=0, time=0.0, prev=GENESIS, **fields)
        record, line = seal(draft, seq=seq, prev=prev, time=now - ago)
        prev = record.hash
        lines.append(line)
    (folder / "ledger-000001.jsonl").write_bytes(b"".join(lines))
    return folder


EVENTS = [
    {"ago": 7200, "event": "received", "call_id": "c0000000000000001", "tool": "inventory_item_show",
     "caller_uid": 0},
    {"ago": 7199, "event": "finished", "call_id": "c0000000000000001", "tool": "inventory_item_show",
     "outcome": "done", "effect": "none"},
    {"ago": 600, "event": "received", "call_id": "c0000000000000002", "tool": LONG_TOOL, "request_id": "q-1",
     "caller_uid": 0},
    {"ago": 599, "event": "held", "call_id": "c0000000000000002", "tool": LONG_TOOL, "request_id": "q-1"},
    {"ago": 300, "event": "denied", "call_id": "c0000000000000002", "tool": LONG_TOOL, "request_id": "q-1",
     "approver_uid": 0, "note": "not before the audit"},
    {"ago": 299, "event": "finished", "call_id": "c0000000000000002", "tool": LONG_TOOL, "request_id": "q-1",
     "outcome": "not_started", "effect": "none", "code": "GATE_DENIED"},
]


@pytest.fixture
def ledger(short_tmp: Path) -> Path:
    return write_ledger(short_tmp / "copy" / "ledger", EVENTS)


async def ctl(*args: str) -> trio.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RUNGD_CONFIG", "RUNGD_SOCKET")}
    return await trio.run_process([sys.executable, "-m", "rungd.ctl", *args], capture_stdout=True,
                                  capture_stderr=True, check=False, env=env)


async def tail_lines(ledger: Path, *args: str) -> list[str]:
    done = await ctl("tail", "--ledger", str(ledger), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().splitlines()


async def test_lines_carry_zone_request_id_approver_and_reason(ledger: Path) -> None:
    lines = await tail_lines(ledger)
    assert len(lines) == len(EVENTS)
    assert all(re.match(ISO_WITH_ZONE + " ", line) for line in lines)
    denied = lines[4]
    assert "request_id=q-1" in denied and "by=0(root)" in denied and 'note="not before the audit"' in denied
    assert "code=GATE_DENIED" in lines[5] and "caller=0(root)" in lines[0]


async def test_a_long_tool_name_moves_no_column(ledger: Path) -> None:
    lines = await tail_lines(ledger)
    # The call_id column starts at the same place on every line, whatever the tool.
    assert len({line.index(" c000000000000000") for line in lines}) == 1
    assert all(f" {LONG_TOOL} " in line for line in lines[2:])


async def test_a_ledger_written_before_names_were_checked_cannot_drive_the_terminal(short_tmp: Path) -> None:
    # A caller's tool name or request_id with an escape, a line break or a bidi override: shown,
    # never obeyed (an older daemon recorded them as sent; the protocol refuses them now).
    forged = write_ledger(short_tmp / "forged" / "ledger", [
        {"ago": 10, "event": "received", "call_id": "c0000000000000003", "caller_uid": 0,
         "tool": "x\x1b]0;OWNED\x07\x1b[2J\ninfo    rungd: stopped", "request_id": "r\u202eevil"}])
    (line,) = await tail_lines(forged)
    assert "\x1b" not in line and "\u202e" not in line and "\n" not in line
    assert "\\x1b]0;OWNED\\x07" in line and "\\ninfo    rungd: stopped" in line and "r\\u202eevil" in line


async def test_n_keeps_the_last_matching_events(ledger: Path) -> None:
    lines = await tail_lines(ledger, "-n", "2")
    assert [line.split()[2] for line in lines] == ["denied", "finished"]
    assert await tail_lines(ledger, "-n", "0") == []


async def test_filters_combine(ledger: Path) -> None:
    assert len(await tail_lines(ledger, "--tool", LONG_TOOL)) == 4
    assert len(await tail_lines(ledger, "--request-id", "q-1", "--event", "denied", "--event", "held")) == 2
    assert len(await tail_lines(ledger, "--call", "c0000000000000001")) == 2
    assert [line.split()[2] for line in await tail_lines(ledger, "--outcome", "not_started")] == ["finished"]


async def test_since_takes_spans_and_times(ledger: Path) -> None:
    assert len(await tail_lines(ledger, "--since", "1h")) == 4
    assert len(await tail_lines(ledger, "--since", "6m")) == 2
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 400))
    assert len(await tail_lines(ledger, "--since", at)) == 2
    bad = await ctl("tail", "--ledger", str(ledger), "--since", "last tuesday")
    assert bad.returncode == 2 and b"examples: 30m, 1h" in bad.stderr


def test_parse_since_reads_what_journalctl_users_type() -> None:
    now = 1_000_000.0
    assert parse_since("30m", now) == now - 1800
    assert parse_since("-2h", now) == now - 7200
    assert parse_since("2h ago", now) == now - 7200
    assert parse_since("1970-01-12T13:46:40+00:00", now) == now
    assert parse_since("1970-01-12T13:46:40Z", now) == now
    assert parse_since("today", now) <= now


async def test_json_prints_records_as_json_lines(ledger: Path) -> None:
    lines = await tail_lines(ledger, "--json", "-n", "1")
    assert json.loads(lines[0])["code"] == "GATE_DENIED"
    assert await tail_lines(ledger, "-o", "json", "-n", "1") == lines  # journalctl's spelling


async def test_json_pretty_prints_each_record_indented(ledger: Path) -> None:
    text = "\n".join(await tail_lines(ledger, "-o", "json-pretty", "-n", "2"))
    records = [json.loads(part) for part in text.replace("}\n{", "}\x00{").split("\x00")]
    assert [r["event"] for r in records] == ["denied", "finished"] and "\n  " in text


async def test_until_bounds_the_time_from_above_as_since_does_from_below(ledger: Path) -> None:
    assert len(await tail_lines(ledger, "--until", "1h")) == 2  # the call two hours ago
    assert len(await tail_lines(ledger, "--since", "15m", "--until", "6m")) == 2  # received and held
    bad = await ctl("tail", "--ledger", str(ledger), "--until", "last tuesday")
    assert bad.returncode == 2 and b"--until 'last tuesday': not a time" in bad.stderr
    backwards = await ctl("tail", "--ledger", str(ledger), "--since", "1m", "--until", "1h")
    assert backwards.returncode == 2 and b"is before --since" in backwards.stderr


async def test_follow_starts_at_the_end_and_prints_new_events(short_tmp: Path) -> None:
    folder = short_tmp / "live"
    with Ledger.open(folder) as writer:
        for i in range(15):
            writer.append("received", f"c{i:016x}", "inventory_item_show")
    env = {k: v for k, v in os.environ.items() if k not in ("RUNGD_CONFIG", "RUNGD_SOCKET")}
    proc = subprocess.Popen([sys.executable, "-m", "rungd.ctl", "tail", "-f", "--ledger", str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        first = [await trio.to_thread.run_sync(proc.stdout.readline) for _ in range(10)]
        assert [line.split()[1] for line in first] == [str(seq).encode() for seq in range(6, 16)]
        with Ledger.open(folder) as writer:
            writer.append("received", "cffffffffffffffff", "late_tool")
        with trio.fail_after(10):
            late = await trio.to_thread.run_sync(proc.stdout.readline)
        assert b"cffffffffffffffff late_tool" in late
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


async def test_verify_takes_a_path_and_names_the_broken_record_in_one_line(ledger: Path) -> None:
    ok = await ctl("ledger", "verify", str(ledger))
    assert ok.returncode == 0 and ok.stdout.startswith(b"ledger ok: 6 records")
    state = await ctl("ledger", "verify", str(ledger.parent))  # a copied state folder works too
    assert state.returncode == 0
    path = ledger / "ledger-000001.jsonl"
    path.write_bytes(path.read_bytes().replace(b"not before the audit", b"approved by nobody!!", 1))
    broken = await ctl("ledger", "verify", str(ledger))
    assert broken.returncode == 1
    out = broken.stdout.decode()
    assert out.count("\n") == 1 and "Problem(" not in out
    assert out.startswith("ledger BROKEN: ledger-000001.jsonl line 5 (seq 5): edited: ")
    assert "4 records before it are sound" in out


async def test_a_follow_ends_once_nobody_reads_it_even_with_nothing_new_to_print(short_tmp: Path) -> None:
    # Issue 31: `rungctl --host ... tail -f` left the host's rungctl running after the ssh
    # connection went, until its next write; a quiet ledger may have none for days.
    folder = short_tmp / "quiet"
    with Ledger.open(folder) as writer:
        writer.append("received", "c0000000000000001", "inventory_item_show")
    env = {k: v for k, v in os.environ.items() if k not in ("RUNGD_CONFIG", "RUNGD_SOCKET")}
    proc = subprocess.Popen([sys.executable, "-m", "rungd.ctl", "tail", "-f", "--ledger", str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert b"inventory_item_show" in await trio.to_thread.run_sync(proc.stdout.readline)
        proc.stdout.close()  # the reader goes; nothing more is written to the ledger
        with trio.fail_after(10):
            status = await trio.to_thread.run_sync(proc.wait)
        assert status == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
