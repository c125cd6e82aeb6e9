"""Retention: deleting whole old ledger files, and saying so in the chain.

Only whole files go, oldest first, never the file being written: the files left are then
always a tail of the chain. Before any file is deleted, one ``pruned`` record naming each
file (its seq range, the hash of its last record, its times and size) is appended durably
to the file being written. ``verify`` then proves that the files left continue exactly that
chain: the first record left has as ``prev`` the last hash a ``pruned`` record names.

A file is kept, and with it every newer file, when any of these holds:

* it has a record inside ``protect_since`` (the idempotency retention: the index of
  request_ids is rebuilt from the files at start, and a repeat must still find its first
  result);
* it holds a record of a call still live (running, held, or finished ``unknown``);
* it is neither older than ``keep_seconds`` nor needed to bring the total under
  ``max_total_bytes``.

Crash safety: the record is durable before the first unlink, and files are unlinked oldest
first. A crash between leaves files the record names; the next prune names them again.
"""

from __future__ import annotations

import os
from collections.abc import Container
from pathlib import Path

import msgspec

from rungd_ledgers.errors import LedgerCorrupt
from rungd_ledgers.files import MAX_LINE_BYTES, decoded_blocks, ledger_files
from rungd_ledgers.records import LineDecoder, PrunedFile, Record, decoder
from rungd_ledgers.writer import Ledger, _fsync_path, _last_line


class PruneResult(msgspec.Struct, frozen=True):
    """What one ``prune`` did.

    Attributes:
        record: the ``pruned`` record appended, ``None`` when nothing was deleted.
        kept_because: why the oldest file left was not deleted, for the journal (``""``
            when it was not due anyway).
        total_bytes: the ledger's size after pruning.
    """

    record: Record | None
    kept_because: str
    total_bytes: int


class _CallIds(msgspec.Struct):
    call_id: str


_call_ids = LineDecoder(_CallIds)


def prune(
    ledger: Ledger,
    *,
    now: float,
    keep_seconds: float | None,
    max_total_bytes: int | None,
    protect_since: float,
    live_calls: Container[str] = frozenset(),
) -> PruneResult:
    """Delete the old files that are due, after recording them in the chain.

    Blocking: run it in a worker thread.

    Args:
        ledger: the open ledger; the ``pruned`` record is appended through it.
        now: the time ages are measured from.
        keep_seconds: a file whose last record is older than this is due; ``None``: never
            by age.
        max_total_bytes: while all files together are larger, the oldest is due; ``None``:
            no bound.
        protect_since: no file with a record at or after this time is deleted.
        live_calls: call_ids whose records must stay.

    Returns:
        What was pruned, and why the next file was kept.

    Raises:
        LedgerUnavailable: the ``pruned`` record could not be written; nothing was deleted.
        LedgerCorrupt: a file read holds a line that is not a record; nothing was deleted.
        OSError: a file could not be read or deleted (files before it are gone, and named
            by the record).
    """
    files = ledger_files(ledger.folder)
    sizes = {path: path.stat().st_size for path in files}
    total = sum(sizes.values())
    chosen: list[PrunedFile] = []
    kept_because = ""
    for path in files[:-1]:  # the newest file is the one being written
        first, last = _first_and_last(path)
        if first is None or last is None:
            continue  # an empty file (a rotation that never got its first record)
        by_age = keep_seconds is not None and last.time < now - keep_seconds
        by_size = max_total_bytes is not None and total > max_total_bytes
        if not (by_age or by_size):
            break
        if last.time >= protect_since:
            kept_because = (f"{path.name} holds records inside the idempotency retention "
                            "(ledger.retention_days)")
            break
        if _holds_live_call(path, live_calls):
            kept_because = f"{path.name} holds records of a call still running, held or unknown"
            break
        chosen.append(PrunedFile(name=path.name, first_seq=first.seq, last_seq=last.seq, last_hash=last.hash,
                                 first_time=first.time, last_time=last.time, bytes=sizes[path]))
        total -= sizes[path]
    if not chosen:
        return PruneResult(None, kept_because, total)
    note = (f"pruned {len(chosen)} file(s) {chosen[0].name}..{chosen[-1].name}: seq {chosen[0].first_seq}-"
            f"{chosen[-1].last_seq}, last hash {chosen[-1].last_hash[:12]}")
    record = ledger.append("pruned", "", "", pruned=chosen, note=note)
    for item in chosen:
        (ledger.folder / item.name).unlink(missing_ok=True)
    _fsync_path(ledger.folder)
    return PruneResult(record, kept_because, total)


def _first_and_last(path: Path) -> tuple[Record | None, Record | None]:
    """The first and last records of a closed file, reading only its two ends (each no
    further than ``MAX_LINE_BYTES``); ``(None, None)`` for an empty file.

    Raises:
        LedgerCorrupt: either line is not a whole record.
    """
    with open(path, "rb") as file:
        first_line = file.readline(MAX_LINE_BYTES + 1)
        size = file.seek(0, os.SEEK_END)
        last_line = _last_line(file, size - 1) if first_line.endswith(b"\n") else None
    if not first_line:
        return None, None
    if last_line is None:
        raise LedgerCorrupt(f"{path} cannot be pruned: its first or last line is not a whole record (no newline, "
                            f"or more than {MAX_LINE_BYTES} bytes); run `rungctl ledger verify` to find it")
    try:
        return decoder.decode(first_line), decoder.decode(last_line)
    except msgspec.DecodeError as error:
        raise LedgerCorrupt(f"{path} cannot be pruned: a line is not a record ({error}); "
                            "run `rungctl ledger verify` to find it") from error


def _holds_live_call(path: Path, live_calls: Container[str]) -> bool:
    for records, _ in decoded_blocks(path, _call_ids):
        if any(record.call_id in live_calls for record in records):
            return True
    return False
