"""A provider-neutral agent loop over rungd: list tools, ask a model, run its calls, feed back.

    result = await run_agent(model, client, "Set the widget count to 15.")

``model(messages, tool_definitions)`` is any function (sync or async) you write around your
provider's SDK. It gets the conversation so far in the neutral shape below and the tool
definitions in the provider's own shape (``fmt``: anthropic, openai, mcp or jsonschema, from
``rungd.authoring.definitions.export``), and returns one of

    {"tool_calls": [{"id": "t1", "name": "inventory_item_show", "arguments": {...}}, ...]}
    {"text": "the final answer"}

(``arguments`` may be a dict or a JSON string, as OpenAI sends it). ``to_anthropic_messages``
and ``to_openai_messages`` turn the neutral conversation into those APIs' message lists.

The neutral conversation:

    {"role": "user", "content": task}
    {"role": "assistant", "content": text or "", "tool_calls": [...]}     (tool_calls optional)
    {"role": "tool", "tool_call_id": id, "name": tool, "content": "<envelope JSON>", "is_error": bool}

What the loop does, and does not:

- Every call goes to the daemon with ``request_id`` taken out of the model's arguments
  (``split_request_id``). The loop never mints one: a key minted per attempt would turn a
  retry into a second change. A write without one comes back as BAD_INPUT, which the model
  repairs like any other.
- Every envelope goes back to the model whole, as compact JSON: status, outcome, effect,
  fields, error {code, message, retry, hint}, next_action, settle. Failures are results the
  model reads, not exceptions.
- A pending envelope is not fed back while it can still finish: the loop ``wait``s on its
  call_id (same call, nothing re-sent) up to ``max_pending_s``, then feeds back whatever it
  has, pending included.
- The loop never repeats a call on its own. Whether to try again after an error is the
  model's decision, made after reading ``retry`` and ``next_action``; a call the envelope
  says not to retry (``retry: no``) or to reconcile runs again only if the model asks.
- It stops on the model's text, or after ``max_turns`` model replies.

Run it against a daemon (``rungd serve`` in another terminal) with a scripted stand-in for
a model:  ``python examples/agent_loop.py [--socket PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
from rungd.aclient import AsyncClient
from rungd.authoring.definitions import Format, export, split_request_id
from rungd.core.envelope import Envelope
from rungd.protocol import ToolDefinition

Message = dict[str, Any]
ModelReply = dict[str, Any]
Model = Callable[[list[Message], list[dict[str, Any]]], ModelReply | Awaitable[ModelReply]]


@dataclasses.dataclass
class ToolRun:
    """One call the model asked for, and what came back."""

    id: str
    name: str
    arguments: dict[str, Any]
    result: dict[str, Any]  # the envelope as fed back (or the loop's own error for bad arguments)
    waits: int = 0  # how many times the loop waited on a pending call


@dataclasses.dataclass
class AgentResult:
    text: str | None  # the model's final answer; None when the loop stopped at max_turns
    stopped: str  # "text" or "max_turns"
    turns: int  # model replies read
    runs: list[ToolRun]
    messages: list[Message]


async def tool_definitions(
    client: AsyncClient, tools: Iterable[str] | None = None
) -> dict[str, ToolDefinition]:
    """The definitions of the tools this caller may use (optionally only those named)."""
    wanted = set(tools) if tools is not None else None
    names = [t.name for t in await client.list_tools() if wanted is None or t.name in wanted]
    return {name: await client.describe(name) for name in names}


async def run_agent(
    model: Model,
    client: AsyncClient,
    task: str,
    *,
    fmt: Format = "anthropic",
    tools: Iterable[str] | None = None,
    max_turns: int = 10,
    wait_s: float = 30.0,
    max_pending_s: float = 300.0,
) -> AgentResult:
    """Run the loop until the model answers in text or ``max_turns`` replies have been read.

    Args:
        model: ``model(messages, tool_definitions)``, sync or async; see the module docstring.
        client: a connected ``AsyncClient``.
        task: the user's request, the first message.
        fmt: the provider shape of the definitions handed to ``model``.
        tools: only these tools (default: every tool the daemon lists for this caller).
        max_turns: how many model replies to read before giving up.
        wait_s: how long one call or wait may take in the daemon before answering pending.
        max_pending_s: how long, in all, to wait on one pending call before feeding it back.

    Raises:
        ClientError: the connection to the daemon failed (a call in flight may have run;
            its envelope is still available by ``wait`` on a new connection).
    """
    definitions = await tool_definitions(client, tools)
    exported = export(definitions.values(), fmt)
    messages: list[Message] = [{"role": "user", "content": task}]
    runs: list[ToolRun] = []
    for turn in range(1, max_turns + 1):
        reply = model(messages, exported)
        if inspect.isawaitable(reply):
            reply = await reply
        calls = reply.get("tool_calls") or []
        text = reply.get("text") or ""
        if not calls:
            messages.append({"role": "assistant", "content": text})
            return AgentResult(text, "text", turn, runs, messages)
        messages.append({"role": "assistant", "content": text, "tool_calls": calls})
        for call in calls:
            run = await run_tool_call(client, call, definitions, wait_s=wait_s, max_pending_s=max_pending_s)
            runs.append(run)
            messages.append({
                "role": "tool",
                "tool_call_id": run.id,
                "name": run.name,
                "content": json.dumps(run.result, separators=(",", ":"), ensure_ascii=False),
                "is_error": run.result.get("status") == "error",
            })
    return AgentResult(None, "max_turns", max_turns, runs, messages)


async def run_tool_call(
    client: AsyncClient,
    call: dict[str, Any],
    definitions: dict[str, ToolDefinition],
    *,
    wait_s: float = 30.0,
    max_pending_s: float = 300.0,
) -> ToolRun:
    """Run one tool call the model asked for, once, waiting out a pending answer."""
    call_id, name, raw = str(call.get("id", "")), str(call.get("name", "")), call.get("arguments") or {}
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
        if not isinstance(arguments, dict):
            raise TypeError
    except (ValueError, TypeError):
        # Nothing went to the daemon; say so in the envelope's own words.
        return ToolRun(call_id, name, {}, {
            "tool": name, "status": "error", "outcome": "not_started", "effect": "none",
            "error": {"code": "BAD_INPUT", "message": "the arguments are not one JSON object", "retry": "no",
                      "hint": "send the arguments as a JSON object matching the tool's input schema"},
            "next_action": "repair",
        })
    # An unknown name goes to the daemon too: its UNKNOWN_TOOL names the closest tools.
    inputs, request_id = split_request_id(arguments, definitions.get(name))
    envelope = await client.call(name, inputs, request_id=request_id, wait_s=wait_s)
    envelope, waits = await wait_out(client, envelope, wait_s=wait_s, max_pending_s=max_pending_s)
    return ToolRun(call_id, name, arguments, msgspec.to_builtins(envelope), waits)


async def wait_out(
    client: AsyncClient, envelope: Envelope, *, wait_s: float, max_pending_s: float
) -> tuple[Envelope, int]:
    """Wait on a pending call by its call_id until it finishes or ``max_pending_s`` passes.

    A ``wait`` re-sends nothing: it picks up the call already made, so this is never a retry.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_pending_s
    waits = 0
    while envelope.status == "pending":
        left = deadline - loop.time()
        if left <= 0:
            break
        envelope = await client.wait(envelope.call_id, wait_s=min(wait_s, left))
        waits += 1
    return envelope, waits


