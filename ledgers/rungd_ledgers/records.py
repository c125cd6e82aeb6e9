"""The ledger record: one line of JSON per event of a call.

Schema evolution follows msgspec's rules, so every ledger ever written stays readable:

* a new field always gets a default, and no field, default or meaning ever changes;
* unknown fields are ignored on decode, so older code reads newer ledgers;
* ``v`` is required and always written, so a reader can tell which rules wrote a line.

Records are written with ``omit_defaults``: a field missing from a line has its default.
That keeps lines short, for a person running ``tail -f`` and for a replay alike.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final, Generic, TypeVar

import msgspec

SCHEMA_VERSION: Final = 1

# Plain strings rather than a Literal on the struct: an older reader must still decode a
# ledger holding an event a newer daemon added. The writer checks against this set.
EVENTS: Final = frozenset(
    {
        "received",
        "rejected",
        "held",
        "approved",
        "denied",
        "expired",
        "dispatched",
        "answered",
        "finished",
        "reconciled",
        # Not events of a call but of a tool, named by the last call observed: a step-down
        # observation fired (note: which, and the calls), and an operator lifted it
        # (approver_uid). Older readers decode them as strings and skip them.
        "step_down",
        "resumed",
        # Not an event of a call: whole old files were deleted (``retention``). ``pruned``
        # names them, so ``verify`` can prove the files left still continue that chain.
        "pruned",
        # Not an event of a call: a reload added, changed or removed tools (note: which,
        # each with its definition digest, as ``received`` records name it in tool_digest).
        "reloaded",
        # Not an event of a call: the ledger could not be written for a while (note: since when,
        # for how long, how many appends were refused), recorded once it could be again.
        "ledger_outage",
    }
)


class PrunedFile(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One ledger file deleted by retention, as the ``pruned`` record names it.

    Attributes:
        name: its file name, e.g. ``ledger-000003.jsonl``.
        first_seq, last_seq: the seqs of its first and last records.
        last_hash: the hash of its last record: the ``prev`` of the record after it,
            which is how ``verify`` links the files left to this one.
        first_time, last_time: when its first and last records were sealed.
        bytes: its size.
    """

    name: str
    first_seq: int
    last_seq: int
    last_hash: str
    first_time: float
    last_time: float
    bytes: int


class Record(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One event of one call, as written to the ledger.

    ``seq``, ``time``, ``prev`` and ``hash`` are filled in by ``Ledger.append``; the other
    fields come from the caller.

    Attributes:
        v: schema version of the writer (``SCHEMA_VERSION``).
        seq: position in the ledger, gap-free from 1 across all files.
        time: unix seconds when the record was sealed.
        event: one of ``EVENTS``.
        call_id: the call this event belongs to.
        tool: the tool called.
        request_id: the caller's idempotency key, if it sent one.
        caller_uid, caller_pid: who called, from the socket's peer credentials.
        input_digest: ``input_digest(tool, inputs)`` of the full inputs.
        tool_digest: on ``received``, the digest of the tool's definition it ran with (its
            contract and what it runs), so what a tool was when it acted can be told.
        inputs: only the inputs the tool marks safe to log.
        outcome: ``done``, ``not_started`` or ``unknown`` once known.
        effect: ``changed``, ``existing``, ``no_change`` or ``none`` once known.
        code: the error code of a failed call.
        approver_uid: who approved or denied a held call.
        note: one line for a person reading the ledger.
        result: on ``finished``, the first result envelope as a plain dict, so a repeat
            of the same request can be answered without running the tool again.
        pruned: on ``pruned`` (call_id and tool empty), the files deleted, oldest first.
        prev: ``hash`` of the record before, ``GENESIS`` for the first.
        hash: sha256 hex of this record's line without its ``hash`` field (see ``chain``).
    """

    v: int
    seq: int
    time: float
    event: str
    call_id: str
    tool: str
    request_id: str | None = None
    caller_uid: int | None = None
    caller_pid: int | None = None
    input_digest: str | None = None
    tool_digest: str | None = None
    inputs: dict[str, Any] = {}
    outcome: str | None = None
    effect: str | None = None
    code: str | None = None
    approver_uid: int | None = None
    note: str | None = None
    result: dict[str, Any] | None = None
    pruned: list[PrunedFile] = []
    prev: str
    hash: str = ""


T = TypeVar("T")


class LineDecoder(Generic[T]):
    """msgspec's JSON decoder for lines of a file (a ledger, tombstones), where a line nested
    too deeply to decode (200,000 brackets under an unknown key) is a malformed line, a
    ``msgspec.DecodeError`` like any other, never a RecursionError out of every reader."""

    def __init__(self, type: Any) -> None:
        self._decoder = msgspec.json.Decoder(type)

    def decode(self, line: bytes | str) -> T:
        try:
            return self._decoder.decode(line)  # type: ignore[no-any-return]
        except RecursionError:
            raise msgspec.DecodeError("it nests too deeply to decode") from None

    def decode_lines(self, lines: bytes | str) -> list[T]:
        try:
            return self._decoder.decode_lines(lines)  # type: ignore[no-any-return]
        except RecursionError:
            raise msgspec.DecodeError("a line nests too deeply to decode") from None


# Built once and shared by every thread: their methods are thread-safe since msgspec 0.16
# (msgspec#402), and the project requires 0.18.
encoder: Final = msgspec.json.Encoder()
decoder: Final[LineDecoder[Record]] = LineDecoder(Record)


def input_digest(tool: str, inputs: dict[str, Any]) -> str:
    """Return the sha256 hex digest of a call's tool name and inputs.

    The encoding sorts keys at every depth, so two dicts that compare equal give the same
    digest whatever order their keys were built in. The daemon compares digests to tell a
    repeat of a request from a different request reusing its request_id.
    """
    canonical = msgspec.json.encode({"tool": tool, "inputs": inputs}, order="sorted")
    return hashlib.sha256(canonical).hexdigest()
