"""``rungctl health`` (reads the ledger files, like ``tail``) and ``rungctl resume`` (asks the daemon)."""

from __future__ import annotations

import time
from pathlib import Path

from rungd_ledgers import LedgerCorrupt

from rungd.service import health as computed
from rungd.ctl.ledger import ledger_folder, parse_since, unreadable
from rungd.ctl.registry import EXIT_OK, CommandFailed, Context, arg, command
from rungd.ctl.show import as_json


@command(
    "health", "per tool: calls, errors, latency, prompts, approvals, step-downs (reads the ledger files)",
    arg("tool", nargs="?", metavar="TOOL", help="only this tool"),
    arg("--since", default="24h", metavar="WHEN",
        help="from WHEN (default 24h): 30m, 6h, 7d, today, '2026-11-30 10:00'"),
    arg("--ledger", type=Path, metavar="DIR", help="read this ledger folder (default: the config's)"),
)
def health(ctx: Context) -> int:
    """Show what the ledger says about each tool since --since: calls by outcome and error
    code, latency p50/p95 (received to finished), prompts caught and answered, approvals
    and how long they waited, step-down signals fired, and calls per hour. With --json, the
    same numbers for a monitoring system.
    """
    since = parse_since(ctx.args.since)
    folder = ledger_folder(ctx, ctx.args.ledger)
    try:
        report = computed.compute(folder, since, tool=ctx.args.tool, now=time.time())
    except OSError as exc:
        raise unreadable(folder, exc) from None
    except LedgerCorrupt as exc:
        raise CommandFailed(f"the ledger at {folder} holds a line that is not a record ({exc}); "
                            f"hint: `rungctl ledger verify {folder}` names it") from None
    report["ledger"] = str(folder)
    print(as_json(report) if ctx.json else computed.format_text(report, folder))
    return EXIT_OK


@command("resume", "lift a tool's step-down mark and suspension (operators)",
         arg("tool", metavar="TOOL", help="the tool marked STEP DOWN in `rungctl tools`"))
def resume(ctx: Context) -> int:
    """Re-enable a tool after a step-down observation fired (and suspended it, when the
    config says so). Check the program first: its output or questions changed. Evidence
    before the resume no longer counts toward the tool's observations."""
    done = ctx.client.resume(ctx.args.tool)
    if ctx.json:
        print(as_json(done))
    elif done.lifted is None:
        print(f"{done.tool} was not marked; nothing to resume")
    else:
        print(f"{done.tool} resumed{' (it was suspended)' if done.was_suspended else ''}; lifted: {done.lifted}")
    return EXIT_OK
