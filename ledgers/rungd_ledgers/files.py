"""Where records live: the ledger files of a folder, and decoding them a block at a time.

Files are named ``ledger-000001.jsonl``, ``ledger-000002.jsonl``, ... and are read in the
order of their number. Only the last file is ever appended to; the writer starts the next
one only after the last byte of the previous one is durable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from rungd_ledgers.errors import LedgerCorrupt

T = TypeVar("T")

# Small on purpose. A block's records are all created at once and count toward the garbage
# collector's young generation while they live. A few hundred records (64 KiB) stay under
# its threshold of 700 and die young; a 1 MiB block gets promoted and scanned over and
# over, which made a replay twice as slow.
CHUNK_BYTES: Final = 1 << 16

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
    path: Path, decoder: msgspec.json.Decoder[T], offset: int = 0
) -> Iterator[tuple[list[T], int]]:
    """Decode a file from ``offset``, a block of whole lines at a time.

    Yields:
        ``(records, end)``: the records of a block and the file offset just past it. A
        partial last line is left for a later call (see ``_complete_lines``).

    Raises:
        LedgerCorrupt: a complete line is not a record of the decoder's type.
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


def _complete_lines(path: Path, offset: int = 0) -> Iterator[tuple[bytes, int]]:
    """Read a file from ``offset`` in blocks that each end on a newline.

    Yields:
        ``(block, end)``: complete lines, newlines included, and the file offset just past
        them. Bytes after the last newline are not yielded: they are a record still being
        written or one torn by a crash, and either way not a record yet.
    """
    with open(path, "rb") as file:
        file.seek(offset)
        partial = b""
        while chunk := file.read(CHUNK_BYTES):
            data = partial + chunk if partial else chunk
            cut = data.rfind(b"\n") + 1
            if cut:
                offset += cut
                yield data[:cut], offset
            partial = data[cut:]
