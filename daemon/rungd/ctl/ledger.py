"""``rungctl tail`` and ``rungctl ledger verify``: they read the ledger files, not the socket.

``tail`` behaves as ``journalctl`` users expect: everything by default, ``-n N`` for the
last N, ``--since`` for a time, ``-f`` to follow from the end (after the last 10 lines),
and filters that combine.
"""

from __future__ import annotations

import grp
import os
import re
import select
import sys
import threading
import time
from collections import deque
from datetime import datetime, timedelta
from pathlib import Path

import msgspec
from rungd_ledgers import EVENTS, Anchor, AnchorFileError, LedgerCorrupt, Record, follow, iter_records, read_anchors, verify
from rungd_ledgers.verify import Problem, VerifyReport

from rungd.ctl.registry import EXIT_ERROR_RESULT, EXIT_OK, CommandFailed, Context, UsageError, arg, command
from rungd.ctl.show import as_json, ledger_line
from rungd.service.ledger_upkeep import check_anchor_signature

FOLLOW_LINES = 10  # what `-f` shows of the past, as journalctl and tail do
_AGO = re.compile(r"-?\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*(?:ago)?")
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class LedgerUnreadable(Exception):
    """The ledger folder or a file in it cannot be read by this user."""


def parse_since(text: str, now: float | None = None, *, flag: str = "--since") -> float:
    """Unix time from what ``--since`` (and ``--until``) takes.

    Accepts a span back from now (``30m``, ``1h``, ``2d``, ``1w``, ``-1h``, ``2h ago``),
    ``today`` / ``yesterday`` (local midnight), and an ISO 8601 time (``2026-11-30 10:00``,
    ``2026-11-30T10:00:00+01:00``, ``...Z``); a time without a zone is local time.

    Raises:
        UsageError: none of those.
    """
    now = time.time() if now is None else now
    spoken = text.strip().lower()
    if match := _AGO.fullmatch(spoken):
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    if spoken in ("today", "yesterday"):
        midnight = datetime.fromtimestamp(now).astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        return (midnight - timedelta(days=spoken == "yesterday")).timestamp()
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"{flag} {text!r}: not a time; examples: 30m, 1h, 2d, today, '2026-11-30 10:00', "
                         "2026-11-30T10:00:00+01:00") from None
    return (when if when.tzinfo else when.astimezone()).timestamp()


def ledger_folder(ctx: Context, given: Path | None) -> Path:
    """``given`` (a ledger folder, or a state folder holding ``ledger/``), else the config's.

    Raises:
        ConfigError: no folder given and the config cannot be loaded.
        UsageError: the folder does not exist.
        LedgerUnreadable: this user may not look into it (or the folder above it).
    """
    start = ctx.config.state_dir / "ledger" if given is None else given
    try:
        if given is None:
            if not start.is_dir():
                raise UsageError(f"no ledger at {start}; hint: pass the daemon's --config (or set RUNGD_CONFIG), "
                                 "or give the ledger folder")
            return start
        if (given / "ledger").is_dir() and not any(given.glob("ledger-*.jsonl")):
            return given / "ledger"
        if not given.is_dir():
            raise UsageError(f"{given}: no such folder; hint: give the folder that holds the ledger-NNNNNN.jsonl "
                             "files")
    except PermissionError as exc:  # a folder on the way is not this user's to enter
        raise unreadable(Path(exc.filename or start).parent, exc) from None
    return given


def unreadable(folder: Path, exc: OSError) -> LedgerUnreadable:
    """The one line for a ledger this user may not read: which group may (the folder's), and
    how to join it; a ledger root's alone needs root."""
    try:
        gid = os.stat(folder).st_gid
        group = grp.getgrgid(gid).gr_name
    except (OSError, KeyError):
        gid, group = -1, "rungd"
    where = f"cannot read the ledger at {exc.filename or folder}: {exc.strerror or exc}; hint: "
    if gid == 0:
        return LedgerUnreadable(where + "this ledger is root's alone: run with sudo, or work on a copy (the install "
                                "guide gives the state folder to group rungd, whose members may read it)")
    return LedgerUnreadable(where + f"the ledger is readable by root and group {group}: run as a member (usermod "
                            f"-aG {group} $USER, then log in again) or with sudo, or work on a copy")


def describe_problem(problem: Problem) -> str:
    """One line: where (file, line, seq) and what is wrong, for a person."""
    seq = f"seq {problem.seq}" if problem.seq is not None else "an unreadable record"
    return f"{problem.file} line {problem.line} ({seq}): {problem.kind.replace('_', ' ')}: {problem.explanation}"


@command("ledger verify", "check the ledger's hash chain, and against published anchors (reads the files, "
         "not the socket)",
         arg("path", nargs="?", type=Path, metavar="PATH",
             help="a ledger folder, e.g. a shipped copy (default: the config's state folder)"),
         arg("--anchors", type=Path, metavar="FILE",
             help="anchors the daemon sent to the journal, as JSON lines: journalctl -o json "
                  "_SYSTEMD_UNIT=rungd.service RUNGD_LEDGER_ANCHOR=1 > FILE"),
         arg("--allowed-signers", type=Path, metavar="FILE",
             help="with --anchors: accept only anchors signed by a key in this ssh allowed_signers file"))
def ledger_verify(ctx: Context) -> int:
    """Check every record of the ledger: parse, hash, seq, and link to the record before.

    A ledger pruned by retention starts after seq 1: a pruned record in the files left
    must name the file that ended just before, with the hash the first record left links
    to. With --anchors, each anchor's seq must have the anchor's hash: a chain rewritten
    after the anchor left the host contradicts it.

    Exit 0 when sound, 1 at the first problem, named in one line: file, line, seq and
    what is wrong.
    """
    folder = ledger_folder(ctx, ctx.args.path)
    anchors = read_anchor_file(ctx.args.anchors, ctx.args.allowed_signers) if ctx.args.anchors else []
    try:
        report = verify(folder, anchors)
    except OSError as exc:
        raise unreadable(folder, exc) from None
    if ctx.json:
        print(as_json({"ok": report.ok, "folder": str(folder), "anchors": len(anchors),
                       **msgspec.to_builtins(report)}))
    elif report.problem is None:
        print(f"ledger ok: {report.records} records in {folder}{_pruned_text(report)}{_anchor_text(report, anchors)}")
    else:
        print(f"ledger BROKEN: {describe_problem(report.problem)}; {report.records} records before it are sound "
              f"({folder})")
    return EXIT_OK if report.ok else EXIT_ERROR_RESULT


def read_anchor_file(path: Path, allowed_signers: Path | None) -> list[Anchor]:
    """The anchors in ``path``; with ``allowed_signers``, each must carry a good signature.

    Raises:
        UsageError: the file cannot be read, a line is not an anchor, or the file holds none.
        CommandFailed: an anchor is unsigned or not signed by an allowed key.
    """
    try:
        with open(path, "rb") as file:
            anchors = read_anchors(file)
    except OSError as exc:
        raise UsageError(f"--anchors {path}: {exc.strerror or exc}; hint: export them with journalctl -o json "
                         "_SYSTEMD_UNIT=rungd.service RUNGD_LEDGER_ANCHOR=1 > FILE") from None
    except AnchorFileError as exc:
        raise UsageError(f"--anchors {path}: {exc}; hint: give journalctl -o json output (one entry a line) or "
                         'lines like {"seq": 12, "hash": "<64 hex>"}') from None
    if not anchors:
        raise UsageError(f"--anchors {path}: no anchors in it (no entry with RUNGD_LEDGER_ANCHOR=1); hint: is "
                         "ledger.anchor_every_s 0, or was the export filtered to another unit?")
    if allowed_signers is not None:
        for anchor in anchors:
            try:
                signer = check_anchor_signature(allowed_signers, anchor)
            except OSError as exc:
                raise UsageError(f"cannot check anchor signatures: {exc}; hint: install openssh-client") from None
            if signer is None:
                raise CommandFailed(f"{anchor.describe()} (seq {anchor.seq}) is not signed by a key in "
                                    f"{allowed_signers}; hint: an anchor anyone on the host could have logged "
                                    "proves nothing: set ledger.anchor_key, or export only the daemon's entries")
    return anchors


def _pruned_text(report: VerifyReport) -> str:
    if report.first_seq <= 1:
        return ""
    files = len(report.pruned)
    return (f"; seq 1 to {report.first_seq - 1} were pruned by retention (the pruned records left name {files} "
            f"file(s), the last ending at seq {report.first_seq - 1}), and the files left continue that chain")


def _anchor_text(report: VerifyReport, anchors: list[Anchor]) -> str:
    if not anchors:
        return ""
    text = f"; {report.anchors_checked} of {len(anchors)} anchors agree"
    if report.anchors_pruned:
        text += f", {report.anchors_pruned} fall inside pruned files and cannot be checked"
    return text


