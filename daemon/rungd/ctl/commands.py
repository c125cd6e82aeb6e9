"""The commands that talk to a running rungd, and the developer's commands beside them."""

from __future__ import annotations

import argparse
import json
import pwd
import sys
from pathlib import Path
from typing import Any

import msgspec

from rungd.authoring import definitions
from rungd.client import Client, ConnectFailed, RequestRejected
from rungd.ctl.registry import (
    EXIT_OK,
    CommandFailed,
    Context,
    UsageError,
    arg,
    command,
    envelope_exit,
)
from rungd.ctl.cli import read_config
from rungd.ctl.show import as_json, local_time, print_definition, print_envelope, record_details
from rungd.core.envelope import Envelope
from rungd.core.errors import ConfigError
from rungd.service.gates import sign
from rungd.service.journal import visible
from rungd.authoring.lint import definitions_from_config, refused_findings
from rungd.authoring.lint import exit_status as lint_exit_status
from rungd.authoring.lint import format_json as lint_json
from rungd.authoring.lint import format_text as lint_text
from rungd.authoring.lint import lint as lint_definitions
from rungd.protocol import ToolDefinition

TOOL = arg("tool", help="the tool's name, as `rungctl tools` lists it")
CALL_ID = arg("call_id", help="the call's id (c + hex), from an envelope or `rungctl pending`")
TOOL_LIST = arg("--tools", metavar="A,B", help="comma-separated tool names (default: every tool you may call)")


def seconds(text: str) -> float:
    """A --wait value: seconds, zero or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r}: seconds to wait must be 0 or more")
    return value


def parse_pairs(pairs: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """Turn ``key=value`` words into inputs, typed by the tool's input schema.

    A value for a string field stays a string (``item=007`` is "007"); integers, numbers,
    booleans, arrays and objects are parsed; fields the schema does not know are passed as
    strings so the daemon can say what is wrong with them.

    Raises:
        UsageError: a word is not ``key=value``, or a value does not parse as its type.
    """
    props = schema.get("properties", {})
    inputs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {pair!r}")
        kind = _kind(props.get(key, {}))
        try:
            if kind == "integer":
                inputs[key] = int(raw)
            elif kind == "number":
                inputs[key] = float(raw)
            elif kind == "boolean":
                inputs[key] = {"true": True, "false": False}[raw.lower()]
            elif kind in ("array", "object"):
                inputs[key] = json.loads(raw)
            else:
                inputs[key] = raw
        except (ValueError, KeyError):
            raise UsageError(f"{key}: {raw!r} is not a valid {kind}") from None
    return inputs


def _kind(prop: dict[str, Any]) -> str | None:
    """The JSON type a field's value takes: its ``type``, or for an optional field (``anyOf``
    a type and null, as pydantic writes ``int | None``) the type that is not null."""
    kinds = [prop.get("type")] if "type" in prop else [option.get("type") for option in prop.get("anyOf", [])]
    kinds = [kind for kind in kinds if kind not in (None, "null")]
    return kinds[0] if len(kinds) == 1 and isinstance(kinds[0], str) else None


def show(ctx: Context, env: Envelope) -> int:
    print(as_json(env) if ctx.json else "", end="\n" if ctx.json else "")
    if not ctx.json:
        print_envelope(env)
    return envelope_exit(env)


@command("tools", "list the tools you may call")
def tools(ctx: Context) -> int:
    """List the tools this user may call: name, side-effect class, what it does."""
    found = ctx.client.list_tools()
    if ctx.json:
        print(as_json(found))
        return EXIT_OK
    if not found:
        # Said on stderr, so stdout stays the (empty) list a script counts.
        me = ctx.client.hello()
        print(f"no tools you may call: rungd sees you as uid {me.uid} (gid {me.gid}); its config's [access] "
              "decides who may call which tool (an empty [access] allows only the uid rungd runs as); "
              "`rungd check-config` lists the tools it offers", file=sys.stderr)
        return EXIT_OK
    width = max((len(t.name) for t in found), default=0)
    for t in found:
        print(f"{t.name:<{width}}  {t.side_effect:12}  {t.summary}")
        if t.step_down:  # the wrapper may no longer fit its program: say so under its line
            print(f"{'':<{width}}  {'STEP DOWN':12}  {t.step_down}; `rungctl resume {t.name}` once checked")
    return EXIT_OK


@command("describe", "show a tool's definition and contract", TOOL)
def describe(ctx: Context) -> int:
    """Show a tool's definition as a model reads it, and its contract as an operator checks it."""
    definition = ctx.client.describe(ctx.args.tool)
    if ctx.json:
        print(as_json(definition))
    else:
        print_definition(definition)
    return EXIT_OK


