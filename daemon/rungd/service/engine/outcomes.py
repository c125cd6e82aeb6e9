"""The one boundary where what happened becomes what the caller hears.

Everything that ends a call, or refuses a request, passes through here exactly once:

    ok_envelope(call, tool, result, ctx)         a handler's Result, checked against the contract
    error_envelope(call, exc, tool=, ctx=, ...)  any RungdError, with the outcome decided here
    crash_error(tool, ctx, settle)               a handler's bug, as FAILED
    timeout_error(tool, ctx, settle)             the deadline, before or after the commit point
    interrupted_error(ctx, settle)               the daemon stopping mid-call
    protocol_error(exc)                          a refused request that has no call (describe,
                                                 approve, an unknown call_id)

Nothing else in rungd builds an envelope or re-maps a code, and exceptions are never changed
after they are raised: the outcome, retry and next action are computed from the exception
and what is known about the call (its commit point, its tool's error table) into a new,
frozen envelope, cut to the tool's byte cap once, here.
"""

from __future__ import annotations

import os

from typing import Any

import msgspec

from rungd.core.contract import CallContext, Result, Tool, shows
from rungd.core.envelope import DEFAULT_CAP_BYTES, Envelope, ErrorInfo, Settle, fit_to_cap
from rungd.core.errors import Failed, Interrupted, NextAction, Outcome, Retry, RungdError, ToolError, ToolTimeout
from rungd.protocol import ProtocolError
from rungd.redact import redact_fields

from rungd.service.engine.calls import Call, ms_since

# Failures that prove nothing about a write's effect once it may have begun.
_INCONCLUSIVE = frozenset({"FAILED", "SURFACE_CHANGED", "AUTH_REQUIRED", "PROMPT_UNEXPECTED", "INTERRUPTED"})


def ok_envelope(call: Call, tool: Tool, result: Result, ctx: CallContext) -> Envelope:
    """The envelope of a handler that returned, once its Result keeps the contract.

    Raises:
        Failed: the plugin broke the contract (a read with an effect, a write without a
            read-back, fields that cannot be sent); pass it to ``error_envelope``.
    """
    _check_result(tool, result, ctx)
    envelope = Envelope(
        call_id=call.call_id,
        tool=tool.name,
        request_id=call.request_id,
        status="ok",
        outcome=result.outcome,
        effect=result.effect,
        fields=redact_fields(result.fields, ctx.secrets) if ctx.secrets else result.fields,
        verified_by=result.verified_by,
        truncated=result.truncated,
        narrow=result.narrow,
        as_of=result.as_of,
        next_action="continue",
        evidence=listed([*ctx.evidence, *(e for e in result.evidence if e not in ctx.evidence)], ctx),
        elapsed_ms=ms_since(call.started),
    )
    return fit_to_cap(envelope, tool.cap_bytes)


EVIDENCE_LISTED = 8  # the most evidence ids an envelope lists; more are named by one index


def listed(ids: list[str], ctx: CallContext) -> list[str]:
    """The evidence ids an envelope carries: all of them, or when there are more than
    ``EVIDENCE_LISTED``, the first ones and the id of an index file that lists every one
    (``rungctl evidence`` reads it like any evidence; it is pruned with the rest)."""
    if len(ids) <= EVIDENCE_LISTED:
        return ids
    every = list(ids)
    index_id, path = ctx.evidence_path("index")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write("".join(f"{evidence_id}\n" for evidence_id in every))
    except OSError:  # a full disk: the envelope lists them all, and fit_to_cap may shorten them
        ctx.evidence.remove(index_id)
        return every
    return [*every[:EVIDENCE_LISTED - 1], index_id]


