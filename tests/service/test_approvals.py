"""Approvals at the unit level: every held call ends, whatever its decision does at the TTL."""

from __future__ import annotations

import time

import trio

from rungd.config import Config
from rungd.core.contract import Caller, NoInputs
from rungd.service.engine.approvals import Approvals
from rungd.service.engine.calls import Call, CallTable
from rungd.service.engine.policy import Policy
from rungd.core.errors import ApprovalExpired, GateDenied

CALLER = Caller(uid=1000, gid=1000, pid=1)
OPERATOR = Caller(uid=0, gid=0, pid=2)


class SlowBadSigner(Approvals):
    """A signature check that takes longer than the TTL and then refuses the signature."""

    async def _signer(self, call: Call, signature: str | None) -> str:
        await trio.sleep(0.5)
        raise GateDenied("not an allowed key")


async def test_a_signed_approval_failing_across_the_ttl_ends_the_call_expired() -> None:
    config = Config.model_validate({"gates": {"approval_ttl_s": 0.3}})
    calls = CallTable(60, lambda caller: caller.uid == 0)
    recorded = []

    async def record(event: str, call: Call, **fields: object) -> None:
        recorded.append(event)

    approvals = SlowBadSigner(Policy(config, {}), calls, record)
    call = Call.new("t", "r1", CALLER)
    call.gate = "signature"
    calls.add(call)
    approvals.hold(call, NoInputs())
    outcome = []

    async def holder() -> None:
        outcome.append(await approvals.verdict(call))

    started = time.monotonic()
    with trio.fail_after(5):  # before the fix the holder waited for ever
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            await trio.sleep(0.1)
            try:
                await approvals.decide(call.call_id, OPERATOR, approve=True, signature="sig")
            except GateDenied:
                pass
    assert isinstance(outcome[0], ApprovalExpired), outcome  # ended, not left pending for ever
    assert time.monotonic() - started < 2
    assert recorded == ["expired"] and call.held is None


async def test_an_approval_while_the_daemon_stops_is_refused() -> None:
    config = Config.model_validate({"gates": {"approval_ttl_s": 30}})
    calls = CallTable(60, lambda caller: caller.uid == 0)

    async def record(event: str, call: Call, **fields: object) -> None:
        pass

    approvals = Approvals(Policy(config, {}), calls, record)
    call = Call.new("t", "r1", CALLER)
    call.gate = "review"
    calls.add(call)
    approvals.hold(call, NoInputs())
    approvals.closed = True
    try:
        await approvals.decide(call.call_id, OPERATOR, approve=True)
    except GateDenied as refused:
        assert "stopping" in refused.message
    else:
        raise AssertionError("an approval during shutdown was accepted")


async def test_an_expiry_the_ledger_cannot_record_still_ends_the_call_expired() -> None:
    from rungd.core.errors import LedgerUnavailable

    config = Config.model_validate({"gates": {"approval_ttl_s": 0.2}})
    calls = CallTable(60, lambda caller: caller.uid == 0)

    async def record(event: str, call: Call, **fields: object) -> None:
        raise LedgerUnavailable("disk full", hint="free space")

    approvals = Approvals(Policy(config, {}), calls, record)
    call = Call.new("t", "r1", CALLER)
    call.gate = "review"
    calls.add(call)
    approvals.hold(call, NoInputs())
    with trio.fail_after(5):
        assert isinstance(await approvals.verdict(call), ApprovalExpired)  # and nothing escaped
