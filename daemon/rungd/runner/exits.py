"""What a finished program's exit says: the tool's table of exit statuses, and the words of a
program that wanted a terminal."""

from __future__ import annotations

from collections.abc import Mapping

from rungd.contract import ErrorRule
from rungd.errors import AuthRequired, Failed, ToolError
from rungd.runner.program import Completed, Program
from rungd.runner.questions import TERMINAL_REQUIRED


def check_exit(done: Completed, table: Mapping[int, ErrorRule], *, ok: tuple[int, ...] = (0,)) -> None:
    """Map a non-zero exit status through the tool's table.

    Raises:
        ToolError: the status is in the table; its rule gives code, retry and hint.
        Failed: the status is in no table; the hint is the redacted stderr tail.
    """
    if done.exit_status in ok:
        return
    rule = table.get(done.exit_status)
    detail = done.stderr_tail(300) or done.stdout[-300:].strip()
    if rule is not None:
        raise ToolError(rule.code, rule.meaning or f"the program exited with status {done.exit_status}",
                        hint=f"{rule.hint} (it said: {detail!r})" if detail else rule.hint,
                        outcome="done", retry=rule.retry, next_action=rule.next_action)
    status = f"signal {-done.exit_status}" if done.exit_status < 0 else f"status {done.exit_status}"
    raise Failed(f"the program exited with {status}, which the tool does not name",
                 hint=detail or "it printed nothing on stderr")


def check_terminal(done: Completed, program: Program) -> None:
    """Refuse a result whose program failed because it wanted a terminal for a credential.

    Raises:
        AuthRequired: it exited non-zero and its last words say it needed a terminal.
    """
    last_words = [line for line in done.stderr.splitlines() if line.strip()][-3:]
    if done.exit_status != 0 and TERMINAL_REQUIRED.search("\n".join(last_words)):
        raise AuthRequired(
            f"{program.argv[0]} wanted a terminal to ask for a credential",
            hint=f"it said: {done.stderr_tail(200)!r}; the operator must provide the credential "
            "to rungd for this tool",
            fields={"question": done.stderr_tail(200)},
        )