@command(
    "call", "call a tool",
    TOOL,
    arg("pairs", nargs="*", metavar="key=value", help="one input each, typed by the tool's schema (item=007 stays "
        "a string for a string field)"),
    arg("--inputs", metavar="JSON", help="all inputs as one JSON object (key=value words are added to it)"),
    arg("--request-id", metavar="ID", help="idempotency key; required for tools that change something"),
    arg("--wait", type=seconds, default=30.0, metavar="S", help="seconds to wait before answering pending (default 30)"),
)
def call(ctx: Context) -> int:
    """Call a tool and print its result envelope; exit 4 while it is pending."""
    args = ctx.args
    inputs: dict[str, Any] = {}
    if args.inputs:
        try:
            inputs = json.loads(args.inputs)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--inputs is not JSON: {exc}") from None
        if not isinstance(inputs, dict):
            raise UsageError("--inputs must be a JSON object")
    if args.pairs:
        inputs.update(parse_pairs(args.pairs, _schema_or_empty(ctx.client, args.tool)))
    # A call held at a gate is said at once, with the command that approves it: the first
    # answer comes within a second, and a call still running is then waited for as asked.
    first = min(args.wait, HELD_NOTICE_S)
    env = ctx.client.call(args.tool, inputs, request_id=args.request_id, wait_s=first)
    if env.status == "pending" and args.wait > first:
        if env.next_action == "wait_approval":
            print(f"rungctl: call {env.call_id} is held at its gate until an operator approves it: rungctl approve "
                  f"{env.call_id} (or denies it: rungctl deny {env.call_id}); waiting up to {args.wait:g} s",
                  file=sys.stderr, flush=True)
        env = ctx.client.wait(env.call_id, args.wait - first)
    return show(ctx, env)


HELD_NOTICE_S = 1.0  # how soon `rungctl call` says that a call is held


def _schema_or_empty(client: Client, tool: str) -> dict[str, Any]:
    # An unknown or denied tool has no schema; the call itself will say so properly.
    try:
        return client.describe(tool).input_schema
    except RequestRejected:
        return {}


@command("wait", "wait for a call's result by its call_id", CALL_ID,
         arg("--wait", type=seconds, default=30.0, metavar="S", help="seconds to wait before answering pending"))
def wait(ctx: Context) -> int:
    """Wait for a call started earlier, from any connection; exit 4 if it is still pending."""
    return show(ctx, ctx.client.wait(ctx.args.call_id, ctx.args.wait))


@command("status", "a call's result and its history from the ledger", CALL_ID)
def status(ctx: Context) -> int:
    """A call's envelope from the daemon, and its whole history from the ledger.

    The daemon keeps envelopes for a while; the ledger keeps everything. When the daemon
    no longer knows the call (it restarted, or the call is old), the history still tells.
    """
    call_id = ctx.args.call_id
    history = call_history(call_id, ctx.args.config)
    try:
        env: Envelope | None = ctx.client.status(call_id)
    except RequestRejected as exc:
        if exc.code != "UNKNOWN_CALL" or not history:
            raise
        env = None
    if ctx.json:
        print(json.dumps({"envelope": msgspec.to_builtins(env), "history": history}, indent=2, ensure_ascii=False))
    else:
        if env is not None:
            print_envelope(env)
        else:
            print(f"{call_id}: the daemon no longer holds this call; from the ledger:")
        for event in history:
            print(f"  {local_time(event['time'])}  {event['event']:10} {record_details(event)}")
    return envelope_exit(env) if env is not None else EXIT_OK


