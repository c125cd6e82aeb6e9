"""``rungctl``: the operator's and developer's command line, a thin layer over the client.

    rungctl tools                               the tools you may call
    rungctl describe TOOL                       the definition a model reads, and the contract
    rungctl call TOOL [key=value ...] [--inputs JSON] [--request-id ID] [--wait S]
    rungctl status CALL_ID | wait CALL_ID
    rungctl reconcile TOOL REQUEST_ID [--found yes|no]
    rungctl pending | approve CALL_ID [--key KEY] | deny CALL_ID [--reason TEXT]
    rungctl export-tools --format openai|anthropic|mcp|jsonschema [--tools a,b]
    rungctl lint [--json] [--tools a,b] [--offline]
    rungctl mcp [--wait S]                      an MCP server on stdio, forwarding to rungd
    rungctl new-plugin NAME [--python] [--dir DIR]
    rungctl ledger verify | tail [--follow] [--tool T] [--outcome O]

Every command takes ``--json`` for machines. Exit status: 0 ok, 1 the call ended in an
error result, 2 bad usage, 3 rungd could not be reached or refused the request, 4 the call
is still pending.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from rungd.client import Client, ClientError, RequestRejected
from rungd.config import load_config
from rungd.envelope import Envelope
from rungd import definitions
from rungd.errors import ConfigError, PluginError
from rungd.lint import definitions_from_config
from rungd.lint import exit_status as lint_exit_status
from rungd.lint import format_json as lint_json
from rungd.lint import format_text as lint_text
from rungd.lint import lint as lint_definitions
from rungd.gates import sign
from rungd.scaffold import new_plugin
from rungd.protocol import ToolDefinition

EXIT_OK, EXIT_ERROR_RESULT, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_PENDING = 0, 1, 2, 3, 4


class UsageError(Exception):
    pass


def _json(value: Any) -> str:
    return json.dumps(msgspec.to_builtins(value), indent=2, ensure_ascii=False)


def parse_pairs(pairs: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """Turn ``key=value`` words into inputs, typed by the tool's input schema.

    A value for a string field stays a string (``item=007`` is "007"); integers, numbers,
    booleans, arrays and objects are parsed; fields the schema does not know are passed as
    strings so the daemon can say what is wrong with them.
    """
    props = schema.get("properties", {})
    inputs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {pair!r}")
        kind = props.get(key, {}).get("type")
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


def print_envelope(env: Envelope) -> None:
    head = f"{env.status:7} {env.tool}  outcome={env.outcome} effect={env.effect}  ({env.elapsed_ms} ms)"
    print(head)
    print(f"  call_id      {env.call_id}" + (f"   request_id {env.request_id}" if env.request_id else ""))
    if env.error:
        print(f"  error        {env.error.code}  retry={env.error.retry}  next={env.next_action}")
        print(f"  message      {env.error.message}")
        if env.error.hint:
            print(f"  hint         {env.error.hint}")
    width = max((len(k) for k in env.fields), default=0)
    for key, value in env.fields.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        print(f"    {key:<{width}}  {shown}")
    if env.verified_by:
        print(f"  verified_by  {env.verified_by}")
    if env.settle:
        print(f"  settle       {env.settle.tool} {json.dumps(env.settle.inputs)}")
    if env.truncated:
        print(f"  truncated    {env.narrow}")
    if env.status == "pending":
        print(f"  pending      rungctl wait {env.call_id}")
    if env.evidence:
        print(f"  evidence     {', '.join(env.evidence)}")


def print_definition(d: ToolDefinition) -> None:
    print(f"{d.name}  ({d.side_effect}, plugin {d.plugin})")
    print()
    for line in d.description.splitlines():
        print(f"  {line}")
    print()
    print(f"  deadline {d.deadline_s:g} s, commit point {d.commit_point}"
          + (f", settle by {d.settle['tool']}" if d.settle else "")
          + (", request_id required" if d.requires_request_id else "")
          + f", result cap {d.cap_bytes} bytes")
    print("  outputs:")
    for name, text in d.outputs.items():
        print(f"    {name:16} {text}")
    if d.errors:
        print("  errors:")
        for err in d.errors:
            print(f"    {err['code']:22} retry={err['retry']:11} next={err['next_action']}")
    print("  input schema:")
    for line in json.dumps(d.input_schema, indent=2, ensure_ascii=False).splitlines():
        print(f"    {line}")


def envelope_exit(env: Envelope) -> int:
    return {"ok": EXIT_OK, "error": EXIT_ERROR_RESULT, "pending": EXIT_PENDING}[env.status]


def build_parser() -> argparse.ArgumentParser:
    def options(suppress: bool) -> argparse.ArgumentParser:
        # The same options before and after the command word. After it they default to
        # SUPPRESS, or argparse would let the subcommand's default overwrite a value given
        # before it (`rungctl --socket S call ...`).
        extra = {"default": argparse.SUPPRESS} if suppress else {}
        parent = argparse.ArgumentParser(add_help=False)
        parent.add_argument("--json", action="store_true", help="machine-readable output", **extra)
        parent.add_argument("--socket", type=Path, help="daemon socket (default: $RUNGD_SOCKET or ./var/rungd.sock)",
                            **extra)
        parent.add_argument("--config", type=Path, help="read the socket path from this config file", **extra)
        return parent

    common = options(suppress=True)
    parser = argparse.ArgumentParser(prog="rungctl", description="Talk to a running rungd.",
                                     parents=[options(suppress=False)])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tools", parents=[common], help="list the tools you may call")
    describe = sub.add_parser("describe", parents=[common], help="show a tool's definition and contract")
    describe.add_argument("tool")
    call = sub.add_parser("call", parents=[common], help="call a tool")
    call.add_argument("tool")
    call.add_argument("pairs", nargs="*", metavar="key=value")
    call.add_argument("--inputs", help="all inputs as one JSON object")
    call.add_argument("--request-id", help="idempotency key; required for tools that change something")
    call.add_argument("--wait", type=float, default=30.0, help="seconds to wait before answering pending")
    sub.add_parser("pending", parents=[common], help="calls held at a gate, waiting for an operator")
    approve = sub.add_parser("approve", parents=[common], help="approve a held call (operators only)")
    approve.add_argument("call_id")
    approve.add_argument("--key", type=Path, help="SSH private key to sign with, for signature-gated calls")
    deny = sub.add_parser("deny", parents=[common], help="deny a held call (operators only)")
    deny.add_argument("call_id")
    deny.add_argument("--reason", default="", help="why; the caller reads it")
    reconcile = sub.add_parser("reconcile", parents=[common],
                               help="settle a request whose outcome is unknown by running its settle read")
    reconcile.add_argument("tool")
    reconcile.add_argument("request_id")
    reconcile.add_argument("--found", choices=["yes", "no"], help="operators only: decide by hand")
    export = sub.add_parser("export-tools", parents=[common],
                            help="tool definitions in a model provider's shape, with their sizes")
    export.add_argument("--format", required=True, choices=["openai", "anthropic", "mcp", "jsonschema"])
    export.add_argument("--tools", help="comma-separated names (default: every tool you may call)")
    lint = sub.add_parser("lint", parents=[common], help="check tools against the contract and description template")
    lint.add_argument("--tools", help="comma-separated names (default: all)")
    lint.add_argument("--offline", action="store_true",
                      help="load the config's plugins here instead of asking a running daemon")
    mcp = sub.add_parser("mcp", parents=[common], help="serve the tools over MCP on stdio (needs rungd[mcp])")
    mcp.add_argument("--wait", type=float, default=25.0, help="seconds a call waits before answering pending")
    scaffold = sub.add_parser("new-plugin", parents=[common], help="scaffold a tool file or a Python plugin")
    scaffold.add_argument("name", help="the legacy program's name: one lower-case word")
    scaffold.add_argument("--python", action="store_true", help="a Python plugin package instead of a TOML file")
    scaffold.add_argument("--dir", type=Path, default=Path("."), help="where to write it (default: here)")
    ledger = sub.add_parser("ledger", parents=[common], help="check the ledger files (reads them, not the socket)")
    ledger.add_argument("action", choices=["verify"])
    tail = sub.add_parser("tail", parents=[common], help="print ledger events (reads the files)")
    tail.add_argument("--follow", "-f", action="store_true")
    tail.add_argument("--tool")
    tail.add_argument("--outcome", choices=["done", "not_started", "unknown"])
    for name in ("status", "wait"):
        cmd = sub.add_parser(name, parents=[common], help=f"{name} of a call by its call_id")
        cmd.add_argument("call_id")
        if name == "wait":
            cmd.add_argument("--wait", type=float, default=30.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    # `rungctl ... | head` should end quietly when head has read enough, like any CLI.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = build_parser().parse_args(argv)
    if args.command == "new-plugin":
        try:
            written = new_plugin(args.name, args.dir, python=args.python)
        except ValueError as exc:
            print(f"rungctl: {exc}", file=sys.stderr)
            return EXIT_USAGE
        for path in written:
            print(f"wrote {path}")
        print("next: fill in every FILL IN, then `rungd check-config` and `rungctl lint`; see plugins/README.md")
        return EXIT_OK
    if args.command == "lint" and args.offline:
        try:
            return run_lint(definitions_from_config(load_config(args.config)), args)
        except (ConfigError, PluginError) as exc:
            print(f"rungctl: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.command in ("ledger", "tail"):
        try:
            return run_ledger_command(args)
        except ConfigError as exc:
            print(f"rungctl: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        socket_path = args.socket or (load_config(args.config).server.socket if args.config else None)
        if args.command == "mcp":
            try:
                from rungd.mcp_bridge import run_bridge
            except ModuleNotFoundError as exc:  # its message says: pip install 'rungd[mcp]'
                print(f"rungctl: {exc}", file=sys.stderr)
                return EXIT_USAGE
            return run_bridge(socket_path, wait_s=args.wait)
        with Client(socket_path) as client:
            return run_command(client, args)
    except UsageError as exc:
        print(f"rungctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        print(f"rungctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RequestRejected as exc:
        print(f"rungctl: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.code in ("UNKNOWN_TOOL", "DENIED") else EXIT_UNREACHABLE
    except ClientError as exc:
        print(f"rungctl: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


def run_command(client: Client, args: argparse.Namespace) -> int:
    if args.command == "tools":
        tools = client.list_tools()
        if args.json:
            print(_json(tools))
        else:
            width = max((len(t.name) for t in tools), default=0)
            for t in tools:
                print(f"{t.name:<{width}}  {t.side_effect:12}  {t.summary}")
        return EXIT_OK
    if args.command == "describe":
        definition = client.describe(args.tool)
        print(_json(definition) if args.json else "", end="\n" if args.json else "")
        if not args.json:
            print_definition(definition)
        return EXIT_OK
    if args.command in ("export-tools", "lint"):
        names = [t.name for t in client.list_tools()]
        chosen = names
        if args.tools:
            chosen = [n.strip() for n in args.tools.split(",") if n.strip()]
            unknown = sorted(set(chosen) - set(names))
            if unknown:
                raise UsageError(f"unknown tools {', '.join(unknown)}; yours are {', '.join(names)}")
        defs = [client.describe(name) for name in chosen]
        if args.command == "lint":
            return run_lint(defs, args, known=names)
        try:
            exported = definitions.export(defs, args.format)
        except definitions.ExportError as exc:
            print(f"rungctl: {exc}", file=sys.stderr)
            return EXIT_ERROR_RESULT
        print(json.dumps(exported, indent=2, ensure_ascii=False))
        print(definitions.size_table(definitions.sizes(exported)), file=sys.stderr)
        return EXIT_OK
    if args.command == "pending":
        held = client.pending()
        if args.json:
            print(_json(held))
        for h in [] if args.json else held:
            print(f"{h.call_id}  {h.tool:24} {h.gate:9} uid={h.caller_uid:<6} age={h.age_s:>6.0f}s "
                  f"expires_in={h.expires_in_s:.0f}s  {json.dumps(h.inputs, ensure_ascii=False)}")
        return EXIT_OK
    if args.command in ("approve", "deny"):
        if args.command == "deny":
            decision = client.deny(args.call_id, args.reason)
        else:
            signature = None
            if args.key:
                held = {h.call_id: h for h in client.pending()}.get(args.call_id)
                if held is None:
                    raise UsageError(f"{args.call_id} is not held (rungctl pending lists held calls)")
                try:
                    signature = sign(args.key, held.approval_message.encode())
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
            decision = client.approve(args.call_id, signature)
        print(_json(decision) if args.json else f"{decision.verdict} {decision.call_id}")
        return EXIT_OK
    if args.command == "call":
        inputs: dict[str, Any] = {}
        if args.inputs:
            try:
                inputs = json.loads(args.inputs)
            except json.JSONDecodeError as exc:
                raise UsageError(f"--inputs is not JSON: {exc}") from None
            if not isinstance(inputs, dict):
                raise UsageError("--inputs must be a JSON object")
        if args.pairs:
            schema = _schema_or_empty(client, args.tool)
            inputs.update(parse_pairs(args.pairs, schema))
        env = client.call(args.tool, inputs, request_id=args.request_id, wait_s=args.wait)
    elif args.command == "reconcile":
        found = None if args.found is None else args.found == "yes"
        env = client.reconcile(args.tool, args.request_id, found)
    elif args.command == "status":
        return show_status(client, args)
    else:
        env = client.wait(args.call_id, args.wait)
    if args.json:
        print(_json(env))
    else:
        print_envelope(env)
    return envelope_exit(env)


def show_status(client: Client, args: argparse.Namespace) -> int:
    """A call's envelope from the daemon, and its whole history from the ledger.

    The daemon keeps envelopes for a while; the ledger keeps everything. When the daemon
    no longer knows the call (it restarted, or the call is old), the history still tells.
    """
    history = call_history(args.call_id, args.config)
    try:
        env: Envelope | None = client.status(args.call_id)
    except RequestRejected as exc:
        if exc.code != "UNKNOWN_CALL" or not history:
            raise
        env = None
    if args.json:
        print(json.dumps({"envelope": msgspec.to_builtins(env), "history": history}, indent=2, ensure_ascii=False))
    else:
        if env is not None:
            print_envelope(env)
        else:
            print(f"{args.call_id}: the daemon no longer holds this call; from the ledger:")
        for event in history:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event["time"]))
            details = " ".join(f"{k}={event[k]}" for k in ("outcome", "effect", "code", "caller_uid", "approver_uid",
                                                            "note") if event.get(k) is not None)
            print(f"  {stamp}  {event['event']:10} {details}")
    return envelope_exit(env) if env is not None else EXIT_OK


def call_history(call_id: str, config_path: Path | None) -> list[dict[str, Any]]:
    """Every ledger event of one call, if this user can read the ledger (else empty)."""
    from rungd_ledgers import iter_records

    try:
        folder = load_config(config_path).state_dir / "ledger"
        records = [msgspec.to_builtins(r) for r in iter_records(folder) if r.call_id == call_id]
    except (ConfigError, OSError):
        return []
    for record in records:
        record.pop("result", None)  # the envelope above is the result
    return records


def run_lint(defs: list[ToolDefinition], args: argparse.Namespace, known: list[str] | None = None) -> int:
    """Lint ``defs``; the exit status is 1 when any finding must be fixed first."""
    if args.tools and args.offline:
        wanted = {n.strip() for n in args.tools.split(",")}
        defs = [d for d in defs if d.name in wanted]
    findings = lint_definitions(defs, known_tools=known or [d.name for d in defs])
    print(lint_json(findings) if args.json else lint_text(findings, len(defs)))
    return lint_exit_status(findings)


def run_ledger_command(args: argparse.Namespace) -> int:
    """``ledger verify`` and ``tail``: they read the ledger files of the configured state folder."""
    from rungd_ledgers import follow, iter_records, verify

    folder = load_config(args.config).state_dir / "ledger"
    if not folder.is_dir():
        raise ConfigError(f"no ledger at {folder}; hint: pass the daemon's --config")
    if args.command == "ledger":
        report = verify(folder)
        if args.json:
            print(_json(report))
        elif report.ok:
            print(f"ledger ok: {report.records} records in {folder}")
        else:
            print(f"ledger BROKEN: {report.problem}")
        return EXIT_OK if report.ok else EXIT_ERROR_RESULT
    records = follow(folder) if args.follow else iter_records(folder)
    try:
        for record in records:
            if (args.tool and record.tool != args.tool) or (args.outcome and record.outcome != args.outcome):
                continue
            if args.json:
                print(msgspec.json.encode(record).decode(), flush=True)
            else:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.time))
                tail = " ".join(f"{k}={v}" for k, v in (("outcome", record.outcome), ("effect", record.effect),
                                                          ("code", record.code), ("uid", record.caller_uid))
                                if v is not None)
                print(f"{stamp} {record.seq:>7} {record.event:10} {record.call_id} {record.tool:24} {tail}",
                      flush=True)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _schema_or_empty(client: Client, tool: str) -> dict[str, Any]:
    # An unknown or denied tool has no schema; the call itself will say so properly.
    try:
        return client.describe(tool).input_schema
    except RequestRejected:
        return {}


if __name__ == "__main__":
    sys.exit(main())
