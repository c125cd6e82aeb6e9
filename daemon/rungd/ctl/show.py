"""Human output: envelopes, tool definitions and ledger lines, short and aligned."""

from __future__ import annotations

import json
import pwd
from typing import Any

import msgspec
from rungd_ledgers import Record

from rungd.core import moments
from rungd.core.envelope import Envelope
from rungd.service.journal import visible
from rungd.protocol import ToolDefinition


def as_json(value: Any) -> str:
    return json.dumps(msgspec.to_builtins(value), indent=2, ensure_ascii=False)


local_time = moments.local_iso  # a number no clock can show (an edited ledger's 1e308) as itself


def user(uid: int) -> str:
    """``1001(bob)``: the number the ledger holds, and the name a person knows."""
    try:
        return f"{uid}({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return str(uid)


def print_envelope(env: Envelope) -> None:
    head = f"{env.status:7} {visible(env.tool)}  outcome={env.outcome} effect={env.effect}  ({env.elapsed_ms} ms)"
    print(head)
    request = f"   request_id {visible(env.request_id)}" if env.request_id else ""
    print(f"  call_id      {visible(env.call_id)}{request}")
    if env.error:
        print(f"  error        {env.error.code}  retry={env.error.retry}  next={env.next_action}")
        print(f"  message      {visible(env.error.message)}")
        if env.error.hint:
            print(f"  hint         {visible(env.error.hint)}")
    width = max((len(k) for k in env.fields), default=0)
    for key, value in env.fields.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        print(f"    {visible(key):<{width}}  {visible(shown)}")
    if env.verified_by:
        print(f"  verified_by  {visible(env.verified_by)}")
    if env.settle:
        print(f"  settle       {visible(env.settle.tool)} {visible(json.dumps(env.settle.inputs))}")
    if env.truncated:
        print(f"  truncated    {visible(env.narrow)}")
    if env.status == "pending":
        if env.narrow:
            print(f"  why          {visible(env.narrow)}")
        print(f"  pending      rungctl wait {env.call_id}")
    if env.evidence:
        print(f"  evidence     {', '.join(env.evidence)}")


def print_definition(d: ToolDefinition) -> None:
    print(f"{d.name}  ({d.side_effect}, plugin {d.plugin})")
    if d.step_down:
        print(f"  STEP DOWN: {d.step_down}; `rungctl resume {d.name}` once checked")
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
    print_heading(d)
    print("  input schema:")
    for line in json.dumps(d.input_schema, indent=2, ensure_ascii=False).splitlines():
        print(f"    {line}")


def print_heading(d: ToolDefinition) -> None:
    """The contract's heading as seed 000's WRAPPER CONTRACT writes it."""
    h = d.heading
    if not h:
        print("  rung:    not declared (the tool has no heading)")
        return
    print(f"  rung:    {h['rung']} {h['rung_name']}")
    for out in h.get("ruled_out") or ():
        print(f"    ruled out  {out['rung']} fails \"{out['fails']}\"" + (f": {out['why']}" if out.get("why") else ""))
    for step in h.get("step_down") or ():
        print(f"    step down  {step['text']}")
    if h.get("climb"):
        print(f"    climb      {h['climb']}")
    print(f"    budget     {h['attempts']} attempt{'s' if h['attempts'] != 1 else ''}")
    session = h.get("session")
    if session:
        names = ", ".join(session.get("credentials") or ()) or "no credential"
        print(f"  session: {session['provided_by']} ({names}; on expiry {session['on_expiry']})")


def record_details(record: Record | dict[str, Any]) -> str:
    """The decision and its who and why, as ``key=value`` words: what an auditor greps for."""
    get = record.get if isinstance(record, dict) else lambda key: getattr(record, key)
    words = []
    for key in ("request_id", "outcome", "effect", "code"):
        if get(key) is not None:
            words.append(f"{key}={visible(get(key))}")
    if get("caller_uid") is not None:
        words.append(f"caller={user(get('caller_uid'))}")
    if get("approver_uid") is not None:
        words.append(f"by={user(get('approver_uid'))}")
    if get("note"):
        # Quoted: a deny reason is free text, and a reader must see where it ends.
        words.append(f"note={visible(json.dumps(get('note'), ensure_ascii=False))}")
    return " ".join(words)


def ledger_line(record: Record) -> str:
    """One ledger event on one line.

    The fixed-width columns come first (time, seq, event, call_id); the tool name and the
    details follow, so a tool name of any length moves only the free text after it.
    """
    return f"{local_time(record.time)} {record.seq:>7} {visible(record.event):10} {visible(record.call_id)} " \
           f"{visible(record.tool)} {record_details(record)}".rstrip()
