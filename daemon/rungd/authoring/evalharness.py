"""Descriptions tested against tasks: hand a model the exported definitions and a task file,
run the calls it asks for against a daemon, and record what it did.

    report = evaluate(client, load_tasks(Path("examples/tasks/demo.toml")), command_model(["./my-model"]))

The numbers describe the model the user plugs in, on these tasks, today: nothing here is a
property of rungd or of a tool alone.

A model is any callable ``model(request) -> reply``:

    request  {"task": "widget-count", "format": "anthropic", "tools": [<exported definitions>],
              "messages": [<the neutral conversation of examples/agent_loop.py>]}
    reply    {"tool_calls": [{"id": "t1", "name": "...", "arguments": {...}}]} | {"text": "..."}

``command_model(argv)`` runs a program per turn that reads the request as JSON on stdin and
writes the reply as JSON on stdout (any provider, any language); ``module_model("pkg.mod:func")``
imports a Python callable. The harness runs each call once, as asked, with the request_id the
model chose: it never repeats a call and never mints a key.

A task file (TOML):

    [[tasks]]
    id = "widget-count"                     # unique
    prompt = "How many widgets are in stock?"
    expect_tool = "inventory_item_show"     # the tool a correct run ends with
    expect_arguments = { item = "widget" }  # the arguments it must carry (request_id aside)
    max_calls = 3                           # optional: more is counted as over budget

Per task the report holds: the tools chosen, the first call's arguments, the call count, the
bytes of definitions, results and requests, whether a BAD_INPUT was repaired by a later call,
the final outcome, and the counters wrong_tool, missing_arguments, invented_fields,
repeated_calls.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from rungd.client import Client
from rungd.authoring.definitions import Format, export, split_request_id
from rungd.protocol import ToolDefinition

Model = Callable[[dict[str, Any]], dict[str, Any]]
REQUEST_ID = "request_id"
MODEL_TIMEOUT_S = 300.0
MAX_CALLS_PER_REPLY = 16
DRY_RUN_LINE = ("dry run: a throw-away daemon on this config, every program a tool starts through run() a "
                "stand-in that does nothing (a handler that starts one itself, by subprocess, is not stood in "
                "for); a task passes on the tool and arguments the model chose, the stand-ins' answers are shown, "
                "not judged; --live runs the tools for real")
TASK_KEYS = {"id", "prompt", "expect_tool", "expect_arguments", "max_calls"}


class EvalError(Exception):
    """The task file, the model or its reply cannot be used as given; the message has a hint."""


@dataclasses.dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    expect_tool: str
    expect_arguments: dict[str, Any]
    max_calls: int = 3


@dataclasses.dataclass
class TaskRecord:
    """What the model did on one task, and how it scores against the task's expectation."""

    task: str
    tools: list[str] = dataclasses.field(default_factory=list)
    arguments: dict[str, Any] | None = None  # of the first call
    calls: int = 0
    result_bytes: int = 0
    request_bytes: int = 0
    repaired: bool = False
    outcome: str = "no call"  # "status outcome code" of the last call
    text: str | None = None
    wrong_tool: int = 0
    missing_arguments: list[str] = dataclasses.field(default_factory=list)
    invented_fields: list[str] = dataclasses.field(default_factory=list)
    repeated_calls: int = 0
    over_budget: bool = False
    passed: bool = False


@dataclasses.dataclass
class Report:
    definition_bytes: int
    records: list[TaskRecord]
    # Run against stand-ins (rungd.authoring.dryrun): a task passes on the tool and arguments
    # the model chose, the stand-in's answer shown but not judged.
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "definition_bytes": self.definition_bytes, "totals": self.totals(),
                "tasks": [dataclasses.asdict(r) for r in self.records]}

    def totals(self) -> dict[str, int]:
        r = self.records
        return {"tasks": len(r), "passed": sum(x.passed for x in r), "wrong_tool": sum(x.wrong_tool for x in r),
                "missing_arguments": sum(len(x.missing_arguments) for x in r),
                "invented_fields": sum(len(x.invented_fields) for x in r),
                "repeated_calls": sum(x.repeated_calls for x in r), "repaired": sum(x.repaired for x in r),
                "calls": sum(x.calls for x in r)}


