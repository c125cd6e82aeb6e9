"""Where records live: the ledger files of a folder, and reading them a line at a time.

Files are named ``ledger-000001.jsonl``, ``ledger-000002.jsonl``, ... and are read in the
order of their number. Only the last file is ever appended to; the writer starts the next
one only after the last byte of the previous one is durable.

Whatever a file holds, reading it stays cheap: a line costs time in proportion to its
length, and no reader holds more than ``MAX_LINE_BYTES`` of one. Readers of many lines go
through ``decoded_blocks`` or ``bounded_lines``; a reader of one line bounds it the same way
(``readline(MAX_LINE_BYTES + 1)`` for a first line, ``writer._last_line`` for a last one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final, TypeVar

import msgspec

from rungd_ledgers.errors import LedgerCorrupt
from rungd_ledgers.records import LineDecoder

T = TypeVar("T")

# Small on purpose. A block's records are all created at once and count toward the garbage
# collector's young generation while they live. A few hundred records (64 KiB) stay under
# its threshold of 700 and die young; a 1 MiB block gets promoted and scanned over and
# over, which made a replay twice as slow.
CHUNK_BYTES: Final = 1 << 16

# The longest line that can be a record, newline excluded. rungd keeps every record far below
# it: one carries a call's logged inputs (at most 1 MiB as JSON, refused at admission past
# that) or one result (a tool's cap_bytes, at most 1 MiB), and the writer refuses a longer
# draft. A longer line is damage, or was written by something else: readers report it as any
# line that is not a record, and stop holding it at this size, so their memory stays bounded
# whatever a file holds.
MAX_LINE_BYTES: Final = 16 << 20

_NAME: Final = re.compile(r"ledger-(\d{6,})\.jsonl")


def file_name(number: int) -> str:
    """The name of ledger file ``number``; names sort in file order up to 999,999 files."""
    return f"ledger-{number:06d}.jsonl"


def file_number(path: Path) -> int:
    """The number in a ledger file's name."""
    match = _NAME.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path.name} is not a ledger file name like {file_name(1)}")
    return int(match.group(1))


def ledger_files(folder: Path) -> list[Path]:
    """The ledger files in ``folder``, oldest first.

    ``*.torn`` files and anything else not named like a ledger file are left out.

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    with os.scandir(folder) as entries:
        paths = [Path(entry.path) for entry in entries if _NAME.fullmatch(entry.name)]
    return sorted(paths, key=file_number)


def decoded_blocks(
    path: Path, decoder: LineDecoder[T], offset: int = 0
) -> Iterator[tuple[list[T], int]]:
    """Decode a file from ``offset``, a block of whole lines at a time.

    Yields:
        ``(records, end)``: the records of a block and the file offset just past it. A
        partial last line is left for a later call (see ``_complete_lines``).

    Raises:
        LedgerCorrupt: a complete line is not a record of the decoder's type, or is longer
            than ``MAX_LINE_BYTES``.
    """
    for block, end in _complete_lines(path, offset):
        try:
            records = decoder.decode_lines(block)
        except msgspec.DecodeError as error:
            raise LedgerCorrupt(
                f"{path} holds a line that is not a ledger record ({error}); "
                "run `rungctl ledger verify` to find it"
            ) from error
        yield records, end


def bounded_lines(file: BinaryIO) -> Iterator[bytes | None]:
    """Each line of ``file`` from where it stands, newline included, one at a time.

    A line longer than ``MAX_LINE_BYTES`` is read past, never held whole, and yielded as
    ``None``. The last line may lack its newline (torn); a torn line that long is yielded as
    its first bytes only, still without a newline, so it reads as torn all the same.
    """
    while piece := file.readline(CHUNK_BYTES):
        # A line longer than a chunk comes in pieces, joined once when it ends (a long line
        # costs its length), and no longer kept once it is past any record's length.
        pieces, size = [piece], len(piece)
        while not piece.endswith(b"\n") and size <= MAX_LINE_BYTES:
            piece = file.readline(CHUNK_BYTES)
            if not piece:
                break  # the end of the file: a torn last line
            pieces.append(piece)
            size += len(piece)
        ended = pieces[-1].endswith(b"\n")
        if (size - 1 if ended else size) <= MAX_LINE_BYTES:
            yield b"".join(pieces) if len(pieces) > 1 else pieces[0]
        elif ended or _read_past_line(file):
            yield None
        else:
            yield pieces[0]


def _complete_lines(path: Path, offset: int = 0) -> Iterator[tuple[bytes, int]]:
    """Read a file from ``offset`` in blocks that each end on a newline.

    Yields:
        ``(block, end)``: complete lines, newlines included, and the file offset just past
        them. Bytes after the last newline are not yielded: they are a record still being
        written or one torn by a crash, and either way not a record yet (past
        ``MAX_LINE_BYTES`` they never will be, and are read past without being kept).

    Raises:
        LedgerCorrupt: a complete line is longer than ``MAX_LINE_BYTES``.
    """
    with open(path, "rb") as file:
        file.seek(offset)
        # The line begun and not ended yet, in pieces, joined once its newline comes: a long
        # line then costs its length, where joining at every chunk cost its length squared.
        pending: list[bytes] = []
        pending_bytes = 0
        while chunk := file.read(CHUNK_BYTES):
            newline = chunk.find(b"\n")
            if pending_bytes + (len(chunk) if newline < 0 else newline) > MAX_LINE_BYTES:
                if newline < 0 and not _read_past_line(file):
                    return  # a torn last line, however long: not a record, as any partial line
                raise LedgerCorrupt(
                    f"{path} holds a line of more than {MAX_LINE_BYTES} bytes from byte {offset}, "
                    "longer than any ledger record; run `rungctl ledger verify` to find it"
                )
            if newline < 0:
                pending.append(chunk)
                pending_bytes += len(chunk)
                continue
            cut = chunk.rfind(b"\n") + 1
            block = b"".join((*pending, chunk[:cut])) if pending else chunk[:cut]
            offset += len(block)
            yield block, offset
            pending = [chunk[cut:]] if cut < len(chunk) else []
            pending_bytes = len(chunk) - cut


def _read_past_line(file: BinaryIO) -> bool:
    """Read on to just past the next newline, keeping nothing: whether there was one."""
    while chunk := file.read(CHUNK_BYTES):
        newline = chunk.find(b"\n")
        if newline >= 0:
            file.seek(newline + 1 - len(chunk), os.SEEK_CUR)
            return True
    return False
