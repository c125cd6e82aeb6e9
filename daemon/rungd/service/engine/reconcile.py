"""Reconcile: settle a request whose outcome is unknown, from evidence.

The first result of such a request names a settle read. Reconcile runs it (as the caller,
through the same call path as any read) and compares what it shows with what the effect
would have left: shown, the effect happened (``existing``); not shown, nothing happened and
the request_id may be used again. A read that is cut, fails or lacks the expected fields
cannot say "it did not happen", so the request stays unknown: guessing no would free the
request_id for a second run. An operator may decide by hand (``found``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from rungd.core.contract import Caller, Tool, shows
from rungd.core.envelope import Envelope, state_digest
from rungd.core.errors import Denied, ReconcileRequired, UnknownCall
from rungd.service.gates import is_operator

from rungd.service.engine import outcomes
from rungd.service.engine.policy import Policy

# await read(tool, inputs, caller) -> the settle read's envelope
ReadCall = Callable[[str, dict[str, Any], Caller], Awaitable[Envelope]]


class Reconciler:
    """Decides unknown outcomes and records what was found.

    Args:
        policy: the configuration in force (who is an operator).
        index: the ledger's idempotency index.
        record: ``await record(event, call_id, tool, **fields)``, durable before it returns.
        read: runs the settle read as a call of the caller's.
    """

    def __init__(self, policy: Policy, index, record, read: ReadCall) -> None:  # noqa: ANN001
        self._policy = policy
        self._index = index
        self._record = record
        self._read = read

    async def reconcile(self, tool: Tool, request_id: str, caller: Caller, found: bool | None = None, *,
                        of_uid: int | None = None) -> Envelope:
        """The request's settled result, or its first result still unknown with why.

        Args:
            of_uid: whose request it is, for an operator settling another caller's (needed
                when several callers used the request_id).

        Raises:
            UnknownCall: no call used this request_id within the retention, or it is
                another caller's and the caller is no operator.
            Denied: ``found`` or ``of_uid`` (another's) given by a caller who is not an operator.
            ReconcileRequired: the first call is still running.
            LedgerUnavailable: the decision could not be recorded.
        """
        entry = self._entry(tool, request_id, caller, of_uid)
        first = msgspec.convert(entry.result, Envelope) if entry.result else None
        if first is None:
            raise ReconcileRequired(f"call {entry.call_id} is still running", hint="wait for it, then reconcile",
                                    outcome="unknown")
        if entry.state != "unknown":
            return first  # already settled: nothing to do, the first result stands
        if found is not None and not is_operator(caller, self._policy.config):
            raise Denied("only an operator may decide a reconcile by hand",
                         hint="run reconcile without --found to use the tool's settle read")
        try:
            found, fields, verified = await self._decide(tool, first, caller, found)
        except ReconcileRequired as undecided:
            return outcomes.still_unknown(first, undecided, tool)
        envelope = outcomes.reconciled_envelope(first, tool, found=found, fields=fields, verified_by=verified)
        await self._record(
            "reconciled", entry.call_id, tool.name, request_id=request_id, caller_uid=caller.uid,
            outcome=envelope.outcome, effect=envelope.effect,
            result=msgspec.to_builtins(envelope) if found else None,
            note="the effect happened" if found else "the effect did not happen; the request_id is free again",
        )
        return envelope

    async def _decide(self, tool: Tool, first: Envelope, caller: Caller,
                      found: bool | None) -> tuple[bool, dict[str, Any], str]:
        """Whether the effect happened, what showed it, and who or what decided.

        Raises:
            ReconcileRequired: nothing can decide it yet.
        """
        if found is not None:
            return found, {}, f"decided by operator uid {caller.uid}"
        settle = first.settle
        if settle is None:
            raise ReconcileRequired(f"{tool.name} declares no settle read; an operator must decide",
                                    hint="rungctl reconcile TOOL REQUEST_ID --found yes|no", outcome="unknown")
        read = await self._read(settle.tool, settle.inputs, caller)
        if read.status != "ok":
            raise ReconcileRequired(
                f"the settle read {settle.tool} did not answer: {read.error.code if read.error else read.status}",
                hint="try reconcile again later", outcome="unknown", settle=msgspec.to_builtins(settle),
            )
        if not settle.expect:
            raise ReconcileRequired(
                f"{tool.name} does not say what its settle read shows after the change; an operator must decide",
                hint=f"the settle read found {read.fields}; decide with rungctl reconcile --found yes|no",
                outcome="unknown", fields=read.fields,
            )
        shown = None if read.truncated else shows(read.fields, settle.expect)
        if shown is None:
            raise ReconcileRequired(
                f"the settle read {settle.tool} cannot decide: it lacks the expected fields",
                hint=f"an operator must decide with rungctl reconcile --found yes|no; it found {read.fields}",
                outcome="unknown", fields=read.fields,
            )
        if not shown and settle.before is not None and state_digest(read.fields, settle.expect) != settle.before:
            # Not what was asked, nor what was there before the act: a part of it may be done.
            raise ReconcileRequired(
                f"the settle read {settle.tool} shows neither the effect nor the state before the act: it moved, "
                "and a part of the effect may be done",
                hint=f"an operator must look, then decide with rungctl reconcile --found yes|no; it found {read.fields}",
                outcome="unknown", fields=read.fields,
            )
        return shown, read.fields, f"settle read {settle.tool} (call {read.call_id})"

    def _entry(self, tool: Tool, request_id: str, caller: Caller, of_uid: int | None = None) -> Any:
        """The caller's own request; for an operator, the one of ``of_uid``, or whoever's it
        is if only one caller used it.

        Raises:
            UnknownCall: no such request of this caller (another caller's is not its business).
            Denied: ``of_uid`` names another caller, and the caller is no operator.
        """
        operator = is_operator(caller, self._policy.config)
        if of_uid is not None and of_uid != caller.uid:
            if not operator:
                raise Denied("only an operator may settle another caller's request",
                             hint="reconcile your own request: leave out the caller's uid")
            entry = self._index.lookup(tool.name, request_id, of_uid)
        else:
            entry = self._index.lookup(tool.name, request_id, caller.uid)
        if entry is None and operator and of_uid is None:
            owners = self._index.owners(tool.name, request_id)
            if len(owners) > 1:
                uids = ", ".join(str(owner.caller_uid) for owner in owners)
                raise UnknownCall(f"{len(owners)} callers (uids {uids}) used request_id {request_id!r} for {tool.name}",
                                  hint=f"name whose request to settle: rungctl reconcile {tool.name} {request_id} "
                                       "--uid UID (or reconcile as that caller)")
            entry = owners[0] if owners else None
        if entry is None:
            raise UnknownCall(f"no call of {tool.name} with request_id {request_id!r} is known to you",
                              hint="reconcile a request_id you sent that ended with outcome unknown")
        return entry
