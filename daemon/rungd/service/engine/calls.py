"""The calls a daemon knows about: one record per call, and the table that keeps them.

A ``Call`` is created the moment a request arrives and lives until its result has been
kept for ``server.keep_results_s``; its ``done`` event is set exactly once, when its
envelope is final. ``CallTable`` answers who may see a call: its own caller, or an
operator; for anyone else it does not exist.
"""

from __future__ import annotations

import collections

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import trio

from rungd.core.contract import Caller
from rungd.core.envelope import Envelope
from rungd.core.errors import UnknownCall


def new_call_id() -> str:
    """A short id that sorts by time: milliseconds since the epoch (hex), then randomness."""
    return f"c{int(time.time() * 1000):x}{secrets.token_hex(4)}"


def ms_since(start: float) -> int:
    """Milliseconds since ``start``, a ``time.monotonic()`` value."""
    return int((time.monotonic() - start) * 1000)


@dataclasses.dataclass
class Held:
    """What a call held at a gate keeps until a person decides."""

    # The inputs as shown (``Admitted.shown``: a sensitive one is its mark), for ``pending``;
    # the inputs the call runs with wait in the task that holds it.
    inputs: Any
    since: float
    expires: float
    plan: tuple[str, ...] = ()  # what the call will do, step by step (Tool.plan)
    decided: trio.Event = dataclasses.field(default_factory=trio.Event)
    verdict: str | None = None  # deciding | approved | denied
    reason: str = ""
    withdrawn: bool = False  # denied by its own caller, not by an operator

    def seconds_left(self) -> int:
        return max(0, int(self.expires - time.time()))


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
    joined: Call | None = None  # the first call of the same request, when this is its repeat

    @classmethod
    def new(cls, tool: str, request_id: str | None, caller: Caller) -> Call:
        return cls(new_call_id(), tool, request_id, caller, time.monotonic())


class CallTable:
    """Every call of this daemon, in start order, until its result is forgotten.

    Args:
        keep_s: how long a finished call's result stays for ``status`` and ``wait``.
        is_operator: whether a caller may see every call.
        max_results: how many finished calls stay at most; the oldest go first.
    """

    def __init__(self, keep_s: float, is_operator: Callable[[Caller], bool], *, max_results: int = 20000) -> None:
        self._keep_s = keep_s
        self._max_results = max_results
        # One caller's flood forgets its own oldest results, not everyone's: each caller keeps
        # at most a quarter of the table.
        self._max_per_uid = max(1, max_results // 4)
        self._finished = 0
        self._is_operator = is_operator
        self._calls: dict[str, Call] = {}
        self._by_uid: dict[int, collections.deque[str]] = {}

    def add(self, call: Call) -> None:
        self._forget_old()
        self._calls[call.call_id] = call
        mine = self._by_uid.setdefault(call.caller.uid, collections.deque())
        mine.append(call.call_id)
        while len(mine) > self._max_per_uid:
            # Its oldest finished (or already forgotten) one; running ones stay (a few hundred
            # at most: server.max_running_calls_per_uid), so this looks at little.
            for at, call_id in enumerate(mine):
                held = self._calls.get(call_id)
                if held is None or held.envelope is not None:
                    del mine[at]
                    self._calls.pop(call_id, None)
                    break
            else:
                break

    def drop(self, call: Call) -> None:
        self._calls.pop(call.call_id, None)

    def get(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def visible(self, call_id: str, caller: Caller | None) -> Call:
        """The call, if this caller may see it: its own, or any for an operator.

        Raises:
            UnknownCall: no such call, or not this caller's business (the same answer, so
                call_ids of others cannot be probed).
        """
        call = self._calls.get(call_id)
        if call is not None and (caller is None or caller.uid == call.caller.uid or self._is_operator(caller)):
            return call
        raise UnknownCall(
            "no call with that call_id is known to you",
            hint="call_ids are kept for a while after the call ends; start a new call",
        )

    def __iter__(self) -> Iterator[Call]:
        return iter(list(self._calls.values()))

    def _forget_old(self) -> None:
        # Runs on every call: calls are in start order, so look only at the old front, and
        # past the count cap drop the oldest finished ones, whatever their age.
        horizon = time.monotonic() - self._keep_s
        over = len(self._calls) - self._max_results
        old = []
        for call in self._calls.values():
            if call.started >= horizon and over <= 0:
                break
            if call.envelope is not None:
                old.append(call.call_id)
                over -= 1
        for call_id in old:
            del self._calls[call_id]