def call_history(call_id: str, config_path: Path | None) -> list[dict[str, Any]]:
    """Every ledger event of one call, if this user can read the ledger (else empty)."""
    from rungd_ledgers import LedgerError, iter_records

    try:
        folder = read_config(config_path).state_dir / "ledger"
        records = [msgspec.to_builtins(r) for r in iter_records(folder) if r.call_id == call_id]
    except (ConfigError, OSError, LedgerError):
        return []  # the daemon's answer above still stands on its own
    for record in records:
        record.pop("result", None)  # the envelope above is the result
    return records


@command("reconcile", "settle a request whose outcome is unknown by running its settle read",
         TOOL, arg("request_id", help="the request_id of the call whose outcome is unknown"),
         arg("--found", choices=["yes", "no"], help="operators only: decide by hand whether the effect happened"),
         arg("--uid", type=int, metavar="UID", help="operators only: whose request it is, when several callers "
             "used the same request_id"))
def reconcile(ctx: Context) -> int:
    """Settle a request whose outcome is unknown, by its tool's settle read (or an operator's word)."""
    found = None if ctx.args.found is None else ctx.args.found == "yes"
    return show(ctx, ctx.client.reconcile(ctx.args.tool, ctx.args.request_id, found, caller_uid=ctx.args.uid))


@command("pending", "calls held at a gate, waiting for an operator")
def pending(ctx: Context) -> int:
    """Calls held at a gate: every one for an operator, else your own."""
    held = ctx.client.pending()
    if ctx.json:
        print(as_json(held))
        return EXIT_OK
    if not held:
        print("no calls held for approval that you may see (operators see every one, others their own)",
              file=sys.stderr)
    for h in held:
        # The tool name comes after the fixed-width columns: a long one moves only free text.
        print(f"{h.call_id}  {h.gate:9} {_account(h.caller_uid):<16} age={h.age_s:>6.0f}s "
              f"expires_in={h.expires_in_s:>5.0f}s  {visible(h.tool)}  {visible(json.dumps(h.inputs, ensure_ascii=False))}")
        for line in h.plan:
            print(f"    {visible(line)}")
    return EXIT_OK


def _account(uid: int) -> str:
    """Who a uid is, as an approver reads it: ``alice(1000)``, or the bare uid of no account."""
    try:
        return f"{pwd.getpwuid(uid).pw_name}({uid})"
    except KeyError:
        return f"uid={uid}"


@command("approve", "approve a held call (operators only)", CALL_ID,
         arg("--key", type=Path, metavar="KEY", help="SSH private key to sign with, for signature-gated calls"),
         arg("--reason", default="", help="why; the ledger keeps it beside your uid"))
def approve(ctx: Context) -> int:
    """Approve a held call; it runs once, with the inputs it was held with."""
    signature = None
    if ctx.args.key:
        held = {h.call_id: h for h in ctx.client.pending()}.get(ctx.args.call_id)
        if held is None:
            raise CommandFailed(f"{ctx.args.call_id} is not held (approved, denied or expired already, or never "
                                "held); hint: `rungctl pending` lists held calls, `rungctl status CALL_ID` tells")
        try:
            signature = sign(ctx.args.key, held.approval_message.encode())
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return _decided(ctx, ctx.client.approve(ctx.args.call_id, signature, ctx.args.reason))


@command("deny", "deny a held call (operators), or withdraw your own", CALL_ID,
         arg("--reason", default="", help="why; the caller reads it, and the ledger keeps it"))
def deny(ctx: Context) -> int:
    """Deny a held call; it never runs, and its caller gets GATE_DENIED with your reason."""
    return _decided(ctx, ctx.client.deny(ctx.args.call_id, ctx.args.reason))


def _decided(ctx: Context, decision: Any) -> int:
    print(as_json(decision) if ctx.json else f"{decision.verdict} {decision.call_id}")
    return EXIT_OK


