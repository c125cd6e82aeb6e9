"""examples/agent_loop.py against a real daemon, with a scripted stand-in for the model.

The loop is asyncio code (it runs on ``rungd.aclient.AsyncClient``); each test runs it with
``asyncio.run`` in a worker thread while the daemon serves in the test's Trio nursery.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from rungd.aclient import AsyncClient

from tests.conftest import TEST_PLUGINS

EXAMPLE = Path(__file__).parents[2] / "examples" / "agent_loop.py"
_spec = importlib.util.spec_from_file_location("rungd_example_agent_loop", EXAMPLE)
agent_loop = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = agent_loop  # dataclasses look their module up by name
_spec.loader.exec_module(agent_loop)


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}"]
"""


class Script:
    """A model that answers from a list of canned replies and keeps what it was shown."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        self.seen.append(([dict(m) for m in messages], tools))
        return self.replies.pop(0)


class CountingClient:
    """An AsyncClient that counts the ``call`` requests it sends."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self.calls: list[tuple[str, dict[str, Any], str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def call(self, tool: str, inputs: dict[str, Any] | None = None, **kw: Any) -> Any:
        self.calls.append((tool, dict(inputs or {}), kw.get("request_id")))
        return await self._client.call(tool, inputs, **kw)


async def run_loop(socket: Path, model: Script, task: str = "task", **kw: Any) -> tuple[Any, CountingClient]:
    async def go() -> tuple[Any, CountingClient]:
        async with AsyncClient(socket) as client:
            counting = CountingClient(client)
            return await agent_loop.run_agent(model, counting, task, **kw), counting

    return await trio.to_thread.run_sync(lambda: asyncio.run(go()))


def call(id_: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"id": id_, "name": name, "arguments": arguments}]}


def fed_back(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m["role"] == "tool"]


async def test_loop_runs_calls_feeds_back_envelopes_and_the_model_repairs_an_error(rungd_daemon) -> None:
    model = Script([
        call("t1", "inventory_item_show", {"item": "-rf"}),
        call("t2", "inventory_item_show", {"item": "widget"}),
        call("t3", "inventory_count_set", {"item": "widget", "count": 15, "request_id": "loop-1"}),
        {"text": "widget is at 15"},
    ])
    result, client = await run_loop(rungd_daemon.socket, model, "Set the widget count to 15.")
    assert (result.stopped, result.text, result.turns) == ("text", "widget is at 15", 4)
    assert [(r.id, r.name) for r in result.runs] == [
        ("t1", "inventory_item_show"), ("t2", "inventory_item_show"), ("t3", "inventory_count_set")]
    assert client.calls == [
        ("inventory_item_show", {"item": "-rf"}, None),
        ("inventory_item_show", {"item": "widget"}, None),
        ("inventory_count_set", {"item": "widget", "count": 15}, "loop-1"),  # request_id beside the inputs
    ]
    bad, read, write = fed_back(result.messages)
    assert (bad["status"], bad["error"]["code"], bad["next_action"]) == ("error", "BAD_INPUT", "repair")
    assert 'inventory_item_show {"item": "widget"}' in bad["error"]["hint"]
    assert read["status"] == "ok" and read["fields"]
    assert (write["status"], write["effect"], write["request_id"]) == ("ok", "changed", "loop-1")
    # The model saw the error envelope before it sent the repaired call.
    second_messages, _ = model.seen[1]
    assert second_messages[-1]["role"] == "tool" and second_messages[-1]["is_error"] is True
    assert json.loads(second_messages[-1]["content"])["error"]["code"] == "BAD_INPUT"


async def test_definitions_are_handed_over_in_the_callers_format(rungd_daemon) -> None:
    model = Script([{"text": "nothing to do"}])
    await run_loop(rungd_daemon.socket, model, tools=["inventory_count_set", "test_text_echo"])
    _, tools = model.seen[0]
    assert {t["name"] for t in tools} == {"inventory_count_set", "test_text_echo"}
    write = next(t for t in tools if t["name"] == "inventory_count_set")
    assert set(write) == {"name", "description", "input_schema"}  # Anthropic's shape, the default
    assert "request_id" in write["input_schema"]["required"]

    model = Script([{"text": "nothing to do"}])
    await run_loop(rungd_daemon.socket, model, fmt="openai", tools=["test_text_echo"])
    (tool,) = model.seen[0][1]
    assert tool["type"] == "function" and tool["function"]["strict"] is True


