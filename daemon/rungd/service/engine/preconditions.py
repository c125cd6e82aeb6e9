"""Expected revisions: a write acts only on the state its caller read (seed 003).

A write may declare a ``Precondition``: a read whose fields must equal what the caller
read (inputs such as ``expected_count``), checked right before the act while no other
rungd call can act on the same resource (a lock key templated over the inputs, e.g.
``"item:{item}"``). When they differ the call ends CONFLICT: outcome not_started, the
current value in ``fields``, next action ``repair`` (re-read, then decide). Repeating the
same stale request cannot resolve it: the check runs again and finds the same difference.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from rungd.core.contract import Caller, Tool, ToolInputs, shows
from rungd.core.envelope import Envelope
from rungd.core.errors import Conflict, Failed

# await read(tool, inputs, caller) -> the read's envelope
ReadCall = Callable[[str, dict[str, Any], Caller], Awaitable[Envelope]]


class ResourceLocks:
    """One lock per resource key, alive while some call holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[trio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str | None) -> AsyncIterator[None]:
        """Hold ``key`` for the body (nothing to hold for None).

        Cancellation: waiting for the lock is cancelled with the call (its deadline); the
        call then never ran, and the lock is never left taken.
        """
        if key is None:
            yield
            return
        lock, users = self._locks.get(key, (trio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


async def check(tool: Tool, inputs: ToolInputs, caller: Caller, read: ReadCall) -> str | None:
    """Run the tool's precondition read and compare; return what verified it, if anything.

    Returns:
        ``"precondition read TOOL (call ID)"`` when checked, None when there was nothing to
        check (no precondition, or every expectation bound to an input left out).

    Raises:
        Conflict: the read shows another value than the caller expected; nothing ran.
        Failed: the read failed, or lacks a field it must show (outcome not_started).
    """
    pre = tool.precondition
    if pre is None or not pre.tool:
        return None
    read_inputs, expect = pre.bind(inputs.model_dump())
    if not expect:
        return None
    found = await read(pre.tool, read_inputs, caller)
    if found.status != "ok" or found.truncated:
        why = found.error.code if found.error else "its result was cut"
        raise Failed(f"the precondition read {pre.tool} did not answer ({why}); nothing was changed",
                     hint="retry later; the state could not be checked before acting",
                     outcome="not_started", retry="yes", next_action="retry_later")
    verdict = shows(found.fields, expect)
    if verdict is None:
        raise Failed(f"the precondition read {pre.tool} lacks a field it must show ({sorted(expect)}); "
                     "nothing was changed", hint="the tool's precondition needs updating; tell the operator",
                     outcome="not_started")
    if not verdict:
        current = {k: found.fields.get(k) for k in expect}
        raise Conflict(
            f"{tool.name} expected {expect} but {pre.tool} now shows {current}; nothing was changed",
            hint="read it again, then decide whether the change still makes sense and send it with the new "
            "expected value and a new request_id",
            outcome="not_started", fields={"current": found.fields, "expected": expect},
        )
    return f"precondition read {pre.tool} (call {found.call_id})"