def load_tasks(path: Path) -> list[Task]:
    """Read a task file.

    Raises:
        EvalError: it cannot be read, is not TOML, or a task lacks a key or repeats an id.
    """
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise EvalError(f"{path}: cannot read the task file: {exc}; "
                        "hint: examples/tasks/demo.toml shows the format") from None
    tasks, seen = [], set()
    for index, entry in enumerate(raw.get("tasks", [])):
        unknown = sorted(set(entry) - TASK_KEYS) if isinstance(entry, dict) else []
        if unknown:
            raise EvalError(f"{path}: tasks[{index}] has {', '.join(map(repr, unknown))}, which no task has; "
                            f"hint: a task's keys are {', '.join(sorted(TASK_KEYS))}")
        try:
            task = Task(id=str(entry["id"]), prompt=str(entry["prompt"]), expect_tool=str(entry["expect_tool"]),
                        expect_arguments=dict(entry.get("expect_arguments", {})),
                        max_calls=int(entry.get("max_calls", 3)))
        except (KeyError, TypeError, ValueError) as exc:
            raise EvalError(f"{path}: tasks[{index}] lacks or mistypes {exc}; "
                            "hint: every task has id, prompt and expect_tool") from None
        if task.id in seen:
            raise EvalError(f"{path}: task id {task.id!r} appears twice; hint: give each task its own id")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise EvalError(f"{path}: no [[tasks]]; hint: examples/tasks/demo.toml shows the format")
    return tasks


def command_model(argv: list[str], timeout_s: float = MODEL_TIMEOUT_S) -> Model:
    """A model behind a program: the request as JSON on stdin, the reply as JSON on stdout.

    The program is started with ``argv`` as is, never through a shell, once per turn.
    """

    def model(request: dict[str, Any]) -> dict[str, Any]:
        try:
            done = subprocess.run(argv, input=json.dumps(request).encode(), capture_output=True,
                                  timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EvalError(f"the model command {argv[0]!r} could not answer: {exc}; "
                            "hint: run it by hand with a request on stdin") from None
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-300:]
            raise EvalError(f"the model command exited {done.returncode}: {tail}; "
                            "hint: run it by hand with a request on stdin")
        return _reply(done.stdout)

    return model


def module_model(spec: str) -> Model:
    """A model that is a Python callable, named ``package.module:function``.

    Raises:
        EvalError: the module or the function cannot be found.
    """
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise EvalError(f"cannot load the model {spec!r}: {exc}; hint: name it as package.module:function") from None
    if not callable(fn) or inspect.iscoroutinefunction(fn):
        raise EvalError(f"{spec} is not a plain function; hint: wrap an async model in asyncio.run")
    return fn


