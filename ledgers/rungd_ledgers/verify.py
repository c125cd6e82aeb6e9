"""Checking a ledger end to end: what ``rungctl ledger verify`` runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec

from rungd_ledgers.chain import GENESIS, line_is_intact
from rungd_ledgers.files import ledger_files
from rungd_ledgers.records import decoder

ProblemKind = Literal["edited", "broken_link", "gap", "torn_last_line", "unparseable"]


class Problem(msgspec.Struct, frozen=True):
    """The first thing wrong with a ledger.

    Attributes:
        kind: ``unparseable`` (not a record), ``edited`` (the line does not hash to its
            ``hash``), ``gap`` (a seq is missing or repeated), ``broken_link`` (``prev`` is
            not the hash of the record before), ``torn_last_line`` (bytes with no newline
            after them, left by a crash).
        file: name of the ledger file.
        line: line number in that file, from 1.
        seq: the seq the line claims, ``None`` when it cannot be read.
        explanation: one line for a person.
    """

    kind: ProblemKind
    file: str
    line: int
    seq: int | None
    explanation: str


class VerifyReport(msgspec.Struct, frozen=True):
    """What ``verify`` found.

    Attributes:
        records: records checked and found good, up to the first problem.
        last_seq: seq of the last good record.
        problem: the first problem, ``None`` for a sound ledger.
    """

    records: int
    last_seq: int
    problem: Problem | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify(folder: str | os.PathLike[str]) -> VerifyReport:
    """Check every record of every file: parse, hash, seq and link to the record before.

    Stops at the first problem. On a ledger that is being written, the batch in flight can
    look like a torn last line; run it again if that is all it reports.

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    files = ledger_files(Path(folder))
    chain = _Chain()
    for path in files:
        with open(path, "rb") as file:
            for number, raw in enumerate(file, start=1):
                found = chain.check(raw, last_file=path == files[-1])
                if found is not None:
                    kind, seq, explanation = found
                    problem = Problem(kind, path.name, number, seq, explanation)
                    return VerifyReport(chain.seq, chain.seq, problem)
    return VerifyReport(chain.seq, chain.seq)


class _Chain:
    """The seq and hash of the last good record, and the check of the line after it."""

    def __init__(self) -> None:
        self.seq = 0
        self.prev = GENESIS

    def check(self, raw: bytes, *, last_file: bool) -> tuple[ProblemKind, int | None, str] | None:
        """Check one line, newline included; if it is good, make it the last good record."""
        if not raw.endswith(b"\n"):
            where = "" if last_file else " of a file that is not the last one"
            return (
                "torn_last_line",
                None,
                f"the last line{where} has no newline: a write cut short by a crash, "
                "which opening the ledger moves aside",
            )
        line = raw[:-1]
        try:
            record = decoder.decode(line)
        except msgspec.DecodeError as error:
            return "unparseable", None, f"not a ledger record: {error}"
        if not line_is_intact(line):
            changed = "the line does not hash to its hash field: it changed after being written"
            return "edited", record.seq, changed
        if record.seq > self.seq + 1:
            first, last = self.seq + 1, record.seq - 1
            missing = f"seq {first} is" if first == last else f"seq {first} to {last} are"
            return "gap", record.seq, f"{missing} missing"
        if record.seq <= self.seq:
            return "gap", record.seq, f"seq {record.seq} repeats or goes back: expected {self.seq + 1}"
        if record.prev != self.prev:
            replaced = f"prev is not the hash of seq {self.seq}: a record before this one was replaced"
            return "broken_link", record.seq, replaced
        self.seq, self.prev = record.seq, record.hash
        return None
