"""``rungctl health`` (reads the ledger files, like ``tail``) and ``rungctl resume`` (asks the daemon)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rungd_ledgers import LedgerCorrupt

from rungd.service import health as computed
from rungd.ctl.ledger import ledger_folder, parse_since, unreadable
from rungd.ctl.registry import EXIT_OK, CommandFailed, Context, UsageError, arg, command
from rungd.ctl.show import as_json


@command(
    "health", "per tool: calls, errors, latency, prompts, approvals, step-downs (reads the ledger files)",
    arg("tool", nargs="?", metavar="TOOL", help="only this tool"),
    arg("--since", default=None, metavar="WHEN",
        help="from WHEN (default 24h; prometheus: everything): 30m, 6h, 7d, today, '2026-11-30 10:00'"),
    arg("--ledger", type=Path, metavar="DIR", help="read this ledger folder (default: the config's)"),
    arg("--format", choices=["text", "json", "prometheus"], default=None,
        help="text (default), json (as --json), or prometheus: the text exposition format, counting every record "
             "the ledger holds unless --since is given"),
    arg("--textfile", type=Path, metavar="FILE.prom",
        help="with --format prometheus: write FILE.prom atomically (node_exporter's textfile collector) instead of "
             "printing"),
)
def health(ctx: Context) -> int:
    """Show what the ledger says about each tool since --since: calls by outcome and error
    code, latency p50/p95 (received to finished), prompts caught and answered, approvals
    and how long they waited, step-down signals fired, and calls per hour. With --json, the
    same numbers for a monitoring system.
    """
    args = ctx.args
    form = args.format or ("json" if ctx.json else "text")
    if args.textfile is not None and form != "prometheus":
        raise UsageError("--textfile writes the prometheus format; hint: add --format prometheus")
    # A scrape wants totals (counters): all the ledger holds, unless a window is asked for.
    since = parse_since(args.since) if args.since is not None else 0.0 if form == "prometheus" else \
        parse_since("24h")
    folder = ledger_folder(ctx, args.ledger)
    try:
        report = computed.compute(folder, since, tool=ctx.args.tool, now=time.time())
    except OSError as exc:
        raise unreadable(folder, exc) from None
    except LedgerCorrupt as exc:
        raise CommandFailed(f"the ledger at {folder} holds a line that is not a record ({exc}); "
                            f"hint: `rungctl ledger verify {folder}` names it") from None
    report["ledger"] = str(folder)
    if form == "prometheus":
        text = computed.prometheus_text(report)
        if args.textfile is None:
            print(text, end="")
        else:
            _write_atomically(args.textfile, text)
    else:
        print(as_json(report) if form == "json" else computed.format_text(report, folder))
    return EXIT_OK


def _write_atomically(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a collector never reads half a file): a temporary
    file beside it, then a rename.

    Raises:
        UsageError: the folder cannot take it (missing, not writable).
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        temporary.chmod(0o644)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}; hint: give a file in a folder you may write "
                         "(node_exporter's --collector.textfile.directory)") from None


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
