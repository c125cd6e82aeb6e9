"""What the daemon needs to know at start, rebuilt by replaying the ledger.

One replay gives three things:

* the idempotency index: ``(tool, request_id, caller uid)`` -> the first call that used it,
  its state and its first result, so a repeated request is answered instead of run twice.
  Each caller has its own request_ids: another caller's use of the same string neither
  answers, blocks nor reveals anything to this one;
* the calls dispatched but never finished, with their processes, for crash recovery;
* the calls held for approval and not yet decided.

A replay decodes only the fields it needs (``_Replayed``) and keeps each result as the JSON
it already is, which makes it about a third faster than decoding whole ``Record`` objects.

How records move an idempotency entry
-------------------------------------
An entry belongs to the first call that used its key; records of later calls with the same
key (repeats) never change it. The caller uid comes from the ``received`` record (``None``
when a record names none); later records of the call find the entry through its call_id.

* ``received`` or ``dispatched`` with a request_id, for a key with no entry: ``running``.
* ``finished`` with outcome ``unknown``: ``unknown``, with the result.
* ``finished`` with outcome ``not_started``, or ``rejected``: the entry is dropped. Nothing happened, so a
  retry with the same request_id must run rather than be answered with a refusal.
* ``finished`` with any other outcome: ``done``, with the result.
* ``reconciled`` settles an ``unknown`` entry. The convention for the record: outcome
  ``done`` with effect ``existing`` when the effect is found (the entry becomes ``done``,
  with the record's ``result`` if it has one), outcome ``not_started`` with effect ``none``
  when it did not happen (the entry is dropped). Any other outcome leaves it ``unknown``.

Entries first used more than ``retention_seconds`` ago are dropped by ``prune``, which
``rebuild`` runs after replaying.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from rungd_ledgers.files import decoded_blocks, ledger_files
from rungd_ledgers.records import LineDecoder, Record, encoder

DEFAULT_RETENTION_SECONDS: Final = 7 * 24 * 3600

State = Literal["running", "done", "unknown"]
_Key = tuple[str, str, int | None]  # tool, request_id, caller uid


# The index may hold hundreds of thousands of entries for a week. Keeping each result as
# JSON bytes in an untracked struct (gc=False is safe: strings, bytes and floats cannot
# form a cycle) keeps them out of reach of the cyclic garbage collector, whose full passes
# over that many live dicts would otherwise take longer than the whole replay.
class Entry(msgspec.Struct, frozen=True, gc=False):
    """The first call that used a ``(tool, request_id)`` key.

    Attributes:
        call_id: that call.
        input_digest: its input digest; a repeat with another digest is a different
            request reusing the key.
        state: ``running``, ``done`` or ``unknown`` (see the module docstring).
        time: when the key was first used.
        result_json: the first result envelope as JSON, once the call finished.
    """

    call_id: str
    input_digest: str | None
    state: State
    time: float
    result_json: bytes | None = None
    caller_uid: int | None = None

    @property
    def result(self) -> dict[str, Any] | None:
        """The first result envelope, decoded afresh on each access."""
        return None if self.result_json is None else _result_decoder.decode(self.result_json)


class Unfinished(msgspec.Struct, frozen=True, gc=False):
    """A call that was dispatched and has no ``finished`` record.

    Attributes:
        time: when it was dispatched. Recovery finds its leftover processes by the call's
            tag and kills each by pid and start time (``rungd.system.proctree.kill_tagged``).
    """

    call_id: str
    tool: str
    request_id: str | None
    time: float


class Held(msgspec.Struct, frozen=True, gc=False):
    """A call held for approval with no ``approved``, ``denied``, ``expired`` or ``finished``.

    Attributes:
        seq: the seq of its ``held`` record; ``iter_records(folder, seq - 1)`` starts there.
        time: when it was held.
    """

    seq: int
    call_id: str
    tool: str
    request_id: str | None
    caller_uid: int | None
    time: float


class _Replayed(msgspec.Struct, kw_only=True, gc=False):
    """The fields of a ``Record`` a replay reads; the decoder skips the others.

    Same names as ``Record``, so one set of handlers serves both; ``result`` is the JSON
    from the line, empty when the line has none.
    """

    seq: int
    time: float
    event: str
    call_id: str
    tool: str
    request_id: str | None = None
    caller_uid: int | None = None
    input_digest: str | None = None
    outcome: str | None = None
    result: msgspec.Raw = msgspec.Raw()


_replay_decoder: Final = LineDecoder(_Replayed)
_result_decoder: Final = LineDecoder(dict[str, Any] | None)


class IdempotencyIndex:
    """The replayed state of a ledger, kept current by ``apply``.

    Thread-safe: every method takes the index's lock.

    Attributes:
        retention_seconds: how long an entry is kept after its key was first used.
        last_seq: the highest seq applied, to compare with ``Ledger.last_seq``.
    """

    def __init__(self, *, retention_seconds: float = DEFAULT_RETENTION_SECONDS) -> None:
        self.retention_seconds = retention_seconds
        self.last_seq = 0
        self._lock = threading.Lock()
        self._entries: dict[_Key, Entry] = {}
        self._keys: dict[str, _Key] = {}  # call_id of an entry's owner -> its key
        # Keyed by call_id; dicts keep insertion order, so both list oldest first.
        self._unfinished: dict[str, Unfinished] = {}
        self._held: dict[str, Held] = {}
        # One handler per event, so a replay does only the work its event needs. Events a
        # newer daemon may add are not here, and are skipped.
        self._handlers: dict[str, Callable[[Record | _Replayed], None]] = {
            "received": self._on_received,
            # A rejected call ran nothing: its key is free again, as after not_started.
            "rejected": self._on_finished,
            "held": self._on_held,
            "approved": self._on_decided,
            "denied": self._on_decided,
            "expired": self._on_decided,
            "dispatched": self._on_dispatched,
            "finished": self._on_finished,
            "reconciled": self._on_reconciled,
        }

    @classmethod
    def rebuild(
        cls,
        folder: str | os.PathLike[str],
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        now: float | None = None,
    ) -> IdempotencyIndex:
        """Replay every record in ``folder``, then drop entries older than the retention.

        Args:
            now: the time retention is measured from, ``time.time()`` by default.

        Raises:
            FileNotFoundError: the folder does not exist.
            LedgerCorrupt: a line is not a record.
        """
        index = cls(retention_seconds=retention_seconds)
        handlers = index._handlers
        # No lock while replaying: nobody else can see the index yet.
        for path in ledger_files(Path(folder)):
            for records, _ in decoded_blocks(path, _replay_decoder):
                for record in records:
                    handle = handlers.get(record.event)
                    if handle is not None:
                        handle(record)
                if records:
                    index.last_seq = records[-1].seq
        index.prune(now)
        return index

    def apply(self, record: Record) -> None:
        """Update the index with one record; the daemon calls it for each record it appends.

        Records of different calls may come in any order (appends finish concurrently),
        but the records of one call must come in the order they were appended.
        """
        with self._lock:
            handle = self._handlers.get(record.event)
            if handle is not None:
                handle(record)
            self.last_seq = max(self.last_seq, record.seq)

    def lookup(self, tool: str, request_id: str, caller_uid: int | None = None) -> Entry | None:
        """The entry of this caller's request, ``None`` if it has not used it within the retention."""
        with self._lock:
            return self._entries.get((tool, request_id, caller_uid))

    def owners(self, tool: str, request_id: str) -> list[Entry]:
        """Every caller's entry for a request_id (for an operator, who may settle any of them)."""
        with self._lock:
            return [entry for (t, r, _), entry in self._entries.items() if (t, r) == (tool, request_id)]

    def __len__(self) -> int:
        """How many request keys the index holds."""
        with self._lock:
            return len(self._entries)

    def unfinished(self) -> list[Unfinished]:
        """Calls dispatched and never finished, oldest first."""
        with self._lock:
            return list(self._unfinished.values())

    def undispatched(self) -> list[tuple[str, str, Entry]]:
        """Keys whose call was received but neither dispatched, held nor finished.

        After a crash these calls ran nothing; recovery finishes them as not_started so
        their request_id is free again. Returns ``(tool, request_id, entry)`` triples.
        """
        with self._lock:
            busy = set(self._unfinished) | set(self._held)
            return [(tool, request_id, entry) for (tool, request_id, _), entry in self._entries.items()
                    if entry.state == "running" and entry.call_id not in busy]

    def held(self) -> list[Held]:
        """Calls still waiting for approval, oldest first."""
        with self._lock:
            return list(self._held.values())

    def live_call_ids(self) -> set[str]:
        """Calls whose records retention must keep: running, held, dispatched and unfinished,
        or finished ``unknown`` (a reconcile still needs their request)."""
        with self._lock:
            live = set(self._unfinished) | set(self._held)
            live.update(entry.call_id for entry in self._entries.values() if entry.state != "done")
            return live

    def prune(self, now: float | None = None) -> None:
        """Drop entries first used more than ``retention_seconds`` before ``now``."""
        cutoff = (time.time() if now is None else now) - self.retention_seconds
        with self._lock:
            self._entries = {key: entry for key, entry in self._entries.items() if entry.time >= cutoff}
            self._keys = {entry.call_id: key for key, entry in self._entries.items()}

    def _on_received(self, record: Record | _Replayed) -> None:
        if record.request_id is None:
            return
        if record.call_id in self._keys:
            return  # a dispatched record of a call whose received record made the entry
        key = (record.tool, record.request_id, record.caller_uid)
        if key not in self._entries:
            self._entries[key] = Entry(record.call_id, record.input_digest, "running", record.time,
                                       caller_uid=record.caller_uid)
            self._keys[record.call_id] = key

    def _on_held(self, record: Record | _Replayed) -> None:
        self._held[record.call_id] = Held(
            record.seq, record.call_id, record.tool, record.request_id, record.caller_uid, record.time
        )

    def _on_decided(self, record: Record | _Replayed) -> None:
        self._held.pop(record.call_id, None)

    def _on_dispatched(self, record: Record | _Replayed) -> None:
        if record.call_id not in self._unfinished:
            self._unfinished[record.call_id] = Unfinished(record.call_id, record.tool, record.request_id,
                                                          record.time)
        # A key first seen on dispatch (its received record is past retention) starts running.
        self._on_received(record)

    def _on_finished(self, record: Record | _Replayed) -> None:
        self._held.pop(record.call_id, None)
        self._unfinished.pop(record.call_id, None)
        owned = self._own_entry(record)
        if owned is None or owned[1].state != "running":
            return
        key, entry = owned
        if record.outcome == "not_started":
            del self._entries[key]
            self._keys.pop(entry.call_id, None)
        else:
            state: State = "unknown" if record.outcome == "unknown" else "done"
            result_json = _result_json(record)
            self._entries[key] = msgspec.structs.replace(entry, state=state, result_json=result_json)

    def _on_reconciled(self, record: Record | _Replayed) -> None:
        owned = self._own_entry(record)
        if owned is None or owned[1].state != "unknown":
            return
        key, entry = owned
        if record.outcome == "not_started":
            del self._entries[key]
            self._keys.pop(entry.call_id, None)
        elif record.outcome == "done":
            result_json = _result_json(record) or entry.result_json
            self._entries[key] = msgspec.structs.replace(entry, state="done", result_json=result_json)

    def _own_entry(self, record: Record | _Replayed) -> tuple[_Key, Entry] | None:
        """The record's key and entry, if the record's call is the one that owns the entry."""
        if record.request_id is None:
            return None
        key = self._keys.get(record.call_id)
        entry = self._entries.get(key) if key is not None else None
        if entry is None or entry.call_id != record.call_id:
            return None
        return key, entry


def _result_json(record: Record | _Replayed) -> bytes | None:
    """The record's result as JSON bytes, ``None`` if it has none."""
    if isinstance(record, _Replayed):
        # bytes() copies: a Raw is a view that would keep the whole block alive.
        return bytes(record.result) or None
    return None if record.result is None else encoder.encode(record.result)
