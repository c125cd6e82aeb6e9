"""What one caller can learn or do to another's calls, with real users on the live socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from rungd.config import load_config
from rungd.testing import start_daemon, write_config

MARKS = '''
import time
from pathlib import Path
from typing import Annotated, Any
from pydantic import Field
from rungd.sdk import Description, Result, Tool, ToolInputs, hookimpl

LOG = Path({log!r})

class Mark(ToolInputs):
    item: Annotated[str, Field(max_length=20, description="What to mark.", examples=["a"])]
    pause: Annotated[float, Field(ge=0, le=5, description="Seconds to take.", examples=[0])] = 0

async def add(ctx: Any, inputs: Mark) -> Result:
    import trio
    with LOG.open("a") as log:
        log.write(inputs.item + "\\n")
    await trio.sleep(inputs.pause)
    return Result(fields={{"item": inputs.item}}, effect="changed", verified_by="read the log back")

@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="mark_item_add", inputs=Mark, outputs={{"item": "what was marked"}}, handler=add,
                  side_effect="reversible", description=Description(
                      does="Marks an item.", use_when="testing.", do_not_use_when="not testing.",
                      returns="the item.", on_error="codes.", if_unknown="reconcile.")))
'''

NOBODY = 65534


@pytest.fixture
async def shared_daemon(nursery, short_tmp: Path):
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    log = short_tmp / "marks.log"
    plugin = short_tmp / "marks.py"
    plugin.write_text(textwrap.dedent(MARKS.format(log=str(log))))
    config = load_config(write_config(short_tmp, f'[access]\nuids = [0, {NOBODY}]\n\n'
                                                 f'[plugins]\nfiles = ["{plugin}"]\n'))
    config = config.model_copy(update={"server": config.server.model_copy(update={"socket_mode": "0666"})})
    short_tmp.chmod(0o755)
    daemon = await start_daemon(nursery, config)
    yield daemon, log


def as_nobody(sock: Path, code: str) -> object:
    """Run ``code`` with ``c`` a client connected as uid 65534; returns what it prints as JSON."""
    script = ("import json, os\nimport msgspec\nfrom rungd.client import Client, RequestRejected\n"
              f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
              f"c = Client({str(sock)!r})\n" + textwrap.dedent(code))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_request_ids_belong_to_their_caller(shared_daemon) -> None:
    daemon, log = shared_daemon
    mine = await daemon.call("mark_item_add", {"item": "root"}, request_id="k1")
    assert (mine.status, mine.effect) == ("ok", "changed")
    theirs = await trio.to_thread.run_sync(as_nobody, daemon.socket, f"""
        env = c.call("mark_item_add", {{"item": "nobody"}}, request_id="k1")
        again = c.call("mark_item_add", {{"item": "nobody"}}, request_id="k1")
        try:
            c.status({mine.call_id!r}); seen = "visible"
        except RequestRejected as e:
            seen = e.code
        try:
            c.reconcile("mark_item_add", "k2"); probe = "visible"
        except RequestRejected as e:
            probe = e.code
        print(json.dumps([env.status, env.effect, env.fields, again.effect, seen, probe]))
    """)
    # The same string is another request for another caller: run, not refused, not answered
    # with root's result; root's call cannot be read, nor its request_ids probed.
    assert theirs == ["ok", "changed", {"item": "nobody"}, "existing", "UNKNOWN_CALL", "UNKNOWN_CALL"]
    assert log.read_text().split() == ["root", "nobody"]
    repeat = await daemon.call("mark_item_add", {"item": "root"}, request_id="k1")
    assert (repeat.effect, repeat.fields) == ("existing", {"item": "root"})


async def test_concurrent_repeats_of_a_running_request_run_once_and_say_existing(shared_daemon) -> None:
    daemon, log = shared_daemon
    results = []

    async def one() -> None:
        results.append(await daemon.call("mark_item_add", {"item": "once", "pause": 1}, request_id="same"))

    async with trio.open_nursery() as callers:
        for _ in range(8):
            callers.start_soon(one)
    assert log.read_text().split() == ["once"]
    assert sorted(env.effect for env in results) == ["changed"] + ["existing"] * 7
    assert all(env.status == "ok" for env in results)


async def test_a_non_operator_learns_nothing_from_approving_anothers_call(shared_daemon) -> None:
    daemon, _ = shared_daemon
    env = await daemon.call("mark_item_add", {"item": "x"}, request_id="k3")
    codes = await trio.to_thread.run_sync(as_nobody, daemon.socket, f"""
        out = []
        for call_id in ({env.call_id!r}, "c0000000000000000"):
            for act in (c.approve, c.deny):
                try:
                    act(call_id); out.append("accepted")
                except RequestRejected as e:
                    out.append(e.code)
        print(json.dumps(out))
    """)
    assert codes == ["UNKNOWN_CALL"] * 4  # the same answer whether the call exists or not


async def test_a_tool_you_may_not_call_looks_like_one_that_does_not_exist(nursery, short_tmp) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    config = load_config(write_config(short_tmp, "[access]\nuids = [0]\n\n[access.tools.inventory_item_show]\n"
                                                 f"uids = [0, {NOBODY}]\n"))
    config = config.model_copy(update={"server": config.server.model_copy(update={"socket_mode": "0666"})})
    short_tmp.chmod(0o755)
    daemon = await start_daemon(nursery, config)
    answers = await trio.to_thread.run_sync(as_nobody, daemon.socket, """
        out = []
        for name in ("inventory_count_set", "inventory_count_sat"):   # exists (not allowed), does not
            env = c.call(name, {"item": "widget", "count": 1}, request_id="r")
            try:
                c.describe(name); described = "visible"
            except RequestRejected as e:
                described = [e.code, str(e).replace(name, "NAME")]
            whole = msgspec.to_builtins(env)
            for varies in ("call_id", "tool", "elapsed_ms"):
                whole.pop(varies)
            whole["error"]["message"] = whole["error"]["message"].replace(name, "NAME")
            out.append([env.error.code, env.error.message.replace(name, "NAME"), env.error.hint, described, whole])
        print(json.dumps(out))
    """)
    real, made_up = answers
    assert real[0] == "UNKNOWN_TOOL" and real == made_up  # word for word the same, envelope and all


async def test_a_forbidden_tools_own_cap_and_error_table_do_not_shape_its_refusal(nursery, short_tmp) -> None:
    # A small cap once cut the refusal of a forbidden tool (truncated, "ask for fewer rows")
    # while a made-up name's refusal came whole: the difference told that the tool exists.
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    tools = short_tmp / "tools"
    tools.mkdir()
    source = (Path(__file__).resolve().parents[2] / "configs" / "tools" / "host.toml").read_text()
    (tools / "host.toml").write_text(source.replace("cap_bytes = 1024", "cap_bytes = 300"))
    config = load_config(write_config(short_tmp, f'[access]\nuids = [0, {NOBODY}]\n\n'
                                                 '[access.tools.host_disk_usage_show]\nuids = [0]\n\n'
                                                 f'[plugins]\ntool_dirs = ["{tools}"]\n'))
    config = config.model_copy(update={"server": config.server.model_copy(update={"socket_mode": "0666"})})
    short_tmp.chmod(0o755)
    tools.chmod(0o755)
    daemon = await start_daemon(nursery, config)
    answers = await trio.to_thread.run_sync(as_nobody, daemon.socket, """
        out = []
        for name in ("host_disk_usage_show", "host_disk_usage_shaw"):   # exists (not allowed), does not
            whole = msgspec.to_builtins(c.call(name, {"mount": "/var"}))
            for varies in ("call_id", "tool", "elapsed_ms"):
                whole.pop(varies)
            whole["error"]["message"] = whole["error"]["message"].replace(name, "NAME")
            out.append(whole)
        print(json.dumps(out))
    """)
    real, made_up = answers
    assert real["error"]["code"] == "UNKNOWN_TOOL" and not real["truncated"]
    assert real == made_up
