"""The MCP bridge, driven by the MCP SDK's own client over stdio against a real daemon.

The daemon is a real ``rungd serve`` process (``daemon_process``); the bridge is a real child
process speaking MCP on its stdin and stdout, exactly as an MCP host starts ``rungctl mcp``;
the client is ``mcp.client.stdio.stdio_client`` with ``ClientSession``. The SDK is written on
anyio, so it runs here on anyio's Trio backend, in the test's own task.

Why the daemon runs in a process of its own here, and not in the test's nursery as elsewhere:
a daemon makes its process a child subreaper and kills the children of that process that
no call claims and that live in a session of their own (``proctree.Reaper``), and the SDK's
``stdio_client`` starts the bridge in a new session. In the test process the bridge would be
such a child and die before it answered ``initialize``. In production the daemon and the
bridge are separate processes too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

pytest.importorskip("mcp", reason="the MCP bridge is the optional extra rungd[mcp]; pip install 'rungd[mcp]'")

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from rungd.client import Client, ClientError
from rungd.config import Config, load_config
from rungd.authoring.definitions import to_mcp
from rungd.core.envelope import Envelope
from rungd.mcp_bridge import EVIDENCE_TOOL, INSTRUCTIONS, WAIT_TOOL, Bridge, envelope_result
from rungd.testing import write_config

from tests.conftest import TEST_PLUGINS


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}"]
"""


class DaemonProcess:
    """A ``rungd serve`` child serving ``config``, and a helper that calls it (as ``RunningDaemon``)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.socket = config.server.socket

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(client, *args)`` with a fresh client in a worker thread."""

        def blocking() -> Any:
            with Client(self.socket) as client:
                return fn(client, *args)

        return await trio.to_thread.run_sync(blocking)


@asynccontextmanager
async def daemon_process(config_path: Path) -> AsyncIterator[DaemonProcess]:
    """``rungd serve --config config_path`` as a child of the test, ready once it answers hello.

    It stays in the test's session, so a daemon running in the test process would not take
    it for a stray. Stopped with SIGTERM on exit, as systemd stops it; the wait is bounded.
    """
    config = load_config(config_path)
    errpath = config_path.with_suffix(".stderr")
    with open(errpath, "wb") as errlog:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", "import sys; from rungd.main import main; sys.exit(main())",
             "serve", "--config", str(config_path)],
            stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog)
        try:
            running = DaemonProcess(config)
            with trio.fail_after(20):
                while True:
                    try:
                        await running.run(Client.hello)
                        break
                    except ClientError:
                        if process.poll() is not None:
                            raise RuntimeError(f"rungd serve exited {process.returncode}: "
                                               f"{errpath.read_text(errors='replace')}") from None
                        await trio.sleep(0.05)
            yield running
        finally:
            with trio.CancelScope(shield=True):
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    with trio.move_on_after(15):
                        await process.wait()
                    if process.poll() is None:
                        process.kill()
                        await process.wait()


@pytest.fixture
async def rungd_daemon(rungd_config: Config) -> AsyncIterator[DaemonProcess]:
    """This module's daemon: the configuration of ``rungd_config_toml``, in a process of its own."""
    async with daemon_process(Path(rungd_config.source)) as running:
        yield running


@asynccontextmanager
async def bridge(
    socket: Path, short_tmp: Path, *, wait_s: float | None = None, uid: int | None = None
) -> AsyncIterator[ClientSession]:
    """An SDK client session with the bridge running as a child process on stdio.

    With ``uid``, the child switches to that uid after its imports and before it connects
    (the test must run as root), so the daemon learns the bridge's user from SO_PEERCRED,
    as it would in production.
    """
    options = "" if wait_s is None else f", wait_s={wait_s!r}"
    # Import first: this machine's Python may live where the other uid cannot read.
    code = "import os, anyio._backends._asyncio\nfrom rungd.mcp_bridge import run_bridge\n"
    if uid is not None:
        code += f"os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n"
    code += f"raise SystemExit(run_bridge({str(socket)!r}{options}))"
    if uid is None:  # what a user types: rungctl mcp
        args = ["-m", "rungd.ctl", "--socket", str(socket), "mcp", *([] if wait_s is None else ["--wait", str(wait_s)])]
    else:
        args = ["-c", code]
    params = StdioServerParameters(command=sys.executable, args=args, env=dict(os.environ))
    errpath = short_tmp / f"bridge-{uuid.uuid4().hex[:8]}.stderr"
    with open(errpath, "w", encoding="utf-8") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                yield session
        except BaseException as exc:
            exc.add_note(f"bridge stderr:\n{errpath.read_text(encoding='utf-8')}")
            raise


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent)
    return result.content[0].text


def envelope_of(result: types.CallToolResult) -> dict[str, Any]:
    """The result's structured content, once its one text block is checked to mirror it: the
    same value as JSON, on one line of ASCII, so no program text in it can pass for a line,
    a quote or a delimiter of rungd's (issue 27)."""
    text = text_of(result)
    assert json.loads(text) == result.structuredContent, text
    assert text.isascii() and len(text.splitlines()) == 1, text
    return result.structuredContent


