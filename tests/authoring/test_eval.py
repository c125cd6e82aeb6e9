"""`rungctl eval`: a task file run through a scripted stand-in for a model, against a real
daemon with the demo tools; the harness scores what the stand-in did, call by call."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from rungd.authoring.evalharness import EvalError, Task, command_model, evaluate, load_tasks
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
    argv = [sys.executable, "-m", "rungd.ctl", "--socket", str(rungd_daemon.socket), "eval", str(TASKS),
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
