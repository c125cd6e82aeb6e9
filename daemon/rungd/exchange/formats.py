"""File formats of legacy exports and imports: CSV/TSV, JSON Lines, fixed-width.

A format is a small frozen description a tool declares once. Reading is streaming: a
``Reader`` gives the preamble (lines before the header), the header, and then batches of
raw records, never the whole file:

    with open_reader(Csv(delimiter=";", encoding="cp1252"), path) as reader:
        reader.header                     # ['invoice', 'date', ...]
        for batch in reader.batches(1000):
            ...                           # lists of cells, one list per record

Encodings: the declared one, except that a byte-order mark wins (a UTF-8 BOM means UTF-8,
a UTF-16 BOM means UTF-16), because a program that writes a BOM has told us. A byte that
does not decode is a changed surface, not a bad row: ``SurfaceChanged`` names the record
and the encoding, since every later row would be wrong the same way.

Speed: a million-row CSV must read at close to the csv module's own speed. Plain text (no
quote, no escape, no bare carriage return) splits at every delimiter exactly as csv.reader
splits it, so it is cut with C-level string methods into a ``FlatBatch``; the first text
that is not plain goes to csv.reader, and so does everything after it. The records are the
same either way (``tests/exchange/test_rows.py`` checks that against csv.reader itself).

Writing (imports) renders rows to bytes in memory first (imports are small and must be
checked whole before anything touches the watched folder): ``render(fmt, columns, rows)``.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import datetime
import io
import itertools
import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgspec

from rungd.core.errors import BadInput, SurfaceChanged
from rungd.exchange.safe import open_regular

BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
CHUNK_BYTES = 1 << 16
_LINE_END = re.compile(r"\r\n|\r|\n")


class Malformed:
    """A record that could not be split into cells (bad JSON, keys that differ, ...)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __len__(self) -> int:
        return 0  # never the width of a header, so a length check alone finds it


# A cell absent from a record (a JSON Lines key that is missing).
MISSING: Any = msgspec.UNSET


@dataclasses.dataclass(frozen=True)
class Csv:
    """Comma- (or otherwise) separated values with a header row.

    Args:
        delimiter, quotechar, escapechar, doublequote: the dialect, as Python's csv module
            names them.
        encoding: the declared encoding (``utf-8``, ``cp1252``, ``latin-1``, ...). A BOM
            overrides it when reading; ``bom`` writes one when writing.
        preamble_lines: lines before the header row (a title, "exported at ..."); they are
            kept for ``AsOf.preamble`` and never parsed as rows.
        lineterminator: what ends a row when writing.
        bom: write a UTF-8 BOM (only with a UTF-8 encoding).
    """

    delimiter: str = ","
    quotechar: str = '"'
    escapechar: str | None = None
    doublequote: bool = True
    encoding: str = "utf-8"
    preamble_lines: int = 0
    lineterminator: str = "\r\n"
    bom: bool = False
    kind: Literal["csv"] = "csv"

    def dialect(self) -> dict[str, Any]:
        return {"delimiter": self.delimiter, "quotechar": self.quotechar, "escapechar": self.escapechar,
                "doublequote": self.doublequote, "lineterminator": self.lineterminator, "strict": False}


def Tsv(**options: Any) -> Csv:
    """Tab-separated values: a ``Csv`` with a tab delimiter."""
    options.setdefault("delimiter", "\t")
    return Csv(**options)


@dataclasses.dataclass(frozen=True)
class JsonLines:
    """One JSON object per line. The keys of the first record are the header.

    Args:
        encoding: the declared encoding; a BOM overrides it.
        preamble_lines: lines before the first record that are not records.
    """

    encoding: str = "utf-8"
    preamble_lines: int = 0
    kind: Literal["jsonl"] = "jsonl"


@dataclasses.dataclass(frozen=True)
class FixedWidth:
    """Fixed-width columns, as mainframe-era programs print them.

    Args:
        columns: ``(name, start, end)`` for each column: 0-based character offsets, end
            exclusive. Cells are stripped of surrounding spaces.
        header: the first line (after the preamble) holds the column names in the same
            positions; it is checked like a CSV header. Without it the declared names are
            the header, so only the row checks apply.
        encoding: the declared encoding; a BOM overrides it.
        preamble_lines: lines before the header (or the first row).
    """

    columns: tuple[tuple[str, int, int], ...]
    header: bool = True
    encoding: str = "cp1252"
    preamble_lines: int = 0
    kind: Literal["fixed"] = "fixed"

    def __post_init__(self) -> None:
        last = 0
        for name, start, end in self.columns:
            if start < last or end <= start:
                raise ValueError(f"fixed-width column {name!r}: spans must be increasing and non-empty")
            last = end

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.columns]

    def split(self, line: str) -> list[str]:
        return [line[start:end].strip() for _, start, end in self.columns]


