"""Step-down signals: noticing, from evidence, that a wrapper has stopped fitting its program.

A tool's heading may declare step-down observations (``rungd.core.contract.StepDown``): "3
SURFACE_CHANGED in a row", "PROMPT_UNEXPECTED twice within 24h", "UNEXPECTED_STATE once".
The daemon evaluates them on every call's final result, in the order the ledger's
``finished`` records have, and when one fires:

    log        a warning naming the tool, the observation and the last evidence
    ledger     a ``step_down`` record (call_id: the last call observed), for auditors and
               ``rungctl health``
    mark       ``describe`` and ``list_tools`` carry the observation (``step_down``)
    suspend    with ``[step_down] suspend = true``, calls answer TOOL_SUSPENDED until an
               operator runs ``rungctl resume TOOL``, which writes a ``resumed`` record

What counts as evidence: a finished call of the tool that ran, whatever it returned. A
refusal before anything ran (BAD_INPUT, DENIED, BUSY, a gate, a suspension...) and a repeat
answered from the ledger say nothing about the program, so they neither count nor break a
row. A mark stays until an operator resumes the tool; evidence before a resume never counts
again.

State is small (per tool and observation, at most ``count`` recent matches) and lives in
memory; at start it is rebuilt by one replay of the ledger that decodes only the fields it
needs, as the idempotency index does.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

import trio
from rungd_ledgers import iter_events

from rungd.service.audit import Audit
from rungd.core import moments
from rungd.core.contract import Caller, StepDown, Tool
from rungd.core.envelope import Envelope
from rungd.core.errors import Denied, RungdError, ToolSuspended, UnknownTool

log = logging.getLogger("rungd.stepdown")

# Codes that end a call before its program ran, or a call's answer given from the ledger:
# they say nothing about whether the wrapper still fits the program.
NOT_EVIDENCE = frozenset({
    "BAD_INPUT", "UNKNOWN_TOOL", "DENIED", "GATE_DENIED", "APPROVAL_EXPIRED", "BUSY", "LEDGER_UNAVAILABLE",
    "IDEMPOTENCY_MISMATCH", "RECONCILE_REQUIRED", "INTERRUPTED", "TOOL_SUSPENDED",
})
_REPEAT_NOTE = "repeat of "
_RECENT_CALLS = 256  # call ids remembered per tool, to count a call once (a repeat carries its first id)


@dataclasses.dataclass(frozen=True)
class Mark:
    """A tool whose step-down observation fired.

    Attributes:
        observation: the observation in words ("SURFACE_CHANGED 3 times in a row -> rung 4").
        at: unix time it fired.
        call_ids: the calls that made it fire, oldest first.
        evidence: their evidence ids, where the results named any.
        suspended: whether its calls are refused until an operator resumes it.
    """

    observation: str
    at: float
    call_ids: tuple[str, ...]
    evidence: tuple[str, ...] = ()
    suspended: bool = False

    def text(self) -> str:
        """One line for ``describe`` and ``rungctl tools``."""
        when = moments.local(self.at)
        state = "suspended" if self.suspended else "marked"
        return f"{state} since {when}: {self.observation} (calls {', '.join(self.call_ids)})"


@dataclasses.dataclass
class _Track:
    """What one tool has shown since its last resume."""

    # Per observation (by position in the heading): recent matches as (time, call_id, evidence).
    matches: dict[int, deque[tuple[float, str, tuple[str, ...]]]] = dataclasses.field(default_factory=dict)
    recent: deque[str] = dataclasses.field(default_factory=lambda: deque(maxlen=_RECENT_CALLS))
    mark: Mark | None = None


class StepDownWatch:
    """Evaluates every tool's step-down observations on its results, and keeps the marks.

    Args:
        tools: the tool of a name now (a reload swaps tools), or None.
        audit: where ``step_down`` and ``resumed`` records go; None records nothing (tests).
        suspend: whether a fired observation also suspends the tool (``[step_down] suspend``).
        is_operator: whether a caller may resume tools.
    """

    def __init__(self, tools: Callable[[str], Tool | None], audit: Audit | None, *, suspend: bool,
                 is_operator: Callable[[Caller], bool]) -> None:
        self._tools = tools
        self._audit = audit
        self._suspend = suspend
        self._is_operator = is_operator
        self._tracks: dict[str, _Track] = {}
        self._send, self._receive = trio.open_memory_channel[tuple[str, str, str, dict]](math.inf)

    # --- start-up ------------------------------------------------------------------------------

    def replay(self, folder: Path) -> None:
        """Rebuild the tracks and marks from the ledger in ``folder`` (blocking: call it in
        a thread, or before serving). Logs one warning per tool still marked.

        Raises:
            LedgerCorrupt: a line is not a record (the daemon's own replay fails first).
        """
        for records in iter_events(folder):
            for record in records:
                if record.event == "finished":
                    if not (record.note or "").startswith(_REPEAT_NOTE):
                        self._observe(record.tool, record.call_id, record.code, record.time, (), live=False)
                elif record.event == "step_down":
                    track = self._track(record.tool)
                    if track.mark is None:  # fired under an earlier heading: the record stands
                        track.mark = Mark(record.note or "step down", record.time, (record.call_id,),
                                          suspended=self._suspend)
                elif record.event == "resumed":
                    self._tracks.pop(record.tool, None)
        for name, track in self._tracks.items():
            if track.mark is not None:
                log.warning("tool %s is still %s", name, track.mark.text(),
                            extra={"tool": name, "call_id": track.mark.call_ids[-1]})

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the ``step_down`` records of fired observations, in order, as they come.

        Cancellation: records still queued at shutdown are not written; the replay at the
        next start re-evaluates the same finished records and marks the tool again.
        """
        task_status.started()
        async for event, call_id, tool, fields in self._receive:
            if self._audit is None:
                continue
            try:
                await self._audit.record(event, call_id, tool, **fields)
            except RungdError:
                pass  # Audit logged why; the mark in memory stands

    # --- as calls finish -----------------------------------------------------------------------

    def observe(self, tool: str, envelope: Envelope, now: float | None = None) -> Mark | None:
        """Count one final result of ``tool``; the mark, when this result made one fire."""
        code = envelope.error.code if envelope.error else None
        return self._observe(tool, envelope.call_id, code, time.time() if now is None else now,
                             tuple(envelope.evidence), live=True)

    def _observe(self, name: str, call_id: str, code: str | None, when: float, evidence: tuple[str, ...], *,
                 live: bool) -> Mark | None:
        if code in NOT_EVIDENCE:
            return None
        tool = self._tools(name)
        if tool is None or tool.heading is None or not tool.heading.step_down:
            return None
        track = self._track(name)
        if call_id in track.recent or track.mark is not None:
            return None
        track.recent.append(call_id)
        for position, observation in enumerate(tool.heading.step_down):
            matches = track.matches.setdefault(position, deque(maxlen=observation.count))
            if code not in observation.codes:
                if observation.within_s is None:
                    matches.clear()  # any other result breaks a row
                continue
            matches.append((when, call_id, evidence))
            if observation.within_s is not None:
                while matches and matches[0][0] < when - observation.within_s:
                    matches.popleft()
            if len(matches) >= observation.count:
                track.mark = self._fire(name, observation, list(matches), when, code, live=live)
                return track.mark
        return None

    def _fire(self, name: str, observation: StepDown, matches: list[tuple[float, str, tuple[str, ...]]],
              when: float, code: str | None, *, live: bool) -> Mark:
        call_ids = tuple(call_id for _, call_id, _ in matches)
        evidence = tuple(e for *_, ids in matches for e in ids)
        mark = Mark(observation.text(), when, call_ids, evidence, suspended=self._suspend)
        if live:
            log.warning(
                "step down: tool %s: %s; evidence: calls %s%s; %s", name, mark.observation, ", ".join(call_ids),
                f" ({', '.join(evidence[-6:])})" if evidence else "",
                f"calls are refused until an operator runs `rungctl resume {name}`" if mark.suspended
                else f"an operator should check the program, then run `rungctl resume {name}`",
                extra={"tool": name, "call_id": call_ids[-1]},
            )
            note = f"{mark.observation}; calls {', '.join(call_ids)}" + ("; suspended" if mark.suspended else "")
            self._send.send_nowait(("step_down", call_ids[-1], name, {"code": code, "note": note}))
        return mark

    def _track(self, name: str) -> _Track:
        track = self._tracks.get(name)
        if track is None:
            track = self._tracks[name] = _Track()
        return track

    # --- what callers and operators see --------------------------------------------------------

    def mark(self, name: str) -> Mark | None:
        """The tool's mark, or None."""
        track = self._tracks.get(name)
        return track.mark if track is not None else None

    def marks(self) -> dict[str, Mark]:
        return {name: track.mark for name, track in self._tracks.items() if track.mark is not None}

    def refuse_if_suspended(self, name: str) -> None:
        """Raise when ``name`` is suspended (admission calls it before validating inputs).

        Raises:
            ToolSuspended: with the observation, and what the caller should do instead.
        """
        mark = self.mark(name)
        if mark is not None and mark.suspended:
            raise ToolSuspended(
                f"{name} is suspended: its program no longer behaves as the wrapper expects "
                f"({mark.observation}); an operator was told; nothing was run",
                hint="do not retry or work around it; stop and tell the person you work for. The operator "
                     f"checks the program, then runs `rungctl resume {name}`",
                outcome="not_started",
            )

    async def resume(self, name: str, caller: Caller, exists: Iterable[str]) -> tuple[Mark | None, bool]:
        """Lift a tool's mark and suspension; evidence before now no longer counts.

        Args:
            name: the tool.
            caller: who asks; only an operator may.
            exists: the names of every tool now, for the hint when ``name`` is not one.

        Returns:
            The mark lifted (None when the tool was not marked) and whether it was suspended.

        Raises:
            Denied: the caller is not an operator.
            UnknownTool: no such tool.
            LedgerUnavailable: the ``resumed`` record could not be written; nothing changed
                (a resume the ledger does not hold would be undone by the next start).

        Cancellation: the record is written or not before this returns (``Audit.record``);
            the mark is lifted only after it is durable.
        """
        if not self._is_operator(caller):
            raise Denied(f"uid {caller.uid} may not resume tools",
                         hint="an operator (gates.operator_uids or operator_groups in the config) runs "
                              f"`rungctl resume {name}`")
        if self._tools(name) is None:
            names = sorted(exists)
            raise UnknownTool(f"no tool named {name!r}", hint=f"the tools are: {', '.join(names[:20]) or 'none'}")
        mark = self.mark(name)
        if mark is None:
            return None, False
        if self._audit is not None:
            await self._audit.record("resumed", mark.call_ids[-1], name, approver_uid=caller.uid,
                                     note=f"resumed by uid {caller.uid}; lifted: {mark.observation}")
        self._tracks.pop(name, None)
        log.info("tool %s resumed by uid %d; lifted: %s", name, caller.uid, mark.observation,
                 extra={"tool": name, "call_id": mark.call_ids[-1]})
        return mark, mark.suspended
