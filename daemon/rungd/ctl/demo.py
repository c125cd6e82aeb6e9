"""``rungd demo``: serve the embedded default and show, with real calls, what it does.

The walkthrough runs the same client an agent would use, in a worker thread, against the
daemon's real socket; then the daemon keeps serving until Ctrl-C so you can try
``rungctl`` yourself.
"""

from __future__ import annotations

import json
import uuid

import trio

from rungd.client import Client
from rungd.ctl.show import print_envelope
from rungd.service.daemon import Daemon, run_until_signalled

STEPS: list[tuple[str, str, dict[str, object], bool]] = [
    ("a read, parsed into typed fields", "inventory_item_show", {"item": "widget"}, False),
    ("a write: confirmation answered after its gate, then read back", "inventory_count_set",
     {"item": "widget", "count": 15}, True),
    ("bad input: touches nothing, says what a valid call looks like", "inventory_item_show",
     {"item": "-rf"}, False),
    ("an unknown tool: the closest names, nothing run", "inventory_itme_show", {"item": "widget"}, False),
    ("a legacy error status mapped to a stable code", "inventory_item_show", {"item": "doohickey"}, False),
    ("a real program wrapped by a TOML file, no Python (configs/tools/host.toml)", "host_disk_usage_show",
     {"mount": "/"}, False),
    ("rung 3: a fresh export read, header checked, rows typed and capped", "ledgerbook_invoices_list",
     {"fresh": True, "status": "open", "limit": 2}, False),
    ("rung 3: an import written into the watched folder, counted before and after", "ledgerbook_invoices_import",
     {"batch": "demo", "invoices": [{"invoice": "INV-2001", "date": "2024-05-14", "customer": "Acme Corp",
                                     "amount": "420.00", "currency": "EUR"}]}, True),
]


def command_line(tool: str, inputs: dict[str, object], request_id: str | None) -> str:
    """The rungctl command a reader could type for this step."""
    if all(isinstance(v, (str, int, float, bool)) for v in inputs.values()):
        words = " ".join(f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in inputs.items())
    else:
        words = f"--inputs '{json.dumps(inputs)}'"
    key = f" --request-id {request_id}" if request_id else ""
    return f"rungctl call {tool} {words}{key}"


def walkthrough(socket: str) -> None:
    with Client(socket) as client:
        print("\n== tools")
        tools = client.list_tools()
        width = max((len(tool.name) for tool in tools), default=0)
        for tool in tools:
            print(f"   {tool.name:<{width}}  {tool.side_effect:11} {tool.summary}")
        shown_evidence = False
        for title, tool, inputs, write in STEPS:
            request_id = str(uuid.uuid4()) if write else None
            print(f"\n== {title}\n   {command_line(tool, inputs, request_id)}")
            envelope = client.call(tool, inputs, request_id=request_id)
            print_envelope(envelope)
            if envelope.evidence and not shown_evidence:
                shown_evidence = True
                print(f"\n== the full, redacted output that call kept, read back through the daemon\n"
                      f"   rungctl evidence {envelope.evidence[0]} --lines 1:5")
                part = client.evidence(envelope.evidence[0], line=1, count=5)
                print("   " + part.text.rstrip("\n").replace("\n", "\n   "))
                print(f"   ({part.size} bytes, {part.lines} lines in all)")


async def run_demo(daemon: Daemon) -> None:
    """Start the daemon, run the walkthrough against it, then serve until signalled."""
    async with trio.open_nursery() as nursery:
        await nursery.start(run_until_signalled, daemon)
        await trio.to_thread.run_sync(walkthrough, str(daemon.socket_path))
        print(f"\nrungd is serving on {daemon.socket_path}; try `.venv/bin/rungctl tools` (or `rungctl evidence "
              "ID --all` with an id from an envelope above) in another terminal, from this folder. Ctrl-C stops it.",
              flush=True)