def _reply(raw: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(raw)
    except ValueError:
        raise EvalError("the model's reply is not JSON; hint: print one JSON object on stdout") from None
    if not isinstance(reply, dict):
        raise EvalError("the model's reply is not a JSON object; hint: {\"tool_calls\": [...]} or {\"text\": \"...\"}")
    return reply


def evaluate(client: Client, tasks: list[Task], model: Model, *, fmt: Format = "anthropic",
             max_turns: int = 6, wait_s: float = 30.0, dry_run: bool = False) -> Report:
    """Run every task once with ``model`` against the daemon ``client`` talks to.

    ``dry_run``: that daemon's programs are stand-ins (``rungd.authoring.dryrun``), whose
    answers say nothing of the model: a task passes on the right tool with the right
    arguments, admitted by the daemon (not BAD_INPUT), whatever the stand-in answered.

    Raises:
        EvalError: the model failed to answer or answered something unusable.
        ClientError: the daemon could not be reached.
    """
    definitions = {t.name: client.describe(t.name) for t in client.list_tools()}
    exported = export(definitions.values(), fmt)
    definition_bytes = len(json.dumps(exported, separators=(",", ":")).encode())
    records = [_run_task(client, task, model, definitions, exported, fmt, max_turns, wait_s, dry_run)
               for task in tasks]
    return Report(definition_bytes, records, dry_run)


def _run_task(client: Client, task: Task, model: Model, definitions: dict[str, ToolDefinition],
              exported: list[dict[str, Any]], fmt: Format, max_turns: int, wait_s: float,
              dry_run: bool) -> TaskRecord:
    record = TaskRecord(task.id)
    seen: list[str] = []
    last_bad: set[str] = set()  # tools whose last call was BAD_INPUT: a later good call repairs it

    def answer(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return _one_call(client, name, arguments, definitions, record, task, seen, last_bad, wait_s, dry_run)

    talk = converse(task, model, {"format": fmt, "tools": exported}, max_turns, answer)
    record.request_bytes, record.result_bytes, record.text = talk.request_bytes, talk.result_bytes, talk.text
    record.over_budget = record.calls > task.max_calls
    return record


@dataclasses.dataclass
class Conversation:
    request_bytes: int = 0
    result_bytes: int = 0
    text: str | None = None  # the model's last words, when it stopped calling


def converse(task: Task, model: Model, request: dict[str, Any], max_turns: int,
             answer: Callable[[str, dict[str, Any]], dict[str, Any]]) -> Conversation:
    """One task's conversation: the model's turns (at most ``max_turns``), each tool call it
    asks for answered by ``answer(name, arguments)`` (arguments that are not a JSON object
    come as ``{"<not JSON>": text}``), until it answers in text.

    Args:
        request: what every request carries besides the task and the messages (the tools, ...).
    """
    talk = Conversation()
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for _turn in range(max_turns):
        asked = {"task": task.id, **request, "messages": messages}
        talk.request_bytes += len(json.dumps(asked, separators=(",", ":")).encode())
        reply = model(asked)
        calls = reply.get("tool_calls") or []
        if not calls:
            talk.text = reply.get("text")
            messages.append({"role": "assistant", "content": reply.get("text") or ""})
            break
        if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
            raise EvalError(f"the model's reply in task {task.id!r} has tool_calls that are not a list of objects; "
                            'hint: {"tool_calls": [{"id": "t1", "name": "...", "arguments": {...}}]}')
        if len(calls) > MAX_CALLS_PER_REPLY:
            raise EvalError(f"the model asked for {len(calls)} tool calls in one reply in task {task.id!r}, over "
                            f"{MAX_CALLS_PER_REPLY}; hint: a task needs a few calls, not a flood")
        messages.append({"role": "assistant", "content": reply.get("text") or "", "tool_calls": calls})
        for call in calls:
            name, arguments = str(call.get("name", "")), call.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = {"<not JSON>": arguments}
            result = answer(name, arguments if isinstance(arguments, dict) else {"<not JSON>": arguments})
            content = json.dumps(result, separators=(",", ":"), ensure_ascii=False)
            talk.result_bytes += len(content.encode())
            messages.append({"role": "tool", "tool_call_id": str(call.get("id", "")), "name": name,
                             "content": content,
                             "is_error": result.get("status") == "error"})
    return talk


def _one_call(client: Client, name: str, arguments: Any, definitions: dict[str, ToolDefinition],
              record: TaskRecord, task: Task, seen: list[str], last_bad: set[str], wait_s: float,
              dry_run: bool) -> dict[str, Any]:
    record.calls += 1
    record.tools.append(name)
    if record.arguments is None:
        record.arguments = arguments
    key = json.dumps([name, arguments], sort_keys=True)
    if key in seen:
        record.repeated_calls += 1
    seen.append(key)
    if name != task.expect_tool:
        record.wrong_tool += 1
    definition = definitions.get(name)
    if definition is not None:
        allowed = set(definition.input_schema.get("properties", {})) | {REQUEST_ID}
        record.invented_fields += sorted(k for k in arguments if k not in allowed)
    if name == task.expect_tool:
        record.missing_arguments += sorted(k for k in task.expect_arguments if k not in arguments
                                           and k not in record.missing_arguments)
    inputs, request_id = split_request_id(arguments, definition)
    envelope = client.call(name, inputs, request_id=request_id, wait_s=wait_s)
    result = msgspec.to_builtins(envelope)
    code = envelope.error.code if envelope.error is not None else "-"
    record.outcome = f"{envelope.status} {envelope.outcome} {code}"
    if code == "BAD_INPUT":
        last_bad.add(name)
    elif name in last_bad:
        record.repaired = True
        last_bad.discard(name)
    wanted = {k: v for k, v in task.expect_arguments.items()}
    answered = code != "BAD_INPUT" if dry_run else envelope.status == "ok"
    record.passed = name == task.expect_tool and answered and all(inputs.get(k) == v for k, v in wanted.items())
    return result


def format_text(report: Report) -> str:
    """One aligned line per task, then the totals."""
    lines = [DRY_RUN_LINE] if report.dry_run else []
    lines += [f"{'task':<20} {'calls':>5} {'tools':<40} {'repair':<6} {'wrong':>5} {'missing':>7} "
             f"{'invented':>8} {'repeat':>6} {'bytes':>7}  outcome"]
    for r in report.records:
        lines.append(f"{r.task:<20} {r.calls:>5} {','.join(r.tools) or '-':<40} {'yes' if r.repaired else 'no':<6} "
                     f"{r.wrong_tool:>5} {len(r.missing_arguments):>7} {len(r.invented_fields):>8} "
                     f"{r.repeated_calls:>6} {r.result_bytes:>7}  {'PASS' if r.passed else 'FAIL'} {r.outcome}")
    totals = report.totals()
    lines.append(f"passed {totals['passed']}/{totals['tasks']}  calls={totals['calls']} "
                 f"wrongTool={totals['wrong_tool']} missingArguments={totals['missing_arguments']} "
                 f"inventedFields={totals['invented_fields']} repeatedCalls={totals['repeated_calls']} "
                 f"repaired={totals['repaired']} definitionBytes={report.definition_bytes}")
    lines.append("these numbers describe the model you plugged in, on these tasks; rerun when it changes")
    return "\n".join(lines)
