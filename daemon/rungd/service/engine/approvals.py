"""Approvals: calls held at a ``review`` or ``signature`` gate until a person decides.

A held call has its inputs in memory and its ``held`` record in the ledger; nothing of it
runs. An operator other than the caller approves or denies it (``decide``); a signature
gate also needs an SSH signature over the call's approval message by an allowed key. Every
held call ends: approved, denied, or expired at its TTL, also when a decision fails while
the TTL runs out. A decision that arrives while the daemon stops is refused, so an approval
never starts a call the daemon would interrupt at once.
"""

from __future__ import annotations

import logging
import pwd
import time
from typing import Literal

import trio

from rungd.core.contract import Caller, ToolInputs
from rungd.core.errors import ApprovalExpired, Busy, Denied, GateDenied, RungdError
from rungd.service.gates import approval_message, is_operator, verify_signature
from rungd.system.proctree import spawning

from rungd.service.engine.calls import Call, CallTable, Held
from rungd.service.engine.policy import Policy

Verdict = Literal["approved", "denied"]

log = logging.getLogger("rungd.calls")


class Approvals:
    """Held calls and the decisions on them.

    Args:
        policy: the configuration in force (gates: TTL, operators, allowed signers).
        calls: the daemon's calls.
        record: ``await record(event, call, **fields)``, durable before it returns.
    """

    def __init__(self, policy: Policy, calls: CallTable, record) -> None:  # noqa: ANN001
        self._policy = policy
        self._calls = calls
        self._record = record
        self.closed = False

    def check_room(self, caller: Caller) -> None:
        """Refuse a new held call of a caller that already has its limit waiting.

        Raises:
            Busy: the caller has ``gates.max_held_per_uid`` calls waiting for approval.
        """
        limit = self._policy.config.gates.max_held_per_uid
        # Held, or on their way to it (gated, not yet running: their held record may still
        # be on its way to the ledger). The call asking is in the table already: it counts.
        waiting = sum(1 for c in self._calls if c.caller.uid == caller.uid and c.envelope is None
                      and c.scope is None and c.gate in ("review", "signature")) - 1
        if waiting >= limit:
            raise Busy(f"uid {caller.uid} already has {waiting} calls waiting for approval, the limit",
                       hint="wait until an operator decides some of them; nothing was held or run")

    def hold(self, call: Call, inputs: ToolInputs, plan: tuple[str, ...] = ()) -> None:
        now = time.time()
        call.held = Held(inputs=inputs, since=now, expires=now + self._policy.config.gates.approval_ttl_s,
                         plan=plan)

    def held_calls(self, caller: Caller) -> list[Call]:
        """Held calls this caller may see: all of them for an operator, else its own."""
        operator = is_operator(caller, self._policy.config)
        return [c for c in self._calls
                if c.held is not None and c.held.verdict is None and (operator or c.caller.uid == caller.uid)]

    async def verdict(self, call: Call) -> RungdError | None:
        """Wait for the decision on a held call; None when approved, else why it may not run.

        Returns:
            None when approved; GateDenied when denied (or approved while the daemon
            stops); ApprovalExpired when nobody decided within the TTL (recorded here).

        Cancellation: the daemon's call nursery cancels it at exit; the ledger then holds
        the call as ``held`` and the next start expires it.
        """
        held = call.held
        assert held is not None
        while True:
            with trio.move_on_at(trio.current_time() + held.expires - time.time()):
                await held.decided.wait()
            if held.verdict == "deciding":
                # An operator is mid-decision at the expiry: let it land (it is bounded by
                # the signature check's own timeout), then look again.
                await held.decided.wait()
            if held.verdict in ("approved", "denied") or time.time() >= held.expires:
                break
            held.decided = trio.Event()  # a decision failed before the expiry: keep waiting
        verdict, call.held = held.verdict, None
        if verdict == "approved":
            if self.closed:
                return GateDenied("the daemon stopped before the approved call could start; it did not run",
                                  hint="call again with the same request_id once rungd is back")
            return None
        if verdict == "denied" and held.withdrawn:
            return GateDenied(f"its caller withdrew the call before anyone decided: {held.reason or 'no reason given'}",
                              hint="it never ran; call again with a new request_id if the change is still wanted")
        if verdict == "denied":
            return GateDenied(f"an operator denied the call: {held.reason or 'no reason given'}",
                              hint="do not retry this change; ask the operator what to do instead")
        try:
            await self._record("expired", call, request_id=call.request_id)
        except RungdError:
            pass  # the ledger said why in the log; the call ran nothing and ends all the same
        return ApprovalExpired(
            f"nobody approved the call within {self._policy.config.gates.approval_ttl_s:g} s; it did not run",
            hint="ask an operator to approve it promptly, then call again with a new request",
        )

    async def decide(self, call_id: str, caller: Caller, *, approve: bool, signature: str | None = None,
                     reason: str = "") -> Verdict:
        """Record an operator's approval or denial of a held call and let it go on; or the
        caller's own denial of its call (a withdrawal: it asked for the wrong thing).

        Raises:
            UnknownCall: no such call, or one this caller may not see (a non-operator
                learns nothing about other callers' calls).
            Denied: the caller is not an operator (and not withdrawing its own call), or
                approves its own call, or signed it with their own key.
            GateDenied: the call is not held, the daemon is stopping, or the signature
                gate refused the signature.
            LedgerUnavailable: the decision could not be recorded; nothing changed.
        """
        operator = is_operator(caller, self._policy.config)
        call = self._calls.visible(call_id, caller if not operator else None)
        withdrawn = not approve and caller.uid == call.caller.uid  # nothing ran: no authority needed
        if not operator and not withdrawn:
            raise Denied(f"uid {caller.uid} is not an operator", hint="operators are set in gates.operator_*")
        held = call.held
        if held is None or held.verdict is not None or held.expires <= time.time():
            raise GateDenied(f"call {call_id} is not waiting for approval", hint="rungctl pending lists held calls")
        if self.closed:
            raise GateDenied("rungd is stopping and starts nothing new",
                             hint="the call expires; the caller may repeat it once rungd is back")
        if approve and caller.uid == call.caller.uid:
            raise Denied("nobody may approve their own call",
                         hint="ask another operator; you may withdraw it (deny) if you no longer want it")
        if approve and call.gate == "signature" and not signature:
            raise GateDenied("this call needs a signed approval", hint="rungctl approve CALL_ID --key KEYFILE")
        # Claim the decision before the first await: a second operator, or the expiry,
        # must find it taken rather than record a second verdict.
        held.verdict = "deciding"
        verdict: Verdict = "approved" if approve else "denied"
        try:
            principal = await self._signer(call, signature) if approve and call.gate == "signature" else None
            if withdrawn:
                note: str | None = f"withdrawn by its caller{': ' + reason if reason else ''}"
            else:  # an operator's verdict: who signed it (a signature gate), and why
                note = "; ".join(part for part in (f"signed by {principal}" if principal else "", reason) if part) \
                    or None
            await self._record(verdict, call, request_id=call.request_id, approver_uid=caller.uid, note=note)
        except BaseException:
            held.verdict = None  # nothing was decided: the call still waits, until its TTL
            raise
        else:
            held.verdict = verdict
            held.reason = reason
            held.withdrawn = withdrawn
            log.info("call %s%s", "withdrawn" if withdrawn else verdict, f": {reason}" if reason else "", extra={
                "call_id": call.call_id, "tool": call.tool, "request_id": call.request_id,
                "caller_uid": call.caller.uid, "journal": {"APPROVER_UID": str(caller.uid), "VERDICT": verdict}})
        finally:
            held.decided.set()  # wake the holder either way: it decides what a failure means
        return verdict

    async def _signer(self, call: Call, signature: str | None) -> str:
        """The principal whose allowed key signed this call's approval message.

        Raises:
            GateDenied: the signature is not by an allowed key, or not over this call.
            Denied: the file lists the signing key for the caller too (``gates.Signer``).
        """
        message = approval_message(call.call_id, call.tool, call.digest)
        signers = self._policy.config.gates.allowed_signers
        assert signers is not None and signature is not None  # check_gates refused to start without it
        # ssh-keygen is our child: keep every reaper off it, or its exit status is lost and a
        # failed verification would read as a success.
        with spawning():
            signer = await trio.to_thread.run_sync(
                lambda: verify_signature(signers, message, signature, _user_names(call.caller.uid)))
        # The two-person rule holds for signatures too: whoever submits it, a signature by
        # the caller's own key is the caller approving its own call. The key is the caller's
        # when any line lists it under any principal naming the caller, not only the first.
        if signer.listed_as is not None:
            raise Denied(f"the approval is signed by a key allowed_signers lists for {signer.listed_as}, who made "
                         "the call; nobody may approve their own call",
                         hint="ask another operator to sign with their own key, one listed for nobody else")
        return signer.principal


def _user_names(uid: int) -> set[str]:
    """The login name of ``uid`` and its number, as a principal may spell either."""
    try:
        return {pwd.getpwuid(uid).pw_name, str(uid)}
    except KeyError:
        return {str(uid)}


__all__ = ["Approvals", "Held"]
