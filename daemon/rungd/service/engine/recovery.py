"""Crash recovery: settle at start-up what a previous run of the daemon left open.

Calls received and never dispatched ran nothing: they end ``not_started``. Calls held at a
gate expire: their inputs were never written down, so they could not run now, and must
never run by surprise. Calls dispatched and never finished are finished as ``unknown``
(INTERRUPTED, with the settle read rebuilt from the logged inputs where it can be), and
their leftover processes are killed, known by pid and start time (``proctree.kill_tagged``).

A torn last line in the ledger (``rungd_ledgers.TornRepair``) may be the ``dispatched``
record of a call whose ``received`` record is intact: a disk that acknowledged an fsync it
had not done can leave one after the program ran. Its dispatch cannot be proven absent, so
every call received and not dispatched then ends ``unknown`` like a dispatched one, and a
repeat is RECONCILE_REQUIRED, never run again. Everything recovery records is one batch: the
torn tail stays in the ledger until that batch is written, so a start-up that dies before
then decides the same again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
from rungd_ledgers import Unfinished, iter_records

from rungd.system import proctree
from rungd.service.audit import Audit
from rungd.core.contract import Tool
from rungd.core.envelope import Settle

from rungd.service.engine import outcomes

log = logging.getLogger("rungd.recovery")

_Event = tuple[str, str, str, dict[str, Any]]


def recover(audit: Audit, tools: Mapping[str, Tool]) -> list[str]:
    """Finish every call a previous run left open, in the ledger, before serving.

    Returns:
        The call_ids recovered.

    Raises:
        LedgerUnavailable: from the ledger; the daemon must not start.
    """
    ledger, index = audit.ledger, audit.index
    undispatched, interrupted = index.undispatched(), index.unfinished()
    maybe_dispatched: set[str] = set()
    if ledger.repair is not None:
        # The torn line may be the dispatched record of any of them: a call approved at a
        # gate is dispatched in a batch of its own, its received record far back in the ledger.
        maybe_dispatched = {entry.call_id for _, _, entry in undispatched}
        interrupted += [Unfinished(entry.call_id, tool, request_id, entry.time)
                        for tool, request_id, entry in undispatched]
        undispatched = []
    events: list[_Event] = [
        ("finished", entry.call_id, tool, {
            "request_id": request_id, "outcome": "not_started", "effect": "none", "code": "INTERRUPTED",
            "note": "the daemon stopped before the call was dispatched; nothing ran"})
        for tool, request_id, entry in undispatched]
    held = index.held()
    for call in held:
        for event, fields in (("expired", {}), ("finished", {"outcome": "not_started", "effect": "none",
                                                             "code": "APPROVAL_EXPIRED"})):
            events.append((event, call.call_id, call.tool, {
                "request_id": call.request_id, "note": "the daemon restarted while the call waited for approval",
                **fields}))
    if interrupted:
        events += _interrupted(audit.folder, tools, interrupted, maybe_dispatched)
    # One batch, so that a torn tail is cut off (it stays until the first write) only once
    # every decision it informed is durable.
    for record in ledger.append_many(events) if events else ():
        index.apply(record)
    ledger.flush()  # a torn tail that informed nothing goes aside now, not at the first call
    for call in held:
        log.warning("a call held for approval expired at start-up (it never ran; its caller may repeat it)",
                    extra={"call_id": call.call_id, "tool": call.tool})
    for call in interrupted:
        log.warning("recovered interrupted call", extra={"call_id": call.call_id, "tool": call.tool})
    return [entry.call_id for _, _, entry in undispatched] + [call.call_id for call in (*held, *interrupted)]


def _interrupted(folder: Path, tools: Mapping[str, Tool], calls: list[Unfinished],
                 maybe_dispatched: set[str]) -> list[_Event]:
    """Kill what is left of calls that may have run, and their ``finished`` records: unknown."""
    logged = _logged_inputs(folder, {call.call_id for call in calls})
    killed = proctree.kill_tagged([call.call_id for call in calls])
    events: list[_Event] = []
    for call in calls:
        settle = _settle(tools.get(call.tool), logged.get(call.call_id, {}))
        envelope = outcomes.recovered_envelope(call.call_id, call.tool, call.request_id, settle)
        torn = "its dispatched record may be the torn last line; " if call.call_id in maybe_dispatched else ""
        events.append(("finished", call.call_id, call.tool, {
            "request_id": call.request_id, "outcome": "unknown", "effect": "none", "code": "INTERRUPTED",
            "result": msgspec.to_builtins(envelope),
            "note": f"recovered at start-up; {torn}{killed[call.call_id]} leftover process(es) killed"}))
    return events


def _logged_inputs(folder: Path, call_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The inputs the ``received`` records of these calls kept (those safe to log)."""
    return {r.call_id: r.inputs for r in iter_records(folder) if r.event == "received" and r.call_id in call_ids}


def _settle(tool: Tool | None, logged: dict[str, Any]) -> Settle | None:
    """The settle read of an interrupted call, if the logged inputs are enough to bind it.

    The ledger keeps only the inputs a tool marks safe to log; a settle read that needs
    another one cannot be rebuilt, and an operator decides instead.
    """
    if tool is None or tool.timing.settle is None:
        return None
    spec = tool.timing.settle
    needed = {v[1:] for v in (*spec.inputs.values(), *spec.expect.values()) if isinstance(v, str) and v.startswith("$")}
    if not needed <= logged.keys():
        return None
    return Settle(**spec.bind(logged))
