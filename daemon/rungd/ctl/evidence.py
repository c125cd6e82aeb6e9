"""``rungctl evidence``: read a call's evidence (its full, redacted output) through the daemon.

The text goes to stdout exactly as stored, so ``rungctl evidence ID --all > out.txt`` is the
file; the one line saying what was cut and what to run next goes to stderr.
"""

from __future__ import annotations

import sys

from rungd.ctl.registry import EXIT_OK, Context, UsageError, arg, command
from rungd.ctl.show import as_json
from rungd.service.journal import visible
from rungd.protocol import EvidenceSlice


def _range(flag: str, value: str | None) -> tuple[int | None, int | None]:
    """``A:B``, ``A:`` or ``A`` as two numbers (or None); ``A`` must be given.

    Raises:
        UsageError: not two non-negative whole numbers.
    """
    if value is None:
        return None, None
    first, _, second = value.partition(":")
    try:
        a = int(first)
        b = int(second) if second else None
    except ValueError:
        a = b = -1
    if a < 0 or (b is not None and b < 0):
        example = "0:4096" if flag == "--bytes" else "1:50"
        raise UsageError(f"{flag} {value!r}: expected two whole numbers as FIRST:COUNT; hint: e.g. {flag} {example}, "
                         f"or {flag} {example.split(':')[0]}: for the rest of the file")
    return a, b


def _status(ctx: Context, part: EvidenceSlice) -> str:
    """One line: what this reply held, what was cut, and the command that reads on."""
    what = (f"{part.matches} matching line(s), searched to byte {part.end}" if ctx.args.grep is not None
            else f"bytes {part.offset}-{part.end}")
    line = f"[{part.evidence_id}: {what} of {part.size} bytes, {part.lines} lines"
    if not part.text and ctx.args.grep is None and part.first_line is not None and part.first_line > part.lines:
        line += f"; line {part.first_line} is past the end: it has {part.lines}"
    if part.truncated:
        line += "; cut at the reply cap" if ctx.args.grep is None else "; cut (reply cap or search time)"
    if part.not_kept:
        line += f"; rungd did not keep the {part.not_kept} bytes the program printed past the file's end: {part.not_kept_why}"
    if part.next is None:
        return line + "; end of file]"
    if part.next.offset is not None:
        more = f"--bytes {part.next.offset}:"
    elif ctx.args.grep is not None:
        more = f"--grep {_quote(ctx.args.grep)} --lines {part.next.line}:"
    else:
        more = f"--lines {part.next.line}:"
    return f"{line}] next: rungctl evidence {part.evidence_id} {more} (or --all)"


def _quote(text: str) -> str:
    return text if text.replace("_", "").replace("-", "").isalnum() else "'" + text.replace("'", "'\\''") + "'"


@command(
    "evidence", "read a call's evidence: its full, redacted output, a part at a time",
    arg("evidence_id", metavar="ID", help="an evidence id from an envelope's evidence list (CALL_ID.N.LABEL)"),
    arg("--bytes", metavar="OFFSET:LENGTH", help="a byte range (LENGTH left out: to the end)"),
    arg("--lines", metavar="FIRST:COUNT", help="a line range, from 1 (with --grep: where the search starts, "
        "and at most COUNT matches)"),
    arg("--grep", metavar="TEXT", help="the lines holding TEXT, a literal (not a regular expression)"),
    arg("--all", action="store_true", help="follow the replies' next pointers to the end (each reply is still "
        "capped)"),
    arg("--raw", action="store_true", help="on a terminal too, write the text as stored (by default a terminal "
        "sees its escape sequences and control characters escaped, never obeyed)"),
)
def evidence(ctx: Context) -> int:
    """Print part of one evidence file, as the daemon stored it (redacted).

    Only the call's own caller and operators may read it; for anyone else, and for an id
    never written, the answer is the same UNKNOWN_EVIDENCE. A pruned id answers
    EVIDENCE_GONE with when and why. The text goes to stdout as stored; one line on stderr
    says what was cut and the command that reads on.
    """
    args = ctx.args
    offset, length = _range("--bytes", args.bytes)
    line, count = _range("--lines", args.lines)
    if args.bytes is not None and (args.lines is not None or args.grep is not None):
        raise UsageError("--bytes reads a byte range and cannot be mixed with --lines or --grep; hint: use one "
                         "of --bytes OFFSET:LENGTH, --lines FIRST:COUNT, --grep TEXT [--lines FIRST:]")
    if line == 0:
        raise UsageError("--lines counts from 1; hint: --lines 1:50 reads the first 50 lines")
    request = dict(offset=offset, length=length, line=line, count=count, grep=args.grep)
    while True:
        part = ctx.client.evidence(args.evidence_id, **request)
        if ctx.json:
            print(as_json(part) if not args.all else as_json(part).replace("\n", " "), flush=True)
        else:
            # A program's output is the data it was given: on a terminal its escapes are shown,
            # never run (a retitled window, a cleared screen); a file or a pipe gets it as stored.
            escape = sys.stdout.isatty() and not args.raw
            sys.stdout.write(visible(part.text, lines=True) if escape else part.text)
            sys.stdout.flush()
        if not args.all or part.next is None:
            break
        # Go on from where the daemon says; a grep keeps its text, a line read stops counting.
        if part.next.offset is not None:
            request = dict(offset=part.next.offset)
        else:
            request = dict(line=part.next.line, grep=args.grep)
    if not ctx.json:
        if part.text and not part.text.endswith("\n") and sys.stdout.isatty():
            print()  # on a terminal the status line starts on its own line; a file gets the bytes only
        print(_status(ctx, part), file=sys.stderr)
    return EXIT_OK