# --- neutral conversation -> provider messages ---------------------------------------------


def to_anthropic_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The Messages API's ``messages``: tool calls as ``tool_use`` blocks, results as
    ``tool_result`` blocks in the next user turn (consecutive results share one turn)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
        elif m["role"] == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": _as_object(c["arguments"])}
                       for c in m.get("tool_calls", [])]
            out.append({"role": "assistant", "content": blocks})
        else:
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"],
                     "is_error": m["is_error"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
    return out


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Chat Completions ``messages``: ``tool_calls`` on the assistant, one ``tool`` message
    per result (OpenAI has no error flag; the envelope's ``status`` says it)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
        elif m["role"] == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": m.get("content") or None}
            if m.get("tool_calls"):
                message["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": _as_json(c["arguments"])}}
                    for c in m["tool_calls"]
                ]
            out.append(message)
        else:
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
    return out


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return {}
    return arguments


def _as_json(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))


# --- run it by hand ------------------------------------------------------------------------


def scripted(replies: list[ModelReply]) -> Model:
    """A stand-in for a model: returns the canned replies in order, then a closing text."""
    queue = list(replies)

    def model(messages: list[Message], tool_definitions: list[dict[str, Any]]) -> ModelReply:
        if messages[-1]["role"] == "tool":
            print(f"  <- {messages[-1]['name']}: {messages[-1]['content']}")
        reply = queue.pop(0) if queue else {"text": "done"}
        for call in reply.get("tool_calls", []):
            print(f"  -> {call['name']} {_as_json(call['arguments'])}")
        return reply

    return model


DEMO = [
    {"tool_calls": [{"id": "t1", "name": "inventory_item_show", "arguments": {"item": "-rf"}}]},
    {"tool_calls": [{"id": "t2", "name": "inventory_item_show", "arguments": {"item": "widget"}}]},
    {"tool_calls": [{"id": "t3", "name": "inventory_count_set",
                     "arguments": {"item": "widget", "count": 15, "request_id": "demo-set-widget-15"}}]},
    {"text": "The widget count is now 15, read back by the daemon."},
]


async def _main() -> None:
    parser = argparse.ArgumentParser(description="Run the agent loop with a scripted model.")
    parser.add_argument("--socket", help="daemon socket (default: $RUNGD_SOCKET or ./var/rungd.sock)")
    args = parser.parse_args()
    async with AsyncClient(args.socket) as client:
        result = await run_agent(scripted(DEMO), client, "Set the widget count to 15.")
    print(f"stopped on {result.stopped} after {result.turns} turns: {result.text}")


if __name__ == "__main__":
    asyncio.run(_main())
