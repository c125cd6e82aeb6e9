"""Refused calls on the record, without letting one caller fill the ledger's disk with them.

Every refused call is answered as always. The ledger records each one (``received`` and
``rejected``) while its caller refuses at an ordinary pace: a burst of ``BURST``, then
``RATE`` a second. Past that, a caller's refusals are counted instead, and one ``rejected``
record per caller (no call_id, no tool) says how many were left out, with which codes and
tool names, ``SUMMARY_AFTER_S`` after the first of them. A caller that may call nothing once
grew the ledger by 0.8 MB a second, and retention prunes nothing younger than its days.
"""

from __future__ import annotations

import collections
import dataclasses
import time

BURST = 100  # refusals of one caller recorded one by one before the pace counts
RATE = 10.0  # then this many a second
SUMMARY_AFTER_S = 10.0  # the refusals left out are summed up this long after the first
_NAMED = 5  # codes and tool names a summary names, the most frequent first
_DISTINCT = 100  # tool names counted apart per summary; the rest together


@dataclasses.dataclass
class _LeftOut:
    since: float
    count: int = 0
    codes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    tools: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


class Rejections:
    """Each caller's budget of refusals recorded one by one, and the count of those left out."""

    def __init__(self) -> None:
        self._tokens: dict[int, tuple[float, float]] = {}  # uid -> (tokens, as of monotonic time)
        self._left_out: dict[int, _LeftOut] = {}

    def record_each(self, uid: int) -> bool:
        """Whether this refusal of ``uid`` is recorded one by one (it takes from its budget)."""
        now = time.monotonic()
        tokens, then = self._tokens.get(uid, (float(BURST), now))
        tokens = min(float(BURST), tokens + (now - then) * RATE)
        enough = tokens >= 1
        self._tokens[uid] = (tokens - 1 if enough else tokens, now)  # one entry per local uid that ever called
        return enough

    def leave_out(self, uid: int, code: str, tool: str) -> bool:
        """Count a refusal of ``uid`` not recorded by itself; True for the first since the
        last summary (the caller then has one written ``SUMMARY_AFTER_S`` later)."""
        left = self._left_out.get(uid)
        first = left is None
        if left is None:
            left = self._left_out[uid] = _LeftOut(since=time.time())
        left.count += 1
        left.codes[code] += 1
        name = tool[:64]
        # Distinct names are bounded too: a flood of made-up ones must not grow a counter.
        left.tools[name if name in left.tools or len(left.tools) < _DISTINCT else "(other names)"] += 1
        return first

    def summary(self, uid: int) -> str | None:
        """One line on the refusals of ``uid`` left out since the last summary (forgetting
        them), or None if there are none."""
        left = self._left_out.pop(uid, None)
        if left is None:
            return None
        codes = ", ".join(f"{code} x{n}" for code, n in left.codes.most_common(_NAMED))
        tools = ", ".join(f"{name!r} x{n}" for name, n in left.tools.most_common(_NAMED))
        return (f"{left.count} more refused calls of uid {uid} in {time.time() - left.since:.0f} s, not recorded "
                f"one by one (more than {RATE:g} a second): {codes}; tools named: {tools}")