def _check_result(tool: Tool, result: Result, ctx: CallContext) -> None:
    bug = "this is a bug in the plugin"
    if tool.side_effect == "read" and result.effect != "none":
        raise Failed(f"{tool.name} is a read but reported effect {result.effect!r}", hint=bug, outcome="done")
    acted = ctx.may_have_acted()
    try:
        msgspec.json.encode(result.fields)
    except (TypeError, msgspec.EncodeError) as exc:
        raise Failed(f"{tool.name} returned a field that cannot be sent: {exc}", hint=bug,
                     outcome="unknown" if acted and tool.side_effect != "read" else "done") from None
    if tool.side_effect != "read" and (result.effect not in ("changed", "no_change") or not result.verified_by):
        raise Failed(f"{tool.name} is a write but reported effect {result.effect!r} without a read-back",
                     hint=f"{bug}: a write reads back and says changed or no_change",
                     outcome="unknown" if acted else "not_started")
    if result.outcome != "done":
        raise Failed(f"{tool.name} reported success with outcome {result.outcome!r}",
                     hint=f"{bug}: raise an error for an outcome that is not done",
                     outcome="unknown" if acted else "not_started")
    if result.effect == "changed" and not result.verified_by:
        raise Failed(f"{tool.name} reported a change it did not read back",
                     hint=f"{bug}: set verified_by after a read-back", outcome="unknown")


def error_envelope(
    call: Call,
    exc: RungdError,
    *,
    tool: Tool | None,
    ctx: CallContext | None = None,
    settle: dict[str, Any] | None = None,
    outcome: Outcome | None = None,
) -> Envelope:
    """The envelope of a call that ended in ``exc``.

    Args:
        call: the call.
        exc: what ended it; read, never changed.
        tool: its tool, when the name was one (its error table and side effect decide).
        ctx: the call's context once its handler ran: the commit point decides the outcome,
            and its secrets (sensitive inputs, credentials) are redacted from the message,
            hint and fields. None for a call refused or held before anything ran.
        settle: the bound settle read, offered when the outcome is unknown.
        outcome: overrides the outcome (a reconcile that stays unknown).
    """
    if outcome is None:
        outcome = _outcome_after(exc, tool, ctx) if ctx is not None else exc.outcome
    retry, next_action = exc.retry, exc.next_action
    offered = exc.settle
    if ctx is not None and outcome == "unknown":
        offered = offered or settle
        # Whatever else is wrong, the first thing to learn is whether it happened; only
        # "stop" (a person must look) outranks that.
        if next_action != "stop":
            retry, next_action = "after_check", "reconcile"
    hint = exc.hint
    rule = tool.error_rule(exc.code) if tool is not None else None
    if rule is not None and isinstance(exc, ToolError):
        # The tool's own table decides retry and next_action for its codes.
        retry, next_action = rule.retry, rule.next_action
        hint = hint or rule.hint
    retry, next_action = _fit_retry(tool, outcome, retry, next_action)
    message, fields = exc.message, exc.fields
    if ctx is not None and ctx.secrets:
        # An error may quote what the call was given or what its program printed: a
        # sensitive input ("password: 'hunter2/x' has a '/'"), a credential in a read-back.
        message, hint, fields = redact_fields((message, hint, fields), ctx.secrets)
    envelope = Envelope(
        call_id=call.call_id,
        tool=call.tool,
        request_id=call.request_id,
        status="error",
        outcome=outcome,
        effect=exc.effect,
        fields=fields,
        error=ErrorInfo(code=exc.code, message=message, retry=retry, hint=hint),
        next_action=next_action,
        settle=Settle(**offered) if offered else None,
        evidence=listed(list(ctx.evidence), ctx) if ctx else [],
        elapsed_ms=ms_since(call.started),
    )
    return fit_to_cap(envelope, tool.cap_bytes if tool is not None else DEFAULT_CAP_BYTES)


def _outcome_after(exc: RungdError, tool: Tool | None, ctx: CallContext) -> Outcome:
    """An error's outcome, decided where the commit point is known: here.

    An error that does not declare its outcome gets ``not_started`` while nothing may have
    acted. A write may have acted once its program ran, whatever its declared commit point
    (a program may create its object before the question it is stopped at): then it is
    ``unknown`` (the dispatcher's settle read, or reconcile, decides). A read that ran is
    ``done``. A declared ``done`` on a failure that proves nothing about a write's effect
    (an unnamed exit status, output that stopped parsing, a question) becomes ``unknown``
    too. Other declared outcomes (a plugin that saw the program refuse, a read-back count)
    stand.
    """
    is_write = tool is not None and tool.side_effect != "read"
    acted = ctx.may_have_acted()
    if not exc.outcome_declared:
        if not acted:
            return "not_started"
        return "unknown" if is_write else "done"
    if is_write and acted and exc.outcome == "done" and exc.code in _INCONCLUSIVE:
        return "unknown"
    return exc.outcome


