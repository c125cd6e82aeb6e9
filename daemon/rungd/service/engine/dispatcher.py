"""The dispatcher: strings the stages of a call together, and nothing more.

    admission     which tool, may this caller use it, are the inputs valid     (admission.py)
    repeats       is this request_id new, running, finished or unknown         (idempotency.py)
    slots         may another call of this tool run now                        (slots.py)
    ledger        received + dispatched (or held), durable before anything runs (rungd.service.audit)
    approvals     held calls wait for a person                                  (approvals.py)
    precondition  the write's expected revision, under its resource lock        (preconditions.py)
    run           the handler under its deadline, in the daemon's call nursery
    settle        a write whose outcome is unknown: its settle read decides at once
    outcomes      whatever happened becomes one envelope, here only             (outcomes.py)
    ledger        finished, durable before the caller hears it (a read's: within a second)

Every decision that reads shared state (the idempotency index, the running requests, the
slots) is taken in ``start`` before its first ``await``, so two identical requests arriving
together cannot both be judged new. A call that never runs ends through one path,
``_never_ran``. Results stay in the call table for ``status`` and ``wait`` from any
connection of the same caller.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from rungd.service import sensitive
from rungd.service.audit import Audit
from rungd.config import Config
from rungd.core.contract import CallContext, Caller, Tool, ToolInputs
from rungd.service.credentials import CredentialStore
from rungd.core.envelope import Envelope, state_digest
from rungd.core.errors import Busy, Interrupted, ReconcileRequired, RungdError
from rungd.service.gates import gate_for, is_operator
from rungd.service.plugins import RegisteredTool
from rungd.system.proctree import Reaper
from rungd.redact import Redactor
from rungd.runner import limits
from rungd.runner.limits import Limits

from rungd.service.engine import outcomes, preconditions
from rungd.service.engine.admission import Admission, Admitted
from rungd.service.engine.policy import Policy

if TYPE_CHECKING:
    from rungd.service.stepdown import StepDownWatch
from rungd.service.engine.approvals import Approvals, Verdict
from rungd.service.engine.calls import Call, CallTable
from rungd.service.engine.idempotency import Requests
from rungd.service.engine.rejections import SUMMARY_AFTER_S, Rejections
from rungd.service.engine.reconcile import Reconciler
from rungd.service.engine.slots import Slots
from rungd.service.engine.workdirs import WorkFolders

log = logging.getLogger("rungd.calls")


def _journal_call(call: Call) -> dict[str, Any]:
    """The fields every journal entry about a call carries: ``journalctl REQUEST_ID=...``,
    ``CALLER_UID=...`` and ``CALL_ID=...`` find it."""
    return {"call_id": call.call_id, "tool": call.tool, "request_id": call.request_id,
            "caller_uid": call.caller.uid}

# A caller may ask to wait this long at most in one request; longer waits take several.
MAX_WAIT_S = 300.0

# observe(tool, envelope, caller): every result observer of the plugins, after the result is final.
Observer = Callable[[str, Envelope, Caller], None]

_Event = tuple[str, str, str, dict[str, Any]]


class Dispatcher:
    """Starts calls, remembers them, and answers ``status``, ``wait`` and decisions.

    Args:
        tools: the registered tools by name.
        config: the daemon's configuration.
        observe: called with every final result (the plugins' observers).
        credentials: the store handlers get named credentials from.
        audit: the ledger and idempotency index; every event is recorded there first.
        nursery: where handlers run; it belongs to the daemon and outlives connections, so
            a call keeps running when the client that started it goes away.
        reaper: the daemon's reaper of adopted orphans, handed to the runner.
        askpass: the daemon's askpass endpoint, handed to the runner.
        stand_in: the substitute for every program a call starts in ``rungctl check``'s
            or eval's dry run's daemon (``CallContext.stand_in``); None under ``rungd serve``.
    """

    def __init__(
        self,
        tools: Mapping[str, RegisteredTool],
        config: Config,
        observe: Observer,
        credentials: CredentialStore,
        audit: Audit,
        nursery: trio.Nursery,
        *,
        reaper: Reaper | None = None,
        askpass: Any = None,
        stand_in: Any = None,
    ) -> None:
        self.policy = Policy(config, tools)
        self.audit = audit
        self._observe = observe
        self._credentials = credentials
        self._reaper = reaper
        self._askpass = askpass
        self._stand_in = stand_in
        self._nursery = nursery
        self.admission = Admission(self.policy, sensitive.Marks.of_state(config.state_dir))
        # Decoding and admitting a large request (server.LARGE_REQUEST) costs memory many times
        # its bytes and the loop up to a few hundred ms: they take turns, one decoded at a
        # time, so no caller's can line up in front of every call.
        self.big_requests = trio.Lock()
        self.calls = CallTable(config.server.keep_results_s, lambda caller: is_operator(caller, self.config),
                               max_results=config.server.max_results)
        self.requests = Requests(audit.index, self.calls)
        self.slots = Slots(config.server.max_running_calls, config.server.max_running_calls_per_uid)
        self.rejections = Rejections()
        self._sum_up_now = trio.Event()  # set at shutdown: every summary is written then
        self.resources = preconditions.ResourceLocks()
        self.approvals = Approvals(self.policy, self.calls, self._record_call)
        self.reconciler = Reconciler(self.policy, audit.index, audit.record, self._read_call)
        self.evidence_dir = config.state_dir / "evidence"
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        (config.state_dir / "work").mkdir(parents=True, exist_ok=True)
        # Never the default thread limiter: see audit.py.
        self.work = WorkFolders(config.state_dir / "work", trio.CapacityLimiter(4))
        # Told every evidence id a call ended with (the envelope may list only the first):
        # the evidence store counts what calls wrote (EvidenceStore.finished).
        self.evidence_written: Callable[[list[str]], None] | None = None
        bounds = config.limits
        # no_new_privs stays off by default: tools wrap setuid programs (sudo -u, crontab).
        limits.set_defaults(Limits(cpu_s=bounds.cpu_s, address_space_bytes=bounds.memory_bytes,
                                   open_files=bounds.open_files, processes=bounds.processes,
                                   file_size_bytes=bounds.file_size_bytes, core_bytes=bounds.core_bytes,
                                   no_new_privs=False))

    @property
    def stopping(self) -> bool:
        """Whether shutdown began: held by the approvals, which refuse decisions from then on."""
        return self.approvals.closed

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.approvals.closed = value

    @property
    def config(self) -> Config:
        """The configuration in force (the policy's; a reload swaps it)."""
        return self.policy.config

    def use(self, config: Config, tools: Mapping[str, RegisteredTool], refused: Sequence[str]) -> None:
        """Decide access, gates and operators by ``config`` and admit calls to ``tools`` from
        now on (a reload); ``refused`` is what the plugins left out, for operators. Calls
        already admitted or held keep what they were decided with."""
        self.policy.use(config, tools, refused)

    def note_reload(self, before: Mapping[str, RegisteredTool], after: Mapping[str, RegisteredTool]) -> str | None:
        """Record in the ledger which tools a reload added, changed (another definition digest)
        or removed, so an auditor can tell what a tool was when it acted; returns the note,
        or None when the reload changed no tool (then nothing is recorded)."""
        added = sorted(after.keys() - before.keys())
        removed = sorted(before.keys() - after.keys())
        changed = sorted(name for name in after.keys() & before.keys() if after[name].digest != before[name].digest)
        if not (added or removed or changed):
            return None
        parts = [f"{what}: " + ", ".join(f"{name} {after[name].digest}" if what != "removed" else name
                                          for name in names)
                 for what, names in (("added", added), ("changed", changed), ("removed", removed)) if names]
        note = "; ".join(parts)
        if len(note) > 3000:  # a ledger line stays small: the names that fit, and how many more
            note = note[:2900].rsplit(",", 1)[0] + f", ... ({len(added) + len(changed) + len(removed)} tools in all)"
        self._nursery.start_soon(self._record_quietly, [("reloaded", "", "", {"note": note})])
        return note

    def watch_step_downs(self, watch: StepDownWatch) -> None:
        """Mark tools, and refuse a suspended one, by ``watch`` from now on."""
        self.admission.step_downs = watch

    @property
    def step_downs(self) -> StepDownWatch | None:
        return self.admission.step_downs

    def visible_tools(self, caller: Caller) -> list[RegisteredTool]:
        """The tools ``caller`` may call, in name order."""
        return self.admission.visible_tools(caller)

    def lookup(self, name: str, caller: Caller) -> RegisteredTool:
        """The tool ``name``, if ``caller`` may use it (else UnknownTool, as admission says)."""
        return self.admission.lookup(name, caller)

    # --- what the server asks ---------------------------------------------------------------

    async def call(
        self, name: str, inputs: Mapping[str, Any], request_id: str | None, caller: Caller, wait_s: float
    ) -> Envelope:
        """Start a call and wait up to ``wait_s`` for its envelope (else a pending one)."""
        call = await self.start(name, inputs, request_id, caller)
        return await self.wait(call.call_id, wait_s, caller)

    async def wait(self, call_id: str, wait_s: float, caller: Caller | None = None) -> Envelope:
        """The envelope of ``call_id``, waiting up to ``wait_s`` for it to finish.

        Raises:
            UnknownCall: never existed, finished long ago, or not the caller's to see.
        """
        call = self.calls.visible(call_id, caller)
        # A scope made directly: move_on_after adds a generator's set-up to every call.
        with trio.CancelScope(deadline=trio.current_time() + max(0.0, min(wait_s, MAX_WAIT_S))):
            await call.done.wait()
        return call.envelope if call.envelope is not None else outcomes.pending_envelope(call)

    def status(self, call_id: str, caller: Caller | None = None) -> Envelope:
        """The envelope of ``call_id`` now. Raises UnknownCall as ``wait``."""
        call = self.calls.visible(call_id, caller)
        return call.envelope if call.envelope is not None else outcomes.pending_envelope(call)

    def held_calls(self, caller: Caller) -> list[Call]:
        return self.approvals.held_calls(caller)

    async def decide(self, call_id: str, caller: Caller, *, approve: bool, signature: str | None = None,
                     reason: str = "") -> Verdict:
        return await self.approvals.decide(call_id, caller, approve=approve, signature=signature, reason=reason)

    async def reconcile(self, tool_name: str, request_id: str, caller: Caller, found: bool | None = None, *,
                        of_uid: int | None = None) -> Envelope:
        """Settle a request whose outcome is unknown (see ``Reconciler.reconcile``)."""
        tool = self.admission.lookup(tool_name, caller).tool
        return await self.reconciler.reconcile(tool, request_id, caller, found, of_uid=of_uid)

    async def shutdown(self, grace_s: float) -> None:
        """Let running calls finish for ``grace_s``, then interrupt the rest.

        Cancellation: interrupted calls end with INTERRUPTED (outcome unknown when their
        commit point had passed); their handlers clean up (kill trees) before returning.
        """
        # From now on neither an approval nor a new call from a connection still open may
        # start something this shutdown would interrupt.
        self.stopping = True
        self._sum_up_now.set()  # refusals left out of the ledger are summed up now
        with trio.move_on_after(grace_s):
            await self.slots.wait_idle()
        for call in self.calls:
            if call.scope is not None and call.envelope is None:
                call.interrupted = True
                call.scope.cancel()
        # Interrupted handlers kill their trees (bounded); this bound only guards a bug.
        with trio.move_on_after(grace_s + 30):
            await self.slots.wait_idle()

    # --- starting a call ---------------------------------------------------------------------

    async def start(self, name: str, inputs: Mapping[str, Any], request_id: str | None, caller: Caller) -> Call:
        """Check, record and start one call. A call that fails its checks ends at once.

        Returns:
            The call. A repeat of a request still running ends when the first call does,
            with its result as a repeat (a change reads ``existing``).
        """
        call = Call.new(name, request_id, caller)
        self.calls.add(call)
        admitted: Admitted | None = None
        try:
            admitted = self.admission.admit(name, inputs, caller)
            call.digest = admitted.digest
            first = self.requests.repeat_of(admitted.tool, request_id, admitted.digest, caller.uid)
            call.gate = gate_for(admitted.tool, self.config)
            if first is None:
                if self.stopping:
                    raise Busy("rungd is stopping and starts nothing new; nothing was started",
                               hint="retry the same call once rungd is back (the same request_id is safe)")
                if self._needs_approval(call):
                    self.approvals.check_room(caller)
                else:
                    self.slots.take(admitted.tool, caller.uid)
                self.requests.claim(call)
        except RungdError as rejection:
            tool = self.admission.usable(name, caller)
            if self.rejections.record_each(caller.uid):
                await self._never_ran(call, rejection, tool, before=[self._received(call, admitted)], final="rejected")
            else:  # refused faster than the ledger records one by one: counted, summed up later
                if self.rejections.leave_out(caller.uid, rejection.code, name):
                    self._nursery.start_soon(self._sum_up_rejections, caller.uid)
                self.requests.release(call)
                self._finish(call, outcomes.error_envelope(call, rejection, tool=tool), journal=False)
            return call
        # No await above this line decided anything: from here on, the decision stands.
        received = self._received(call, admitted)
        if isinstance(first, Call):
            call.joined = first
            state = f"held at its {first.gate} gate" if first.held is not None else "still running"
            received[3]["note"] = f"repeat of {first.call_id}, {state}"
            try:
                await self._record_quietly([received])
            except BaseException:  # cancelled (a shutdown): this repeat waits for nothing now
                self._finish(call, outcomes.error_envelope(call, Interrupted(
                    f"rungd stopped while this repeat waited for the first call of its request ({first.call_id}), "
                    "which may act", hint="send the same request_id again once rungd is back: it is answered "
                    "with the first call's result, or told to reconcile", outcome="unknown"), tool=admitted.tool))
                raise
            self._nursery.start_soon(self._join, call, first)
            return call
        if first is not None:
            await self._answer_repeat(call, first, received)
            return call
        await self._dispatch(call, admitted, received)
        return call

    def _needs_approval(self, call: Call) -> bool:
        return call.gate in ("review", "signature")

    def _received(self, call: Call, admitted: Admitted | None) -> _Event:
        return ("received", call.call_id, call.tool, {
            "input_digest": admitted.digest if admitted else None, "inputs": admitted.logged if admitted else {},
            "request_id": call.request_id, "caller_uid": call.caller.uid, "caller_pid": call.caller.pid,
            "tool_digest": admitted.definition or None if admitted else None,
        })

    async def _dispatch(self, call: Call, admitted: Admitted, received: _Event) -> None:
        """Record received and dispatched (or held) with one fsync, then run or hold."""
        tool, held = admitted.tool, self._needs_approval(call)
        then: _Event = (("held", call.call_id, call.tool, {"request_id": call.request_id, "note": f"{call.gate} gate"})
                        if held else ("dispatched", call.call_id, call.tool, {"request_id": call.request_id}))
        try:
            # A write's records are durable before it runs. A read's are written before it runs
            # and made durable by the next fsync, within a second (the README says what a
            # crash can lose): a read has no effect to be unsure about.
            await self.audit.record_many([received, then], new_work=True,
                                         durable=held or tool.side_effect != "read")
        except BaseException as failure:
            # The ledger cannot be written: run nothing (fail closed). Or the connection was
            # cancelled meanwhile (a shutdown): the call never runs, and must hold no slot
            # (the shutdown waits for them) nor its request_id (a repeat would wait on it).
            if not held:
                self.slots.release(tool, call.caller.uid)
            self.requests.release(call)
            error = failure if isinstance(failure, RungdError) else Busy(
                "rungd stopped before the call was recorded; nothing was started",
                hint="retry the same call once rungd is back (the same request_id is safe)")
            self._finish(call, outcomes.error_envelope(call, error, tool=tool))
            if error is not failure:
                raise
            return
        if held:
            # The held call keeps its inputs as shown (pending lists them to operators); the
            # inputs it runs with wait in its own task, the one place that runs them.
            self.approvals.hold(call, admitted.shown, _plan(tool, admitted.shown))
            log.info("call held at its %s gate", call.gate, extra={
                **_journal_call(call), "journal": {"GATE": str(call.gate)}})
            self._nursery.start_soon(self._hold, call, tool, admitted.inputs)
        else:
            self._nursery.start_soon(self._run, call, tool, admitted.inputs)

    async def _answer_repeat(self, call: Call, first: dict[str, Any], received: _Event | None) -> None:
        """Answer a repeat of a finished request with its first result; run nothing.

        The answer comes from memory even when the ledger cannot take the repeat's records:
        a repeat changes nothing, so there is nothing to fail closed on.
        """
        envelope = outcomes.repeat_envelope(first, call)
        finished = ("finished", call.call_id, call.tool, {
            "request_id": call.request_id, "outcome": envelope.outcome, "effect": envelope.effect,
            "code": envelope.error.code if envelope.error else None,
            "note": f"repeat of {first['call_id']}; nothing was run",
        })
        try:
            await self._record_quietly([received, finished] if received else [finished])
        finally:  # even if cancelled meanwhile (a shutdown): the call has its answer
            self._finish(call, envelope)

    async def _join(self, call: Call, first: Call) -> None:
        """A repeat of a request still running: end with the first call's result, as a repeat
        (RECONCILE_REQUIRED when its outcome is unknown, as for any repeat of such a request)."""
        await first.done.wait()
        assert first.envelope is not None
        if first.envelope.outcome == "unknown":
            settle = msgspec.to_builtins(first.envelope.settle) if first.envelope.settle else None
            await self._never_ran(call, ReconcileRequired(
                f"the first call with request_id {call.request_id!r} ({first.call_id}) ended with outcome unknown",
                hint="run its settle read before retrying; a blind retry could do it twice",
                outcome="unknown", settle=settle), self.admission.tool(call.tool))
            return
        await self._answer_repeat(call, msgspec.to_builtins(first.envelope), None)

    async def _hold(self, call: Call, tool: Tool, inputs: ToolInputs) -> None:
        """Wait for a person's decision on a held call, then run it with ``inputs``, or end it unrun."""
        assert call.held is not None
        refusal = await self.approvals.verdict(call)
        if refusal is None:
            try:
                self.slots.take(tool, call.caller.uid)
            except RungdError as busy:
                refusal = busy
        if refusal is None:
            try:
                await self.audit.record_many([("dispatched", call.call_id, tool.name,
                                               {"request_id": call.request_id})], new_work=True)
            except RungdError as failure:
                self.slots.release(tool, call.caller.uid)
                refusal = failure
        if refusal is not None:
            await self._never_ran(call, refusal, tool)
            return
        await self._run(call, tool, inputs)

    async def _never_ran(self, call: Call, error: RungdError, tool: Tool | None, *,
                         before: Sequence[_Event] = (), final: str = "finished") -> None:
        """End a call that ran nothing: record it (if the ledger takes it), free its
        request_id, and give the caller its envelope."""
        envelope = outcomes.error_envelope(call, error, tool=tool)
        fields: dict[str, Any] = {"request_id": call.request_id, "outcome": envelope.outcome, "effect": "none",
                                  "code": error.code}
        if final == "finished":
            fields["result"] = msgspec.to_builtins(envelope)
        try:
            await self._record_quietly([*before, (final, call.call_id, call.tool, fields)])
        finally:  # even if cancelled meanwhile (a shutdown): nothing waits on this call
            self.requests.release(call)
            self._finish(call, envelope)

    # --- running one call ----------------------------------------------------------------------

    async def _run(self, call: Call, tool: Tool, inputs: ToolInputs) -> None:
        work_dir = await self.work.take()
        ctx = CallContext(
            call_id=call.call_id,
            tool=tool,
            caller=call.caller,
            request_id=call.request_id,
            deadline=trio.current_time() + tool.timing.deadline_s,
            work_dir=work_dir,
            evidence_dir=self.evidence_dir,
            reaper=self._reaper,
            askpass=self._askpass,
            secrets=sensitive.values(inputs),  # its sensitive inputs: redacted like credentials
            stand_in=self._stand_in,
        )

        def credential(name: str) -> str | None:
            value = self._credentials.get(name, tool.name)
            if value:
                ctx.secrets.append(value)  # kept out of the result's fields as well as its output
            return value

        ctx.credentials = credential
        settle = tool.timing.settle.bind(inputs.model_dump()) if tool.timing.settle else None
        try:
            envelope = await self._outcome(call, tool, inputs, ctx, settle)
            spec = tool.timing.settle
            if envelope.outcome == "unknown" and spec and spec.at_once and settle and settle["expect"] \
                    and not call.interrupted:
                envelope = await self._settle_now(call, tool, envelope, settle, ctx)
            if envelope.outcome == "unknown" and envelope.settle is not None and envelope.settle.expect and \
                    (before := ctx.read_before(envelope.settle.tool, envelope.settle.inputs)) is not None:
                # For a reconcile: what the state was before the act, so it can tell a move.
                envelope = msgspec.structs.replace(envelope, settle=msgspec.structs.replace(
                    envelope.settle, before=state_digest(before, envelope.settle.expect)))
            # The work folder is scratch for this call only: empty or gone before the caller
            # hears; what the call left in it is removed (in a worker thread: an rmdir waits on
            # the filesystem's journal) while the finished record is written.
            remove = self.work.give_back(work_dir)
            if ctx.evidence and self.evidence_written is not None:
                self.evidence_written(ctx.evidence)
            events = _end_events(call, envelope, ctx)
            durable = tool.side_effect != "read"  # a write's end is synced before its caller hears
            if remove is not None or durable or not self.audit.record_now(events):
                with trio.CancelScope(shield=True):  # the end of a call is recorded even at shutdown
                    if remove is None:
                        await self._record_end(call, events, durable=durable)
                    else:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(remove)
                            await self._record_end(call, events, durable=durable)
            # (else a read's end was recorded on the loop, with no wait that a stop could cut)
            self.requests.release(call)
            self._finish(call, envelope)
        finally:
            # Released only once the caller can read the result, so a shutdown that waits
            # for idle never cuts off an answer.
            self.slots.release(tool, call.caller.uid)

    async def _outcome(
        self, call: Call, tool: Tool, inputs: ToolInputs, ctx: CallContext, settle: dict[str, Any] | None
    ) -> Envelope:
        """Run the handler under the deadline; whatever happens becomes one envelope."""
        pre = tool.precondition
        try:
            # One scope: the call's deadline, and a shutdown's interruption (which sets
            # call.interrupted before it cancels).
            with trio.CancelScope(deadline=ctx.deadline) as call.scope:
                result = await (self._checked(call, tool, inputs, ctx) if pre else tool.handler(ctx, inputs))
            if call.scope.cancelled_caught:  # a result that came first stands
                if call.interrupted:
                    raise outcomes.interrupted_error(ctx, settle)
                raise outcomes.timeout_error(tool, ctx, settle)
            return outcomes.ok_envelope(call, tool, result, ctx)
        except Exception as exc:  # a bug in a handler, or in shaping its error, must not take the daemon down
            if isinstance(exc, RungdError):
                try:
                    return outcomes.error_envelope(call, exc, tool=tool, ctx=ctx, settle=settle)
                except Exception as shaping:  # the error's own fields could not be shaped
                    exc = shaping
            # The traceback may quote an input or a credential (a handler's f-string): it
            # reaches the journal redacted, like everything else the call produced.
            told = "".join(traceback.format_exception(exc)).rstrip("\n")
            log.error("tool %s crashed in call %s\n%s", tool.name, call.call_id, Redactor(ctx.secrets).text(told),
                      extra={"call_id": call.call_id, "tool": tool.name, "crashed": True})
            crash = outcomes.crash_error(tool, ctx, settle, exc)
            return outcomes.error_envelope(call, crash, tool=tool, ctx=ctx, settle=settle)

    async def _checked(self, call: Call, tool: Tool, inputs: ToolInputs, ctx: CallContext) -> Any:
        """Run the handler of a tool with a precondition once the precondition holds.

        The lock spans the check and the act: no other call acts on the same resource in
        between.
        """
        assert tool.precondition is not None
        async with self.resources.hold(tool.precondition.lock_key(inputs.model_dump())):
            await preconditions.check(tool, inputs, call.caller, self._read_call)
            return await tool.handler(ctx, inputs)

    async def _settle_now(self, call: Call, tool: Tool, envelope: Envelope, settle: dict[str, Any],
                          ctx: CallContext) -> Envelope:
        """Run a write's settle read at once when its outcome is unknown, and let the read
        decide (``outcomes.settled``), compared with the same read made before the act when
        the handler noted one: a change, a state that was already there, nothing moved, or
        the read cannot say and the outcome stays ``unknown`` for reconcile.

        Cancellation: bounded by the settle tool's own deadline; a daemon that stops
        meanwhile leaves the outcome unknown.
        """
        read = await self.call(settle["tool"], settle["inputs"], None, call.caller, MAX_WAIT_S)
        if read.status != "ok" or read.truncated:
            return envelope
        return outcomes.settled(envelope, tool, read=read, expect=settle["expect"],
                                before=ctx.read_before(settle["tool"], settle["inputs"]), acted=ctx.may_have_acted(),
                                committed=ctx.committed)

    async def _record_end(self, call: Call, events: list[_Event], *, durable: bool) -> None:
        """Record a call's end (:func:`_end_events`; the caller hears it next); ``durable``: synced
        before it returns (a write's), else within a second (a read's)."""
        for delay in (0.1, 0.5, 1.0, 2.0, None):  # space may come back: try for a few seconds
            try:
                # A read's finished record is synced within a second, not before the caller
                # hears: a read has no effect to lose (the README says what a crash can lose).
                await self.audit.record_many(events, durable=durable)
                break
            except RungdError:
                if delay is None:
                    # The effect happened (or not) whatever the ledger says: the caller gets
                    # the truth, the log says the record is missing, and recovery will
                    # finish the call as unknown, so a repeat is reconciled, never rerun.
                    log.critical("finished record lost", extra={"call_id": call.call_id, "tool": call.tool})
                else:
                    await trio.sleep(delay)

    async def _read_call(self, tool: str, inputs: dict[str, Any], caller: Caller) -> Envelope:
        """Run a read (a settle or precondition read) as a call of ``caller``, on the record."""
        return await self.call(tool, inputs, None, caller, MAX_WAIT_S)

    # --- the end of every call -----------------------------------------------------------------

    def _finish(self, call: Call, envelope: Envelope, *, journal: bool = True) -> None:
        call.envelope = envelope
        self._observe(call.tool, envelope, call.caller)
        call.done.set()
        if not journal:  # one of a flood of refusals: the ledger's summary tells of it
            return
        # The ledger has every call; the journal, what an operator looks for: a call that
        # failed or changed something; a call that went well and changed nothing only with
        # --verbose (its line would cost the daemon more than the call's three ledger records).
        # An error is a warning (journalctl -p warning), unless the caller's own input was
        # wrong (next_action repair), and so is an outcome nobody knows.
        quiet = envelope.status == "ok" and envelope.effect == "none"
        trouble = envelope.outcome == "unknown" or (envelope.status == "error" and envelope.next_action != "repair")
        level = logging.DEBUG if quiet else logging.WARNING if trouble else logging.INFO
        if not log.isEnabledFor(level):
            return  # (the line's fields are not even gathered: the common read's case)
        log.log(
            level,
            "call finished",
            extra={**_journal_call(call), "status": envelope.status,
                   "code": envelope.error.code if envelope.error else None,
                   "journal": {"OUTCOME": envelope.outcome, "EFFECT": envelope.effect}},
        )

    async def _record_call(self, event: str, call: Call, **fields: Any) -> None:
        await self.audit.record(event, call.call_id, call.tool, **fields)

    async def _sum_up_rejections(self, uid: int) -> None:
        """Record how many refused calls of ``uid`` were left out of the ledger, a while
        after the first of them (at shutdown at the latest)."""
        with trio.move_on_after(SUMMARY_AFTER_S):
            await self._sum_up_now.wait()
        if (summary := self.rejections.summary(uid)) is not None:
            log.warning("uid %d is refused faster than the ledger records each refusal: %s", uid, summary)
            await self._record_quietly([("rejected", "", "", {"caller_uid": uid, "note": summary})])

    async def _record_quietly(self, events: list[_Event]) -> None:
        """Record events of a call that runs nothing; a ledger failure is logged, not fatal."""
        try:
            await self.audit.record_many(events)
        except RungdError:
            pass  # already logged by Audit; nothing was or will be run for this call


def _end_events(call: Call, envelope: Envelope, ctx: CallContext) -> list[_Event]:
    """What the runner answered for the call, and how it finished."""
    answered: list[_Event] = [("answered", call.call_id, call.tool, {"request_id": call.request_id, "note": what})
                              for what in ctx.answered]
    finished: _Event = ("finished", call.call_id, call.tool, {
        "request_id": call.request_id, "outcome": envelope.outcome, "effect": envelope.effect,
        "code": envelope.error.code if envelope.error else None,
        # The result is kept for what a repeat or reconcile answers: calls with a request_id.
        # A read's result would only grow the ledger (its evidence stays on disk).
        "result": msgspec.to_builtins(envelope) if call.request_id else None,
    })
    return [*answered, finished]


def _plan(tool: Tool, shown: ToolInputs) -> tuple[str, ...]:
    """What the held call will do, for its approver; a plugin's plan that fails shows none
    (the inputs are still listed), never stops the call."""
    if tool.plan is None:
        return ()
    try:
        return tuple(str(line)[:300] for line in tool.plan(shown.model_dump(mode="json")))[:64]
    except Exception:  # noqa: BLE001 - a plugin's code, whatever it raises
        log.exception("tool %s: its plan for an approver failed", tool.name)
        return ()