def _chosen_definitions(ctx: Context, refused: list[str] | None = None) -> tuple[list[ToolDefinition], list[str]]:
    """The definitions ``--tools`` picks (all by default) and every tool's name; ``refused``
    gets what the daemon refused to load, when the caller is an operator."""
    listing = ctx.client.tool_listing()
    if refused is not None:
        refused.extend(listing.refused)
    names = [t.name for t in listing.tools]
    chosen = names
    if ctx.args.tools:
        chosen = [n.strip() for n in ctx.args.tools.split(",") if n.strip()]
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise UsageError(f"unknown tools {', '.join(unknown)}; yours are {', '.join(names)}")
    return [ctx.client.describe(name) for name in chosen], names


@command("export-tools", "tool definitions in a model provider's shape, with their sizes",
         arg("--format", required=True, choices=list(definitions.FORMATS),
             help="the provider's shape: openai (Chat Completions), openai-responses (Responses API), "
                  "anthropic, mcp, jsonschema"),
         TOOL_LIST)
def export_tools(ctx: Context) -> int:
    """Print tool definitions as JSON in a provider's shape; their sizes go to stderr."""
    defs, _ = _chosen_definitions(ctx)
    try:
        exported = definitions.export(defs, ctx.args.format)
    except definitions.ExportError as exc:
        raise CommandFailed(str(exc)) from None
    print(json.dumps(exported, indent=2, ensure_ascii=False))
    print(definitions.size_table(definitions.sizes(exported)), file=sys.stderr)
    return EXIT_OK


@command("lint", "check tools against the contract and description template",
         TOOL_LIST,
         arg("--offline", action="store_true", help="load the config's plugins here instead of asking a running daemon"))
def lint(ctx: Context) -> int:
    """Lint tool definitions; exit 1 when any finding must be fixed first."""
    refused: list[str] = []
    if ctx.args.offline:
        defs = definitions_from_config(ctx.config, refused)
        known = [d.name for d in defs]
        if ctx.args.tools:
            wanted = {n.strip() for n in ctx.args.tools.split(",")}
            defs = [d for d in defs if d.name in wanted]
    else:
        try:
            defs, known = _chosen_definitions(ctx, refused)
        except ConnectFailed as exc:  # linting needs no daemon: say how
            raise ConnectFailed(f"{exc}; or lint without a daemon: rungctl lint --offline [--config FILE] "
                                "loads the config's plugins here", exc.path, exc.reason) from None
    findings = lint_definitions(defs, known_tools=known) + refused_findings(refused)
    print(lint_json(findings) if ctx.json else lint_text(findings, len(defs)))
    return lint_exit_status(findings)


@command("mcp", "serve the tools over MCP on stdio (needs the mcp extra: the README's install carries it)",
         arg("--wait", type=seconds, default=25.0, metavar="S", help="seconds a call waits before answering pending"))
def mcp(ctx: Context) -> int:
    """Serve the daemon's tools to an MCP client on stdin/stdout, forwarding each call."""
    try:
        from rungd.mcp_bridge import run_bridge
    except ModuleNotFoundError as exc:  # its message says what to install
        raise UsageError(str(exc)) from None
    return run_bridge(ctx.socket_path(), wait_s=ctx.args.wait)


@command("new-plugin", "scaffold a tool file or a Python plugin",
         arg("name", help="the legacy program's name: one lower-case word"),
         arg("--python", action="store_true", help="a Python plugin package instead of a TOML file"),
         arg("--dir", type=Path, default=Path("."), help="an existing folder to write into (default: here)"))
def new_plugin(ctx: Context) -> int:
    """Write a starting point for wrapping one more legacy program."""
    from rungd.authoring.scaffold import new_plugin as scaffold

    folder: Path = ctx.args.dir
    if not folder.is_dir():
        raise UsageError(f"--dir {folder}: no such folder; hint: create it first (mkdir -p {folder}) "
                         "or pass an existing folder")
    try:
        written = scaffold(ctx.args.name, folder, python=ctx.args.python)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write into {folder}: {exc.strerror or exc}; hint: pass --dir to a folder "
                         "you may write") from None
    for path in written:
        print(f"wrote {path}")
    print("next: fill in every FILL IN, then `rungd check-config` and `rungctl lint`; see plugins/README.md")
    return EXIT_OK
