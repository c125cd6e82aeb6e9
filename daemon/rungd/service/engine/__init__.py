"""The call engine: one call from request to envelope, as a pipeline of small stages.

    dispatcher.py    strings the stages together (start here)
    policy.py        the config, tools and refusals every stage decides by; a reload swaps it
    admission.py     lookup, access, input validation
    idempotency.py   repeats of a request_id
    slots.py         per-tool concurrency
    approvals.py     calls held at a gate until a person decides
    reconcile.py     settling an unknown outcome from a read
    preconditions.py expected revisions and resource locks
    outcomes.py      the one boundary where exceptions become envelopes and protocol errors
    calls.py         the call record and the table of calls
    recovery.py      what a crashed run left open, settled at start-up
"""

from rungd.service.engine.calls import Call, new_call_id
from rungd.service.engine.dispatcher import MAX_WAIT_S, Dispatcher

__all__ = ["MAX_WAIT_S", "Call", "Dispatcher", "new_call_id"]