async def test_lists_rungd_tools_with_rungds_own_schema(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
    summaries = await rungd_daemon.run(Client.list_tools)
    assert set(listed) == {s.name for s in summaries} | {WAIT_TOOL, EVIDENCE_TOOL}
    for name in ("inventory_item_show", "inventory_count_set", "test_text_echo"):
        definition = await rungd_daemon.run(Client.describe, name)
        expected = to_mcp(definition)
        tool = listed[name]
        assert tool.inputSchema == expected["inputSchema"]
        assert tool.description == definition.description
        assert tool.annotations.model_dump(exclude_none=True) == expected["annotations"]
    write = listed["inventory_count_set"]
    assert "request_id" in write.inputSchema["required"]
    assert write.inputSchema["additionalProperties"] is False
    assert listed["inventory_item_show"].annotations.readOnlyHint is True


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the bridge as a second uid")
async def test_lists_and_calls_only_what_the_bridges_own_uid_may_use(short_tmp) -> None:
    other = 65534
    path = write_config(short_tmp, f"""
        [access]
        uids = [0, {other}]

        [access.tools.inventory_count_set]
        uids = [0]
        """)
    path.write_text(path.read_text().replace("[server]\n", '[server]\nsocket_mode = "0666"\n', 1))
    short_tmp.chmod(0o755)
    async with daemon_process(path) as daemon, bridge(daemon.socket, short_tmp, uid=other) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        denied = await session.call_tool("inventory_count_set", {"item": "widget", "count": 1, "request_id": "u1"})
        read = await session.call_tool("inventory_item_show", {"item": "widget"})
    assert "inventory_item_show" in names and "inventory_count_set" not in names
    assert denied.isError is True and envelope_of(denied)["error"]["code"] == "UNKNOWN_TOOL"
    assert read.isError is False


async def test_read_is_ok_with_the_envelope_as_structured_content(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        result = await session.call_tool("test_text_echo", {"text": "ab", "times": 2})
    assert result.isError is False
    envelope = envelope_of(result)
    assert (envelope["status"], envelope["outcome"], envelope["effect"]) == ("ok", "done", "none")
    assert envelope["fields"] == {"text": "abab"}
    assert (envelope["truncated"], envelope["verified_by"], envelope["error"]) == (False, "echo", None)
    # rungd's verdict first; the tool's fields, which may hold a program's output, last.
    assert list(json.loads(text_of(result)))[:3] == ["call_id", "tool", "status"]
    assert list(json.loads(text_of(result)))[-1] == "fields"


async def test_bad_input_is_an_error_with_the_daemons_hint(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        result = await session.call_tool("inventory_item_show", {"item": "-rf"})
    assert result.isError is True
    envelope = envelope_of(result)
    assert (envelope["error"]["code"], envelope["tool"]) == ("BAD_INPUT", "inventory_item_show")
    assert 'inventory_item_show {"item": "widget"}' in envelope["error"]["hint"]
    assert (envelope["next_action"], envelope["error"]["retry"], envelope["outcome"]) == ("repair", "no", "not_started")


async def test_unknown_tool_is_an_error_naming_the_closest_tool(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        result = await session.call_tool("inventory_itme_show", {"item": "widget"})
    assert result.isError is True
    error = envelope_of(result)["error"]
    assert error["code"] == "UNKNOWN_TOOL" and "inventory_item_show" in error["hint"]


async def test_write_without_request_id_is_an_error_asking_for_one(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        await session.list_tools()
        result = await session.call_tool("inventory_count_set", {"item": "widget", "count": 15})
    assert result.isError is True
    error = envelope_of(result)["error"]
    assert error["code"] == "BAD_INPUT" and "request_id" in error["message"] + error["hint"]
    assert not (rungd_daemon.config.state_dir / "demo" / "inventory.json").exists()


async def test_write_with_request_id_changes_once_and_a_repeat_gets_the_first_result(
    rungd_daemon, short_tmp
) -> None:
    request_id = str(uuid.uuid4())
    arguments = {"item": "widget", "count": 15, "request_id": request_id}
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        await session.list_tools()
        first = await session.call_tool("inventory_count_set", arguments)
        again = await session.call_tool("inventory_count_set", arguments)
    assert first.isError is False, text_of(first)
    envelope = envelope_of(first)
    assert (envelope["status"], envelope["effect"], envelope["request_id"]) == ("ok", "changed", request_id)
    assert envelope["verified_by"]
    # Answered, not run again: the first result, as a repeat under its own call_id.
    repeat = envelope_of(again)
    assert (repeat["status"], repeat["effect"], repeat["fields"]) == ("ok", "existing", envelope["fields"])
    assert repeat["call_id"] != envelope["call_id"]


async def test_slow_call_is_pending_not_success_and_the_wait_tool_fetches_it(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp, wait_s=0.2) as session:
        pending = await session.call_tool("test_clock_sleep", {"seconds": 1.0})
        assert pending.isError is False
        envelope = envelope_of(pending)
        assert (envelope["status"], envelope["outcome"], envelope["error"]) == ("pending", "unknown", None)
        assert "still running" in envelope["narrow"]
        call_id = envelope["call_id"]
        done = await session.call_tool(WAIT_TOOL, {"call_id": call_id, "wait_s": 10})
    assert "Status pending is neither done nor failed" in INSTRUCTIONS and WAIT_TOOL in INSTRUCTIONS
    assert done.isError is False
    assert envelope_of(done)["status"] == "ok"
    assert done.structuredContent["fields"] == {"slept": 1.0}


async def test_wait_tool_rejects_unknown_call_ids_and_bad_arguments(rungd_daemon, short_tmp) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        unknown = await session.call_tool(WAIT_TOOL, {"call_id": "c0000000000000000"})
        bad = await session.call_tool(WAIT_TOOL, {"call_id": "c1", "wait_s": 3600})
        malformed = await session.call_tool(WAIT_TOOL, {"call_id": "c" * 200})
    assert unknown.isError is True and envelope_of(unknown)["error"]["code"] == "UNKNOWN_CALL"
    assert "repeat the original call" in unknown.structuredContent["error"]["hint"]  # expired: the way back
    assert bad.isError is True and envelope_of(bad)["error"]["code"] == "BAD_INPUT"
    # A call_id no daemon could have made says nothing of a call: repair the wait, reconcile nothing.
    assert malformed.isError is True and "repeat the original call" not in text_of(malformed)
    assert "reconcile" not in text_of(malformed), text_of(malformed)


async def test_unreachable_daemon_is_an_error_not_a_success(short_tmp) -> None:
    async with bridge(short_tmp / "nobody.sock", short_tmp) as session:
        result = await session.call_tool("inventory_item_show", {"item": "widget"})
    # The SDK looks the tool up (tools/list) before the call, so the error is that lookup's.
    assert result.isError is True
    assert "cannot connect to rungd" in text_of(result) and "hint: start it" in text_of(result)


async def test_a_connection_lost_mid_call_is_reported_as_unknown_never_as_success(short_tmp) -> None:
    async def go() -> tuple[types.CallToolResult, types.CallToolResult]:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(4096)  # the request arrived; the "daemon" dies before answering
            writer.close()

        arguments = {"item": "widget", "count": 1, "request_id": "r1"}
        async with await asyncio.start_unix_server(hang_up, str(short_tmp / "drop.sock")):
            lost = await Bridge(short_tmp / "drop.sock").call_tool("inventory_count_set", arguments)
        unreachable = await Bridge(short_tmp / "none.sock").call_tool("inventory_count_set", arguments)
        return lost, unreachable

    lost, unreachable = await trio.to_thread.run_sync(lambda: asyncio.run(go()))
    assert lost.isError is True
    envelope = envelope_of(lost)
    assert (envelope["error"]["code"], envelope["outcome"]) == ("BRIDGE_LOST", "unknown")
    assert "same request_id" in envelope["error"]["hint"]
    assert unreachable.isError is True
    assert (envelope_of(unreachable)["error"]["code"], unreachable.structuredContent["outcome"]) == (
        "UNREACHABLE", "not_started")


# --- the mapping itself, for states a demo tool cannot easily reach ------------------------


def test_unknown_outcome_error_carries_its_settle_read_and_the_instructions_say_not_to_repeat() -> None:
    env = _envelope(
        status="error", outcome="unknown", next_action="reconcile",
        error={"code": "TIMEOUT", "message": "deadline of 5s passed", "retry": "after_check", "hint": "run settle"},
        settle={"tool": "inventory_item_show", "inputs": {"item": "widget"}},
    )
    result = envelope_result(env)
    assert result.isError is True
    assert envelope_of(result) == msgspec.to_builtins(env)
    assert result.structuredContent["settle"] == {"tool": "inventory_item_show", "inputs": {"item": "widget"},
                                                  "expect": {}, "before": None}
    assert "reconcile: the effect may or may not have happened: run the settle read" in INSTRUCTIONS
    assert "never repeat the change with a new request_id" in INSTRUCTIONS


def test_held_call_is_pending_awaiting_approval_not_an_error() -> None:
    result = envelope_result(_envelope(status="pending", outcome="not_started", next_action="wait_approval"))
    assert result.isError is False
    assert (envelope_of(result)["status"], result.structuredContent["next_action"]) == ("pending", "wait_approval")
    assert f"wait_approval: a person must approve it first: fetch the result with {WAIT_TOOL}" in INSTRUCTIONS


def test_the_text_is_the_structured_content_even_where_a_json_encoder_would_differ() -> None:
    # A "number" field parsed from a program's "nan": JSON has no NaN, so both say null, as the
    # SDK's own encoder would put it on the wire; characters past ASCII come back from the escapes.
    env = _envelope(status="ok", outcome="done", fields={"ratio": float("nan"), "name": "Zoë \u2028 \u202e"})
    envelope = envelope_of(envelope_result(env))
    assert envelope["fields"] == {"ratio": None, "name": "Zoë \u2028 \u202e"}


def _envelope(**kwargs: object) -> Envelope:
    base = {"call_id": "c0123456789abcdef", "tool": "inventory_count_set", "effect": "none", "request_id": "r1"}
    return msgspec.convert({**base, **kwargs}, Envelope)
