"""Tools for bench/runner_bench.py: each wraps one program the benchmark times, through the
real runner, exactly as a plugin for a legacy program would.

Loaded by the benchmark's daemon as a plugin file (``[plugins] files = [...]``). The
programs are /bin/true, the fakes in tests/fakes, and two small Python scripts defined here
(run with ``python -c``, so the benchmark and its baselines run the very same argv).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from rungd import runner
from rungd.core.contract import CallContext, Description, Result, Timing, Tool, ToolInputs
from rungd.core.hookspecs import hookimpl

FAKES = Path(__file__).resolve().parents[1] / "tests" / "fakes"

# The deadline-kill tree: the kill must wait GRACE_S for the SIGTERM-ignoring child.
TREE_DEADLINE_S = 1.0
TREE_GRACE_S = 1.0

# A tree like tests/fakes/doublefork --wait --stubborn-middle, that also writes every pid to
# the file named by argv[1] ("role pid" lines) so the benchmark can watch each one die:
# the parent sleeps (SIGTERM kills it), its child ignores SIGTERM, and the grandchild calls
# setsid() to leave the process group and session, then sleeps.
TREE = r"""
import os, signal, sys, time
def report(role):
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, f"{role} {os.getpid()}\n".encode())
    os.close(fd)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        os.setsid()
        report("grandchild")
        while True:
            time.sleep(3600)
    report("child")
    while True:
        signal.pause()
report("parent")
while True:
    signal.pause()
"""

# An installer asking a question nobody declared, stamping the moment it asked (monotonic
# clock, the same for every process on the machine) into the question itself.
PROMPT = r"""
import sys, time
sys.stdout.write(f"[asked at {time.monotonic():.6f}] Overwrite the existing import? (yes/no) ")
sys.stdout.flush()
sys.exit(0 if sys.stdin.readline().strip() == "yes" else 1)
"""


# A program that asks a question rungd is told to answer; it reports how long after printing
# the question its answer arrived (measured inside the program, on its own clock).
CONFIRM = r"""
import sys, time
sys.stdout.write("Proceed with the import? [y/N] ")
sys.stdout.flush()
asked = time.monotonic()
answer = sys.stdin.readline().strip()
print(f"\nanswered {answer} after {(time.monotonic() - asked) * 1000:.3f} ms")
"""


def confirm_argv() -> tuple[str, ...]:
    return (sys.executable, "-c", CONFIRM)


def tree_argv(pidfile: str) -> tuple[str, ...]:
    return (sys.executable, "-c", TREE, pidfile)


def prompt_argv() -> tuple[str, ...]:
    return (sys.executable, "-c", PROMPT)


def busy_argv(mode: str, seconds: float) -> tuple[str, ...]:
    return (str(FAKES / "busy"), "--mode", mode, "--seconds", str(seconds))


def flood_argv(size: int) -> tuple[str, ...]:
    return (str(FAKES / "flood"), "--bytes", str(size))


def describe(does: str) -> Description:
    return Description(does=does, use_when="benchmarking rungd.", do_not_use_when="not benchmarking.",
                       returns="the program's exit status and output size.", on_error="the runner's codes.",
                       if_unknown="run the benchmark again.")


class NoInputs(ToolInputs):
    pass


class TreeInputs(ToolInputs):
    pidfile: Annotated[str, Field(max_length=200, pattern=r"^/[A-Za-z0-9_./-]+$",
                                  description="Where the tree writes its pids.", examples=["/tmp/tree.pids"])]


class BusyInputs(ToolInputs):
    mode: Annotated[Literal["sleep", "compute", "socket", "progress", "select"],
                    Field(description="How the fake stays quiet.", examples=["sleep"])]
    seconds: Annotated[float, Field(gt=0, le=30, description="How long it works.", examples=[1.0])]


class FloodInputs(ToolInputs):
    size: Annotated[int, Field(ge=0, le=1 << 34, description="Bytes to write to stdout.", examples=[1 << 30])]


class NoteInputs(ToolInputs):
    key: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,40}$", description="The note's name.", examples=["n-1"])]
    text: Annotated[str, Field(max_length=200, description="What the note says.", examples=["hello"])]


async def _run(ctx: CallContext, program: runner.Program) -> Result:
    done = await runner.run(ctx, program)
    return Result(fields={"exit_status": done.exit_status, "stdout_bytes": done.stdout_bytes,
                          "stdout": done.stdout[-200:]},
                  truncated=done.truncated, narrow="full output in evidence" if done.truncated else None)


async def run_true(ctx: CallContext, inputs: NoInputs) -> Result:
    return await _run(ctx, runner.Program(argv=("/bin/true",)))


async def run_true_without_terminal(ctx: CallContext, inputs: NoInputs) -> Result:
    """/bin/true with no daemon-owned terminal: what the terminal costs a read, beside run_true."""
    return await _run(ctx, runner.Program(argv=("/bin/true",), terminal="none"))


async def run_tree(ctx: CallContext, inputs: TreeInputs) -> Result:
    return await _run(ctx, runner.Program(argv=tree_argv(inputs.pidfile), grace_s=TREE_GRACE_S))


async def run_prompt(ctx: CallContext, inputs: NoInputs) -> Result:
    return await _run(ctx, runner.Program(argv=prompt_argv()))


async def run_confirm(ctx: CallContext, inputs: NoInputs) -> Result:
    program = runner.Program(argv=confirm_argv(),
                             confirmations=(runner.Confirmation(re.compile(r"Proceed with the import\?"), "y"),))
    done = await runner.run(ctx, program)
    # A write (only a gated call's confirmation is answered) that changes nothing: the program
    # only says when it read its answer, and that report is the read-back.
    return Result(fields={"exit_status": done.exit_status, "stdout": done.stdout[-200:]}, effect="no_change",
                  verified_by="the program's own report of the answer it read")


async def run_busy(ctx: CallContext, inputs: BusyInputs) -> Result:
    return await _run(ctx, runner.Program(argv=busy_argv(inputs.mode, inputs.seconds)))


async def run_flood(ctx: CallContext, inputs: FloodInputs) -> Result:
    return await _run(ctx, runner.Program(argv=flood_argv(inputs.size)))


class Notes:
    """A durable write done in the daemon itself: write, fsync, read back."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def put(self, ctx: CallContext, inputs: NoteInputs) -> Result:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / inputs.key
        before = path.read_text() if path.exists() else None
        ctx.mark_committed()
        write_durably(path, inputs.text)
        after = path.read_text()
        effect = "no_change" if before == inputs.text else "changed"
        return Result(fields={"key": inputs.key, "text": after}, effect=effect, verified_by="read back the note")


