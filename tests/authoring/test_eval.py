"""`rungctl eval`: a task file run through a scripted stand-in for a model, against a real
daemon with the demo tools; the harness scores what the stand-in did, call by call."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from rungd.authoring.evalharness import EvalError, Task, command_model, evaluate, format_text, load_tasks
from rungd.testing import RunningDaemon

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "demo.toml"
MODEL = Path(__file__).parents[1] / "fakes" / "scripted_model"


async def test_scripted_model_is_scored_per_task(rungd_daemon: RunningDaemon) -> None:
    tasks = load_tasks(TASKS)
    report = await rungd_daemon.run(lambda client: evaluate(client, tasks, command_model([str(MODEL)])))
    got = {r.task: r for r in report.records}
    wrong = got["widget-count"]
    assert wrong.tools == ["inventory_count_set", "inventory_item_show"]
    assert wrong.wrong_tool == 1 and wrong.passed and wrong.calls == 2
    invented = got["gadget-location"]
    assert invented.invented_fields == ["warehouse"]
    assert not invented.passed and invented.outcome.endswith("BAD_INPUT")
    repaired = got["sprocket-recount"]
    assert repaired.repaired and repaired.passed and repaired.calls == 2
    right = got["widget-restock"]
    assert right.passed and right.calls == 1 and right.wrong_tool == 0 and not right.repaired
    assert right.arguments == {"item": "widget", "count": 40, "request_id": "eval-rs-1"}
    assert all(r.result_bytes > 0 and r.request_bytes > report.definition_bytes for r in report.records)
    totals = report.totals()
    assert (totals["passed"], totals["wrong_tool"], totals["invented_fields"], totals["repaired"]) == (3, 1, 1, 1)


async def test_a_repeated_call_and_a_missing_argument_are_counted(rungd_daemon: RunningDaemon) -> None:
    def model(request: dict[str, Any]) -> dict[str, Any]:
        seen = sum(1 for m in request["messages"] if m["role"] == "tool")
        if seen < 2:  # the same call twice, without the count the task needs
            return {"tool_calls": [{"id": f"t{seen}", "name": "inventory_count_set",
                                    "arguments": {"item": "widget", "request_id": "same"}}]}
        return {"text": "gave up"}

    task = Task("t", "Set widgets to 3", "inventory_count_set", {"item": "widget", "count": 3})
    report = await rungd_daemon.run(lambda client: evaluate(client, [task], model))
    [record] = report.records
    assert record.repeated_calls == 1 and record.missing_arguments == ["count"]
    assert not record.passed and not record.repaired and record.text == "gave up"


def test_a_task_file_without_expectations_is_refused_with_a_hint(short_tmp: Path) -> None:
    bad = short_tmp / "tasks.toml"
    bad.write_text('[[tasks]]\nid = "x"\nprompt = "p"\n', encoding="utf-8")
    with pytest.raises(EvalError, match=r"tasks\[0\] lacks .*'expect_tool'.*hint"):
        load_tasks(bad)


async def test_rungctl_eval_prints_a_table_and_json(rungd_daemon: RunningDaemon) -> None:
    argv = [sys.executable, "-m", "rungd.ctl", "--socket", str(rungd_daemon.socket), "eval", "--live", str(TASKS),
            "--model", str(MODEL)]
    done = await trio.run_process([*argv, "--json"], capture_stdout=True, capture_stderr=True, check=False)
    report = json.loads(done.stdout)
    assert report["totals"]["tasks"] == 4 and report["totals"]["wrong_tool"] == 1
    # A task the model failed is a failed run: a CI job gates on the exit status.
    assert report["totals"]["passed"] < 4 and done.returncode == 1, done.stderr.decode()
    text = await trio.run_process(argv[:-2] + ["--model", "/nonexistent/model"], capture_stdout=True,
                                  capture_stderr=True, check=False)
    assert text.returncode == 2
    assert "could not answer" in text.stderr.decode() and "hint:" in text.stderr.decode()


MARKING_TOOL = """
[program]
name = "marker"
command = "{marker}"

[tools.marker_note_add]
side_effect = "reversible"
argv = ["add", "{{note}}"]
confirm = [{{ pattern = '^Add the note\\? \\[y/N\\]$', answer = "y" }}]
verify = {{ tool = "marker_note_show", expect = {{ note = "{{note}}" }} }}
[tools.marker_note_add.inputs.note]
description = "The note."
example = "hello"
pattern = "[a-z]{{1,20}}"
[tools.marker_note_add.description]
does = "Adds a note. A write."
use_when = "you must add a note."
do_not_use_when = "never otherwise."
returns = "effect."
on_error = "TIMEOUT (retry once)."
if_unknown = "ask the user."