def _fit_retry(tool: Tool | None, outcome: Outcome, retry: Retry, next_action: NextAction) -> tuple[Retry, NextAction]:
    """``retry`` and ``next_action`` as the tool's side effect allows them."""
    if tool is None:
        return retry, next_action
    if tool.side_effect == "read":
        # A read has no effect to check and no request_id to reconcile (a screen step's
        # deadline, say, with the code's write-minded defaults): it may simply be tried again.
        if next_action == "reconcile":
            return ("yes" if retry == "after_check" else retry), "retry_later"
        return retry, next_action
    # A repeat with the same request_id is answered from the ledger, and a new one risks
    # doing it twice: after a possible effect, check before retrying.
    if retry == "yes" and outcome != "not_started":
        return "after_check", "reconcile"
    return retry, next_action


def crash_error(tool: Tool, ctx: CallContext, settle: dict[str, Any] | None, exc: BaseException) -> Failed:
    """FAILED for a handler that raised something that is not a RungdError (a plugin bug)."""
    acted = ctx.may_have_acted() and tool.side_effect != "read"
    return Failed(
        f"the tool's handler failed: {type(exc).__name__}",
        hint="this is a bug in the plugin; the operator's log has the details",
        outcome="unknown" if acted else _ran_or_not(ctx),
        settle=settle if acted else None,
    )


def _ran_or_not(ctx: CallContext) -> Outcome:
    """The outcome of a call that cannot have acted: a read (no effect to be unsure about)
    is done once its program ran, and anything else not started."""
    return "done" if ctx.committed and ctx.tool.side_effect == "read" else "not_started"


# rungd's own advice for an unknown outcome, which the settle read run at once answers (settled).
_RUN_THE_SETTLE_READ = "the effect may or may not have happened: run the settle read before any retry"
_RECONCILE_FIRST = "run the settle read (reconcile) before retrying"


_KILLED = "; the process tree was killed"  # said only when a program ran (an export read runs none)