def write_durably(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably (the benchmark's baseline does the same)."""
    temp = path.with_suffix(".tmp-" + os.urandom(4).hex())
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)


@hookimpl
def rungd_register_tools(register: Any, config: Any) -> None:
    register(Tool(name="bench_true_run", description=describe("Runs /bin/true."), inputs=NoInputs,
                  outputs={"exit_status": "exit status"}, handler=run_true, timing=Timing(deadline_s=10)))
    register(Tool(name="bench_true_noterm_run", description=describe("Runs /bin/true with no terminal."),
                  inputs=NoInputs, outputs={"exit_status": "exit status"}, handler=run_true_without_terminal,
                  timing=Timing(deadline_s=10)))
    register(Tool(name="bench_tree_run", description=describe("Runs a tree that resists being killed."),
                  inputs=TreeInputs, outputs={"exit_status": "exit status"}, handler=run_tree,
                  timing=Timing(deadline_s=TREE_DEADLINE_S)))
    register(Tool(name="bench_prompt_run", description=describe("Runs a program that asks a question."),
                  inputs=NoInputs, outputs={"exit_status": "exit status"}, handler=run_prompt,
                  timing=Timing(deadline_s=15)))
    register(Tool(name="bench_confirm_run", description=describe("Runs a program whose question is declared."),
                  inputs=NoInputs, outputs={"exit_status": "exit status", "stdout": "what it printed"},
                  handler=run_confirm, side_effect="reversible", timing=Timing(deadline_s=15)))
    register(Tool(name="bench_busy_run", description=describe("Runs a busy, quiet program."),
                  inputs=BusyInputs, outputs={"exit_status": "exit status"}, handler=run_busy,
                  timing=Timing(deadline_s=30)))
    register(Tool(name="bench_flood_run", description=describe("Runs a program that floods stdout."),
                  inputs=FloodInputs, outputs={"exit_status": "exit status", "stdout_bytes": "bytes"},
                  handler=run_flood, timing=Timing(deadline_s=300)))
    notes = Notes(Path(config.state_dir) / "bench-notes")
    register(Tool(name="bench_note_put", description=describe("Writes a note durably and reads it back."),
                  inputs=NoteInputs, outputs={"key": "name", "text": "what it says"}, handler=notes.put,
                  side_effect="reversible", timing=Timing(deadline_s=10, commit_point="callback")))
