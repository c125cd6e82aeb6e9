"""What the ledger says about each tool: the numbers behind ``rungctl health``.

Computed from the ledger files alone (no second store), in one pass that decodes only the
fields it needs (``rungd_ledgers.Event``), the way the idempotency index replays:

    calls         final records (``finished``, ``rejected``) by outcome and by error code
    latency       p50 / p95 of received -> finished, from the records' own times (a read's
                  ``finished`` record no longer carries its result, so not elapsed_ms)
    prompts       PROMPT_UNEXPECTED and AUTH_REQUIRED results, and ``answered`` records
                  (a confirmation or credential the daemon gave)
    approvals     held -> approved / denied / expired: how many, and how long they waited
    step downs    ``step_down`` records (an observation fired) and ``resumed`` ones
    trend         calls per hour, oldest first

Blocking, standard library and msgspec only: ``rungctl`` calls it directly.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rungd_ledgers import Event, iter_events

from rungd.core import moments

PROMPT_CODES = ("PROMPT_UNEXPECTED", "AUTH_REQUIRED")
SPARK = "▁▂▃▄▅▆▇█"
MAX_TREND = 48  # hours shown at most; a longer span is shown in wider buckets


class _Tool:
    """Running totals for one tool."""

    __slots__ = ("calls", "outcomes", "codes", "finals", "latencies", "answered", "waits", "verdicts", "step_downs",
                 "last_step_down", "resumed", "hours")

    def __init__(self, buckets: int) -> None:
        self.calls = 0
        self.outcomes: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self.finals: Counter[tuple[str, str]] = Counter()  # (outcome, code) of each final record
        self.latencies: list[float] = []
        self.answered = 0
        self.waits: list[float] = []
        self.verdicts: Counter[str] = Counter()
        self.step_downs = 0
        self.last_step_down: str | None = None
        self.resumed = 0
        self.hours = [0] * buckets


def records(folder: Path) -> Iterator[list[Event]]:
    """The ledger's records in blocks, oldest first (``rungd_ledgers.iter_events``).

    Raises:
        OSError: a file cannot be read (permissions).
        LedgerCorrupt: a line is not a record.
    """
    return iter_events(folder)


def compute(folder: Path, since: float, *, tool: str | None = None, now: float | None = None) -> dict[str, Any]:
    """Per-tool health from the ledger in ``folder``, for events at or after ``since``.

    Args:
        folder: the ledger folder.
        since: unix time; earlier events are skipped (a call received before it and
            finished after it still counts, with its latency).
        tool: only this tool.
        now: the end of the trend, ``time.time()`` by default.

    Returns:
        ``{"since", "until", "hours", "tools": {name: {...}}}``, plain data for ``--json``.

    Raises:
        OSError, LedgerCorrupt: as ``records``.
    """
    now = time.time() if now is None else now
    hours = max(1, math.ceil((now - since) / 3600 - 0.001))  # a span of "24h" parsed a moment ago is 24
    tools: dict[str, _Tool] = {}
    received: dict[str, float] = {}
    held: dict[str, float] = {}
    waiting: dict[str, str] = {}  # calls held now (no verdict, no final record yet): call_id -> tool
    outages = 0
    for block in records(folder):
        for r in block:
            if r.event == "ledger_outage" and r.time >= since:
                outages += 1
                continue
            if (tool is not None and r.tool != tool) or not r.tool:
                continue  # no tool's: a retention record, a summary of refused calls
            event = r.event
            if event == "received":
                received[r.call_id] = r.time
                continue
            if event == "held":
                held[r.call_id] = r.time
                waiting[r.call_id] = r.tool
                continue
            if event in ("approved", "denied", "expired", "finished", "rejected"):
                waiting.pop(r.call_id, None)
            if r.time < since:
                if event in ("finished", "rejected"):
                    received.pop(r.call_id, None)
                continue
            t = tools.get(r.tool)
            if t is None:
                t = tools[r.tool] = _Tool(hours)
            if event == "finished" or event == "rejected":
                t.calls += 1
                t.outcomes[r.outcome or "none"] += 1
                t.codes[r.code or "ok"] += 1
                t.finals[r.outcome or "none", r.code or "ok"] += 1
                start = received.pop(r.call_id, None)
                if start is not None and event == "finished":  # a refusal's 0 ms is no call's latency
                    t.latencies.append((r.time - start) * 1000)
                bucket = int((r.time - since) // 3600)
                if 0 <= bucket < hours:
                    t.hours[bucket] += 1
            elif event == "answered":
                t.answered += 1
            elif event in ("approved", "denied", "expired"):
                t.verdicts[event] += 1
                start = held.pop(r.call_id, None)
                if start is not None:
                    t.waits.append(r.time - start)
            elif event == "step_down":
                t.step_downs += 1
                t.last_step_down = r.note
            elif event == "resumed":
                t.resumed += 1
    return {
        "since": since,
        "until": now,
        "hours": hours,
        "tools": {name: _summary(t) for name, t in sorted(tools.items())},
        "held_now": dict(Counter(waiting.values())),
        "ledger_outages": outages,
    }


def _summary(t: _Tool) -> dict[str, Any]:
    latencies = sorted(t.latencies)
    waits = sorted(t.waits)
    return {
        "calls": t.calls,
        "finals": [[outcome, code, n] for (outcome, code), n in sorted(t.finals.items())],
        "buckets_ms": _buckets(latencies),
        "latency_ms_sum": round(sum(latencies), 3),
        "ok": t.codes.get("ok", 0),
        "outcomes": dict(t.outcomes),
        "codes": {code: n for code, n in t.codes.most_common() if code != "ok"},
        "latency_ms": {"p50": _pct(latencies, 50), "p95": _pct(latencies, 95), "count": len(latencies)},
        "prompts": {"caught": sum(t.codes.get(code, 0) for code in PROMPT_CODES), "answered": t.answered},
        "approvals": {**{k: t.verdicts.get(k, 0) for k in ("approved", "denied", "expired")},
                      "wait_s_p50": _pct(waits, 50), "wait_s_max": round(waits[-1], 1) if waits else None},
        "step_downs": {"fired": t.step_downs, "resumed": t.resumed, "last": t.last_step_down},
        "calls_per_hour": t.hours,
    }


# Call duration histogram bounds, in seconds (Prometheus' defaults, and one more for long writes).
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _buckets(sorted_ms: list[float]) -> list[int]:
    """How many latencies fall at or under each bound of ``BUCKETS_S`` (cumulative)."""
    counts, at = [], 0
    for bound in BUCKETS_S:
        while at < len(sorted_ms) and sorted_ms[at] <= bound * 1000:
            at += 1
        counts.append(at)
    return counts


def prometheus_text(report: dict[str, Any]) -> str:
    """The report in the Prometheus text exposition format (what node_exporter's textfile
    collector and a scrape both read). Labels are bounded: tool names, outcomes and error
    codes, never a request id, a caller or an input. Counters count the ledger's records
    since ``report["since"]`` (0: all it holds; pruning shows as a counter reset)."""
    lines: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        lines.extend((f"# HELP {name} {text}", f"# TYPE {name} {kind}"))

    tools = report["tools"]
    family("rungd_calls_total", "counter", "Calls that ended (finished or refused), by tool, outcome and error code "
           "(ok: none).")
    for tool, t in tools.items():
        for outcome, code, n in t["finals"]:
            lines.append(f'rungd_calls_total{{tool="{_label(tool)}",outcome="{outcome}",code="{code}"}} {n}')
    family("rungd_call_duration_seconds", "histogram", "Time from received to finished, by tool.")
    for tool, t in tools.items():
        for bound, n in zip(BUCKETS_S, t["buckets_ms"]):
            lines.append(f'rungd_call_duration_seconds_bucket{{tool="{_label(tool)}",le="{bound:g}"}} {n}')
        count = t["latency_ms"]["count"]
        lines.append(f'rungd_call_duration_seconds_bucket{{tool="{_label(tool)}",le="+Inf"}} {count}')
        lines.append(f'rungd_call_duration_seconds_sum{{tool="{_label(tool)}"}} {t["latency_ms_sum"] / 1000:.6f}')
        lines.append(f'rungd_call_duration_seconds_count{{tool="{_label(tool)}"}} {count}')
    family("rungd_prompts_answered_total", "counter", "Confirmations and credentials rungd answered, by tool.")
    for tool, t in tools.items():
        lines.append(f'rungd_prompts_answered_total{{tool="{_label(tool)}"}} {t["prompts"]["answered"]}')
    family("rungd_approvals_total", "counter", "Held calls decided, by tool and verdict.")
    for tool, t in tools.items():
        for verdict in ("approved", "denied", "expired"):
            lines.append(f'rungd_approvals_total{{tool="{_label(tool)}",verdict="{verdict}"}} '
                         f'{t["approvals"][verdict]}')
    family("rungd_step_downs_total", "counter", "Step-down observations that fired, by tool.")
    for tool, t in tools.items():
        lines.append(f'rungd_step_downs_total{{tool="{_label(tool)}"}} {t["step_downs"]["fired"]}')
    family("rungd_ledger_outages_total", "counter", "Times the ledger could not be written (new calls were refused "
           "meanwhile), as the daemon recorded once it could write again.")
    lines.append(f"rungd_ledger_outages_total {report.get('ledger_outages', 0)}")
    family("rungd_held_calls", "gauge", "Calls held at a gate now, waiting for an operator, by tool.")
    for tool, n in sorted(report.get("held_now", {}).items()):
        lines.append(f'rungd_held_calls{{tool="{_label(tool)}"}} {n}')
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A label value as the exposition format writes it (a tool name needs none of this)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _pct(values: list[float], p: int) -> float | None:
    """The p-th percentile (nearest rank) of sorted ``values``, or None."""
    if not values:
        return None
    return round(values[max(0, math.ceil(p / 100 * len(values)) - 1)], 1)


def sparkline(counts: list[int], width: int = MAX_TREND) -> str:
    """Counts as bars, at most ``width`` of them (neighbours summed when there are more)."""
    if not counts:
        return ""
    size = math.ceil(len(counts) / width)
    buckets = [sum(counts[i:i + size]) for i in range(0, len(counts), size)]
    top = max(buckets)
    if top == 0:
        return " " * len(buckets)
    return "".join(" " if n == 0 else SPARK[min(len(SPARK) - 1, (n * len(SPARK) - 1) // top)] for n in buckets)


def format_text(report: dict[str, Any], ledger: Path) -> str:
    """Aligned lines for a terminal: one row per tool, then its error codes and step-downs."""
    tools = report["tools"]
    span = report["hours"]
    per = math.ceil(span / MAX_TREND)
    head = (f"since {moments.local(report['since'], '%Y-%m-%d %H:%M %Z')} ({span} h), "
            f"ledger {ledger}")
    if not tools:
        return head + "\nno calls in this span"
    rows = [("tool", "calls", "ok", "error", "unknown", "p50", "p95", "prompts", "approvals", "step-downs",
             f"calls/{'hour' if per == 1 else f'{per}h'}")]
    for name, t in tools.items():
        lat = t["latency_ms"]
        appr = t["approvals"]
        decided = appr["approved"] + appr["denied"] + appr["expired"]
        rows.append((
            name, str(t["calls"]), str(t["ok"]), str(t["calls"] - t["ok"]), str(t["outcomes"].get("unknown", 0)),
            _ms(lat["p50"]), _ms(lat["p95"]),
            f"{t['prompts']['caught']}/{t['prompts']['answered']}",
            f"{decided}" + (f" ({_s(appr['wait_s_p50'])})" if decided else ""),
            str(t["step_downs"]["fired"]), sparkline(t["calls_per_hour"]),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {1, 2, 3, 4, 5, 6, 7, 9}
    lines = [head, ""]
    for n, row in enumerate(rows):
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            continue
        t = tools[row[0]]
        if t["codes"]:
            lines.append("    codes: " + ", ".join(f"{code} {count}" for code, count in t["codes"].items()))
        if t["step_downs"]["last"]:
            lines.append(f"    step down: {t['step_downs']['last']}"
                         + (f" (resumed {t['step_downs']['resumed']}x)" if t["step_downs"]["resumed"] else ""))
    lines.append("")
    lines.append("prompts: caught (PROMPT_UNEXPECTED, AUTH_REQUIRED) / answered by rungd; approvals: decided "
                 "(median wait)")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f}s" if value >= 10_000 else f"{value:.0f}ms"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}s"