Format = Csv | JsonLines | FixedWidth


def sniff_encoding(head: bytes, declared: str) -> tuple[str, int]:
    """The encoding to read with and the number of BOM bytes to skip: a BOM wins over what
    the tool declared."""
    for bom, name in BOMS:
        if head.startswith(bom):
            return ("utf-8", len(bom)) if name == "utf-8-sig" else (name, 0)
    return declared, 0


@dataclasses.dataclass(frozen=True)
class Limits:
    """How big an export may be before reading it is refused as a changed surface.

    Reading stays linear in the file's size whatever it holds, and these bound that size,
    so a file a user can write never makes a read run for minutes or hold gigabytes.

    Args:
        max_line_chars: the longest line (about: checked every 64 KiB read).
        max_columns: the widest header.
        max_bytes: the largest file.
    """

    max_line_chars: int = 1 << 20
    max_columns: int = 4096
    max_bytes: int = 4 << 30


class Stopped(Exception):
    """The read was told to stop (the call's deadline passed); nothing more is read."""


class _Text:
    """The decoded text of a binary file, read in chunks; hands out lines or runs of lines.

    Decoding is incremental: a multi-byte character split across reads is fine, and a byte
    that does not decode raises UnicodeDecodeError where it is met. Each byte is read,
    decoded and searched for a line end once (a long line is gathered in parts and joined
    once), so the cost is linear in the file; ``limits`` bound line and file length, and
    ``stop`` is checked before every read.
    """

    def __init__(self, raw: BinaryIO, encoding: str, *, limits: Limits = Limits(), name: str = "the export",
                 stop: threading.Event | None = None) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
        self._buffer = ""
        self._eof = False
        self._limits = limits
        self._name = name
        self._stop = stop
        self.bytes = 0

    def _read(self) -> str:
        """The next chunk of text ("" and ``_eof`` set at the end of the file)."""
        if self._stop is not None and self._stop.is_set():
            raise Stopped
        data = self._raw.read(CHUNK_BYTES)
        self.bytes += len(data)
        if self.bytes > self._limits.max_bytes:
            raise _limit(self._name, f"is larger than {self._limits.max_bytes} bytes", "max_bytes")
        if not data:
            self._eof = True
            return self._decoder.decode(b"", final=True)
        return self._decoder.decode(data)

    def _too_long(self) -> SurfaceChanged:
        return _limit(self._name, f"has a line longer than {self._limits.max_line_chars} characters",
                      "max_line_chars")

    def _ready(self) -> bool:
        """Make sure the buffer holds a whole line (or the rest of the file). False at the end."""
        buffer = self._buffer
        if self._eof or "\n" in buffer or "\r" in buffer[:-1]:
            return bool(buffer)
        parts, size = [buffer], len(buffer)
        while not self._eof:
            if size > self._limits.max_line_chars:
                raise self._too_long()
            text = self._read()
            complete = "\n" in text or "\r" in text[:-1] or (text and parts[-1].endswith("\r"))
            parts.append(text)
            size += len(text)
            if complete:
                break
        self._buffer = "".join(parts)
        return bool(self._buffer)

    def readline(self) -> str:
        """The next line with its line end ("" at the end of the file).

        Lines end at "\r\n", "\r" or "\n", as in a file opened with ``newline=""``, which
        is how Python's csv module expects to be fed.
        """
        if not self._ready():
            return ""
        match = _LINE_END.search(self._buffer)
        cut = match.end() if match else len(self._buffer)
        line, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return line

    def lines(self) -> Iterator[str]:
        """Every remaining line, each with its line end (the last one may lack it)."""
        while self._ready():
            buffer, start = self._buffer, 0
            for match in _LINE_END.finditer(buffer):
                if match.end() == len(buffer) and buffer.endswith("\r") and not self._eof:
                    break  # maybe half of a "\r\n": wait for the next read
                yield buffer[start:match.end()]
                start = match.end()
            if start == 0 and (self._eof or not buffer.endswith("\r")):
                start = len(buffer)  # the end of the file, without a line end
                yield buffer
            self._buffer = buffer[start:]

    def chunk(self) -> str | None:
        """The next run of whole lines: up to a newline, or to the end of the file."""
        parts, size = [self._buffer], len(self._buffer)
        newline = "\n" in self._buffer
        while (not newline or size < CHUNK_BYTES // 2) and not self._eof:
            if not newline and size > self._limits.max_line_chars:
                raise self._too_long()
            text = self._read()
            parts.append(text)
            size += len(text)
            newline = newline or "\n" in text
        buffer = "".join(parts)
        if not buffer:
            self._buffer = ""
            return None
        cut = buffer.rfind("\n")
        end = cut + 1 if cut >= 0 else len(buffer)
        text, self._buffer = buffer[:end], buffer[end:]
        return text

    def push_back(self, text: str) -> None:
        self._buffer = text + self._buffer


def _limit(name: str, what: str, limit: str) -> SurfaceChanged:
    return SurfaceChanged(
        f"{name} {what}, beyond the tool's {limit} limit; nothing more was read",
        hint=f"the export is not the file the tool was written for, or it outgrew the tool: a person must check "
        f"the file, or raise {limit} in the tool's export limits",
        outcome="done",
        fields={"limit": limit},
    )


class Batch(list):  # type: ignore[type-arg]
    """A list of records, each a list of cells or ``Malformed``."""


class FlatBatch:
    """A run of plain CSV lines of one width, kept as one flat list of cells, row after row.

    Plain means no quote, no escape and no stray carriage return: such lines split at every
    delimiter exactly as csv.reader splits them. One ``str.split`` over the whole run makes
    every cell at once, and a column is a strided slice of it; ``lines`` keeps the lines
    themselves (without line ends) for writing them out again.
    """

    __slots__ = ("cells", "count", "lines", "width")

    def __init__(self, cells: list[str], lines: list[str]) -> None:
        self.cells = cells
        self.lines = lines
        self.count = len(lines)
        self.width = len(cells) // self.count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> list[str]:
        width = self.width
        return self.cells[i * width:(i + 1) * width]

    def __iter__(self) -> Iterator[list[str]]:
        return (self[i] for i in range(self.count))

    def column(self, position: int) -> list[str]:
        return self.cells[position::self.width]


def _flat(joined: str, lines: list[str], delimiter: str, width: int) -> list[str] | None:
    """Every cell of ``lines``, row after row, if each line has exactly ``width`` cells.

    ``joined`` is the lines joined by a NUL marker and the delimiter, so the last cell of
    every line but the last ends with one marker. All in C-level string operations: if the
    cells number ``width`` per line and all markers sit in the cells at positions width-1,
    2*width-1, ..., then the lines start exactly at cells 0, width, 2*width, ... (each
    line has at least one cell, so line starts strictly increase). The caller makes sure
    the text holds no NUL of its own.
    """
    count = len(lines)
    cells = joined.split(delimiter)
    if len(cells) != count * width or (width == 1 and "" in lines):  # csv.reader skips empty lines
        return None
    last = "".join(cells[width - 1::width]).split("\x00")
    if len(last) != count:
        return None
    cells[width - 1::width] = last
    return cells


class Reader:
    """An open export: its preamble, header, and a way to read it in batches of records.

    Use ``open_reader``; the file is closed when its ``with`` block ends.

    Attributes:
        preamble: the raw lines before the header (newlines stripped).
        header: the column names as the file spells them.
        encoding: the encoding actually used (after BOM sniffing).
        records: how many records were handed out so far (header and preamble excluded).
    """

    def __init__(self, fmt: Format, text: _Text, encoding: str, name: str, limits: Limits = Limits()) -> None:
        self.fmt = fmt
        self.encoding = encoding
        self.records = 0
        self._name = name
        self._text = text
        self._limits = limits
        self.preamble = [self._guard(text.readline).rstrip("\r\n") for _ in range(fmt.preamble_lines)]
        self.header: list[str] = []
        self._first: Any = None
        if isinstance(fmt, Csv):
            lines = iter([self._guard(text.readline)])
            self.header = [cell.strip() for cell in self._guard(next, csv.reader(lines, **fmt.dialect()), [])]
        elif isinstance(fmt, FixedWidth):
            self.header = fmt.split(self._guard(text.readline).rstrip("\r\n")) if fmt.header else fmt.names
        else:
            self._jsonl_rows = self._jsonl()
            self._first = self._guard(next, self._jsonl_rows, None)
        self._check_width()

    def _check_width(self) -> None:
        if len(self.header) > self._limits.max_columns:
            raise _limit(self._name, f"has a header of {len(self.header)} columns, more than "
                         f"{self._limits.max_columns}", "max_columns")

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except UnicodeDecodeError as exc:
            raise _decode_error(self._name, self.encoding, self.records, exc) from None
        except csv.Error as exc:
            raise SurfaceChanged(
                f"{self._name} no longer parses as the declared CSV near record {self.records + 1}: {exc}",
                hint="the program may have changed its export dialect; a person should compare the file with "
                "the tool's declared delimiter and quoting",
                outcome="done",
            ) from None

    def batches(self, size: int, *, width: int | None = None) -> Iterator[Batch | FlatBatch]:
        """Yield batches of records: each record a list of cells (text; JSON values for JSON
        Lines), or ``Malformed``.

        Args:
            size: records per batch (plain CSV batches follow chunk boundaries instead).
            width: CSV only: the header's width. A run of plain lines that all have it
                comes as one ``FlatBatch``. Either way the records are exactly those
                Python's csv module gives for the file.

        Empty lines are skipped (they hold no record). Nothing is held between batches.

        Raises:
            SurfaceChanged: a byte does not decode in the file's encoding, or the CSV
                dialect no longer parses.
        """
        if isinstance(self.fmt, Csv):
            yield from self._csv_batches(self.fmt, size, width)
            return
        if isinstance(self.fmt, FixedWidth):
            rows: Iterator[Any] = self._fixed(self.fmt)
        else:
            rows = itertools.chain([self._first] if self._first is not None else [], self._jsonl_rows)
        while batch := Batch(self._guard(list, itertools.islice(rows, size))):
            self.records += len(batch)
            yield batch

    def _csv_batches(self, fmt: Csv, size: int, width: int | None) -> Iterator[Batch | FlatBatch]:
        # Plain text (no quote, no escape, no carriage return but in CRLF) splits at every
        # delimiter and line end exactly as csv.reader splits it, at a fraction of the cost.
        # The first chunk that is not plain hands the rest of the file to csv.reader: a
        # quoted field may hold a line break and run across chunks.
        special = [fmt.quotechar, *([fmt.escapechar] if fmt.escapechar else [])]
        delimiter = fmt.delimiter
        while (text := self._guard(self._text.chunk)) is not None:
            if any(c in text for c in special):
                self._text.push_back(text)
                break
            newline = "\r\n" if "\r\n" in text else "\n"
            lines = text.removesuffix(newline).split(newline)
            # Joined with a NUL marker after each line (see _flat); a CR or LF left inside a
            # line is a bare line end, which csv.reader treats as one: let it judge.
            joined = ("\x00" + delimiter).join(lines)
            if "\r" in joined or "\n" in joined:
                self._text.push_back(text)
                break
            if width and "\x00" not in text and (flat := _flat(joined, lines, delimiter, width)) is not None:
                self.records += len(lines)
                yield FlatBatch(flat, lines)
                continue
            batch = Batch(row for row in map(str.split, lines, itertools.repeat(delimiter)) if row != [""])
            self.records += len(batch)
            yield batch
        rows = csv.reader(self._text.lines(), **fmt.dialect())
        while batch := Batch(self._guard(list, itertools.islice(rows, size))):
            if not all(batch):
                batch = Batch(row for row in batch if row)
            self.records += len(batch)
            yield batch

    def _fixed(self, fmt: FixedWidth) -> Iterator[Any]:
        width = fmt.columns[-1][2]
        for line in self._text.lines():
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if line[width:].strip():
                yield Malformed(f"text beyond the last column (character {width + 1} on): {line[width:][:40]!r}")
                continue
            yield fmt.split(line)

    def _jsonl(self) -> Iterator[Any]:
        decode = msgspec.json.Decoder().decode
        header: list[str] | None = None
        keys: set[str] = set()
        for line in self._text.lines():
            if not line.strip():
                continue
            try:
                record = decode(line)
            except msgspec.DecodeError as exc:
                yield Malformed(f"not JSON: {exc}")
                continue
            except RecursionError:
                yield Malformed("not JSON this reader accepts: nested too deep")
                continue
            if not isinstance(record, dict):
                yield Malformed(f"a JSON {type(record).__name__}, not an object")
                continue
            if header is None:
                header = list(record)
                keys = set(header)
                self.header = header
            row = [record.get(k, MISSING) for k in header]
            if len(record) != len(header) or MISSING in row:
                missing = sorted(keys - record.keys())
                extra = sorted(record.keys() - keys)
                yield Malformed(f"keys differ from the first record: missing {missing}, unexpected {extra}")
                continue
            yield row


def _decode_error(name: str, encoding: str, records: int, exc: UnicodeDecodeError) -> SurfaceChanged:
    return SurfaceChanged(
        f"{name} does not decode as {encoding} near record {records + 1}: {exc.reason}",
        hint=f"the program may have changed its export encoding; the tool reads {encoding}. A person should "
        "check the file and update the tool's declared encoding (cp1252 or latin-1 for many legacy Windows "
        "programs)",
        outcome="done",
        fields={"encoding": encoding, "record": records + 1},
    )


@contextlib.contextmanager
def open_reader(fmt: Format, path: Path, *, fd: int | None = None, limits: Limits = Limits(),
                stop: threading.Event | None = None) -> Iterator[Reader]:
    """Open ``path`` (or the already open ``fd``, which is then owned) for streaming reads.

    Blocking: call it from a worker thread. Opening by path refuses anything but a
    regular file, without blocking on a FIFO.

    Args:
        limits: the longest line, widest header and largest file accepted.
        stop: once set, the next read raises ``Stopped`` (the caller's deadline passed).

    Raises:
        SurfaceChanged: the preamble or header does not decode, or a limit is passed.
        OSError: the file cannot be opened.
    """
    if fd is None:
        fd = open_regular(path, follow=True)
    raw = open(fd, "rb", buffering=0)  # noqa: SIM115 - closed below
    try:
        encoding, skip = sniff_encoding(os.pread(raw.fileno(), 4, 0), fmt.encoding)
        raw.seek(skip)
        text = _Text(raw, encoding, limits=limits, name=path.name, stop=stop)
        yield Reader(fmt, text, encoding, path.name, limits)
    finally:
        raw.close()


# --- writing ---------------------------------------------------------------------------------


def cell(value: Any) -> str:
    """A value as a legacy program reads it in a text cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    return value


def render(fmt: Format, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    """The whole file for ``rows`` (cells in ``columns`` order), encoded as ``fmt`` says.

    Raises:
        BadInput: a value cannot be written in the format's encoding or does not fit its
            fixed-width column; the message names the row and the column.
    """
    out = io.StringIO(newline="")
    if isinstance(fmt, Csv):
        writer = csv.writer(out, **fmt.dialect())
        writer.writerow(columns)
        writer.writerows([cell(v) for v in row] for row in rows)
    elif isinstance(fmt, JsonLines):
        for row in rows:
            out.write(json.dumps({c: _jsonable(v) for c, v in zip(columns, row)}, ensure_ascii=False))
            out.write("\n")
    else:
        _render_fixed(fmt, columns, rows, out)
    text = out.getvalue()
    try:
        data = text.encode(fmt.encoding)
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start)
        raise BadInput(
            f"row {line}: {text[exc.start:exc.end]!r} cannot be written in {fmt.encoding}, "
            "the encoding the program reads",
            hint=f"use only characters {fmt.encoding} can hold (for example plain quotes, not typographic ones)",
        ) from None
    if isinstance(fmt, Csv) and fmt.bom:
        data = codecs.BOM_UTF8 + data
    return data


def _render_fixed(fmt: FixedWidth, columns: Sequence[str], rows: Sequence[Sequence[Any]], out: io.StringIO) -> None:
    spans = {name: (start, end - start) for name, start, end in fmt.columns}
    order = [c for c in columns if c in spans]

    def line(cells: Sequence[str]) -> str:
        text = ""
        for name, value in zip(order, cells):
            start, width = spans[name]
            text = text.ljust(start) + value.ljust(width)
        return text.rstrip() + "\n"

    if fmt.header:
        out.write(line(order))
    for number, row in enumerate(rows, 1):
        cells = [cell(v) for v in row]
        for name, value in zip(order, cells):
            if len(value) > spans[name][1]:
                raise BadInput(f"row {number}: {name} is {len(value)} characters; the program reads at most "
                               f"{spans[name][1]}", hint=f"shorten {name} to {spans[name][1]} characters")
        out.write(line(cells))