async def test_openai_style_string_arguments_with_strict_nulls_reach_the_daemon_clean(rungd_daemon) -> None:
    model = Script([call("c1", "test_text_echo", '{"text": "hi", "times": null}'), {"text": "ok"}])
    result, client = await run_loop(rungd_daemon.socket, model, fmt="openai")
    assert client.calls == [("test_text_echo", {"text": "hi"}, None)]  # the null meant "not given"
    assert result.runs[0].result["fields"] == {"text": "hi"}


async def test_a_write_without_request_id_is_not_given_one(rungd_daemon) -> None:
    model = Script([call("t1", "inventory_count_set", {"item": "widget", "count": 3}), {"text": "stopped"}])
    result, client = await run_loop(rungd_daemon.socket, model)
    assert client.calls == [("inventory_count_set", {"item": "widget", "count": 3}, None)]
    (env,) = fed_back(result.messages)
    assert env["error"]["code"] == "BAD_INPUT" and "request_id" in env["error"]["message"]


async def test_errors_that_say_do_not_retry_are_not_retried_by_the_loop(rungd_daemon) -> None:
    model = Script([call("t1", "inventory_itme_show", {"item": "widget"}), {"text": "no such tool"}])
    result, client = await run_loop(rungd_daemon.socket, model)
    assert len(client.calls) == 1
    (env,) = fed_back(result.messages)
    assert (env["error"]["code"], env["error"]["retry"]) == ("UNKNOWN_TOOL", "no")
    assert "inventory_item_show" in env["error"]["hint"]


async def test_pending_call_is_waited_on_not_fed_back_or_sent_again(rungd_daemon) -> None:
    model = Script([call("t1", "test_clock_sleep", {"seconds": 1.0}), {"text": "slept"}])
    result, client = await run_loop(rungd_daemon.socket, model, wait_s=0.2)
    assert len(client.calls) == 1
    (run,) = result.runs
    assert run.waits >= 1
    assert (run.result["status"], run.result["fields"]) == ("ok", {"slept": 1.0})


async def test_loop_stops_after_max_turns(rungd_daemon) -> None:
    model = Script([call(f"t{i}", "test_text_echo", {"text": "again"}) for i in range(5)])
    result, client = await run_loop(rungd_daemon.socket, model, max_turns=3)
    assert (result.stopped, result.text, result.turns) == ("max_turns", None, 3)
    assert len(client.calls) == 3


async def test_arguments_that_are_not_an_object_come_back_as_bad_input_without_a_call(rungd_daemon) -> None:
    model = Script([call("t1", "test_text_echo", "{not json"), {"text": "gave up"}])
    result, client = await run_loop(rungd_daemon.socket, model)
    assert client.calls == []
    (env,) = fed_back(result.messages)
    assert (env["status"], env["error"]["code"], env["outcome"]) == ("error", "BAD_INPUT", "not_started")


def test_neutral_messages_convert_to_anthropic_and_openai() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "name": "x_y_show", "arguments": {"k": 1}},
            {"id": "b", "name": "x_y_show", "arguments": '{"k": 2}'}]},
        {"role": "tool", "tool_call_id": "a", "name": "x_y_show", "content": '{"status":"ok"}', "is_error": False},
        {"role": "tool", "tool_call_id": "b", "name": "x_y_show", "content": '{"status":"error"}', "is_error": True},
        {"role": "assistant", "content": "done"},
    ]
    anthropic = agent_loop.to_anthropic_messages(messages)
    assert [m["role"] for m in anthropic] == ["user", "assistant", "user", "assistant"]
    assert anthropic[1]["content"][1] == {"type": "tool_use", "id": "b", "name": "x_y_show", "input": {"k": 2}}
    assert [b["tool_use_id"] for b in anthropic[2]["content"]] == ["a", "b"]
    assert anthropic[2]["content"][1]["is_error"] is True
    openai = agent_loop.to_openai_messages(messages)
    assert [m["role"] for m in openai] == ["user", "assistant", "tool", "tool", "assistant"]
    assert openai[1]["tool_calls"][0]["function"] == {"name": "x_y_show", "arguments": '{"k":1}'}
    assert openai[1]["content"] is None
