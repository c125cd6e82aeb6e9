"""The MCP bridge answers promptly and says what is going on: a held write answers PENDING at
once, a running call sends progress, a cancelled wait leaves the call running, every tool has
a title, an output schema its results meet and hints from its side effect, and a line nested
too deep gets a JSON-RPC error while the bridge goes on serving.

Driven as tests/client/test_mcp_bridge.py drives it: a real ``rungd serve``, the bridge as a child on
stdio, the SDK's own client.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any

import jsonschema
import pytest
import trio

pytest.importorskip("mcp", reason="the MCP bridge is the optional extra rungd[mcp]; pip install 'rungd[mcp]'")

from mcp import types
from rungd.mcp_bridge import (
    EVIDENCE_TOOL,
    MAX_DEPTH,
    WAIT_TOOL,
    Bridge,
    bridge_tool,
    envelope_schema,
    nesting,
    refusal,
)
from rungd.protocol import ToolDefinition

from tests.conftest import TEST_PLUGINS
from tests.client.test_mcp_bridge import bridge, envelope_of, rungd_daemon, text_of  # noqa: F401 (a fixture)

HELD = {"program": "exit_with", "request_id": "held-1"}


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}", "{TEST_PLUGINS / 'fake_tools.py'}"]
"""


async def test_a_held_write_answers_pending_within_two_seconds_not_after_the_bridges_wait(
    rungd_daemon, short_tmp
) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:  # the default wait: 25 s
        await session.list_tools()
        started = time.monotonic()
        result = await session.call_tool("fake_records_delete", HELD)
        took = time.monotonic() - started
    assert took < 2.5, f"a held call took {took:.1f} s to answer"
    envelope = envelope_of(result)
    assert result.isError is False
    assert (envelope["status"], envelope["next_action"], envelope["outcome"]) == ("pending", "wait_approval",
                                                                                  "not_started")
    assert "an operator must approve it" in envelope["narrow"]


async def test_a_running_call_sends_progress_naming_its_call_id_then_its_result(rungd_daemon, short_tmp) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with bridge(rungd_daemon.socket, short_tmp) as session:
        result = await session.call_tool("test_clock_sleep", {"seconds": 2.5}, progress_callback=on_progress)
    assert result.structuredContent["status"] == "ok" and result.structuredContent["fields"] == {"slept": 2.5}
    assert len(seen) >= 1, "no progress notification while the call ran"
    call_id = result.structuredContent["call_id"]
    assert all(call_id in (message or "") and "still running" in (message or "") for _, _, message in seen)
    assert WAIT_TOOL in (seen[0][2] or "")
    assert [p for p, _, _ in seen] == sorted({p for p, _, _ in seen}), "progress must grow with every report"


async def test_a_cancelled_wait_leaves_the_call_running_and_its_call_id_fetches_the_result(rungd_daemon) -> None:
    messages: list[str] = []

    async def progress(waited: float, message: str) -> None:
        messages.append(message)

    bridge_ = Bridge(rungd_daemon.socket)
    with trio.move_on_after(1.6) as waited:  # the MCP request is cancelled: the bridge stops waiting
        await bridge_.call_tool("test_clock_sleep", {"seconds": 2.5}, progress=progress)
    assert waited.cancelled_caught and messages
    found = re.search(r'"call_id": "(c[0-9a-f]+)"', messages[0])
    assert found, messages[0]
    done = await bridge_.call_tool(WAIT_TOOL, {"call_id": found.group(1), "wait_s": 10})
    assert done.structuredContent["status"] == "ok", text_of(done)
    assert done.structuredContent["fields"] == {"slept": 2.5}


async def test_tools_have_a_title_the_envelope_as_output_schema_and_hints_from_their_side_effect(
    rungd_daemon, short_tmp
) -> None:
    async with bridge(rungd_daemon.socket, short_tmp) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
    expected = {  # name: (title, readOnlyHint, destructiveHint)
        "test_text_echo": ("Test text echo", True, False),  # read
        "fake_write_slow": ("Fake write slow", False, False),  # reversible
        "fake_records_delete": ("Fake records delete", False, True),  # visible
    }
    for name, (title, read_only, destructive) in expected.items():
        tool = listed[name]
        assert tool.title == title
        assert tool.outputSchema == envelope_schema()
        hints = tool.annotations
        assert (hints.readOnlyHint, hints.destructiveHint, hints.idempotentHint, hints.openWorldHint) == (
            read_only, destructive, True, False), name
    for own in (WAIT_TOOL, EVIDENCE_TOOL):
        assert listed[own].title and listed[own].outputSchema["type"] == "object"
        assert listed[own].annotations.readOnlyHint is True
    for tool in listed.values():
        assert tool.outputSchema is not None and tool.outputSchema["type"] == "object", tool.name
        jsonschema.Draft202012Validator.check_schema(tool.outputSchema)


def test_an_irreversible_tool_is_destructive_and_every_tool_idempotent_by_request_id() -> None:
    definition = ToolDefinition(
        name="archive_purge", description="Does: purges.", side_effect="irreversible", outputs={}, errors=[],
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        deadline_s=5, commit_point="spawn", requires_request_id=True)
    tool = bridge_tool(definition)
    assert tool.title == "Archive purge"
    assert (tool.annotations.readOnlyHint, tool.annotations.destructiveHint, tool.annotations.idempotentHint) == (
        False, True, True)
    assert "request_id" in tool.inputSchema["required"]


