"""Anchors: the ledger's head, published where the host cannot rewrite it later.

The hash chain proves that no record was changed *within* the chain; a host root can still
rewrite the whole chain consistently. An anchor fixes a point of it outside the host: the
daemon logs ``(seq, hash of that record, time)`` to the journal every few minutes, the
journal ships off-host, and ``rungctl ledger verify --anchors FILE`` checks a copy of the
ledger against them: a rewritten chain has, at some anchored seq, another hash.

The journal entry (see ``rungd.service.ledger_upkeep``) carries these fields::

    RUNGD_LEDGER_ANCHOR=1
    LEDGER_SEQ=1234
    LEDGER_HEAD_HASH=<sha256 hex of record 1234's line>
    LEDGER_RECORD_TIME=<unix time the record was sealed, as written>
    LEDGER_ANCHOR_SIGNATURE=<ssh-keygen -Y sign output over anchor_message(), optional>

``read_anchors`` takes ``journalctl -o json`` output (one JSON object per line; entries
without ``RUNGD_LEDGER_ANCHOR=1`` are skipped, so an export of the whole unit works) or plain
JSON lines ``{"seq": 1234, "hash": "..."}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from rungd_ledgers.records import LineDecoder

SIGNATURE_NAMESPACE: Final = "rungd-ledger-anchor"
_HASH: Final = re.compile(r"[0-9a-f]{64}")


class Anchor(msgspec.Struct, frozen=True):
    """One published checkpoint of the chain.

    Attributes:
        seq: the anchored record's seq.
        hash: that record's hash.
        time: the record's time as published (text, so a signature over it checks), if given.
        sent: when the journal received the anchor (``__REALTIME_TIMESTAMP``), unix seconds.
        signature: the ``ssh-keygen -Y sign`` signature over ``anchor_message``, if signed.
        line: where the anchor was in the file it was read from, from 1.
    """

    seq: int
    hash: str
    time: str | None = None
    sent: float | None = None
    signature: str | None = None
    line: int = 0

    def describe(self) -> str:
        """``the anchor at line 7 (sent 2026-…)`` for a person."""
        import datetime

        when = ""
        if self.sent is not None:
            try:
                when = f", sent {datetime.datetime.fromtimestamp(self.sent).astimezone().isoformat(timespec='seconds')}"
            except (OverflowError, ValueError, OSError):  # a number no clock can show
                when = f", sent at {self.sent!r} (not a time)"
        return f"the anchor at line {self.line}{when}"


class AnchorFileError(ValueError):
    """A line of an anchors file is neither a journal entry nor an anchor."""


def anchor_message(seq: int, hash: str, time: str) -> bytes:
    """The exact bytes the daemon signs for one anchor."""
    return f"rungd ledger anchor\nseq {seq}\nhash {hash}\ntime {time}\n".encode()


def read_anchors(lines: Iterable[bytes | str]) -> list[Anchor]:
    """The anchors in a JSON-lines file, in file order.

    Raises:
        AnchorFileError: a line that is not JSON, or an anchor entry without a valid
            seq or hash; the message names the line.
    """
    anchors: list[Anchor] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        try:
            entry = _entries.decode(text)
        except msgspec.DecodeError as error:
            raise AnchorFileError(f"line {number} is not JSON ({error})") from None
        if not isinstance(entry, dict):
            raise AnchorFileError(f"line {number} is not a JSON object")
        anchor = _anchor(entry, number)
        if anchor is not None:
            anchors.append(anchor)
    return anchors


_entries: LineDecoder[Any] = LineDecoder(Any)


def _anchor(entry: dict[str, Any], number: int) -> Anchor | None:
    if "RUNGD_LEDGER_ANCHOR" in entry or "__REALTIME_TIMESTAMP" in entry or "MESSAGE" in entry:
        if _text(entry.get("RUNGD_LEDGER_ANCHOR")) != "1":
            return None  # another entry of the unit's journal
        seq, hash = _text(entry.get("LEDGER_SEQ")), _text(entry.get("LEDGER_HEAD_HASH"))
        time, signature = _text(entry.get("LEDGER_RECORD_TIME")), _text(entry.get("LEDGER_ANCHOR_SIGNATURE"))
        realtime = _text(entry.get("__REALTIME_TIMESTAMP"))
        sent = int(realtime) / 1e6 if realtime and realtime.isdigit() else None
    else:
        seq, hash = entry.get("seq"), entry.get("hash")
        time, signature, sent = _text(entry.get("time")), _text(entry.get("signature")), None
    try:
        seq_number = int(seq)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seq_number = 0
    if seq_number < 1 or not isinstance(hash, str) or not _HASH.fullmatch(hash):
        raise AnchorFileError(f"line {number} is an anchor without a valid seq and hash "
                              f"(seq {seq!r}, hash {hash!r})")
    return Anchor(seq_number, hash, time, sent, signature, number)


def _text(value: Any) -> str | None:
    """A journal field as text: ``journalctl -o json`` writes a string, a list of byte values
    for a value that is not UTF-8, or a list when the field repeats (the first is taken)."""
    if isinstance(value, list):
        if value and all(isinstance(item, int) for item in value):
            return bytes(value).decode("utf-8", "replace")
        return _text(value[0]) if value else None
    return None if value is None else str(value)