@command(
    "tail", "print ledger events, like journalctl (reads the files, not the socket)",
    arg("-n", "--lines", type=int, metavar="N", help=f"only the last N matching events (default: all; "
        f"{FOLLOW_LINES} with -f)"),
    arg("--since", metavar="WHEN", help="only events at or after WHEN: 30m, 1h, 2d, today, '2026-11-30 10:00', or "
        "an ISO 8601 time with zone"),
    arg("--until", metavar="WHEN", help="only events at or before WHEN (the forms --since takes)"),
    arg("-o", "--output", choices=["short", "json", "json-pretty"], default=None,
        help="short: one line each (default); json: JSON Lines (as --json); json-pretty: indented JSON"),
    arg("-f", "--follow", action="store_true", help="keep printing new events as they are written"),
    arg("--tool", metavar="NAME", help="only this tool's events"),
    arg("--outcome", choices=["done", "not_started", "unknown"], help="only events with this outcome"),
    arg("--call", metavar="CALL_ID", help="only this call's events"),
    arg("--request-id", metavar="ID", help="only events of calls with this request_id"),
    arg("--event", action="append", choices=sorted(EVENTS), metavar="EVENT",
        help=f"only this kind of event; repeat for more ({', '.join(sorted(EVENTS))})"),
    arg("--ledger", type=Path, metavar="DIR", help="read this ledger folder (default: the config's)"),
)
def tail(ctx: Context) -> int:
    """Print ledger events, oldest first, one line each: time with zone, seq, event,
    call_id, tool, then request_id, outcome, effect, code, caller, approver (by=) and note
    (a deny reason). With -o json (or --json), the records as JSON Lines; -o json-pretty,
    indented. --since and --until bound the time, as journalctl's do.
    """
    args = ctx.args
    if args.lines is not None and args.lines < 0:
        raise UsageError(f"-n {args.lines}: give a count of 0 or more")
    since = parse_since(args.since) if args.since else None
    until = parse_since(args.until, flag="--until") if args.until else None
    if since is not None and until is not None and until < since:
        raise UsageError(f"--until {args.until!r} is before --since {args.since!r}: nothing could match")
    output = args.output or ("json" if ctx.json else "short")
    folder = ledger_folder(ctx, args.ledger)
    limit = args.lines if args.lines is not None else FOLLOW_LINES if args.follow else None

    def wanted(record: Record) -> bool:
        return ((since is None or record.time >= since)
                and (until is None or record.time <= until)
                and (args.tool is None or record.tool == args.tool)
                and (args.outcome is None or record.outcome == args.outcome)
                and (args.call is None or record.call_id == args.call)
                and (args.request_id is None or record.request_id == args.request_id)
                and (args.event is None or record.event in args.event))

    def emit(record: Record) -> None:
        if output == "short":
            text = ledger_line(record)
        elif output == "json":
            text = msgspec.json.encode(record).decode()
        else:
            text = as_json(msgspec.to_builtins(record))
        print(text, flush=args.follow)

    try:
        last_seq = 0
        shown: deque[Record] | list[Record] = deque(maxlen=limit) if limit is not None else []
        for record in iter_records(folder):
            last_seq = record.seq
            if wanted(record):
                if limit is None:
                    emit(record)  # all of it: print as it is read, not after the whole file
                else:
                    shown.append(record)
        for record in shown:
            emit(record)
        if args.follow:
            for record in follow(folder, since_seq=last_seq, stop=_UntilReaderGone(sys.stdout.fileno())):
                if wanted(record):
                    emit(record)
    except OSError as exc:
        raise unreadable(folder, exc) from None
    except LedgerCorrupt as exc:
        raise CommandFailed(f"the ledger at {folder} holds a line that is not a record ({exc}); "
                            f"hint: `rungctl ledger verify {folder}` names it") from None
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a follow ends
    return EXIT_OK


class _UntilReaderGone(threading.Event):
    """Set once whoever reads our stdout is gone (a pipe's reader closed it, a terminal hung
    up, the ssh connection of ``rungctl --host ... tail -f`` ended): a follow that prints
    rarely would otherwise learn it only at its next write, which may never come."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def is_set(self) -> bool:
        if super().is_set():
            return True
        poller = select.poll()
        poller.register(self._fd, 0)  # errors and hang-ups are reported whatever is asked
        try:
            gone = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
        except OSError:
            gone = False
        if gone:
            self.set()
        return gone

    def wait(self, timeout: float | None = None) -> bool:
        super().wait(timeout)
        return self.is_set()