def timeout_error(tool: Tool, ctx: CallContext, settle: dict[str, Any] | None) -> ToolTimeout:
    """TIMEOUT for a handler cancelled at its deadline: ``unknown`` only after the commit point."""
    deadline = tool.timing.deadline_s
    if tool.side_effect == "read":
        # A read has no effect to be unsure about: nothing to settle, safe to try again. It
        # is done once its program ran (as any error of a read that ran), else not started.
        return ToolTimeout(
            f"{tool.name} passed its {deadline:g} s deadline{_KILLED if ctx.spawned else ''}",
            hint="a read changes nothing: retry; if it keeps timing out, ask the operator to raise the deadline",
            outcome=_ran_or_not(ctx), retry="yes", next_action="retry_later",
        )
    if ctx.may_have_acted():
        where = "after its commit point" if ctx.committed else "after its program started"
        return ToolTimeout(
            f"{tool.name} passed its {deadline:g} s deadline {where}{_KILLED if ctx.spawned else ''}",
            hint=_RUN_THE_SETTLE_READ,
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


def interrupted_error(ctx: CallContext, settle: dict[str, Any] | None) -> Interrupted:
    """INTERRUPTED for a call the daemon stopped while it ran (a read: retry, nothing to settle)."""
    acted = ctx.may_have_acted() and ctx.tool.side_effect != "read"
    return Interrupted(
        "the daemon stopped while the call was running",
        hint=_RECONCILE_FIRST if acted else "retry the call",
        outcome="unknown" if acted else _ran_or_not(ctx),
        settle=settle if acted else None,
    )


def recovered_envelope(call_id: str, tool: str, request_id: str | None, settle: Settle | None) -> Envelope:
    """The envelope of a call a crashed daemon left running: INTERRUPTED, outcome unknown."""
    exc = Interrupted("the daemon stopped while this call was running",
                      hint="run the tool's settle read (rungctl reconcile) before any retry", outcome="unknown")
    return Envelope(
        call_id=call_id, tool=tool, request_id=request_id, status="error", outcome="unknown", effect="none",
        error=ErrorInfo(code=exc.code, message=exc.message, retry=exc.retry, hint=exc.hint),
        next_action=exc.next_action, settle=settle,
    )


def repeat_envelope(first: dict[str, Any], call: Call) -> Envelope:
    """A repeat of a finished request, answered with its first result: a change is ``existing``.

    It carries the repeat's own call_id, the one the ledger records it under (its
    ``finished`` record notes the first call's), so what a caller holds is what an
    auditor finds; ``status`` and ``wait`` answer for it like for any call.
    """
    envelope = msgspec.convert(first, Envelope)
    envelope = msgspec.structs.replace(envelope, call_id=call.call_id, elapsed_ms=ms_since(call.started))
    # Whatever the first call's status, a repeat changed nothing more (a write settled done
    # and changed by its read is an error that did change something).
    if envelope.effect in ("changed", "no_change"):
        envelope = msgspec.structs.replace(envelope, effect="existing")
    return envelope


def pending_envelope(call: Call) -> Envelope:
    """The envelope of a call that is held at its gate or still running (or a repeat of one
    that is: it says what the first call waits for, and how to get its own result)."""
    first = call.joined or call
    if first.held is not None:
        outcome, next_action = "not_started", "wait_approval"
        which = "held" if first is call else f"a repeat of {first.call_id}, which is held"
        narrow = (f"{which} at the {first.gate} gate: an operator must approve it (rungctl approve {first.call_id}) "
                  f"within {first.held.seconds_left()} s; send wait with call_id {call.call_id} for the result")
    elif first is not call:
        outcome, next_action = "unknown", "retry_later"
        narrow = f"a repeat of {first.call_id}, still running; send wait with call_id {call.call_id} to get the result"
    else:
        outcome, next_action = "unknown", "retry_later"
        narrow = f"still running; send wait with call_id {call.call_id} to get the result"
    return Envelope(call_id=call.call_id, tool=call.tool, request_id=call.request_id, status="pending",
                    outcome=outcome, effect="none", next_action=next_action, narrow=narrow,
                    elapsed_ms=ms_since(call.started))


def reconciled_envelope(first: Envelope, tool: Tool, *, found: bool, fields: dict[str, Any],
                        verified_by: str) -> Envelope:
    """The first result of a request once reconcile decided whether its effect happened."""
    envelope = msgspec.structs.replace(
        first, status="ok", outcome="done" if found else "not_started", effect="existing" if found else "none",
        error=None, next_action="continue", settle=None, fields=fields, verified_by=verified_by,
    )
    return fit_to_cap(envelope, tool.cap_bytes)


def still_unknown(first: Envelope, exc: RungdError, tool: Tool) -> Envelope:
    """The first result of a request reconcile could not decide: still unknown, with why."""
    settle = exc.settle or (msgspec.to_builtins(first.settle) if first.settle else None)
    envelope = msgspec.structs.replace(
        first, status="error", outcome="unknown", effect="none", fields=exc.fields,
        error=ErrorInfo(code=exc.code, message=exc.message, retry=exc.retry, hint=exc.hint),
        next_action=exc.next_action, settle=Settle(**settle) if settle else None,
    )
    return fit_to_cap(envelope, tool.cap_bytes)


# Errors that only say the daemon does not know what happened; once a read knows, the call
# may go on (done) or simply be tried again (not_started).
_NOT_KNOWING = frozenset({"TIMEOUT", "INTERRUPTED"})


def settled(envelope: Envelope, tool: Tool, *, read: Envelope, expect: dict[str, Any],
            before: dict[str, Any] | None, acted: bool, committed: bool) -> Envelope:
    """A write's unknown error once its settle read decides, with ``verified_by`` naming the
    read; unchanged when the read cannot say (``shows`` is None) or moved elsewhere.

    What the read can credit to this call depends on the read before the act (``before``,
    when the handler noted one):

    - it shows the effect, and the read before did not: ``done``, ``changed``;
    - it shows the effect, and so did the read before: the call cannot be
      credited with it. ``not_started``, ``none`` when its program never ran and the read
      did not move; otherwise ``done``, ``no_change``;
    - it shows the effect and there is no read before: ``done``, ``existing`` (the effect
      is there; whether this call made it, nothing says, as after a reconcile);
    - it does not show the effect: ``not_started`` when nothing moved; when the read moved
      elsewhere since the read before, the outcome stays ``unknown``, and so it does when
      the program was killed (a deadline, a stop) past its commit point (``committed``):
      wherever it was, a part of the effect the read cannot see may be done.

    "Moved" looks at the fields ``expect`` names: one that changes on every read (a
    timestamp, a counter) moves nothing. ``acted``:
    whether the call's program may have acted (it ran: evidence, not its declared commit
    point). The error stays: it is what went wrong; its hint now says what the read showed,
    then what the program said (its quoted words), when the hint quoted it.
    """
    assert envelope.error is not None
    happened = shows(read.fields, expect, before)
    if happened is None:
        return envelope
    already = before is not None and shows(before, expect, before) is True
    moved = before is not None and any(read.fields.get(key) != before.get(key) for key in expect)
    name = f"the settle read {read.tool}"
    verified_by = f"settle read {read.tool} (call {read.call_id})"
    if happened:
        if before is None:
            outcome, effect = "done", "existing"
            said = f"{name} shows the effect in place; whether this call made it, nothing shows. Do not repeat it"
        elif not already:
            outcome, effect = "done", "changed"
            said = f"{name} shows the effect, which the read before the act did not: it happened. Do not repeat it"
        elif not acted and not moved:
            outcome, effect = "not_started", "none"
            said = f"{name} shows the state as it was before, already as asked, and the program never ran"
        else:
            outcome, effect = "done", "no_change"
            said = f"{name} shows the state already as asked before the act, unchanged: nothing more to do"
    elif moved:
        return envelope  # something moved, not to the expected state: only a person can say what
    elif committed and envelope.error.code in _NOT_KNOWING:
        # Killed past its commit point, wherever it was (a deadline, the daemon stopping): the
        # read shows that what was asked is not there, not that nothing of it was done (half a
        # file, some rows).
        said = (f"{name} shows the effect absent and nothing it reads moved, but the program was killed past its "
                "commit point: a part of the effect that read cannot see may be there. Check before repeating it")
        return fit_to_cap(msgspec.structs.replace(
            envelope, verified_by=verified_by,
            error=msgspec.structs.replace(envelope.error, hint=_with_its_words(said, envelope.error.hint)),
        ), tool.cap_bytes)
    else:
        outcome, effect = "not_started", "none"
        said = f"{name} shows nothing moved and the effect absent: it did not happen; the request_id is free again"
    code = envelope.error.code
    if code in _NOT_KNOWING:
        retry, next_action = ("no", "continue") if outcome == "done" else ("yes", "retry_later")
    else:
        # What the code itself asks for, now that "find out first" is answered.
        rule = tool.error_rule(code)
        retry, next_action = (rule.retry, rule.next_action) if rule else ("no", "stop")
        if retry == "after_check" or next_action == "reconcile":
            retry, next_action = "no", "stop"
    settled_envelope = msgspec.structs.replace(
        envelope, outcome=outcome, effect=effect,
        verified_by=verified_by, settle=None, next_action=next_action,
        # The error's own hint stays beside what the read showed: the read decides the
        # outcome, the program's words and the fix still say why it failed.
        error=msgspec.structs.replace(envelope.error, retry=retry, hint=_with_its_words(said, envelope.error.hint)),
    )
    return fit_to_cap(settled_envelope, tool.cap_bytes)


def _with_its_words(said: str, hint: str) -> str:
    """``said``, then the error's own hint: what to fix (a credential to add, the tool
    table's advice) and what the program said still hold once the read decided. rungd's
    advice to run the settle read is answered by now, and goes; a quote of the program after
    it (rungd writes every quote after ``it said:``, issue 27) stays."""
    for answered in (_RUN_THE_SETTLE_READ, _RECONCILE_FIRST):
        if hint.startswith(answered):
            hint = hint[len(answered):].lstrip(" ;")
    return f"{said}; {hint}" if hint else said


def protocol_error(exc: RungdError) -> ProtocolError:
    """The reply to a request refused before any call existed (describe, approve, deny,
    status of an unknown call_id): its code, message and hint."""
    return ProtocolError(code=exc.code, message=exc.message, hint=exc.hint)
