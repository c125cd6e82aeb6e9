"""``rungctl probe``: run a program once as a call would and show what it did (``rungd.authoring.probe``)."""

from __future__ import annotations

import json
import os
import pwd
import shlex
from pathlib import Path

from rungd.authoring.probe import ScreenProbe
from rungd.authoring.probe import probe as run_probe
from rungd.ctl.registry import EXIT_OK, Context, UsageError, arg, command


@command(
    "probe",
    "run a program once as a call would, show what it asked and did, and draft a tool file",
    arg("program", nargs="+", metavar="-- PROGRAM ARGS", help="the program and its arguments, after --"),
    arg("--read", metavar="'CMD ARGS'", help="a read run before and after, to see whether the program acted before "
                                             "asking (split into words; no shell)"),
    arg("--answer", action="append", default=[], metavar="REGEX=TEXT",
        help="type TEXT for a question a line of which REGEX matches (repeatable), to see what it asks next"),
    arg("--deadline", type=float, default=10.0, metavar="S", help="seconds before its whole tree is killed "
                                                                  "(default: 10)"),
    arg("--stdin", choices=["none", "eof"], default="none", help="none: open and silent (default); eof: closed"),
    arg("--no-terminal", action="store_true", help="give it no terminal (a tool's terminal = \"none\")"),
    arg("--user", metavar="ACCOUNT", help="run it as this account, as a tool's user = does (needs root, as the "
                                          "daemon does; a setuid program's question is seen only by root)"),
    arg("--draft", type=Path, metavar="FILE.toml", help="write the drafted tool file here (refuses to overwrite)"),
    arg("--screen", action="store_true", help="run it as a screen program (terminal = \"screen\"): show each screen "
                                              "it draws, with row and column numbers, and draft the steps"),
    arg("--send", action="append", default=[], metavar="KEY|text:WORDS",
        help="with --screen: press KEY (Enter, Down, Tab, F10, Ctrl-X...) or type WORDS, one step each, in order "
             "(repeatable); the screen before each is shown"),
    arg("--term", choices=["xterm-256color", "vt100"], default="xterm-256color", help="with --screen: its TERM"),
    arg("--size", default="24x80", metavar="ROWSxCOLUMNS", help="with --screen: the terminal's size (default 24x80)"),
    arg("--output-fd", type=int, metavar="N", help="with --screen: give it a pipe as descriptor N (3-9) for the "
                                                   "answer it writes there (dialog --output-fd N), and show it"),
)
def probe(ctx: Context) -> int:
    """Run PROGRAM once as a rungd call would: its stdin open and silent, rungd's terminal as
    its /dev/tty, nothing answered (but --answer), its whole tree killed at the deadline.
    Then print what the evidence showed: each question with its exact text and where it came
    (stdin, the terminal, askpass), the terminal's echo (off: a secret), whether --read
    changed before the question (it acts before it asks), the exit status and the output's
    shape; and a draft tool file with the question declared.

    The program really runs, as you: probe a write only against something it may change.

        rungctl probe -- /usr/bin/passwd rungd-test
        rungctl probe --read 'getent passwd alice' --draft alice.toml -- /usr/sbin/userdel alice
        rungctl probe --screen --send Down --send Enter -- /usr/bin/dialog --menu Pick 10 30 3 a A b B
    """
    args = ctx.args
    argv = [word for word in args.program if word != "--"] if args.program[:1] == ["--"] else list(args.program)
    if not argv:
        raise UsageError("name the program after --, e.g. rungctl probe -- /usr/bin/passwd alice")
    if not argv[0].startswith("/"):
        import shutil

        found = shutil.which(argv[0])
        if found is None:
            raise UsageError(f"{argv[0]}: no such program on PATH; hint: give its absolute path")
        argv[0] = found
    answers = []
    for given in args.answer:
        pattern, sep, text = given.rpartition("=")
        if not sep or not pattern:
            raise UsageError(f"--answer {given!r}: give REGEX=TEXT, e.g. --answer 'Continue\\?=y'")
        answers.append((pattern, text))
    if args.user is not None:
        try:
            pwd.getpwnam(args.user)
        except KeyError:
            raise UsageError(f"--user {args.user}: no such account; hint: name an account of this host") from None
        if os.geteuid() != 0:
            raise UsageError(f"--user {args.user}: only root may run a program as another account; hint: run "
                             "rungctl probe with sudo")
    if args.draft is not None and args.draft.exists():
        raise UsageError(f"{args.draft}: refusing to overwrite it; hint: name a new file")
    screen = None
    if args.screen:
        rows, _, columns = args.size.partition("x")
        if not (rows.isdigit() and columns.isdigit() and 10 <= int(rows) <= 200 and 20 <= int(columns) <= 500):
            raise UsageError(f"--size {args.size!r}: give ROWSxCOLUMNS, e.g. 24x80 (10-200 rows, 20-500 columns)")
        if args.output_fd is not None and not 3 <= args.output_fd <= 9:
            raise UsageError(f"--output-fd {args.output_fd}: give a descriptor from 3 to 9, as the program's option "
                             "names it (dialog --output-fd 3)")
        screen = ScreenProbe(tuple(args.send), int(rows), int(columns), args.term, args.output_fd)
    elif args.send or args.output_fd is not None:
        raise UsageError("--send and --output-fd drive a screen program; hint: add --screen")
    try:
        seen = run_probe(argv, deadline_s=args.deadline, read=shlex.split(args.read) if args.read else None,
                         answers=answers, stdin=args.stdin, terminal="none" if args.no_terminal else "line",
                         user=args.user, screen=screen)
    except ValueError as exc:  # a bad --answer pattern, or --read that does not split
        raise UsageError(str(exc)) from None
    draft = seen.draft()
    if ctx.json:
        print(json.dumps({**seen.as_dict(), "draft": draft}, indent=2))
    else:
        print("\n".join(seen.report()))
        if args.draft is None:
            print("\n# --- draft tool file (write it with --draft FILE.toml) ---")
            print(draft, end="")
    if args.draft is not None:
        args.draft.write_text(draft, encoding="utf-8")
        if not ctx.json:
            print(f"\ndraft written to {args.draft}")
    return EXIT_OK
