"""Checking a ledger end to end: what ``rungctl ledger verify`` runs.

Three things are proved: every line is a record that hashes to its hash and links to the
one before (from seq 1, or from where retention pruned the ledger: then a ``pruned`` record
in the files left must name the file that ended just before, with the hash the first record
left links to); and, given anchors published off-host, that the chain agrees with each.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec

from rungd_ledgers.anchors import Anchor
from rungd_ledgers.chain import GENESIS, line_is_intact
from rungd_ledgers.files import MAX_LINE_BYTES, bounded_lines, ledger_files
from rungd_ledgers.records import PrunedFile, Record, decoder

ProblemKind = Literal["edited", "broken_link", "gap", "torn_last_line", "unparseable", "unvouched_start",
                      "contradicts_anchor", "anchor_beyond_end"]


class Problem(msgspec.Struct, frozen=True):
    """The first thing wrong with a ledger.

    Attributes:
        kind: ``unparseable`` (not a record), ``edited`` (the line does not hash to its
            ``hash``), ``gap`` (a seq is missing or repeated), ``broken_link`` (``prev`` is
            not the hash of the record before), ``torn_last_line`` (bytes with no newline
            after them, left by a crash), ``unvouched_start`` (the first file starts after
            seq 1 and no ``pruned`` record names the files before it),
            ``contradicts_anchor`` (an anchor names another hash for this seq: the chain
            was rewritten), ``anchor_beyond_end`` (an anchor names a seq past the end:
            records were cut off, or the copy is older than the anchor).
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
        first_seq: seq of the first record in the files (1 unless files were pruned; 0
            for an empty ledger).
        pruned: the files the ``pruned`` records in the ledger name, oldest first.
        anchors_checked: anchors whose seq is in the files (or ends a pruned file), checked.
        anchors_pruned: anchors inside pruned files, which nothing left can check.
    """

    records: int
    last_seq: int
    problem: Problem | None = None
    first_seq: int = 0
    pruned: list[PrunedFile] = []
    anchors_checked: int = 0
    anchors_pruned: int = 0

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify(folder: str | os.PathLike[str], anchors: Iterable[Anchor] = ()) -> VerifyReport:
    """Check every record of every file: parse, hash, seq and link to the record before;
    then that a pruned start is vouched for, and that the chain agrees with ``anchors``.

    Stops at the first problem. On a ledger that is being written, the batch in flight can
    look like a torn last line; run it again if that is all it reports. Anchors inside the
    files are checked as their records are read; anchors at the end of a pruned file, once
    every ``pruned`` record has been read.

    Args:
        anchors: published checkpoints (``rungd_ledgers.anchors``).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    files = ledger_files(Path(folder))
    anchored: dict[int, list[Anchor]] = {}
    for anchor in anchors:
        anchored.setdefault(anchor.seq, []).append(anchor)
    chain = _Chain()
    checked = 0
    start: tuple[int, str, str] | None = None  # (seq before the first record, its prev, file name)
    ends: dict[int, str] = {}  # last seq -> last hash of each pruned file a record names
    pruned: list[PrunedFile] = []
    vouched = 0  # the seq of the last record an anchor agreed with

    def report(problem: Problem | None = None, *, unsound: int = 0) -> VerifyReport:
        """``unsound``: records the problem takes back (an anchor that contradicts the chain
        leaves sound only what an earlier anchor vouched for)."""
        first = 0 if chain.records == 0 and start is None else (start[0] + 1 if start else 1)
        return VerifyReport(chain.records - unsound, chain.seq - unsound, problem, first, pruned, checked,
                            sum(len(found) for seq, found in anchored.items() if seq < first and seq not in ends))

    for path in files:
        with open(path, "rb") as file:
            for number, raw in enumerate(bounded_lines(file), start=1):
                if chain.records == 0 and start is None:
                    start = chain.begin(raw, path.name)
                found = chain.check(raw, last_file=path == files[-1])
                if found is not None:
                    kind, seq, explanation = found
                    return report(Problem(kind, path.name, number, seq, explanation))
                record = chain.record
                if record.event == "pruned":
                    pruned.extend(record.pruned)
                    ends.update((item.last_seq, item.last_hash) for item in record.pruned)
                for anchor in anchored.get(record.seq, ()):
                    checked += 1
                    if anchor.hash != record.hash:
                        # Rewritten at or before this seq: sound is what the last anchor that
                        # agreed vouches for, none of what came after it.
                        return report(Problem("contradicts_anchor", path.name, number, record.seq,
                                              _contradiction(anchor, record.hash)),
                                      unsound=record.seq - max(vouched, (start[0] if start else 0)))
                    vouched = record.seq
    if start is not None:
        before, prev, name = start
        if ends.get(before) != prev:
            said = f" (the pruned record says its hash was {ends[before][:16]}…)" if before in ends else ""
            return report(Problem(
                "unvouched_start", name, 1, before + 1,
                f"the ledger starts at seq {before + 1}, and no pruned record names the file that ended at seq "
                f"{before} with hash {prev[:16]}…{said}: files were removed outside rungd, or this copy is partial"))
        for seq in sorted(s for s in anchored if s <= before and s in ends):
            for anchor in anchored[seq]:
                checked += 1
                if anchor.hash != ends[seq]:
                    return report(Problem("contradicts_anchor", name, 1, seq, _contradiction(anchor, ends[seq])
                                          + " (in a pruned file, as its pruned record names it)"),
                                  unsound=chain.records)  # the chain this copy starts from is the one contradicted
    beyond = sorted(seq for seq in anchored if seq > chain.seq)
    if beyond:
        anchor = anchored[beyond[0]][0]
        where = files[-1].name if files else "(no files)"
        return report(Problem(
            "anchor_beyond_end", where, 0, anchor.seq,
            f"{anchor.describe()} says seq {anchor.seq} existed, but this copy ends at seq {chain.seq}: records "
            "were cut off the end, or the copy is older than that anchor (export anchors only up to the copy's "
            "time: journalctl --until)"))
    return report()


def _contradiction(anchor: Anchor, found: str) -> str:
    return (f"{anchor.describe()} says seq {anchor.seq} had hash {anchor.hash[:16]}…, this copy has "
            f"{found[:16]}…: the chain was rewritten at or before seq {anchor.seq}")


class _Chain:
    """The seq and hash of the last good record, and the check of the line after it."""

    def __init__(self) -> None:
        self.seq = 0
        self.prev = GENESIS
        self.records = 0
        self.record: Record | None = None

    def begin(self, raw: bytes | None, name: str) -> tuple[int, str, str] | None:
        """Start the chain at the first line: at seq 1, or where pruning left it.

        Returns:
            ``(seq before, prev, file name)`` when the first record is past seq 1, so
            ``verify`` can look for the ``pruned`` record that vouches for the start.
        """
        if raw is None:
            return None  # check() reports it
        try:
            first = decoder.decode(raw.rstrip(b"\n"))
        except msgspec.DecodeError:
            return None  # check() reports it
        if first.seq <= 1:
            return None
        self.seq, self.prev = first.seq - 1, first.prev
        return first.seq - 1, first.prev, name

    def check(self, raw: bytes | None, *, last_file: bool) -> tuple[ProblemKind, int | None, str] | None:
        """Check one line, newline included (``None``: one too long to be read, see
        ``bounded_lines``); if it is good, make it the last good record."""
        if raw is None:
            return ("unparseable", None, f"not a ledger record: a line of more than {MAX_LINE_BYTES} bytes, "
                    "longer than any record rungd writes (damage, or written by something else)")
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
        self.records += 1
        self.record = record
        return None
