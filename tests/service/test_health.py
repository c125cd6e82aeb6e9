"""rungctl health: what the ledger says about each tool, read from the files alone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from rungd.service.health import compute, format_text, sparkline

from tests.ctl.test_ctl_tail import write_ledger

NOW = time.time()  # the ledger's records and the report share this "now"

TOOL = "inventory_count_set"


def _call(n: int, ago: float, took: float, code: str | None = None, *, held_s: float | None = None,
          answered: bool = False) -> list[dict]:
    call_id = f"c{n:016d}"
    base = {"call_id": call_id, "tool": TOOL}
    events = [{"ago": ago, "event": "received", **base}]
    start = ago
    if held_s is not None:
        events.append({"ago": ago, "event": "held", **base})
        events.append({"ago": ago - held_s, "event": "approved", "approver_uid": 0, **base})
        start = ago - held_s
    if answered:
        events.append({"ago": start - took / 2, "event": "answered", "note": "confirmation", **base})
    events.append({"ago": start - took, "event": "finished", "outcome": "not_started" if code else "done",
                   "effect": "none" if code else "changed", "code": code, **base})
    return events


def _ledger(short_tmp: Path) -> Path:
    events = [
        *_call(1, 30 * 3600, 0.1),  # before the 24h span: not counted
        *_call(2, 5000, 0.010),
        *_call(3, 4000, 0.020, answered=True),
        *_call(4, 3000, 0.030, "SURFACE_CHANGED"),
        *_call(5, 2000, 2.000, "PROMPT_UNEXPECTED", held_s=60),
        *_call(6, 100, 0.040, "SURFACE_CHANGED"),
        {"ago": 99, "event": "step_down", "call_id": f"c{6:016d}", "tool": TOOL, "code": "SURFACE_CHANGED",
         "note": "SURFACE_CHANGED twice in a row; calls c4, c6"},
    ]
    return write_ledger(short_tmp / "state" / "ledger", events, now=NOW)


def test_health_counts_calls_codes_latency_prompts_approvals_and_step_downs(short_tmp: Path) -> None:
    report = compute(_ledger(short_tmp), NOW - 24 * 3600, now=NOW)
    t = report["tools"][TOOL]
    assert (t["calls"], t["ok"]) == (5, 2)
    assert t["codes"] == {"SURFACE_CHANGED": 2, "PROMPT_UNEXPECTED": 1}
    assert t["outcomes"] == {"done": 2, "not_started": 3}
    # received -> finished: 10, 20, 30, 40 ms and the held call's 60 s wait plus 2 s.
    assert t["latency_ms"]["p50"] == 30.0 and t["latency_ms"]["p95"] == 62000.0
    assert t["prompts"] == {"caught": 1, "answered": 1}
    assert t["approvals"]["approved"] == 1 and t["approvals"]["wait_s_p50"] == 60.0
    assert t["step_downs"]["fired"] == 1 and "twice in a row" in t["step_downs"]["last"]
    assert sum(t["calls_per_hour"]) == 5 and len(t["calls_per_hour"]) == 24
    assert t["calls_per_hour"][-2:] == [2, 3]  # 83 and 67 min ago; 50, 34 and 2 min ago


def test_health_text_is_aligned_with_a_trend_and_json_is_for_machines(short_tmp: Path) -> None:
    folder = _ledger(short_tmp)
    text = format_text(compute(folder, NOW - 24 * 3600, now=NOW), folder)
    header, row = text.splitlines()[2:4]
    assert header.startswith("tool") and row.startswith(TOOL)
    assert header.index("calls") + len("calls") == row.index(" 5 ") + 2  # right-aligned under its title
    assert "codes: SURFACE_CHANGED 2, PROMPT_UNEXPECTED 1" in text
    assert "step down: SURFACE_CHANGED twice in a row" in text
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "health", TOOL, "--since", "24h", "--json",
                           "--ledger", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tools"][TOOL]["calls"] == 5


def test_health_says_in_one_line_when_the_ledger_cannot_be_read(short_tmp: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "health", "--ledger", str(short_tmp / "nowhere")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1 and "hint" in done.stderr


def test_sparkline_scales_to_the_busiest_hour_and_fits_its_width() -> None:
    assert sparkline([0, 1, 8]) == " ▁█"
    assert len(sparkline(list(range(168)), width=48)) == 42  # 4 hours a bar


def test_records_of_no_tool_are_no_tools_row(short_tmp: Path) -> None:
    # A summary of refused calls (and a retention record) names no tool: no "" row.
    folder = write_ledger(short_tmp, [*_call(7, 100, 0.01),
                                      {"ago": 50, "event": "rejected", "call_id": "", "tool": "", "caller_uid": 5,
                                       "note": "300 more refused calls of uid 5 in 3 s, not recorded one by one"}])
    assert list(compute(folder, NOW - 3600, now=NOW)["tools"]) == [TOOL]


def test_a_refusal_counts_as_a_call_but_not_in_latency(short_tmp: Path) -> None:
    refused = [{"ago": 60, "event": "received", "call_id": "c9", "tool": TOOL},
               {"ago": 60, "event": "rejected", "call_id": "c9", "tool": TOOL, "outcome": "not_started",
                "code": "BAD_INPUT"}]
    folder = write_ledger(short_tmp, [*_call(7, 100, 0.5), *refused])
    row = compute(folder, NOW - 3600, now=NOW)["tools"][TOOL]
    assert row["calls"] == 2 and row["latency_ms"]["count"] == 1 and row["latency_ms"]["p50"] >= 400


def test_prometheus_format_parses_and_counts_every_record_with_bounded_labels(short_tmp: Path) -> None:
    # Issue 31: what a Prometheus on the host scrapes, read back by the real client's parser.
    from prometheus_client.parser import text_string_to_metric_families

    folder = _ledger(short_tmp)
    held = {"call_id": f"c{7:016d}", "tool": TOOL}
    more = write_ledger(short_tmp / "state2" / "ledger", [{"ago": 50, "event": "received", **held},
                                                           {"ago": 50, "event": "held", **held}], now=NOW)
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "health", "--format", "prometheus", "--ledger",
                           str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    families = {family.name: family for family in text_string_to_metric_families(done.stdout)}
    calls = {(s.labels["outcome"], s.labels["code"]): s.value for s in families["rungd_calls"].samples}
    # Every record the ledger holds (the call 30 h ago too: a counter, not a window).
    assert calls == {("done", "ok"): 3, ("not_started", "SURFACE_CHANGED"): 2, ("not_started", "PROMPT_UNEXPECTED"): 1}
    duration = {(s.name, s.labels.get("le")): s.value for s in families["rungd_call_duration_seconds"].samples}
    assert duration[("rungd_call_duration_seconds_count", None)] == 6
    assert duration[("rungd_call_duration_seconds_bucket", "0.025")] == 2  # 10 and 20 ms
    assert duration[("rungd_call_duration_seconds_bucket", "+Inf")] == 6
    approvals = {s.labels["verdict"]: s.value for s in families["rungd_approvals"].samples}
    assert approvals == {"approved": 1, "denied": 0, "expired": 0}
    assert families["rungd_step_downs"].samples[0].value == 1
    for family in families.values():
        for sample in family.samples:
            assert set(sample.labels) <= {"tool", "outcome", "code", "le", "verdict"}, sample
    # A call held now is a gauge; --textfile writes the file whole for node_exporter.
    textfile = short_tmp / "rungd.prom"
    done = subprocess.run([sys.executable, "-m", "rungd.ctl", "health", "--format", "prometheus", "--ledger",
                           str(more), "--textfile", str(textfile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    families = {family.name: family for family in text_string_to_metric_families(textfile.read_text())}
    assert [(s.labels["tool"], s.value) for s in families["rungd_held_calls"].samples] == [(TOOL, 1)]
    assert not [p for p in short_tmp.iterdir() if p.name.startswith(".rungd.prom")]
    wrong = subprocess.run([sys.executable, "-m", "rungd.ctl", "health", "--ledger", str(more), "--textfile",
                            str(textfile)], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "--format prometheus" in wrong.stderr
