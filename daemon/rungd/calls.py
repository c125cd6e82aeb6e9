"""Running calls: the one boundary where exceptions become result envelopes.

A call goes through: look up the tool (UNKNOWN_TOOL), check the caller (DENIED), validate
inputs (BAD_INPUT), require a request_id for writes, take a concurrency slot (BUSY), then
run the handler in the daemon's call nursery under the tool's deadline. Whatever happens,
the call ends with exactly one envelope, kept for a while so ``status`` and ``wait`` can
fetch it from any connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import secrets
import shutil
import time
from collections.abc import Mapping
from typing import Any

import msgspec
import pluggy
import trio
from rungd_ledgers import input_digest

from rungd.config import Config
from rungd.audit import Audit
from rungd.credentials import CredentialStore
from rungd.contract import CallContext, Caller, Result, Tool, shows
from rungd.envelope import Envelope, ErrorInfo, Settle, fit_to_cap
from rungd.gates import approval_message, gate_for, is_operator, verify_signature
from rungd.errors import (
    ApprovalExpired,
    BadInput,
    Busy,
    Denied,
    Failed,
    GateDenied,
    IdempotencyMismatch,
    Interrupted,
    ReconcileRequired,
    RungdError,
    ToolError,
    ToolTimeout,
    UnknownTool,
)
from rungd.plugins import RegisteredTool
from rungd.proctree import Reaper

log = logging.getLogger("rungd.calls")

# A caller may ask to wait this long at most in one request; longer waits take several.
MAX_WAIT_S = 300.0


def new_call_id() -> str:
    """A short id that sorts by time: milliseconds since the epoch (hex), then randomness."""
    return f"c{int(time.time() * 1000):x}{secrets.token_hex(4)}"


@dataclasses.dataclass
class Held:
    """What a call held at a gate keeps until a person decides."""

    inputs: Any
    since: float
    expires: float
    decided: trio.Event = dataclasses.field(default_factory=trio.Event)
    verdict: str | None = None  # approved | denied
    reason: str = ""


@dataclasses.dataclass
class Call:
    """One call the daemon knows about, running or finished."""

    call_id: str
    tool: str
    request_id: str | None
    caller: Caller
    started: float
    digest: str = ""
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    envelope: Envelope | None = None
    scope: trio.CancelScope | None = None
    interrupted: bool = False
    gate: str = "none"
    held: Held | None = None

    def pending(self) -> Envelope:
        """The envelope of a call that is held at its gate or still running."""
        if self.held is not None:
            outcome, next_action = "not_started", "wait_approval"
            narrow = (f"held at the {self.gate} gate: an operator must approve it (rungctl approve {self.call_id}) "
                      f"within {max(0, int(self.held.expires - time.time()))} s; send wait with this call_id for "
                      "the result")
        else:
            outcome, next_action = "unknown", "retry_later"
            narrow = f"still running; send wait with call_id {self.call_id} to get the result"
        return Envelope(call_id=self.call_id, tool=self.tool, request_id=self.request_id, status="pending",
                        outcome=outcome, effect="none", next_action=next_action, narrow=narrow,
                        elapsed_ms=_ms_since(self.started))


class Dispatcher:
    """Starts calls, remembers them, and answers ``status`` and ``wait``.

    Args:
        tools: the registered tools by name.
        config: the daemon's configuration.
        pm: the plugin manager, for the result observers.
        credentials: the store handlers get named credentials from.
        audit: the ledger and idempotency index; every event is recorded there first.
        reaper: the daemon's reaper of adopted orphans, handed to the runner.
        nursery: where handlers run; it belongs to the daemon and outlives connections, so
            a call keeps running when the client that started it goes away.
    """

    def __init__(
        self,
        tools: Mapping[str, RegisteredTool],
        config: Config,
        pm: pluggy.PluginManager,
        credentials: CredentialStore,
        audit: Audit,
        nursery: trio.Nursery,
        *,
        reaper: Reaper | None = None,
    ) -> None:
        self.tools = tools
        self.config = config
        self.pm = pm
        self.credentials = credentials
        self.reaper = reaper
        self.audit = audit
        self._keys: dict[tuple[str, str], str] = {}  # (tool, request_id) -> running call_id
        self._nursery = nursery
        self._calls: dict[str, Call] = {}
        self._running: dict[str, int] = {}
        self._idle = trio.Event()
        self._idle.set()
        self.evidence_dir = config.state_dir / "evidence"
        self.work_root = config.state_dir / "work"
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        self.work_root.mkdir(parents=True, exist_ok=True)

    # --- entry points used by the server ---------------------------------------------------

    def visible_tools(self, caller: Caller) -> list[RegisteredTool]:
        """The tools this caller may call, in name order."""
        return [
            reg
            for name, reg in sorted(self.tools.items())
            if self.config.allowed(name, caller.uid, caller.groups)
        ]

    def lookup(self, name: str, caller: Caller) -> RegisteredTool:
        """The tool called ``name``, if this caller may use it.

        Raises:
            UnknownTool: no such tool (or one this caller may not see); the hint lists the
                closest names the caller may use. Nothing near is ever run.
            Denied: the tool exists and the caller is not on its allow-list.
        """
        reg = self.tools.get(name)
        if reg is None:
            names = [r.tool.name for r in self.visible_tools(caller)]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
            hint = f"did you mean: {', '.join(close)}?" if close else "list the tools to see what exists"
            raise UnknownTool(f"no tool named {name!r}", hint=hint + " Nothing was run.")
        if not self.config.allowed(name, caller.uid, caller.groups):
            raise Denied(
                f"uid {caller.uid} may not call {name}",
                hint="ask the operator to add your uid or group to the tool's access list",
            )
        return reg

    async def call(
        self, name: str, inputs: Mapping[str, Any], request_id: str | None, caller: Caller, wait_s: float
    ) -> Envelope:
        """Start a call and wait up to ``wait_s`` for its envelope (else a pending one)."""
        call = await self.start(name, inputs, request_id, caller)
        return await self.wait(call.call_id, wait_s)

    async def start(self, name: str, inputs: Mapping[str, Any], request_id: str | None, caller: Caller) -> Call:
        """Check, record and start one call. A call that fails its checks ends at once.

        Order matters: every decision that reads shared state (the idempotency index, the
        concurrency slots) is taken before the first ``await``, so two identical requests
        arriving together cannot both be judged new.

        Returns:
            The call; for a repeat of a request still running, the first call.
        """
        self._forget_old()
        call = Call(new_call_id(), name, request_id, caller, time.monotonic())
        self._calls[call.call_id] = call
        digest: str | None = None
        safe: dict[str, Any] = {}
        try:
            reg = self.lookup(name, caller)
            tool = reg.tool
            valid = tool.validate(inputs)
            # Digest and logged fields come from the validated inputs, so whatever a frame
            # carried (bytes, extension types) was refused before it reached the ledger.
            plain = valid.model_dump(mode="json")
            digest = call.digest = input_digest(name, plain)
            safe = {k: plain[k] for k in tool.log_fields if k in plain}
            first = self._repeat_of(tool, request_id, digest)
            call.gate = gate_for(tool, self.config)
            held = first is None and call.gate in ("review", "signature")
            if first is None:
                if not held:
                    self._take_slot(tool)
                if request_id:
                    self._keys[(name, request_id)] = call.call_id
        except RungdError as rejection:
            return await self._reject(call, rejection, digest, safe)
        who = {"request_id": request_id, "caller_uid": caller.uid, "caller_pid": caller.pid}
        if isinstance(first, Call):
            await self._record_quietly("received", call, input_digest=digest, inputs=safe,
                                       note=f"repeat of {first.call_id}, still running", **who)
            self._calls.pop(call.call_id)
            return first
        received = ("received", call.call_id, name, {"input_digest": digest, "inputs": safe, **who})
        try:
            if first is not None:
                await self.audit.record_many([received])
                await self._answer_repeat(call, first)
                return call
            # Received and dispatched (or held) share one fsync; both are durable before
            # anything runs.
            if held:
                then = ("held", call.call_id, name, {"request_id": request_id, "note": f"{call.gate} gate"})
            else:
                then = ("dispatched", call.call_id, name, {"request_id": request_id})
            await self.audit.record_many([received, then])
        except RungdError as failure:  # the ledger cannot be written: run nothing (fail closed)
            if first is None:
                if not held:
                    self._release_slot(tool)
                self._keys.pop((name, request_id or ""), None)
            self._finish(call, self._error_envelope(call, failure, tool=tool))
            return call
        if held:
            call.held = Held(inputs=valid, since=time.time(),
                             expires=time.time() + self.config.gates.approval_ttl_s)
            self._nursery.start_soon(self._hold, call, tool)
        else:
            self._nursery.start_soon(self._run, call, tool, valid)
        return call

    # --- gates -------------------------------------------------------------------------------

    async def _hold(self, call: Call, tool: Tool) -> None:
        """Wait for a person's decision on a held call, then run it, or end it unrun."""
        assert call.held is not None
        with trio.move_on_at(trio.current_time() + call.held.expires - time.time()):
            await call.held.decided.wait()
        if call.held.verdict == "deciding":  # an operator is mid-decision at the expiry: let it land
            await call.held.decided.wait()
        verdict = call.held.verdict
        if verdict != "approved":
            if verdict is None:
                await self._record_quietly("expired", call, request_id=call.request_id)
                error: RungdError = ApprovalExpired(
                    f"nobody approved the call within {self.config.gates.approval_ttl_s:g} s; it did not run",
                    hint="ask an operator to approve it promptly, then call again with a new request",
                )
            else:
                error = GateDenied(f"an operator denied the call: {call.held.reason or 'no reason given'}",
                                   hint="do not retry this change; ask the operator what to do instead")
            envelope = self._error_envelope(call, error, tool=tool)
            await self._record_quietly("finished", call, request_id=call.request_id, outcome="not_started",
                                       effect="none", code=error.code, result=msgspec.to_builtins(envelope))
            self._keys.pop((tool.name, call.request_id or ""), None)
            call.held = None
            self._finish(call, envelope)
            return
        inputs = call.held.inputs
        call.held = None
        try:
            self._take_slot(tool)
        except Busy as busy:
            envelope = self._error_envelope(call, busy, tool=tool)
            await self._record_quietly("finished", call, request_id=call.request_id, outcome="not_started",
                                       effect="none", code=busy.code, result=msgspec.to_builtins(envelope))
            self._keys.pop((tool.name, call.request_id or ""), None)
            self._finish(call, envelope)
            return
        try:
            await self.audit.record("dispatched", call.call_id, tool.name, request_id=call.request_id)
        except RungdError as failure:
            self._release_slot(tool)
            self._keys.pop((tool.name, call.request_id or ""), None)
            envelope = self._error_envelope(call, failure, tool=tool)
            # Nothing ran: say so, if the ledger takes it, so the request_id is free again.
            await self._record_quietly("finished", call, request_id=call.request_id, outcome="not_started",
                                       effect="none", code=failure.code)
            self._finish(call, envelope)
            return
        await self._run(call, tool, inputs)

    # --- reconcile ---------------------------------------------------------------------------

    async def reconcile(self, tool_name: str, request_id: str, caller: Caller, found: bool | None = None) -> Envelope:
        """Settle a request whose outcome is unknown, and record what was found.

        Runs the settle read named in the first result; when it shows the expected fields
        the effect happened (``existing``), when it does not, nothing happened and the
        request_id may be used again. A tool that declares no expected fields cannot be
        decided by code: an operator decides with ``found``.

        Raises:
            UnknownTool, Denied: as for a call of ``tool_name``.
            ReconcileRequired: the settle read failed, or could not decide; still unknown.
            KeyError: no call used this request_id within the retention.
        """
        tool = self.lookup(tool_name, caller).tool
        entry = self.audit.index.lookup(tool_name, request_id)
        if entry is None:
            raise KeyError(request_id)
        first = msgspec.convert(entry.result, Envelope) if entry.result else None
        if entry.state != "unknown" or first is None:
            if first is not None:
                return first  # already settled: nothing to do, the first result stands
            raise ReconcileRequired(f"call {entry.call_id} is still running", hint="wait for it, then reconcile",
                                    outcome="unknown")
        settle = first.settle
        if found is None:
            if settle is None:
                raise ReconcileRequired(f"{tool_name} declares no settle read; an operator must decide",
                                        hint="rungctl reconcile TOOL REQUEST_ID --found yes|no", outcome="unknown")
            read = await self.call(settle.tool, settle.inputs, None, caller, MAX_WAIT_S)
            if read.status != "ok":
                raise ReconcileRequired(
                    f"the settle read {settle.tool} did not answer: "
                    f"{read.error.code if read.error else read.status}",
                    hint="try reconcile again later", outcome="unknown", settle=msgspec.to_builtins(settle),
                )
            if not settle.expect:
                raise ReconcileRequired(
                    f"{tool_name} does not say what its settle read shows after the change; an operator must decide",
                    hint=f"the settle read found {read.fields}; decide with rungctl reconcile --found yes|no",
                    outcome="unknown", fields=read.fields,
                )
            found = None if read.truncated else shows(read.fields, settle.expect)
            if found is None:
                # A cut result, or an expectation that could not be bound, cannot say "it did
                # not happen": guessing no would free the request_id for a second run.
                raise ReconcileRequired(
                    f"the settle read {settle.tool} cannot decide: it lacks the expected fields",
                    hint=f"an operator must decide with rungctl reconcile --found yes|no; it found {read.fields}",
                    outcome="unknown", fields=read.fields,
                )
            evidence, verified = read.fields, f"settle read {settle.tool} (call {read.call_id})"
        else:
            if not is_operator(caller, self.config):
                raise Denied("only an operator may decide a reconcile by hand",
                             hint="run reconcile without --found to use the tool's settle read")
            evidence, verified = {}, f"decided by operator uid {caller.uid}"
        envelope = msgspec.structs.replace(
            first, status="ok", outcome="done" if found else "not_started", effect="existing" if found else "none",
            error=None, next_action="continue", settle=None, fields=evidence, verified_by=verified,
        )
        await self.audit.record(
            "reconciled", entry.call_id, tool.name, request_id=request_id, caller_uid=caller.uid,
            outcome=envelope.outcome, effect=envelope.effect,
            result=msgspec.to_builtins(envelope) if found else None,
            note="the effect happened" if found else "the effect did not happen; the request_id is free again",
        )
        return envelope

    def held_calls(self, caller: Caller) -> list[Call]:
        """Held calls this caller may see: all of them for an operator, else its own."""
        operator = is_operator(caller, self.config)
        return [c for c in self._calls.values()
                if c.held is not None and c.held.verdict is None and (operator or c.caller.uid == caller.uid)]

    async def decide(self, call_id: str, caller: Caller, *, approve: bool, signature: str | None = None,
                     reason: str = "") -> None:
        """Record an operator's approval or denial of a held call and let it go on.

        Raises:
            KeyError: no such call.
            Denied: the caller is not an operator, or is the one who made the call.
            GateDenied: the call is not held, or its signature gate refused the signature.
            LedgerUnavailable: the decision could not be recorded; nothing changed.
        """
        call = self._calls[call_id]
        held = call.held
        if held is None or held.verdict is not None or held.expires <= time.time():
            raise GateDenied(f"call {call_id} is not waiting for approval", hint="rungctl pending lists held calls")
        if not is_operator(caller, self.config):
            raise Denied(f"uid {caller.uid} is not an operator", hint="operators are set in gates.operator_*")
        if caller.uid == call.caller.uid:
            raise Denied("nobody may approve or deny their own call", hint="ask another operator")
        if approve and call.gate == "signature" and not signature:
            raise GateDenied("this call needs a signed approval", hint="rungctl approve CALL_ID --key KEYFILE")
        # Claim the decision before the first await: a second operator, or the expiry,
        # must find it taken rather than record a second verdict.
        held.verdict = "deciding"
        try:
            principal = None
            if approve and call.gate == "signature":
                message = approval_message(call.call_id, call.tool, call.digest)
                signers = self.config.gates.allowed_signers
                assert signers is not None  # check_gates refused to start without it
                # ssh-keygen is our child: keep the reaper off it, or its exit status is lost
                # and a failed verification would read as a success.
                with self.reaper.spawning() if self.reaper else contextlib.nullcontext():
                    principal = await trio.to_thread.run_sync(verify_signature, signers, message, signature)
            event = "approved" if approve else "denied"
            note = f"signed by {principal}" if principal else (reason or None)
            await self.audit.record(event, call.call_id, call.tool, request_id=call.request_id,
                                    approver_uid=caller.uid, note=note)
        except BaseException:
            held.verdict = None  # nothing was decided: the call still waits
            raise
        held.verdict = event
        held.reason = reason
        held.decided.set()

    def _repeat_of(self, tool: Tool, request_id: str | None, digest: str) -> Call | dict[str, Any] | None:
        """What an earlier call with this request_id means for this one.

        Returns:
            None: a new request; run it. A ``Call``: the same request is running now;
            answer with it. A dict: the first result of the same request, finished.

        Raises:
            BadInput: a write without a request_id.
            IdempotencyMismatch: the request_id was used with other inputs.
            ReconcileRequired: the first call's outcome is unknown.
        """
        if not tool.requires_request_id:
            return None
        if not request_id:
            raise BadInput(
                f"{tool.name} changes something ({tool.side_effect}), so it needs a request_id",
                hint="send a request_id that is unique per intended change, e.g. a UUID; "
                "repeat it only to retry the same change",
            )
        running = self._calls.get(self._keys.get((tool.name, request_id), ""))
        entry = self.audit.index.lookup(tool.name, request_id)
        first_digest = running.digest if running else entry.input_digest if entry else None
        if first_digest is not None and first_digest != digest:
            raise IdempotencyMismatch(
                f"request_id {request_id!r} was already used for {tool.name} with other inputs",
                hint="use a new request_id for a new change; reuse one only to retry the very same inputs",
            )
        if running is not None and running.envelope is None:
            return running
        if entry is None:
            return None
        first = entry.result
        if entry.state == "running" or first is None:
            raise ReconcileRequired(
                f"request_id {request_id!r} belongs to call {entry.call_id}, which never finished",
                hint="run the settle read (reconcile) to learn whether it took effect",
                outcome="unknown",
            )
        if entry.state == "unknown":
            raise ReconcileRequired(
                f"the first call with request_id {request_id!r} ({entry.call_id}) ended with outcome unknown",
                hint="run its settle read before retrying; a blind retry could do it twice",
                outcome="unknown",
                settle=first.get("settle"),
            )
        return first

    async def _answer_repeat(self, call: Call, first: dict[str, Any]) -> None:
        """Answer a repeat of a finished request with its first result; run nothing."""
        envelope = msgspec.convert(first, Envelope)
        if envelope.status == "ok" and envelope.effect in ("changed", "no_change"):
            envelope = msgspec.structs.replace(envelope, effect="existing")
        await self.audit.record("finished", call.call_id, call.tool, request_id=call.request_id,
                                outcome=envelope.outcome, effect=envelope.effect,
                                code=envelope.error.code if envelope.error else None,
                                note=f"repeat of {envelope.call_id}; nothing was run")
        self._finish(call, envelope)

    async def _reject(self, call: Call, rejection: RungdError, digest: str, safe: dict[str, Any]) -> Call:
        envelope = self._error_envelope(call, rejection, tool=self.tools.get(call.tool))
        who = {"request_id": call.request_id, "caller_uid": call.caller.uid, "caller_pid": call.caller.pid}
        await self._record_quietly("received", call, input_digest=digest, inputs=safe, **who)
        await self._record_quietly("rejected", call, request_id=call.request_id, outcome=envelope.outcome,
                                   effect="none", code=rejection.code)
        self._finish(call, envelope)
        return call

    async def _record_quietly(self, event: str, call: Call, **fields: Any) -> None:
        """Record an event of a call that runs nothing; a ledger failure is logged, not fatal."""
        try:
            await self.audit.record(event, call.call_id, call.tool, **fields)
        except RungdError:
            pass  # already logged by Audit; nothing was or will be run for this call

    def _visible(self, call_id: str, caller: Caller | None) -> Call:
        """The call, if this caller may see it: its own, an operator, or one allowed its tool.

        Raises:
            KeyError: no such call, or not this caller's business (the same answer, so
                call_ids of others cannot be probed).
        """
        call = self._calls[call_id]
        if caller is None or caller.uid == call.caller.uid or is_operator(caller, self.config):
            return call
        if call.tool in self.tools and self.config.allowed(call.tool, caller.uid, caller.groups):
            return call
        raise KeyError(call_id)

    async def wait(self, call_id: str, wait_s: float, caller: Caller | None = None) -> Envelope:
        """The envelope of ``call_id``, waiting up to ``wait_s`` for it to finish.

        Raises:
            KeyError: the call is unknown (never existed, finished long ago, or not the
                caller's to see).
        """
        call = self._visible(call_id, caller)
        with trio.move_on_after(max(0.0, min(wait_s, MAX_WAIT_S))):
            await call.done.wait()
        return call.envelope if call.envelope is not None else call.pending()

    def status(self, call_id: str, caller: Caller | None = None) -> Envelope:
        call = self._visible(call_id, caller)
        return call.envelope if call.envelope is not None else call.pending()

    async def shutdown(self, grace_s: float) -> None:
        """Let running calls finish for ``grace_s``, then interrupt the rest.

        Cancellation: interrupted calls end with INTERRUPTED (outcome unknown when their
        commit point had passed); their handlers clean up (kill trees) before returning.
        """
        with trio.move_on_after(grace_s):
            await self._idle.wait()
        for call in self._calls.values():
            if call.scope is not None and call.envelope is None:
                call.interrupted = True
                call.scope.cancel()
        await self._idle.wait()

    # --- running one call ------------------------------------------------------------------

    async def _run(self, call: Call, tool: Tool, inputs: Any) -> None:
        work_dir = self.work_root / call.call_id
        ctx = CallContext(
            call_id=call.call_id,
            tool=tool,
            caller=call.caller,
            request_id=call.request_id,
            deadline=trio.current_time() + tool.timing.deadline_s,
            work_dir=work_dir,
            evidence_dir=self.evidence_dir,
            credentials=lambda name: self.credentials.get(name, tool.name),
            reaper=self.reaper,
        )
        settle = tool.timing.settle.bind(inputs.model_dump()) if tool.timing.settle else None
        try:
            envelope = await self._outcome(call, tool, inputs, ctx, settle)
            # The work folder is scratch for this call only (the runner's private files
            # included): gone once the call is.
            shutil.rmtree(work_dir, ignore_errors=True)
            with trio.CancelScope(shield=True):  # the end of a call is recorded even at shutdown
                await self._record_end(call, tool, envelope)
        finally:
            # Released only once the caller can read the result, so a shutdown that waits
            # for idle never cuts off an answer.
            self._release_slot(tool)

    async def _outcome(
        self, call: Call, tool: Tool, inputs: Any, ctx: CallContext, settle: dict[str, Any] | None
    ) -> Envelope:
        """Run the handler under the deadline; turn whatever happens into one envelope."""
        try:
            with trio.CancelScope() as call.scope:
                with trio.move_on_at(ctx.deadline) as deadline_scope:
                    result = await tool.handler(ctx, inputs)
            if call.interrupted and call.scope.cancelled_caught:  # a finished result stands
                raise Interrupted(
                    "the daemon stopped while the call was running",
                    hint="run the settle read (reconcile) before retrying" if ctx.committed else "retry the call",
                    outcome="unknown" if ctx.committed else "not_started",
                    settle=settle if ctx.committed else None,
                )
            if deadline_scope.cancelled_caught:
                raise _timeout(tool, ctx, settle)
            envelope = self._ok_envelope(call, tool, result, ctx)
        except RungdError as exc:
            _after_commit_point(exc, tool, ctx, settle)
            envelope = self._error_envelope(call, exc, tool=tool, ctx=ctx)
        except Exception as exc:  # a bug in a handler must not take the daemon down
            log.exception("tool %s crashed in call %s", tool.name, call.call_id)
            outcome = "unknown" if ctx.committed else "not_started"
            failure = Failed(
                f"the tool's handler failed: {type(exc).__name__}",
                hint="this is a bug in the plugin; the operator's log has the details",
                outcome=outcome,
                settle=settle if ctx.committed else None,
            )
            envelope = self._error_envelope(call, failure, tool=tool, ctx=ctx)
        return envelope

    async def _record_end(self, call: Call, tool: Tool, envelope: Envelope) -> None:
        envelope = fit_to_cap(envelope, tool.cap_bytes)
        for delay in (0.1, 0.5, 1.0, 2.0, None):  # space may come back: try for a few seconds
            try:
                await self.audit.record(
                    "finished", call.call_id, tool.name, request_id=call.request_id, outcome=envelope.outcome,
                    effect=envelope.effect, code=envelope.error.code if envelope.error else None,
                    result=msgspec.to_builtins(envelope),
                )
                break
            except RungdError:
                if delay is None:
                    # The effect happened (or not) whatever the ledger says: the caller gets
                    # the truth, the log says the record is missing, and recovery will
                    # finish the call as unknown, so a repeat is reconciled, never rerun.
                    log.critical("finished record lost", extra={"call_id": call.call_id, "tool": tool.name})
                else:
                    await trio.sleep(delay)
        if call.request_id:
            self._keys.pop((tool.name, call.request_id), None)
        self._finish(call, envelope)

    def _take_slot(self, tool: Tool) -> None:
        running = self._running.get(tool.name, 0)
        if tool.concurrency is not None and running >= tool.concurrency:
            raise Busy(
                f"{tool.name} already runs {running} call(s), its limit",
                hint="wait for the running call to finish, then retry; nothing was started",
            )
        self._running[tool.name] = running + 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle

    def _release_slot(self, tool: Tool) -> None:
        self._running[tool.name] -= 1
        if not any(self._running.values()):
            self._idle.set()

    def _finish(self, call: Call, envelope: Envelope) -> None:
        cap = self.tools[call.tool].tool.cap_bytes if call.tool in self.tools else None
        call.envelope = fit_to_cap(envelope, cap) if cap else fit_to_cap(envelope)
        for result in self.pm.hook.rungd_observe_result.get_hookimpls():
            try:
                result.function(
                    **{k: v for k, v in {"tool": call.tool, "envelope": call.envelope, "caller": call.caller}.items()
                       if k in result.argnames}
                )
            except Exception:  # an observer must never change or lose the result
                log.exception("result observer %s failed", result.plugin_name)
        call.done.set()
        log.info(
            "call finished",
            extra={"call_id": call.call_id, "tool": call.tool, "status": call.envelope.status,
                   "code": call.envelope.error.code if call.envelope.error else None},
        )

    def _forget_old(self) -> None:
        # Runs on every call: _calls is in start order, so look only at the old front of it.
        horizon = time.monotonic() - self.config.server.keep_results_s
        old = []
        for call in self._calls.values():
            if call.started >= horizon:
                break
            if call.envelope is not None:
                old.append(call.call_id)
        for call_id in old:
            del self._calls[call_id]

    # --- building envelopes ----------------------------------------------------------------

    def _ok_envelope(self, call: Call, tool: Tool, result: Result, ctx: CallContext) -> Envelope:
        if tool.side_effect == "read" and result.effect != "none":
            raise Failed(f"{tool.name} is a read but reported effect {result.effect!r}",
                         hint="this is a bug in the plugin", outcome="done")
        try:
            msgspec.json.encode(result.fields)
        except (TypeError, msgspec.EncodeError) as exc:
            raise Failed(f"{tool.name} returned a field that cannot be sent: {exc}",
                         hint="this is a bug in the plugin", outcome="unknown" if ctx.committed else "done") from None
        if tool.side_effect != "read" and (result.effect not in ("changed", "no_change") or not result.verified_by):
            raise Failed(f"{tool.name} is a write but reported effect {result.effect!r} without a read-back",
                         hint="this is a bug in the plugin: a write reads back and says changed or no_change",
                         outcome="unknown" if ctx.committed else "not_started")
        if result.outcome != "done":
            raise Failed(f"{tool.name} reported success with outcome {result.outcome!r}",
                         hint="this is a bug in the plugin: raise an error for an outcome that is not done",
                         outcome="unknown" if ctx.committed else "not_started")
        if result.effect == "changed" and not result.verified_by:
            raise Failed(f"{tool.name} reported a change it did not read back",
                         hint="this is a bug in the plugin: set verified_by after a read-back",
                         outcome="unknown")
        return Envelope(
            call_id=call.call_id,
            tool=tool.name,
            request_id=call.request_id,
            status="ok",
            outcome=result.outcome,
            effect=result.effect,
            fields=result.fields,
            verified_by=result.verified_by,
            truncated=result.truncated,
            narrow=result.narrow,
            as_of=result.as_of,
            next_action="continue",
            evidence=[*ctx.evidence, *(e for e in result.evidence if e not in ctx.evidence)],
            elapsed_ms=_ms_since(call.started),
        )

    def _error_envelope(
        self, call: Call, exc: RungdError, *, tool: Tool | RegisteredTool | None, ctx: CallContext | None = None
    ) -> Envelope:
        if isinstance(tool, RegisteredTool):
            tool = tool.tool
        retry, next_action = exc.retry, exc.next_action
        rule = tool.error_rule(exc.code) if tool else None
        if rule is not None and isinstance(exc, ToolError):
            # The tool's own table decides retry and next_action for its codes.
            retry, next_action = rule.retry, rule.next_action
            if not exc.hint and rule.hint:
                exc.hint = rule.hint
        if tool is not None and tool.side_effect != "read" and retry == "yes" and exc.outcome != "not_started":
            # A repeat with the same request_id is answered from the ledger, and a new one
            # risks doing it twice: after a possible effect, check before retrying.
            retry, next_action = "after_check", "reconcile"
        return Envelope(
            call_id=call.call_id,
            tool=call.tool,
            request_id=call.request_id,
            status="error",
            outcome=exc.outcome,
            effect=exc.effect,
            fields=exc.fields,
            error=ErrorInfo(code=exc.code, message=exc.message, retry=retry, hint=exc.hint),
            next_action=next_action,
            settle=Settle(**exc.settle) if exc.settle else None,
            evidence=list(ctx.evidence) if ctx else [],
            elapsed_ms=_ms_since(call.started),
        )


