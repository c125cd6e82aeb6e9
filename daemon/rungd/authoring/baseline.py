"""``rungctl eval --baseline``: the same tasks through the broad-shell shape, over the same
stand-ins, so a user sees what task-shaped tools buy them.

Seed 001 asks to "compare against the broad-shell baseline using the same contract and
fixture". The baseline arm hands the model one free-text tool per program, the pass-through
shape (``PROGRAM_run(arguments)``: the command line after the program's name). Its words are
split as a shell would split them (``shlex``), with no shell, and the dry run's stand-in is
run with them: nothing real runs, and the model reads back the exit status, stdout and
stderr as text.

Which programs, and which command line a task needs, comes from evidence: before the arms
run, each task's expected tool is called once in the dry run's daemon with the task's
arguments, and the stand-in records the argv the tool's handler started (a write's act, a
read's first program). A baseline task passes when the model ran that program with exactly
that command line. A task whose tool started no program (or, for a write, never reached its
act: a read before it found nothing to parse in the stand-in's output) has no baseline, and
the report lists it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shlex
import subprocess
from pathlib import Path
from typing import Any

from rungd.authoring.definitions import Format, export
from rungd.authoring.evalharness import Model, Report, Task, converse
from rungd.authoring.plugin_check import StandIn, Started
from rungd.authoring.standins import EXAMPLE_ENV, ROLE_ENV
from rungd.client import Client, ClientError
from rungd.protocol import ToolDefinition

RUN_S = 10.0  # a stand-in that does nothing is done long before


@dataclasses.dataclass
class BaselineRecord:
    """What the model did on one task with free-text tools only."""

    task: str
    expected: str = ""  # the command line the task needs, after the program's name
    tools: list[str] = dataclasses.field(default_factory=list)
    calls: int = 0
    result_bytes: int = 0
    request_bytes: int = 0
    outcome: str = "no call"
    passed: bool = False


@dataclasses.dataclass
class Baseline:
    definition_bytes: int
    records: list[BaselineRecord]
    # Tasks whose expected command is not known: nothing to compare a command line with.
    without: list[str] = dataclasses.field(default_factory=list)

    def totals(self) -> dict[str, int]:
        return {"tasks": len(self.records), "passed": sum(r.passed for r in self.records),
                "calls": sum(r.calls for r in self.records)}

    def as_dict(self) -> dict[str, Any]:
        return {"definition_bytes": self.definition_bytes, "totals": self.totals(), "without": self.without,
                "tasks": [dataclasses.asdict(r) for r in self.records]}


def expected_commands(client: Client, stand_in: StandIn, tasks: list[Task], wait_s: float) -> dict[str, Started]:
    """Per task, the program its expected tool started when called with the task's arguments
    (its act, for a write): the command line a free-text call must reproduce."""
    found = {}
    for task in tasks:
        try:
            definition = client.describe(task.expect_tool)
        except ClientError:  # no such tool: the task fails in the tools arm, and has no baseline
            continue
        request_id = f"baseline-{secrets.token_hex(6)}" if definition.requires_request_id else None
        before = len(stand_in.started.get(task.expect_tool, []))
        client.call(task.expect_tool, task.expect_arguments, request_id=request_id, wait_s=wait_s)
        started = stand_in.started.get(task.expect_tool, [])[before:]
        # A write's command is its act's; when the reads before it ended the call (a stand-in
        # prints nothing they can parse), that command is not known, and not guessed.
        ran = [run for run in started if run.role == "act" or not definition.requires_request_id]
        if ran:
            found[task.id] = ran[0]
    return found


def run_baseline(tasks: list[Task], model: Model, expected: dict[str, Started], standin: Path,
                 fmt: Format, max_turns: int) -> Baseline:
    """Run the tasks that have an expected command through ``model`` with one free-text tool
    per program those commands name."""
    programs = _tool_names([run.argv[0] for run in expected.values()])
    exported = export([_definition(name, path) for name, path in sorted(programs.items())], fmt)
    definition_bytes = len(json.dumps(exported, separators=(",", ":")).encode())
    records = []
    for task in tasks:
        if task.id not in expected:
            continue
        records.append(_run_task(task, model, exported, programs, expected[task.id], standin, fmt, max_turns))
    return Baseline(definition_bytes, records, [t.id for t in tasks if t.id not in expected])


def _tool_names(paths: list[str]) -> dict[str, str]:
    """A tool name per program path (``PROGRAM_run``), the same base name numbered apart."""
    names: dict[str, str] = {}
    for path in dict.fromkeys(paths):
        word = re.sub(r"[^a-z0-9_]", "_", os.path.basename(path).lower()).strip("_")[:40] or "program"
        name, n = f"{word}_run", 1
        while name in names:
            n += 1
            name = f"{word}_{n}_run"
        names[name] = path
    return names


def _definition(name: str, path: str) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        description=(f"Runs {path} with the arguments you give and returns its exit status, stdout and stderr. "
                     "Use it for anything that program can do."),
        input_schema={"type": "object", "additionalProperties": False, "required": ["arguments"],
                      "properties": {"arguments": {"type": "string", "description": (
                          f"The command line after {os.path.basename(path)}, as you would type it in a shell "
                          "(it is split into words as a shell would; no shell runs it).")}}},
        side_effect="irreversible", outputs={}, errors=[], deadline_s=RUN_S, commit_point="spawn")


def _run_task(task: Task, model: Model, exported: list[dict[str, Any]], programs: dict[str, str],
              expected: Started, standin: Path, fmt: Format, max_turns: int) -> BaselineRecord:
    record = BaselineRecord(task.id, expected=shlex.join(expected.argv[1:]))

    def answer(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        record.calls += 1
        record.tools.append(name)
        line = str(arguments.get("arguments", ""))
        try:
            right = programs.get(name) == expected.argv[0] and shlex.split(line) == list(expected.argv[1:])
        except ValueError:
            right = False
        # The right command line gets what the tool's own program would have printed (its
        # example_output), as the tools arm did; any other, the stand-in's silence.
        result = _run(programs.get(name), line, standin, expected.example if right else None)
        record.passed |= right
        record.outcome = f"exit {result['exit_status']}" if "exit_status" in result else str(result["error"])[:60]
        return result

    talk = converse(task, model, {"format": fmt, "tools": exported, "arm": "baseline"}, max_turns, answer)
    record.request_bytes, record.result_bytes = talk.request_bytes, talk.result_bytes
    return record


def _run(program: str | None, line: str, standin: Path, example: str | None) -> dict[str, Any]:
    """The pass-through call: split ``line`` without a shell and run the stand-in with it."""
    if program is None:
        return {"status": "error", "error": "no such tool"}
    try:
        words = shlex.split(line)
    except ValueError as exc:
        return {"status": "error", "error": f"cannot split the arguments: {exc}"}
    try:
        env = {**os.environ, ROLE_ENV: "act", **({EXAMPLE_ENV: example} if example is not None else {})}
        done = subprocess.run([str(standin), *words], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=RUN_S, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:  # ValueError: a NUL in a word
        return {"status": "error", "error": f"cannot run: {exc}"}
    return {"exit_status": done.returncode, "stdout": done.stdout.decode(errors="replace")[-2000:],
            "stderr": done.stderr.decode(errors="replace")[-2000:]}


def format_side_by_side(report: Report, baseline: Baseline) -> str:
    """Both arms, task by task: tools chosen, calls, payload bytes, outcome."""
    lines = [f"{'task':<20} {'arm':<9} {'calls':>5} {'tools':<40} {'bytes':>7}  outcome (bytes: of results)"]
    by_task = {r.task: r for r in baseline.records}
    for r in report.records:
        lines.append(f"{r.task:<20} {'tools':<9} {r.calls:>5} {','.join(r.tools) or '-':<40} "
                     f"{r.result_bytes:>7}  {'PASS' if r.passed else 'FAIL'} {r.outcome}")
        b = by_task.get(r.task)
        if b is None:
            lines.append(f"{r.task:<20} {'baseline':<9} {'-':>5} {'-':<40} {'-':>7}  not run: the command its tool "
                         "runs is not known (it started none, or a write's reads before it ended the call)")
            continue
        lines.append(f"{b.task:<20} {'baseline':<9} {b.calls:>5} {','.join(b.tools) or '-':<40} "
                     f"{b.result_bytes:>7}  {'PASS' if b.passed else 'FAIL'} {b.outcome}"
                     + ("" if b.passed else f" (needed: {b.expected[:80]})"))
    tools, base = report.totals(), baseline.totals()
    lines.append(f"tools:    passed {tools['passed']}/{tools['tasks']}  calls={tools['calls']} "
                 f"definitionBytes={report.definition_bytes}")
    lines.append(f"baseline: passed {base['passed']}/{base['tasks']}  calls={base['calls']} "
                 f"definitionBytes={baseline.definition_bytes}  (one free-text tool per program; a task passes "
                 "on the exact command line its tool ran)")
    return "\n".join(lines)
