"""What a finished program's exit says: the tool's table of exit statuses, and the words of a
program that wanted a terminal."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping

from rungd.core.contract import ErrorRule
from rungd.core.errors import AuthRequired, Failed, PromptUnexpected, ToolError
from rungd.runner.limits import Limits
from rungd.runner.program import Completed, Program, tail
from rungd.runner.questions import CREDENTIAL_NEEDED, TERMINAL_REQUIRED, is_credential_question


def check_exit(done: Completed, table: Mapping[int, ErrorRule], *, ok: tuple[int, ...] = (0,)) -> None:
    """Map a non-zero exit status through the tool's table.

    Raises:
        ToolError: the status is in the table; its rule gives code, retry and hint.
        Failed: the status is in no table; the hint quotes the redacted stderr tail.
    """
    if done.exit_status in ok:
        return
    rule = table.get(done.exit_status)
    detail = done.stderr_tail(300) or tail(done.stdout, 300)
    if rule is not None:
        # No outcome is declared: a status names what the program says, not what happened.
        # A read ran: done. A write that may have begun is decided by its read-back or settle
        # read at the boundary (engine.outcomes), as an unnamed status is: a program may
        # exit "not found" having created half of it, or "failed" having done it all.
        raise ToolError(rule.code, rule.meaning or f"the program exited with status {done.exit_status}",
                        hint=f"{rule.hint} (it said: {detail!r})" if detail else rule.hint,
                        retry=rule.retry, next_action=rule.next_action)
    status = f"signal {-done.exit_status}" if done.exit_status < 0 else f"status {done.exit_status}"
    # Quoted and labelled like every other quote of a program: its words could pose as rungd's.
    raise Failed(f"the program exited with {status}, which the tool does not name",
                 hint=f"it said: {detail!r}" if detail else "it printed nothing on stderr")


def check_terminal(done: Completed, program: Program, tty: tuple[str, str] | None = None) -> None:
    """Refuse a result whose program wanted a terminal: it asked something nobody answered.

    A child of rungd has no controlling terminal, so opening /dev/tty fails (ENXIO). Some
    programs then fail; others carry on and exit 0 as if a person had answered. Either way
    the call must not end ``ok`` silently.

    Args:
        tty: the program's own words about /dev/tty and the question it had just printed,
            if it said it tried (from the watch).

    Raises:
        AuthRequired: it wanted a terminal for a credential (its question, its failure, or
            what it printed just before, says so).
        PromptUnexpected: it tried to ask something else on /dev/tty, or did not say what for.
    """
    program_name = program.argv[0]
    if tty is not None:
        words, question = tty
        shown = question or words
        # What it said last: a statement that it needs a credential, on stderr, or a status
        # line on stdout (gpg --status-fd 1); never ordinary output ("needs a password reset").
        status = [line for line in done.stdout.splitlines()[-10:] if line.startswith("[GNUPG:]")]
        recent = "\n".join([*done.stderr.splitlines()[-10:], *status])
        if is_credential_question(question) or TERMINAL_REQUIRED.search(words) \
                or CREDENTIAL_NEEDED.search(recent):
            shown = question if is_credential_question(question) else words
            raise AuthRequired(
                f"{program_name} tried to ask for a credential on /dev/tty: {shown!r}",
                hint=f"it said: {words!r}; the operator must provide the credential to rungd for this "
                "tool (askpass, a credential prompt or a credential file)",
                fields={"question": shown})
        raise PromptUnexpected(
            f"{program_name} tried to ask on /dev/tty, which rungd gives no program: {shown!r}",
            hint=f"it said: {words!r}"
            f"{f' after asking {question!r}' if question else ', and not what it wanted to ask'}; "
            "nothing answered it, whatever its exit status. The tool's author must pass the answer as an "
            "argument or an option that skips the question; if it wanted a credential, give it one it reads "
            "without a terminal (a credential file, askpass or a credential prompt) or make it say so "
            "(gpg: --status-fd 2)",
            fields={"question": shown})
    last_words = [line for line in done.stderr.splitlines() if line.strip()][-3:]
    if done.exit_status != 0 and TERMINAL_REQUIRED.search("\n".join(last_words)):
        raise AuthRequired(
            f"{program_name} wanted a terminal to ask for a credential",
            hint=f"it said: {done.stderr_tail(200)!r}; the operator must provide the credential "
            "to rungd for this tool",
            fields={"question": done.stderr_tail(200)},
        )


# What programs print when an allocation or a fork fails (glibc, Python, C++, bash, Go).
_NO_MEMORY = re.compile(r"MemoryError|Cannot allocate memory|out of memory|bad_alloc|memory exhausted"
                        r"|failed to allocate|mmap.*failed", re.IGNORECASE)
_TOO_LARGE = re.compile(r"File too large|EFBIG", re.IGNORECASE)
_NO_PROCESS = re.compile(r"fork.*(Resource temporarily unavailable|retry)|can(no|')t fork|BlockingIOError.*11",
                         re.IGNORECASE)


def check_limits(done: Completed, limits: Limits) -> None:
    """Report a program stopped by one of the call's limits as LIMIT_EXCEEDED, naming it.

    The kernel says so for file size (SIGXFSZ) and CPU time (SIGXCPU). Memory and processes
    show only as a failed allocation or fork, so a failure whose last words say so, under
    such a limit, is reported as that limit.

    Raises:
        ToolError: LIMIT_EXCEEDED, with ``fields.limit`` one of ``file_size``, ``cpu``,
            ``memory``, ``processes``.
    """
    if done.exit_status == 0:
        return
    words = done.stderr_tail(400)
    which = None
    if done.exit_status == -signal.SIGXFSZ or (limits.file_size_bytes is not None and _TOO_LARGE.search(words)):
        which = "file_size"  # a program ignoring SIGXFSZ (Python does) sees EFBIG instead
    elif done.exit_status == -signal.SIGXCPU:
        which = "cpu"
    elif limits.address_space_bytes is not None and _NO_MEMORY.search(words):
        which = "memory"
    elif limits.processes is not None and _NO_PROCESS.search(words):
        which = "processes"
    if which is None:
        return
    raise ToolError(
        "LIMIT_EXCEEDED",
        f"the program hit the call's {which.replace('_', ' ')} limit and was stopped",
        hint=f"it said: {words[-200:]!r}; the operator may raise [limits] in the config or the tool's "
        "own limits if this use is legitimate" if words else "the operator may raise [limits] in the config "
        "or the tool's own limits if this use is legitimate",
        retry="no", next_action="stop", fields={"limit": which})
