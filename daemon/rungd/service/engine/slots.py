"""Concurrency slots: how many calls of each tool, of each caller and in all run now.

A tool may declare ``concurrency``; a call beyond it, beyond its caller's share
(``server.max_running_calls_per_uid``, root exempt) or beyond the daemon's
(``server.max_running_calls``) is BUSY and nothing starts. The daemon waits for ``idle`` at
shutdown, so a slot is released only once the call's caller can read its result.
"""

from __future__ import annotations

import trio

from rungd.core.contract import Tool
from rungd.core.errors import Busy


class Slots:
    """Running calls per tool."""

    def __init__(self, max_running: int = 1 << 16, max_per_uid: int = 1 << 16) -> None:
        self._running: dict[str, int] = {}
        self._by_uid: dict[int, int] = {}
        self._total = 0
        self._max_running = max_running
        self._max_per_uid = max_per_uid
        self._idle = trio.Event()
        self._idle.set()

    def take(self, tool: Tool, uid: int) -> None:
        """Take a slot of ``tool`` for caller ``uid``, before the first await of the decision
        to run.

        Raises:
            Busy: the tool, the caller or the daemon already runs its limit of calls.
        """
        running = self._running.get(tool.name, 0)
        if tool.concurrency is not None and running >= tool.concurrency:
            raise Busy(
                f"{tool.name} already runs {running} call(s), its limit",
                hint="wait for the running call to finish, then retry; nothing was started",
            )
        mine = self._by_uid.get(uid, 0)
        if uid != 0 and mine >= self._max_per_uid:
            raise Busy(f"you already run {mine} calls at once, your limit",
                       hint="wait for some to finish, then retry; nothing was started (the operator sets "
                       "server.max_running_calls_per_uid)")
        if self._total >= self._max_running:
            raise Busy(f"rungd already runs {self._total} calls at once, its limit",
                       hint="retry later; nothing was started (the operator sets server.max_running_calls)")
        self._running[tool.name] = running + 1
        self._by_uid[uid] = mine + 1
        self._total += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def release(self, tool: Tool, uid: int) -> None:
        self._running[tool.name] -= 1
        self._total -= 1
        if self._by_uid[uid] == 1:
            del self._by_uid[uid]
        else:
            self._by_uid[uid] -= 1
        if not self._total:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Until no call holds a slot."""
        await self._idle.wait()
