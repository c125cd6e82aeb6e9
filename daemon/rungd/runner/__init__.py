"""Rung 2: run one legacy command-line program so it cannot hang, lie, or leave debris.

    program = Program(argv=("inventory", "show", item), confirmations=(...,))
    done = await run(ctx, program)          # Completed: exit status, capped text, evidence
    check_exit(done, exit_table)            # map the exit status to the tool's codes

What ``run`` guarantees:

* No shell, and a terminal the daemon holds: argv is passed as is; the child leads a new
  session whose controlling terminal is a pseudo-terminal the daemon holds the master of
  (``rungd.runner.terminal``), while its stdin, stdout and stderr are pipes. What it asks on
  ``/dev/tty`` is seen whole; echo off there is a secret. ``terminal="none"``: no terminal at
  all, and opening ``/dev/tty`` fails with ENXIO.
* stdin is a pipe the runner owns and never closes on its own (end-of-file is an answer
  for many programs): it stays open and silent, carries declared data, or is closed right
  away only when the tool declares ``stdin="eof"``.
* A question is recognised by evidence: when output goes quiet, the runner asks the kernel
  whether a process of the call is blocked reading its stdin or its terminal, or stopped for
  reading the terminal from a background group (``rungd.runner.procwatch``). A
  declared confirmation is answered only when the call passed its gate; a credential
  question is answered only with a credential the tool declared, at most as often as
  declared; anything else kills the tree and raises PromptUnexpected or AuthRequired,
  quoting what the program printed since the last answer. A refused question is never
  answered, not even with nothing: the program is held until the kill.
* The askpass endpoint answers only processes of the call's own tree (peer credentials).
* Output is drained as it comes; head and tail within the cap are kept, and the full
  redacted streams go to evidence files (themselves capped, and saying so; a stream that
  printed nothing has none).
* On the deadline or any cancellation the whole tree dies, descendants that left the
  process group included (``rungd.system.proctree``). Every wait after the kill is bounded.

Where each concern lives:

    program.py         Program, Confirmation, CredentialPrompt, Completed, credential_file_marker: what a plugin
                       hands in and gets back
    environment.py     the child's environment, and credentials looked up for a call
    limits.py          Limits: setrlimit and no_new_privs, applied before exec
    streams.py         output capture: redact, cap, evidence files; Outputs, the call's one
                       epoll of its pipes and exit
    askpass_server.py  the daemon's askpass endpoint (a private one for another user's program)
    launch.py          the daemon's side of starting a program: Launcher, Child, Pipe
    launcher.py        the launcher process: clone3 into the call's cgroup, then exec; its wire
    launcher.c         the same launcher compiled (by hatch_build.py where cc is present): used
                       when built from this source, for a start about 1 ms cheaper
    terminal.py        Terminal: the call's pseudo-terminal, its echo, and answers typed on it
    screen.py          screen programs: Screen, Step, Wait, Read, Band; the emulator, the steps, the cast
    keys.py            named keys as a terminal type sends them, from the host's terminfo
    questions.py       the words of credential questions on stdin, and of programs without a terminal
    watch.py           prompt watching: feed stdin, notice a question, answer or stop
    execute.py         run(): spawn, supervise, kill and reap
    exits.py           check_exit(): exit statuses through the tool's table
"""

from rungd.runner.environment import DEFAULT_PATH, PASS_THROUGH, QUIET_ENV, child_env
from rungd.runner.execute import run
from rungd.runner.exits import check_exit
from rungd.runner.limits import Limits
from rungd.runner.program import Completed, Confirmation, CredentialPrompt, Program, credential_file_marker
from rungd.runner.questions import CREDENTIAL_QUESTION, TERMINAL_REQUIRED
from rungd.runner.screen import Band, Read, Screen, Step, Wait

__all__ = [
    "CREDENTIAL_QUESTION",
    "DEFAULT_PATH",
    "PASS_THROUGH",
    "QUIET_ENV",
    "TERMINAL_REQUIRED",
    "Band",
    "Completed",
    "Confirmation",
    "CredentialPrompt",
    "Limits",
    "Program",
    "Read",
    "Screen",
    "Step",
    "Wait",
    "check_exit",
    "child_env",
    "credential_file_marker",
    "run",
]
