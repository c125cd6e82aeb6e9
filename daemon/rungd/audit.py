"""The daemon's side of the ledger: recording call events, and remembering requests.

Every event of a call is appended to the ledger (``rungd_ledgers``) before the caller hears
about it, and ``dispatched`` is durable before the handler starts: if the ledger cannot be
written, nothing new runs (fail closed). The idempotency index is rebuilt from the ledger
at start-up and kept current with every record appended.

At start-up, calls that were dispatched and never finished (the daemon crashed or was
killed mid-call) are finished as ``unknown`` with INTERRUPTED, and processes still carrying
their tag are killed.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import trio
from rungd_ledgers import IdempotencyIndex, Ledger, iter_records
from rungd_ledgers import LedgerUnavailable as LedgerWriteFailed

from rungd import proctree
from rungd.contract import Tool
from rungd.envelope import Envelope, ErrorInfo, Settle
from rungd.errors import CORE_ERRORS, LedgerUnavailable

log = logging.getLogger("rungd.audit")


class Audit:
    """The ledger and the idempotency index of one daemon.

    Args:
        folder: the ledger folder (``<state>/ledger``).
        retention_s: how long a request_id is remembered.
        rotate_bytes: size at which a ledger file is closed and a new one started.

    Raises:
        LedgerCorrupt: a record in the ledger cannot be read (run ``rungctl ledger verify``).
    """

    def __init__(self, folder: Path, *, retention_s: float, rotate_bytes: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.ledger = Ledger.open(folder, rotate_bytes=rotate_bytes)
        if self.ledger.repair is not None:
            log.warning("ledger: a torn last line was moved aside: %s", self.ledger.repair)
        self.index = IdempotencyIndex.rebuild(folder, retention_seconds=retention_s)

    def recover(self, tools: Mapping[str, Tool] | None = None) -> list[str]:
        """Settle what a previous run left open.

        Calls received and never dispatched ran nothing: they end not_started. Calls held
        at a gate expire: their inputs were never written down, so they could
        not run now, and must never run by surprise. Calls dispatched and never finished
        are finished as unknown, and their leftover processes are killed.

        Returns:
            The call_ids recovered.
        """
        recovered = []
        for tool, request_id, entry in self.index.undispatched():
            record = self.ledger.append(
                "finished", entry.call_id, tool, request_id=request_id, outcome="not_started", effect="none",
                code="INTERRUPTED", note="the daemon stopped before the call was dispatched; nothing ran",
            )
            self.index.apply(record)
            recovered.append(entry.call_id)
        for held in self.index.held():
            for event, fields in (("expired", {}), ("finished", {"outcome": "not_started", "effect": "none",
                                                                 "code": "APPROVAL_EXPIRED"})):
                record = self.ledger.append(event, held.call_id, held.tool, request_id=held.request_id,
                                            note="the daemon restarted while the call waited for approval",
                                            **fields)
                self.index.apply(record)
            recovered.append(held.call_id)
        unfinished = self.index.unfinished()
        logged = _logged_inputs(self.folder, {call.call_id for call in unfinished}) if unfinished else {}
        for call in unfinished:
            killed = _kill_tagged(call.call_id)
            tool = (tools or {}).get(call.tool)
            settle = _settle(tool, logged.get(call.call_id, {}))
            envelope = Envelope(
                call_id=call.call_id,
                tool=call.tool,
                request_id=call.request_id,
                status="error",
                outcome="unknown",
                effect="none",
                error=ErrorInfo(
                    code="INTERRUPTED",
                    message="the daemon stopped while this call was running",
                    retry=CORE_ERRORS["INTERRUPTED"][0],
                    hint="run the tool's settle read (rungctl reconcile) before any retry",
                ),
                next_action="reconcile",
                settle=settle,
            )
            record = self.ledger.append(
                "finished", call.call_id, call.tool, request_id=call.request_id, outcome="unknown",
                effect="none", code="INTERRUPTED", result=msgspec.to_builtins(envelope),
                note=f"recovered at start-up; {killed} leftover process(es) killed",
            )
            self.index.apply(record)
            recovered.append(call.call_id)
            log.warning("recovered interrupted call", extra={"call_id": call.call_id, "tool": call.tool})
        return recovered

    async def record(self, event: str, call_id: str, tool: str, **fields: Any) -> None:
        """Append one event durably, then update the index.

        Raises:
            LedgerUnavailable: the ledger could not be written; the caller must not start
                anything new. The daemon's log says why.
        """
        await self.record_many([(event, call_id, tool, fields)])

    async def record_many(self, events: list[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Append events of one call together, in order, with one fsync; then update the index.

        Raises:
            LedgerUnavailable: as ``record``; none of the events was recorded.
        """
        try:
            records = await trio.to_thread.run_sync(
                lambda: self.ledger.append_many(events), abandon_on_cancel=False
            )
        except LedgerWriteFailed as exc:
            log.error("ledger write failed: %s", exc, extra={"call_id": events[0][1], "tool": events[0][2]})
            raise LedgerUnavailable(
                "rungd cannot write its ledger, so it runs nothing new",
                hint="retry later; the operator must free space or fix the state folder's permissions",
            ) from None
        for record in records:
            self.index.apply(record)

    def close(self) -> None:
        self.ledger.close()


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


def _kill_tagged(call_id: str) -> int:
    """Kill every process that carries the call's tag (recovery only: the call is long over)."""
    killed = 0
    for pid in proctree.tagged_pids(call_id):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed
