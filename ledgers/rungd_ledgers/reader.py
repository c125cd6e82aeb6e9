"""Reading the ledger: every record in order, or new records as they are appended."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec

from rungd_ledgers.files import MAX_LINE_BYTES, decoded_blocks, file_number, ledger_files
from rungd_ledgers.records import LineDecoder, Record, decoder

POLL_SECONDS = 0.2


class Event(msgspec.Struct, gc=False):
    """A record as the ledger's readers of many events see it: what happened, to which call
    and tool, and how it ended. The decoder skips the rest of each line (the result, the
    inputs), which makes a pass over a million events several times faster."""

    time: float
    event: str
    call_id: str
    tool: str
    outcome: str | None = None
    code: str | None = None
    note: str | None = None


_event_decoder = LineDecoder(Event)


def iter_events(folder: str | os.PathLike[str]) -> Iterator[list[Event]]:
    """Every record of the ledger in ``folder`` as an ``Event``, in blocks, oldest first.

    Raises:
        OSError: a file cannot be read.
        LedgerCorrupt: a line is not a record.
    """
    for path in ledger_files(Path(folder)):
        for block, _ in decoded_blocks(path, _event_decoder):
            yield block


def iter_records(folder: str | os.PathLike[str], since_seq: int = 0) -> Iterator[Record]:
    """Yield the records with a seq above ``since_seq``, oldest first, across all files.

    A partial last line (a record being written, or torn by a crash) is not yielded.
    Files wholly before ``since_seq`` are skipped without being read.

    Raises:
        FileNotFoundError: the folder does not exist.
        LedgerCorrupt: a complete line is not a record; ``verify`` names it.
    """
    files = ledger_files(Path(folder))
    for path in _files_after(files, since_seq):
        try:
            for records, _ in decoded_blocks(path, decoder):
                yield from _after(records, since_seq)
        except FileNotFoundError:
            # Retention deleted it after it was listed: only old files go, and the pruned
            # record that names them is further on. The last file is never pruned.
            if path == files[-1]:
                raise


def follow(
    folder: str | os.PathLike[str],
    since_seq: int = 0,
    *,
    poll_seconds: float = POLL_SECONDS,
    stop: threading.Event | None = None,
) -> Iterator[Record]:
    """Yield the records above ``since_seq``, then each new one as it is appended.

    Polls every ``poll_seconds``, like ``tail -f``, and moves on to the next file when the
    writer rotates. A partial last line is a record still being written: it is yielded
    once its newline arrives.

    Args:
        stop: when set, the generator ends at its next poll. Without it, the generator
            runs until the caller stops iterating.

    Raises:
        FileNotFoundError: the folder does not exist.
        LedgerCorrupt: a complete line is not a record.
    """
    folder = Path(folder)
    stop = stop or threading.Event()
    path: Path | None = None
    offset = 0
    while not stop.is_set():
        files = ledger_files(folder)
        if path is None:
            if not files:
                stop.wait(poll_seconds)
                continue
            path = _files_after(files, since_seq)[0]
        # Listed before reading: the writer starts a new file only after the last byte of
        # the current one is durable, so if a newer file was already listed, reading the
        # current file to its end below gets all of it.
        newer = [candidate for candidate in files if file_number(candidate) > file_number(path)]
        try:
            for records, end in decoded_blocks(path, decoder, offset):
                offset = end
                yield from _after(records, since_seq)
        except FileNotFoundError:
            if not newer:
                raise
            # Pruned while we read it (a follower far behind): go on with the next file.
        if newer:
            path, offset = newer[0], 0
        else:
            stop.wait(poll_seconds)


def _after(records: list[Record], since_seq: int) -> list[Record]:
    if records and records[0].seq <= since_seq:
        return [record for record in records if record.seq > since_seq]
    return records


def _files_after(files: list[Path], since_seq: int) -> list[Path]:
    """``files`` without those whose every record has a seq at or below ``since_seq``."""
    first = 0
    # Seqs are gap-free, so a file holds only seqs below the first seq of the file after it.
    while first + 1 < len(files):
        next_first_seq = _first_seq(files[first + 1])
        if next_first_seq is None or next_first_seq > since_seq + 1:
            break
        first += 1
    return files[first:]


def _first_seq(path: Path) -> int | None:
    """The seq of a file's first record, ``None`` when it has no readable first line."""
    try:
        with open(path, "rb") as file:
            line = file.readline(MAX_LINE_BYTES + 1)  # a longer one is not a record anyway
    except FileNotFoundError:
        return None  # pruned since it was listed
    try:
        return decoder.decode(line).seq
    except msgspec.DecodeError:
        # Not worth failing over here: reading that file reports the bad line properly.
        return None
