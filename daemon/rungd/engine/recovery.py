"""Crash recovery: settle at start-up what a previous run of the daemon left open.

Calls received and never dispatched ran nothing: they end ``not_started``. Calls held at a
gate expire: their inputs were never written down, so they could not run now, and must
never run by surprise. Calls dispatched and never finished are finished as ``unknown``
(INTERRUPTED, with the settle read rebuilt from the logged inputs where it can be), and
their leftover processes are killed, known by pid and start time (``proctree.kill_tagged``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
from rungd_ledgers import iter_records

from rungd import proctree
from rungd.audit import Audit
from rungd.contract import Tool
from rungd.envelope import Settle

from rungd.engine import outcomes

log = logging.getLogger("rungd.recovery")


def recover(audit: Audit, tools: Mapping[str, Tool]) -> list[str]:
    """Finish every call a previous run left open, in the ledger, before serving.

    Returns:
        The call_ids recovered.

    Raises:
        LedgerUnavailable: from the ledger; the daemon must not start.
    """
    ledger, index = audit.ledger, audit.index
    recovered = []
    for tool, request_id, entry in index.undispatched():
        index.apply(ledger.append(
            "finished", entry.call_id, tool, request_id=request_id, outcome="not_started", effect="none",
            code="INTERRUPTED", note="the daemon stopped before the call was dispatched; nothing ran",
        ))
        recovered.append(entry.call_id)
    for held in index.held():
        for event, fields in (("expired", {}), ("finished", {"outcome": "not_started", "effect": "none",
                                                             "code": "APPROVAL_EXPIRED"})):
            index.apply(ledger.append(event, held.call_id, held.tool, request_id=held.request_id,
                                      note="the daemon restarted while the call waited for approval", **fields))
        recovered.append(held.call_id)
        log.warning("a call held for approval expired at start-up (it never ran; its caller may repeat it)",
                    extra={"call_id": held.call_id, "tool": held.tool})
    unfinished = index.unfinished()
    if not unfinished:
        return recovered
    logged = _logged_inputs(audit.folder, {call.call_id for call in unfinished})
    killed = proctree.kill_tagged([call.call_id for call in unfinished])
    for call in unfinished:
        settle = _settle(tools.get(call.tool), logged.get(call.call_id, {}))
        envelope = outcomes.recovered_envelope(call.call_id, call.tool, call.request_id, settle)
        index.apply(ledger.append(
            "finished", call.call_id, call.tool, request_id=call.request_id, outcome="unknown",
            effect="none", code="INTERRUPTED", result=msgspec.to_builtins(envelope),
            note=f"recovered at start-up; {killed[call.call_id]} leftover process(es) killed",
        ))
        recovered.append(call.call_id)
        log.warning("recovered interrupted call", extra={"call_id": call.call_id, "tool": call.tool})
    return recovered


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
