"""Repeats: what an earlier call with the same request_id means for a new one.

A write needs a ``request_id``. The same request_id with the same inputs is the same
request: while the first call runs, a repeat joins it; once it finished, a repeat is
answered with its first result (a change reads ``existing``) and nothing runs; when its
outcome is unknown, a repeat is RECONCILE_REQUIRED until reconcile settles it. The same
request_id with other inputs is IDEMPOTENCY_MISMATCH.

Request_ids belong to their caller: the same string from another uid is another request,
which neither answers, blocks nor reveals this one. Running requests are known here
(``claim`` / ``release``); finished ones in the ledger's idempotency index, which survives
restarts.
"""

from __future__ import annotations

from typing import Any

from rungd_ledgers import IdempotencyIndex

from rungd.core.contract import Tool
from rungd.core.errors import BadInput, IdempotencyMismatch, ReconcileRequired

from rungd.service.engine.calls import Call, CallTable


class Requests:
    """The requests with a request_id that are running now, beside the ledger's index.

    Args:
        index: the ledger's idempotency index (finished and unknown requests).
        calls: the daemon's calls, to find a running first call.
    """

    def __init__(self, index: IdempotencyIndex, calls: CallTable) -> None:
        self.index = index
        self._calls = calls
        self._running: dict[tuple[str, str, int], str] = {}  # (tool, request_id, uid) -> call_id

    def repeat_of(self, tool: Tool, request_id: str | None, digest: str, uid: int) -> Call | dict[str, Any] | None:
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
        running = self._calls.get(self._running.get((tool.name, request_id, uid), ""))
        entry = self.index.lookup(tool.name, request_id, uid)
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

    def claim(self, call: Call) -> None:
        """Mark ``call`` as the running first call of its request_id."""
        if call.request_id:
            self._running[(call.tool, call.request_id, call.caller.uid)] = call.call_id

    def release(self, call: Call) -> None:
        """Forget ``call`` as running (it ended, or never ran); the index knows the rest."""
        key = (call.tool, call.request_id or "", call.caller.uid)
        if call.request_id and self._running.get(key) == call.call_id:
            del self._running[key]