# Failures that prove nothing about a write's effect once it may have begun.
_INCONCLUSIVE = {"FAILED", "SURFACE_CHANGED", "AUTH_REQUIRED", "PROMPT_UNEXPECTED", "INTERRUPTED"}


def _after_commit_point(exc: RungdError, tool: Tool, ctx: CallContext, settle: dict[str, Any] | None) -> None:
    """Decide an error's outcome where the commit point is known: here.

    An error that does not declare its outcome gets ``not_started`` before the commit point
    and, after it, ``unknown`` for a write (reconcile with the settle read before any
    retry) or ``done`` for a read. A declared ``done`` on a failure that proves nothing
    about a write's effect (an unnamed exit status, output that stopped parsing, a
    question) becomes ``unknown`` too. Other declared outcomes (a plugin that saw the
    program refuse, a read-back count) stand.
    """
    write_committed = tool.side_effect != "read" and ctx.committed
    if not exc.outcome_declared:
        exc.outcome = ("unknown" if write_committed else "done") if ctx.committed else "not_started"
    elif write_committed and exc.outcome == "done" and exc.code in _INCONCLUSIVE:
        exc.outcome = "unknown"
    if exc.outcome == "unknown":
        exc.settle = exc.settle or settle
        # Whatever else is wrong, the first thing to learn is whether it happened; only
        # "stop" (a person must look) outranks that.
        if exc.next_action != "stop":
            exc.retry, exc.next_action = "after_check", "reconcile"


def _timeout(tool: Tool, ctx: CallContext, settle: dict[str, Any] | None) -> ToolTimeout:
    deadline = tool.timing.deadline_s
    if ctx.committed:
        return ToolTimeout(
            f"{tool.name} passed its {deadline:g} s deadline after its commit point; the process tree was killed",
            hint="the effect may or may not have happened: run the settle read before any retry",
            outcome="unknown",
            settle=settle,
        )
    return ToolTimeout(
        f"{tool.name} passed its {deadline:g} s deadline before its commit point; nothing was changed",
        hint="safe to retry; if it keeps timing out, ask the operator to raise the deadline",
        outcome="not_started",
        retry="yes",
        next_action="retry_later",
    )


def _ms_since(start: float) -> int:
    return int((time.monotonic() - start) * 1000)
