"""``rungctl mcp``: rungd's tools as an MCP server on stdio, for desktop and IDE agents.

An MCP host starts ``rungctl mcp`` as a child and speaks JSON-RPC over its stdin and stdout.
The bridge connects to the daemon's socket as itself, so the daemon sees the bridge's uid
(SO_PEERCRED): the tools listed and the gates applied are those of the user who runs it.
The bridge holds no state of its own beyond a cache of definitions; every request opens its
own connection, so a slow call never holds up another.

What an MCP client sees:

- ``tools/list``: every tool the daemon lists for this uid, with the MCP definition from
  ``rungd.definitions.to_mcp`` (rungd's input schema, plus a required ``request_id`` for
  a write), and two tools of the bridge's own: ``rungd_call_wait``, which picks up a call
  that answered pending, and ``rungd_evidence_read``, which reads part of the evidence an
  envelope names (for an agent with no access to the daemon's files).
- ``tools/call``: the arguments go to the daemon as they are, less ``request_id``, which
  travels beside the inputs (``split_request_id``). The bridge does not validate them
  (the SDK's own check is off): the daemon does, and its BAD_INPUT hint names the field
  and a valid call, which a schema library's message does not. A write without a
  ``request_id`` gets the daemon's BAD_INPUT asking for one; the bridge never mints a key,
  since a key minted per attempt would make a model's retry a second change.

How an envelope maps onto a ``CallToolResult`` (``envelope_result``):

- ``ok``: ``isError`` false; the text is compact JSON of the fields with status, outcome,
  effect, verified_by, truncated (and narrow, as_of when set) and the call_id.
- ``error``: ``isError`` true; the text is what a model should act on: the code and
  message, the hint, retry, next_action in words, the outcome, and the settle read when
  the outcome is unknown.
- ``pending``: ``isError`` false, but the text starts with ``PENDING`` and says it is
  neither done nor failed, why (held for approval, or still running) and how to fetch the
  result (``rungd_call_wait`` with the call_id).

``structuredContent`` is the whole envelope in every case, so a client that reads
structured results branches on ``status`` exactly as agent code on the socket would. A
failure is never reported as a success: if the bridge cannot tell what happened (the
connection broke after the call was sent) it says the outcome is unknown.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any

import msgspec

try:
    import anyio
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError(
        f"the MCP bridge needs the MCP SDK ({exc}); install it with: pip install 'rungd[mcp]'",
        name=exc.name,
    ) from exc

import rungd
from rungd.aclient import AsyncClient
from rungd.client import ClientError, ConnectFailed, RequestRejected, default_socket
from rungd.definitions import ExportError, compact_json, split_request_id, to_mcp
from rungd.envelope import Envelope
from rungd.protocol import EvidenceSlice, ToolDefinition

log = logging.getLogger("rungd.mcp_bridge")

DEFAULT_WAIT_S = 25.0
"""How long a call waits in the daemon before the bridge answers pending. Below the minute
many MCP hosts allow a tool call, so a slow call comes back as pending, not as a timeout."""

MAX_WAIT_S = 60.0

WAIT_TOOL = "rungd_call_wait"
EVIDENCE_TOOL = "rungd_evidence_read"

INSTRUCTIONS = (
    "These tools come from rungd, which operates legacy programs on this host for you. "
    "Every tool that changes something requires a request_id argument: unique per intended "
    "change (a fresh UUID), reused only to retry that same change. Errors carry a code, a hint "
    "and a next_action: follow them. A result that starts with PENDING is neither done nor "
    f"failed: fetch it with {WAIT_TOOL} and its call_id, and do not repeat the change. "
    f"A result's evidence ids name its full, redacted output: read it with {EVIDENCE_TOOL}."
)

_NEXT_ACTION_WORDS = {
    "repair": "fix the call as the hint says, then call again",
    "reconcile": "the effect may or may not have happened: run the settle read before anything "
    "else, and never repeat the change with a new request_id",
    "request_authority": "this needs access or a credential only a person can give: stop and tell the user",
    "retry_later": "try the same call (same request_id) again after a pause",
    "stop": "do not repeat this call: report it to the user",
    "wait_approval": f"a person must approve it first: fetch the result with {WAIT_TOOL}",
    "continue": "go on",
}


def _wait_tool(default_wait_s: float) -> types.Tool:
    return types.Tool(
        name=WAIT_TOOL,
        description=(
            "Does: fetches the result of a rungd call that answered PENDING, waiting up to wait_s "
            "seconds for it. Use when: a tool result said PENDING and gave a call_id. Do not use "
            "when: the result was ok or an error; to start a call (call the tool itself). Returns: "
            "that call's result, as the tool would have returned it, or PENDING again if it is "
            "still held or running. On error: UNKNOWN_CALL when no call has that call_id (it "
            "expired or was mistyped). If unknown: call it again with the same call_id."
        ),
        inputSchema={
            "type": "object",
            "properties": {
                "call_id": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 64,
                    "description": "The call_id from the PENDING result.",
                    "examples": ["c0123456789abcdef"],
                },
                "wait_s": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_WAIT_S,
                    "default": default_wait_s,
                    "description": "Seconds to wait for the result before answering PENDING again.",
                    "examples": [default_wait_s],
                },
            },
            "required": ["call_id"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(
            readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False
        ),
    )


def _evidence_tool() -> types.Tool:
    def number(minimum: int, description: str, example: int) -> dict[str, Any]:
        return {"type": "integer", "minimum": minimum, "description": description, "examples": [example]}

    return types.Tool(
        name=EVIDENCE_TOOL,
        description=(
            "Does: reads part of a call's evidence, the full redacted output a result's evidence list names: "
            "a byte range (offset, length), a line range (line, count), or the lines holding a literal text "
            "(grep, searched from line). Use when: a result was truncated or you need the exact output behind it. "
            "Do not use when: the result's fields already answer the question. Returns: the text (capped), the "
            "file's size and lines, whether it was cut, and the arguments that read on. On error: "
            "UNKNOWN_EVIDENCE when no evidence with that id is yours; EVIDENCE_GONE when it was pruned; "
            "BAD_INPUT for an id that is not one or a byte range mixed with lines. If unknown: read again from "
            "offset 0."
        ),
        inputSchema={
            "type": "object",
            "properties": {
                "evidence_id": {"type": "string", "minLength": 1, "maxLength": 200,
                                "pattern": r"^[A-Za-z0-9_-]+\.[0-9]+\.[A-Za-z0-9_.-]+$",
                                "description": "An id from a result's evidence list, as given.",
                                "examples": ["c18f2a3b4c5d6e7f80.1.stdout"]},
                "offset": number(0, "First byte to read (a byte range; not with line or grep).", 0),
                "length": number(0, "Bytes to read from offset; left out: to the end (capped).", 4096),
                "line": number(1, "First line to read, from 1; with grep: the line the search starts at.", 1),
                "count": number(1, "Lines to read; with grep: at most this many matches.", 50),
                "grep": {"type": "string", "minLength": 1, "maxLength": 256,
                         "description": "Return only the lines holding this text (a literal, not a regex), "
                                        "each as LINE:text.", "examples": ["error"]},
                "max_bytes": number(1, "Ask for a smaller reply than the daemon's cap.", 2048),
            },
            "required": ["evidence_id"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(
            readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False
        ),
    )


def evidence_result(part: EvidenceSlice, *, grep: bool = False) -> types.CallToolResult:
    """The MCP result for one slice: the text, then one line on what was cut and how to read on."""
    where = f"from line {part.first_line}" if part.first_line else f"bytes {part.offset}-{part.end}"
    note = f"[rungd: {part.evidence_id}, {where} of {part.size} bytes, {part.lines} lines"
    if grep:
        note += f", {part.matches} matching line(s) shown as LINE:text"
    if part.truncated:
        note += "; cut to the reply cap"
    if part.next is None:
        note += "; end of the file]"
    else:
        step = {"offset": part.next.offset} if part.next.offset is not None else {"line": part.next.line}
        more = compact_json({"evidence_id": part.evidence_id, **step})
        note += f"; read on with {EVIDENCE_TOOL} {more}" + (" and the same grep]" if grep else "]")
    text = part.text + ("" if not part.text or part.text.endswith("\n") else "\n") + note
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structuredContent=msgspec.to_builtins(part), isError=False)


# --- envelope -> MCP result ----------------------------------------------------------------


def envelope_result(env: Envelope) -> types.CallToolResult:
    """The MCP result for one envelope: ok, error (``isError``) or pending (said as such)."""
    structured = msgspec.to_builtins(env)
    if env.status == "ok":
        text = compact_json(_ok_summary(env))
    elif env.status == "pending":
        text = _pending_text(env)
    else:
        text = _error_text(env)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent=structured,
        isError=env.status == "error",
    )


def _ok_summary(env: Envelope) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "status": env.status,
        "outcome": env.outcome,
        "effect": env.effect,
        "fields": env.fields,
        "verified_by": env.verified_by,
        "truncated": env.truncated,
    }
    if env.truncated and env.narrow:
        summary["narrow"] = env.narrow
    if env.as_of:
        summary["as_of"] = env.as_of
    summary["call_id"] = env.call_id
    return summary


def _error_text(env: Envelope) -> str:
    code, message, hint, retry = "FAILED", "the call failed without an error record", "", "no"
    if env.error is not None:
        code, message, hint, retry = env.error.code, env.error.message, env.error.hint, env.error.retry
    lines = [f"ERROR {code} from {env.tool}: {message}"]
    if hint:
        lines.append(f"hint: {hint}")
    lines.append(f"retry: {retry}")
    lines.append(f"next_action: {env.next_action} ({_NEXT_ACTION_WORDS.get(env.next_action, env.next_action)})")
    if env.outcome == "unknown":
        lines.append("outcome: unknown (the effect may or may not have happened)")
    else:
        lines.append(f"outcome: {env.outcome}")
    if env.settle is not None:
        lines.append(f"settle: call {env.settle.tool} with {compact_json(env.settle.inputs)} to learn whether "
                     "the effect happened")
    if env.request_id:
        lines.append(f"request_id: {env.request_id}")
    lines.append(f"call_id: {env.call_id}")
    return "\n".join(lines)


def _pending_text(env: Envelope) -> str:
    if env.next_action == "wait_approval":
        why = "is held at a gate until an operator approves or denies it; nothing has run yet"
    else:
        why = "is still running"
    first = (f"PENDING: not done and not failed. Call {env.call_id} of {env.tool} {why} "
             f"(next_action: {env.next_action}).")
    then = (f'Fetch its result with {WAIT_TOOL} {{"call_id": "{env.call_id}"}}. Do not call {env.tool} '
            "again with a new request_id: that would ask for a second change.")
    return f"{first}\n{then}"


def bridge_error(code: str, message: str, hint: str, *, outcome: str) -> types.CallToolResult:
    """An error the bridge itself found (no envelope): still ``isError``, still actionable."""
    text = f"ERROR {code}: {message}\nhint: {hint}\noutcome: {outcome}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


# --- the server ----------------------------------------------------------------------------


class Bridge:
    """The two MCP handlers, forwarding to the daemon at ``socket_path``.

    Args:
        socket_path: the daemon's socket.
        wait_s: how long a call waits in the daemon before the bridge answers pending.
    """

    def __init__(self, socket_path: Path | str, *, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.socket_path = Path(socket_path)
        self.wait_s = wait_s
        self._definitions: dict[str, ToolDefinition] = {}
        self._wait_tool = _wait_tool(wait_s)
        self._evidence_tool = _evidence_tool()

    async def list_tools(self) -> list[types.Tool]:
        """The daemon's tools for this uid as MCP tools, plus ``rungd_call_wait``.

        Raises:
            ClientError: the daemon cannot be reached; the SDK answers the request with a
                JSON-RPC error carrying the message.
        """
        definitions: list[ToolDefinition] = []
        async with AsyncClient(self.socket_path) as client:
            for summary in await client.list_tools():
                try:
                    definitions.append(await client.describe(summary.name))
                except RequestRejected as exc:  # withdrawn or denied since the listing
                    log.warning("skipping %s: %s", summary.name, exc)
        tools: list[types.Tool] = []
        known: dict[str, ToolDefinition] = {}
        for definition in definitions:
            if definition.name in (WAIT_TOOL, EVIDENCE_TOOL):
                log.warning("skipping the daemon's %s: the bridge's own tool has that name", definition.name)
                continue
            try:
                tools.append(types.Tool.model_validate(to_mcp(definition)))
            except ExportError as exc:  # `rungctl lint` reports these as fix-first
                log.warning("skipping %s: %s", definition.name, exc)
                continue
            known[definition.name] = definition
        self._definitions = known
        return [*tools, self._wait_tool, self._evidence_tool]

    async def call_tool(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        """Forward one call; the envelope (or the bridge's own error) as an MCP result."""
        if name == WAIT_TOOL:
            return await self._wait(arguments or {})
        if name == EVIDENCE_TOOL:
            return await self._evidence(arguments or {})
        # The cached definition lets split_request_id drop nulls that only mean "not given";
        # a tool not cached (not listed yet, or unknown) goes to the daemon as sent, and an
        # unknown one gets the daemon's UNKNOWN_TOOL with the closest names.
        inputs, request_id = split_request_id(arguments or {}, self._definitions.get(name))
        return await self._forward(name, lambda c: c.call(name, inputs, request_id=request_id, wait_s=self.wait_s))

    async def _wait(self, arguments: dict[str, Any]) -> types.CallToolResult:
        call_id = arguments.get("call_id")
        wait_s = arguments.get("wait_s", self.wait_s)
        unknown = sorted(set(arguments) - {"call_id", "wait_s"})
        if (unknown or not isinstance(call_id, str) or not call_id
                or isinstance(wait_s, bool) or not isinstance(wait_s, int | float)
                or not math.isfinite(wait_s) or not 0 <= wait_s <= MAX_WAIT_S):
            return bridge_error(
                "BAD_INPUT",
                f"{WAIT_TOOL} takes a call_id string and an optional wait_s in seconds (0 to {MAX_WAIT_S:g})"
                + (f"; unknown arguments: {', '.join(unknown)}" if unknown else ""),
                f'a valid call: {WAIT_TOOL} {{"call_id": "c0123456789abcdef", "wait_s": {self.wait_s:g}}}',
                outcome="not_started",
            )
        return await self._forward(WAIT_TOOL, lambda c: c.wait(call_id, wait_s=float(wait_s)))

    async def _evidence(self, arguments: dict[str, Any]) -> types.CallToolResult:
        """Read evidence. The daemon checks the arguments (a wrong type is its INVALID_MESSAGE)
        and who may see it; its words reach the model as they are."""
        known = {"evidence_id", "offset", "length", "line", "count", "grep", "max_bytes"}
        unknown = sorted(set(arguments) - known)
        if unknown or not isinstance(arguments.get("evidence_id"), str):
            return bridge_error(
                "BAD_INPUT", f"{EVIDENCE_TOOL} takes an evidence_id string and one of offset/length, line/count "
                "or grep" + (f"; unknown arguments: {', '.join(unknown)}" if unknown else ""),
                f'a valid call: {EVIDENCE_TOOL} {{"evidence_id": "c18f2a3b4c5d6e7f80.1.stdout", "line": 1, '
                '"count": 50}', outcome="done")
        try:
            async with AsyncClient(self.socket_path) as client:
                part = await client.evidence(**arguments)
        except ConnectFailed as exc:
            return bridge_error("UNREACHABLE", str(exc), "the rungd daemon is not running or not reachable; "
                                "tell the user", outcome="done")
        except RequestRejected as exc:
            return bridge_error(exc.code, str(exc), exc.hint or "check the arguments", outcome="done")
        except ClientError as exc:
            return bridge_error("BRIDGE_LOST", f"lost the connection to rungd: {exc}", "read it again",
                                outcome="done")
        return evidence_result(part, grep=arguments.get("grep") is not None)

    async def _forward(self, name: str, request: Any) -> types.CallToolResult:
        try:
            async with AsyncClient(self.socket_path) as client:
                envelope = await request(client)
        except ConnectFailed as exc:
            return bridge_error("UNREACHABLE", str(exc), "the rungd daemon is not running or not reachable; "
                                "tell the user; repeat with the same request_id once it is back",
                                outcome="not_started" if name != WAIT_TOOL else "unknown")
        except RequestRejected as exc:
            # A rejected call ran nothing; a rejected wait says nothing about the call it names
            # (its result may have expired, or the daemon restarted).
            known = "not_started" if name != WAIT_TOOL else "unknown"
            hint = exc.hint or "check the call against the tool's schema"
            if name == WAIT_TOOL:
                hint = ("the result is no longer held; repeat the original call with the same request_id: "
                        "if it ran, rungd answers with its result and runs nothing")
            return bridge_error(exc.code, str(exc), hint, outcome=known)
        except ClientError as exc:
            # The request may have reached the daemon: say so, and say how to find out.
            return bridge_error(
                "BRIDGE_LOST", f"lost the connection to rungd during {name}: {exc}",
                "the call may have run; repeat it with the same arguments and the same request_id "
                "to get its result (a repeat with the same request_id never runs it twice)",
                outcome="unknown",
            )
        return envelope_result(envelope)


def build_server(socket_path: Path | str, *, wait_s: float = DEFAULT_WAIT_S) -> Server:
    """The low-level MCP server with the bridge's handlers registered."""
    bridge = Bridge(socket_path, wait_s=wait_s)
    server: Server = Server("rungd", version=rungd.__version__, instructions=INSTRUCTIONS)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return await bridge.list_tools()

    # The daemon validates inputs and answers BAD_INPUT with a hint naming the field and a
    # valid call; the SDK's jsonschema check would answer first, with less to go on.
    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        return await bridge.call_tool(name, arguments)

    return server


async def serve_stdio(socket_path: Path | str, *, wait_s: float = DEFAULT_WAIT_S) -> None:
    """Serve MCP on this process's stdin and stdout until stdin closes.

    Cancellation: in-flight calls are cancelled with the server; a call the daemon had
    already received keeps running there and its result stays available by call_id.
    """
    server = build_server(socket_path, wait_s=wait_s)
    try:
        async with AsyncClient(socket_path) as client:
            welcome = await client.hello()
        log.info("bridging rungd at %s as uid %d", socket_path, welcome.uid)
    except ClientError as exc:
        # An MCP host may start us before the daemon; serve anyway and say so on stderr.
        print(f"rungctl mcp: {exc}", file=sys.stderr, flush=True)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run_bridge(socket_path: Path | str | None = None, *, wait_s: float = DEFAULT_WAIT_S) -> int:
    """Run the MCP bridge on stdio (``rungctl mcp``); returns the exit status.

    Args:
        socket_path: the daemon's socket; default ``$RUNGD_SOCKET`` or ``./var/rungd.sock``.
        wait_s: seconds a call waits in the daemon before the bridge answers pending.

    Nothing else may write to stdout while this runs: stdout carries the protocol.
    """
    path = Path(socket_path) if socket_path is not None else default_socket()
    try:
        anyio.run(_serve, path, wait_s, backend="asyncio")
    except KeyboardInterrupt:
        return 130
    return 0


async def _serve(path: Path, wait_s: float) -> None:
    await serve_stdio(path, wait_s=wait_s)
