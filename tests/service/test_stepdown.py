"""Step-down signals: a program's output changes mid-run and the daemon notices from evidence."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio
from rungd.client import RequestRejected
from rungd.config import load_config
from rungd.core.contract import Description, Heading, NoInputs, Result, StepDown, Tool
from rungd.core.envelope import Envelope, ErrorInfo
from rungd.service.stepdown import StepDownWatch
from rungd.testing import start_daemon, write_config
from rungd_ledgers import iter_records

from tests.conftest import FAKES

STATUS_TOOL = """\
[program]
name = "status"
command = "{command}"

[tools.status_state_show]
argv = ["{folder}"]
deadline_s = 10

[tools.status_state_show.description]
does = "Reads the state of the status program. Changes nothing."
use_when = "you need the state."
do_not_use_when = "never otherwise."
returns = "state."
on_error = "SURFACE_CHANGED (stop)."
if_unknown = "ask the user."

[tools.status_state_show.parse]
kind = "key_value"
fields = {{ state = "string" }}

[tools.status_state_show.heading]
rung = 2
ruled_out = [{{ rung = 1, fails = "present", why = "no API" }}]
step_down = [{{ codes = ["SURFACE_CHANGED"], count = 2, to = "stop: a person checks the program" }}]
session = {{ provided_by = "nobody signs in" }}
"""


def _config(short_tmp: Path, *, suspend: bool) -> tuple[Path, Path]:
    program = short_tmp / "program"
    program.mkdir()
    tools = short_tmp / "tools"
    tools.mkdir()
    (tools / "status.toml").write_text(STATUS_TOOL.format(command=FAKES / "upgraded_status", folder=program))
    config = write_config(short_tmp, f"""
        [plugins]
        tool_dirs = ["{tools}"]

        [gates]
        operator_uids = [{os.getuid()}]

        [step_down]
        suspend = {'true' if suspend else 'false'}
    """)
    return config, program


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rungd.stepdown" and r.levelno == logging.WARNING]


async def test_a_changed_output_fires_the_step_down_suspends_the_tool_and_an_operator_resumes_it(
        short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rungd")
    config_path, program = _config(short_tmp, suspend=True)
    config = load_config(config_path)
    async with trio.open_nursery() as nursery:
        daemon = await start_daemon(nursery, config)
        assert (await daemon.call("status_state_show")).fields == {"state": "ok"}

        (program / "release").write_text("2")  # the vendor update lands while rungd runs
        first = await daemon.call("status_state_show")
        assert first.error is not None and first.error.code == "SURFACE_CHANGED"
        assert (await daemon.run(lambda c: c.describe("status_state_show"))).step_down is None
        assert _warnings(caplog) == []

        second = await daemon.call("status_state_show")
        assert second.error is not None and second.error.code == "SURFACE_CHANGED"
        [warning] = _warnings(caplog)
        assert warning.tool == "status_state_show" and warning.call_id == second.call_id
        message = warning.getMessage()
        assert "SURFACE_CHANGED twice in a row" in message and first.call_id in message and second.call_id in message

        definition = await daemon.run(lambda c: c.describe("status_state_show"))
        assert definition.suspended and "SURFACE_CHANGED twice in a row" in (definition.step_down or "")
        [summary] = [t for t in await daemon.run(lambda c: c.list_tools()) if t.name == "status_state_show"]
        assert summary.suspended and summary.step_down == definition.step_down

        refused = await daemon.call("status_state_show")
        assert refused.error is not None and refused.error.code == "TOOL_SUSPENDED"
        assert (refused.outcome, refused.error.retry, refused.next_action) == ("not_started", "no", "stop")
        assert "rungctl resume status_state_show" in refused.error.hint

        resumed = await daemon.run(lambda c: c.resume("status_state_show"))
        assert resumed.was_suspended and "SURFACE_CHANGED" in (resumed.lifted or "")
        assert (await daemon.run(lambda c: c.describe("status_state_show"))).step_down is None
        # Evidence before the resume no longer counts: one more failure does not fire again.
        again = await daemon.call("status_state_show")
        assert again.error is not None and again.error.code == "SURFACE_CHANGED"
        assert len(_warnings(caplog)) == 1
        # A second one does, and a restarted daemon rebuilds the suspension from the ledger.
        await daemon.call("status_state_show")
        assert len(_warnings(caplog)) == 2
        daemon.daemon.stop()

    events = [r.event for r in iter_records(config.state_dir / "ledger") if r.event in ("step_down", "resumed")]
    assert events == ["step_down", "resumed", "step_down"]
    async with trio.open_nursery() as nursery:
        daemon = await start_daemon(nursery, config)
        refused = await daemon.call("status_state_show")
        assert refused.error is not None and refused.error.code == "TOOL_SUSPENDED"
        (program / "release").write_text("1")  # a person fixed the program
        await daemon.run(lambda c: c.resume("status_state_show"))
        assert (await daemon.call("status_state_show")).status == "ok"
        daemon.daemon.stop()


async def test_without_suspension_the_tool_is_marked_and_keeps_running(
        short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    config_path, program = _config(short_tmp, suspend=False)
    (program / "release").write_text("2")
    async with trio.open_nursery() as nursery:
        daemon = await start_daemon(nursery, load_config(config_path))
        for _ in range(3):
            envelope = await daemon.call("status_state_show")
            assert envelope.error is not None and envelope.error.code == "SURFACE_CHANGED"
        definition = await daemon.run(lambda c: c.describe("status_state_show"))
        assert definition.step_down and not definition.suspended
        assert len(_warnings(caplog)) == 1  # fired once; the mark stays until a resume
        daemon.daemon.stop()


@pytest.mark.skipif(os.getuid() == 0, reason="root is always an operator")
async def test_only_an_operator_may_resume(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, "[gates]\noperator_uids = []\n"))
    async with trio.open_nursery() as nursery:
        daemon = await start_daemon(nursery, config)
        with pytest.raises(RequestRejected, match="may not resume"):
            await daemon.run(lambda c: c.resume("inventory_item_show"))
        daemon.daemon.stop()


# --- the observations themselves, without a daemon ---------------------------------------------


async def _noop(ctx, inputs) -> Result:  # pragma: no cover - never called
    return Result()


def _watch(*observations: StepDown) -> StepDownWatch:
    tool = Tool(name="demo_thing_show", description=Description("d", "u", "n", "r", "e", "i"), inputs=NoInputs,
                outputs={}, handler=_noop, heading=Heading(2, step_down=observations))
    return StepDownWatch(lambda name: tool if name == tool.name else None, None, suspend=False,
                         is_operator=lambda caller: True)


def _result(call_id: str, code: str | None) -> Envelope:
    error = ErrorInfo(code=code, message="m", retry="no", hint="") if code else None
    return Envelope(call_id=call_id, tool="demo_thing_show", status="error" if code else "ok",
                    outcome="done", effect="none", next_action="stop" if code else "continue", error=error)


def test_a_window_counts_only_results_inside_it() -> None:
    watch = _watch(StepDown("PROMPT_UNEXPECTED", count=2, within_s=3600))
    assert watch.observe("demo_thing_show", _result("c1", "PROMPT_UNEXPECTED"), now=0) is None
    assert watch.observe("demo_thing_show", _result("c2", None), now=10) is None  # no row to break
    assert watch.observe("demo_thing_show", _result("c3", "PROMPT_UNEXPECTED"), now=4000) is None  # c1 left
    mark = watch.observe("demo_thing_show", _result("c4", "PROMPT_UNEXPECTED"), now=4100)
    assert mark is not None and mark.call_ids == ("c3", "c4")
    assert mark.observation == "PROMPT_UNEXPECTED twice within 1h"


def test_a_row_is_broken_by_another_result_but_not_by_a_refusal_or_a_repeat() -> None:
    watch = _watch(StepDown("SURFACE_CHANGED", count=2))
    assert watch.observe("demo_thing_show", _result("c1", "SURFACE_CHANGED"), now=0) is None
    assert watch.observe("demo_thing_show", _result("c2", None), now=1) is None  # ran fine: the row breaks
    assert watch.observe("demo_thing_show", _result("c3", "SURFACE_CHANGED"), now=2) is None
    assert watch.observe("demo_thing_show", _result("c4", "BAD_INPUT"), now=3) is None  # ran nothing
    assert watch.observe("demo_thing_show", _result("c3", "SURFACE_CHANGED"), now=4) is None  # a repeat of c3
    assert watch.observe("demo_thing_show", _result("c5", "SURFACE_CHANGED"), now=5) is not None
