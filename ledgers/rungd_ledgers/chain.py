"""The hash chain: how a record is sealed into a line, and how a line is checked.

A record's ``hash`` is the sha256 of its line as written, minus the ``hash`` field::

    line = {"v":1,"seq":7,...,"prev":"<hash of seq 6>","hash":"<sha256 of the part before>"}

The writer encodes the record without ``hash`` (its default is omitted), hashes those
bytes, and splices ``,"hash":"..."`` in before the closing brace. A checker hashes the
bytes on disk, never a re-encoding, so a reader that does not know a field a newer writer
added still verifies that writer's lines, and any change to a line, even whitespace, shows.
Each record's ``prev`` is the hash of the record before it, so removing or replacing a
record breaks the link that follows it.
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec

from rungd_ledgers.records import Record, encoder

GENESIS: Final = "0" * 64

_HASH_FIELD: Final = b',"hash":"'
_LINE_END: Final = b'"}'
# A sealed line, newline excluded, ends with these many bytes: hash field, digest, brace.
_TAIL: Final = len(_HASH_FIELD) + 64 + len(_LINE_END)
_DIGEST: Final = slice(-64 - len(_LINE_END), -len(_LINE_END))


def seal(draft: Record, *, seq: int, prev: str, time: float) -> tuple[Record, bytes]:
    """Give a draft its place in the chain.

    Returns:
        The sealed record and its line, newline included, ready to append.
    """
    unsealed = msgspec.structs.replace(draft, seq=seq, prev=prev, time=time, hash="")
    body = encoder.encode(unsealed)
    digest = hashlib.sha256(body).hexdigest()
    line = b"".join((body[:-1], _HASH_FIELD, digest.encode(), _LINE_END, b"\n"))
    return msgspec.structs.replace(unsealed, hash=digest), line


def line_is_intact(line: bytes) -> bool:
    """Whether a line, without its newline, still hashes to the hash it carries."""
    if len(line) <= _TAIL or not line.endswith(_LINE_END) or line[-_TAIL:_DIGEST.start] != _HASH_FIELD:
        return False
    body = line[:-_TAIL] + b"}"
    return hashlib.sha256(body).hexdigest().encode() == line[_DIGEST]