[tools.marker_note_show]
argv = ["show"]
parse = {{ kind = "key_value", fields = {{ note = "string" }} }}
[tools.marker_note_show.description]
does = "Shows the note. Changes nothing."
use_when = "you need the note."
do_not_use_when = "never otherwise."
returns = "note."
on_error = "TIMEOUT (retry once)."
if_unknown = "ask the user."
"""


def test_a_dry_run_scores_the_models_choices_and_runs_no_real_program(short_tmp: Path) -> None:
    from rungd.authoring.baseline import format_side_by_side
    from rungd.authoring.dryrun import evaluate_dry
    from rungd.config import load_config

    marker = short_tmp / "ran"
    program = short_tmp / "marker.py"
    program.write_text(f"#!{sys.executable}\nimport pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    program.chmod(0o755)
    (short_tmp / "tools").mkdir()
    (short_tmp / "tools" / "marker.toml").write_text(MARKING_TOOL.format(marker=program))
    config = short_tmp / "rungd.toml"
    config.write_text(f'[server]\nsocket = "{short_tmp}/s.sock"\n[state]\ndir = "{short_tmp}/state"\n'
                      f'[plugins]\ntool_dirs = ["{short_tmp}/tools"]\n[plugins.settings.demo]\n', encoding="utf-8")

    def model(request: dict[str, Any]) -> dict[str, Any]:
        if any(m["role"] == "tool" for m in request["messages"]):
            return {"text": "done"}
        if request.get("arm") == "baseline":  # one free-text tool per program: a command line
            [tool] = request["tools"]
            line = "show" if request["task"] == "show" else "show 'unbalanced"
            return {"tool_calls": [{"id": "b1", "name": tool["name"], "arguments": {"arguments": line}}]}
        names = {t["name"] for t in request["tools"]}
        assert {"marker_note_add", "inventory_count_set"} <= names  # the config's definitions, both kinds
        return {"tool_calls": [{"id": "t1", "name": "marker_note_add",
                                "arguments": {"note": "hello", "request_id": "dry-1"}}]}

    task = Task("note", "Add the note hello", "marker_note_add", {"note": "hello"})
    show = Task("show", "What is the note?", "marker_note_show", {})
    unsplit = Task("unsplit", "What is the note now?", "marker_note_show", {})
    report, baseline = evaluate_dry(load_config(config), [task, show, unsplit], model, baseline=True)
    record = report.records[0]
    assert report.dry_run and record.passed and record.calls == 1, record
    # The stand-in did nothing and said nothing: the read-back could not show the note.
    assert record.outcome.startswith("error "), record.outcome
    assert not marker.exists()  # the real program never ran
    assert "dry run:" in format_text(report).splitlines()[0]
    # The baseline arm: one free-text tool for the program the tool ran ("marker.py"), passed
    # on exactly the command line the tool ran for the task, split without a shell. The
    # write's act was never reached (its read before found nothing to parse): no baseline.
    assert baseline is not None and baseline.without == ["note"]
    right, wrong = baseline.records
    assert right.tools == ["marker_py_run"] and right.passed and right.outcome == "exit 0", right
    assert not wrong.passed and wrong.outcome.startswith("cannot split"), wrong
    side = format_side_by_side(report, baseline)
    assert "baseline: passed 1/2" in side and "not run: the command its tool runs is not known" in side, side


async def test_rungctl_eval_is_a_dry_run_unless_live(short_tmp: Path) -> None:
    config = short_tmp / "rungd.toml"
    config.write_text(f'[server]\nsocket = "{short_tmp}/s.sock"\n[state]\ndir = "{short_tmp}/state"\n'
                      '[plugins.settings.demo]\n', encoding="utf-8")
    argv = [sys.executable, "-m", "rungd.ctl", "--config", str(config), "eval", str(TASKS), "--model", str(MODEL)]
    done = await trio.run_process([*argv, "--json"], capture_stdout=True, capture_stderr=True, check=False)
    report = json.loads(done.stdout)
    # No daemon runs here: the dry run started its own, and the model's choices are scored.
    assert report["dry_run"] and report["totals"]["passed"] == 3, report
    assert done.returncode == 1  # gadget-location's invented field fails the task
    refused = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--socket", str(short_tmp / "s.sock"),
                                      "eval", str(TASKS), "--model", str(MODEL)],
                                     capture_stdout=True, capture_stderr=True, check=False)
    assert refused.returncode == 2 and "add --live" in refused.stderr.decode()


def test_a_reply_whose_tool_calls_are_not_objects_is_one_error() -> None:
    task = Task("t", "p", "x", {})
    with pytest.raises(EvalError, match=r"tool_calls that are not a list of objects; hint:"):
        evaluate_client_free(task, lambda request: {"tool_calls": ["oops"]})
    with pytest.raises(EvalError, match=r"17 tool calls in one reply"):
        evaluate_client_free(task, lambda request: {"tool_calls": [{"name": "x"}] * 17})


def evaluate_client_free(task: Task, model: Any) -> None:
    from rungd.authoring.evalharness import converse

    converse(task, model, {"tools": []}, 3, lambda name, arguments: {})


def test_a_baseline_command_line_with_a_nul_is_an_error_result_not_a_crash(short_tmp: Path) -> None:
    from rungd.authoring.baseline import _run

    assert _run("/bin/true", "show a\x00b", Path("/bin/true"), None)["error"].startswith("cannot run")