async def test_every_result_ok_error_pending_or_the_bridges_own_meets_its_tools_output_schema(
    rungd_daemon, short_tmp
) -> None:
    async with bridge(rungd_daemon.socket, short_tmp, wait_s=0.3) as session:
        schemas = {t.name: t.outputSchema for t in (await session.list_tools()).tools}
        results = {
            "ok": await session.call_tool("test_text_echo", {"text": "ab"}),
            "daemon error": await session.call_tool("test_text_echo", {"text": 5}),
            "held": await session.call_tool("fake_records_delete", {**HELD, "request_id": "held-2"}),
            "running": await session.call_tool("test_clock_sleep", {"seconds": 1.0}),
            "bad wait": await session.call_tool(WAIT_TOOL, {"call_id": "c1", "wait_s": 3600}),
            "unknown call": await session.call_tool(WAIT_TOOL, {"call_id": "c0000000000000000"}),
            "unknown evidence": await session.call_tool(EVIDENCE_TOOL, {"evidence_id": "c18f2a3b4c5d6e7f80.1.stdout"}),
        }
        call_id = results["running"].structuredContent["call_id"]
        results["fetched"] = await session.call_tool(WAIT_TOOL, {"call_id": call_id, "wait_s": 10})
    names = {"ok": "test_text_echo", "daemon error": "test_text_echo", "held": "fake_records_delete",
             "running": "test_clock_sleep", "bad wait": WAIT_TOOL, "unknown call": WAIT_TOOL,
             "unknown evidence": EVIDENCE_TOOL, "fetched": WAIT_TOOL}
    statuses = {}
    for what, result in results.items():
        jsonschema.validate(envelope_of(result), schemas[names[what]])
        statuses[what] = (result.structuredContent.get("status"), result.isError)
    assert statuses == {
        "ok": ("ok", False), "daemon error": ("error", True), "held": ("pending", False),
        "running": ("pending", False), "bad wait": ("error", True), "unknown call": ("error", True),
        "unknown evidence": ("error", True), "fetched": ("ok", False),
    }
    assert results["bad wait"].structuredContent["error"]["code"] == "BAD_INPUT"
    assert results["unknown call"].structuredContent["error"]["code"] == "UNKNOWN_CALL"


async def test_an_unreachable_daemon_is_an_error_envelope_that_meets_the_schema(short_tmp) -> None:
    result = await Bridge(short_tmp / "none.sock").call_tool("inventory_count_set", {"request_id": "r1"})
    assert result.isError is True
    jsonschema.validate(result.structuredContent, envelope_schema())
    error = result.structuredContent["error"]
    assert (error["code"], result.structuredContent["outcome"], result.structuredContent["request_id"]) == (
        "UNREACHABLE", "not_started", "r1")


# --- lines the SDK would drop --------------------------------------------------------------


class Lines:
    """JSON lines to and from a child's stdin and stdout, each read bounded in time."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buffer = b""

    async def send(self, line: str | dict[str, Any]) -> None:
        text = line if isinstance(line, str) else json.dumps(line)
        await self.process.stdin.send_all(text.encode() + b"\n")

    async def receive(self) -> dict[str, Any]:
        with trio.fail_after(10):
            while b"\n" not in self.buffer:
                chunk = await self.process.stdout.receive_some(65536)
                assert chunk, "the bridge closed its stdout"
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


async def test_a_line_nested_ten_thousand_deep_gets_a_json_rpc_error_and_the_next_request_an_answer(
    rungd_daemon, short_tmp
) -> None:
    errlog = open(short_tmp / "bridge.stderr", "wb")  # noqa: SIM115 (closed below)
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "rungd.ctl", "--socket", str(rungd_daemon.socket), "mcp"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog)
    try:
        lines = Lines(process)
        await lines.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
        assert (await lines.receive())["id"] == 1
        await lines.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        deep = "[" * 10_000 + "]" * 10_000
        await lines.send('{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_text_echo",'
                         f'"arguments":{{"text":{deep}}}}}}}')
        refused = await lines.receive()
        await lines.send("[" * 10_000)
        nameless = await lines.receive()
        await lines.send("not json")
        garbage = await lines.receive()
        await lines.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                          "params": {"name": "test_text_echo", "arguments": {"text": "still here"}}})
        answered = await lines.receive()
    finally:
        with trio.move_on_after(5):  # end of stdin ends the bridge
            await process.stdin.aclose()
            await process.wait()
        if process.poll() is None:
            process.kill()
            await process.wait()
        errlog.close()
    assert refused["id"] == 2 and refused["error"]["code"] == -32600
    assert f"deeper than {MAX_DEPTH} levels" in refused["error"]["message"]
    assert nameless["id"] is None and nameless["error"]["code"] == -32600
    assert garbage["id"] is None and garbage["error"]["code"] == -32700
    assert answered["id"] == 3 and answered["result"]["structuredContent"]["fields"] == {"text": "still here"}


def test_the_depth_scan_skips_brackets_in_strings_and_finds_the_top_level_id() -> None:
    assert nesting('{"id": "a]]]", "params": {"x": "[[[[", "y": [[1]]}}') == (4, "a]]]")
    assert nesting('{"params": {"id": 7}, "id": 9}') == (2, 9)
    assert nesting("[" * 100_000)[0] == 100_000
    assert refusal('{"jsonrpc": "2.0", "id": 1, "method": "ping"}') is None
    not_a_message = json.loads(refusal('{"id": "x", "hello": 1}'))
    assert (not_a_message["id"], not_a_message["error"]["code"]) == ("x", types.INVALID_REQUEST)
    assert json.loads(refusal('{"id": 1, "method": '))["error"]["code"] == types.PARSE_ERROR
