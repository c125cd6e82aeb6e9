"""Concurrency slots: how many calls of each tool run now, and whether any does.

A tool may declare ``concurrency``; a call beyond it is BUSY and nothing starts. The daemon
waits for ``idle`` at shutdown, so a slot is released only once the call's caller can read
its result.
"""

from __future__ import annotations

import trio

from rungd.contract import Tool
from rungd.errors import Busy


class Slots:
    """Running calls per tool."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._idle = trio.Event()
        self._idle.set()

    def take(self, tool: Tool) -> None:
        """Take a slot of ``tool``, before the first await of the decision to run.

        Raises:
            Busy: the tool already runs its limit of calls.
        """
        running = self._running.get(tool.name, 0)
        if tool.concurrency is not None and running >= tool.concurrency:
            raise Busy(
                f"{tool.name} already runs {running} call(s), its limit",
                hint="wait for the running call to finish, then retry; nothing was started",
            )
        self._running[tool.name] = running + 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def release(self, tool: Tool) -> None:
        self._running[tool.name] -= 1
        if not any(self._running.values()):
            self._idle.set()

    async def wait_idle(self) -> None:
        """Until no call holds a slot."""
        await self._idle.wait()
