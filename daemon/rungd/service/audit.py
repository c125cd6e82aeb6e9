"""The daemon's side of the ledger: recording call events, and remembering requests.

Every event of a call is appended to the ledger (``rungd_ledgers``) before the caller hears
about it, and ``dispatched`` is durable before the handler starts: if the ledger cannot be
written, nothing new runs (fail closed). The idempotency index is rebuilt from the ledger
at start-up and kept current with every record appended.

Ledger writes that wait on the disk run in worker threads of their own (``Audit.limiter``):
nothing a caller or a file can make slow (an export parse, a lock probe) ever waits in front
of the ledger. A read's records, which need no fsync, are written on the loop when the
writer is free (a write to the page cache, as evidence is, and a fallocate topping the
reserve up).
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import trio
from rungd_ledgers import IdempotencyIndex, Ledger
from rungd_ledgers.writer import DEFAULT_RESERVE_BYTES
from rungd_ledgers import LedgerUnavailable as LedgerWriteFailed

from rungd.core.errors import LedgerUnavailable

log = logging.getLogger("rungd.audit")

# Enough threads for group commit to batch concurrent calls' records into one fsync.
LEDGER_THREADS = 16


class Audit:
    """The ledger and the idempotency index of one daemon.

    Args:
        folder: the ledger folder (``<state>/ledger``).
        retention_s: how long a request_id is remembered.
        rotate_bytes: size at which a ledger file is closed and a new one started.

    Raises:
        LedgerCorrupt: a record in the ledger cannot be read (run ``rungctl ledger verify``).
    """

    def __init__(self, folder: Path, *, retention_s: float, rotate_bytes: int,
                 reserve_bytes: int = DEFAULT_RESERVE_BYTES) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.ledger = Ledger.open(folder, rotate_bytes=rotate_bytes, reserve_bytes=reserve_bytes)
        if self.ledger.repair is not None:
            log.warning("ledger: a torn last line was moved aside: %s", self.ledger.repair)
        self.index = IdempotencyIndex.rebuild(folder, retention_seconds=retention_s)
        self.limiter = trio.CapacityLimiter(LEDGER_THREADS)
        # An outage the ledger could not record while it lasted: (when it began, appends
        # refused); written as a ``ledger_outage`` record once the ledger takes records again.
        self._outage: tuple[float, int] | None = None

    async def record(self, event: str, call_id: str, tool: str, **fields: Any) -> None:
        """Append one event durably, then update the index.

        Raises:
            LedgerUnavailable: the ledger could not be written; the caller must not start
                anything new. The daemon's log says why.
        """
        await self.record_many([(event, call_id, tool, fields)])

    async def record_many(self, events: list[tuple[str, str, str, dict[str, Any]]], *, new_work: bool = False,
                          durable: bool = True) -> None:
        """Append events of one call together, in order, with one fsync; then update the index.

        Args:
            events: ``(event, call_id, tool, fields)`` in order.
            new_work: the events start something (received and dispatched or held): refused
                while the ledger cannot keep its reserve, so what runs can always finish.
            durable: False for a read's records: written (to the kernel) before the read runs
                and before its caller hears, made durable by the next fsync: another call's,
                or :meth:`flush` within a second (a machine crash before that may lose them;
                a read has no effect to lose). Writes always wait.

        Raises:
            LedgerUnavailable: as ``record``; none of the events was recorded.

        Cancellation: not abandoned: once handed to the writer, a record is either durable
        or failed before this returns, so the index never disagrees with the file.
        """
        # A read's records need no fsync: written on the loop when the writer is free, in a
        # worker thread when it is busy (or the write on the loop failed: tried again there).
        if not durable and self.record_now(events, keep_reserve=new_work):
            return
        try:
            records = await trio.to_thread.run_sync(
                functools.partial(self.ledger.append_many, events, sync=durable, keep_reserve=new_work),
                abandon_on_cancel=False, limiter=self.limiter)
        except LedgerWriteFailed as exc:
            log.error("ledger write failed: %s", exc, extra={"call_id": events[0][1], "tool": events[0][2]})
            began, refused = self._outage or (time.time(), 0)
            self._outage = began, refused + 1
            raise LedgerUnavailable(
                "rungd cannot write its ledger, so it runs nothing new",
                hint="retry later; the operator must free space or fix the state folder's permissions",
            ) from None
        for record in records:
            self.index.apply(record)
        if self._outage is not None:
            # Shielded: the events are recorded already; a cancellation now must not tell the
            # caller they were not (and the outage's note is one bounded fsync).
            with trio.CancelScope(shield=True):
                await self._record_outage()

    def record_now(self, events: list[tuple[str, str, str, dict[str, Any]]], *, keep_reserve: bool = False) -> bool:
        """Append a read's events (no fsync: see :meth:`record_many`) on the loop, if the
        writer can take them without a wait, and update the index. ``keep_reserve``: refused
        while the ledger cannot keep its reserve (``record_many``'s ``new_work``).

        Returns:
            True once they are recorded; False when they must go through ``record_many``:
            the writer is busy or due to rotate, an outage is to be written down first, or
            the write failed (``record_many`` tries again, and says so).
        """
        if self._outage is not None:
            return False
        try:
            records = self.ledger.append_now(events, keep_reserve=keep_reserve)
        except LedgerWriteFailed:
            return False
        if records is None:
            return False
        for record in records:
            self.index.apply(record)
        return True

    async def _record_outage(self) -> None:
        """Write down the outage that just ended, now that the ledger takes records again (for
        ``rungctl health``, its counters and an auditor): when it began and how many appends it
        refused. Kept for the next record if this one fails too."""
        began, refused = self._outage or (0.0, 0)
        self._outage = None
        note = (f"the ledger could not be written from {time.strftime('%Y-%m-%dT%H:%M:%S%z', time.localtime(began))} "
                f"for {time.time() - began:.0f} s: {refused} append(s) refused (their calls ran nothing new)")
        try:
            records = await trio.to_thread.run_sync(
                functools.partial(self.ledger.append_many, [("ledger_outage", "", "", {"note": note})], sync=True),
                abandon_on_cancel=False, limiter=self.limiter)
        except LedgerWriteFailed:
            self._outage = began, refused
            return
        log.warning("ledger writable again: %s", note)
        for record in records:
            self.index.apply(record)

    async def flush(self) -> None:
        """Make the records written without an fsync (reads') durable, if any wait.

        Raises:
            LedgerUnavailable: as ``record``.
        """
        if not self.ledger.unsynced:
            return
        try:
            await trio.to_thread.run_sync(self.ledger.flush, abandon_on_cancel=False, limiter=self.limiter)
        except LedgerWriteFailed as exc:
            log.error("ledger flush failed: %s", exc)
            raise LedgerUnavailable("rungd cannot write its ledger, so it runs nothing new",
                                    hint="the operator must free space or fix the state folder") from None

    def close(self) -> None:
        self.ledger.close()
