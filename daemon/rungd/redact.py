"""Redaction of credential values from everything that leaves a call.

A credential the daemon hands to a child may come back in its output (an echoed password,
a URL with a token in it, an ``Authorization: Basic`` header). Every byte of output passes
through a ``Redactor`` before it is kept, written as evidence, quoted in an error or
returned.

A secret is looked for in every encoding a reader could decode back to it: as is,
JSON-escaped, percent-encoded, hex, and base64. Base64 is the subtle one: it encodes three
bytes as four characters, so a secret behind other bytes (``user:`` in Basic auth) shows up
as a run of characters that depends on where it starts, cut from a longer encoded token.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

MARK = b"[REDACTED]"
# Secrets shorter than this are not redacted: they would redact ordinary text and protect
# nothing. A base64 match is held to the same bar: see ``_Run``.
SHORTEST = 4
# What a base64 token is made of, in either alphabet, with the '\' of a JSON-escaped '/'.
_TOKEN = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_\\"
_STANDARD = _TOKEN[:64]
_URLSAFE = _TOKEN[:62] + b"-_"
# A stream holds back a base64 token still being printed, up to this many bytes before the
# cut, because a secret found later in it redacts all of it. The bytes of a longer token
# beyond this reach carry none of the secret's bits, so releasing them gives nothing away.
_REACH = 4096
# Each byte as 't' if base64 tokens are made of it, else '.': a token's ends are then found
# by one find in C, a window at a time, so finding one costs its length, not the output's.
_KINDS = bytes(ord("t") if byte in _TOKEN else ord(".") for byte in range(256))
_WINDOW = 4096
_ALNUM = frozenset(_STANDARD[:62])  # what no URL encoder escapes: see ``_Percent``


class _Run(NamedTuple):
    """The base64 characters a secret alone decides, for one alignment and alphabet.

    A secret starting 0, 1 or 2 bytes into the encoded data is spread over characters that
    each hold six bits: those wholly inside the secret form ``chars``; the one on each side
    that holds some of the secret's bits and some of a neighbour's may be any of the
    characters in ``before`` (``after``) that agree on the secret's bits (empty when the
    secret starts, or ends, on a character boundary).

    A match is checked on both: then it pins every bit of the secret, as a plain match
    does, and is no likelier by chance, so the same ``SHORTEST`` applies. The run alone
    would not do: a 4-byte secret behind one byte leaves a 4-character run, 24 bits, which
    random base64 (a key, an image in an export) holds once in 16 million characters.
    """

    chars: bytes
    before: bytes
    after: bytes


def _base64_runs(raw: bytes) -> set[_Run]:
    """``raw``'s runs at the three alignments, in both alphabets, and with '/' JSON-escaped."""
    runs = set()
    for skip in range(3):
        start, end = 8 * skip, 8 * (skip + len(raw))  # the secret's bits in the encoded data
        first, last = -(-start // 6), end // 6  # the characters wholly inside them
        # Zero bytes stand for the unknown neighbours, and fill the last group: no '=' pads.
        padded = bytes(skip) + raw + bytes(-(skip + len(raw)) % 3)
        values = [_STANDARD.index(char) for char in base64.b64encode(padded)]
        lead_bits, tail_bits = 6 * first - start, end - 6 * last
        lead = [value for value in range(64)
                if first and value % (1 << lead_bits) == values[first - 1] % (1 << lead_bits)]
        tail = [value for value in range(64)
                if tail_bits and value >> (6 - tail_bits) == values[last] >> (6 - tail_bits)]
        for alphabet in (_STANDARD, _URLSAFE):
            run = _Run(bytes(alphabet[value] for value in values[first:last]),
                       bytes(alphabet[value] for value in lead), bytes(alphabet[value] for value in tail))
            runs |= {run, run._replace(chars=run.chars.replace(b"/", b"\\/"))}
    return runs


class _Percent(NamedTuple):
    """A secret percent-encoded, however an encoder chose to print it.

    Encoders differ on which punctuation they escape (``quote`` keeps '/' and '~',
    JavaScript's ``encodeURIComponent`` keeps ``!'()*``, ``quote_plus`` prints a space as
    '+') and on the case of the hex digits, so no one string covers them: ``pattern`` takes
    any mix. They agree on the rest: letters and digits are never escaped (RFC 3986 says
    they should not be), other bytes always are. The longest run of those, as it reads in
    lowered output, is the ``anchor``, found with a plain search first, because the pattern
    (an alternative at each byte) is slow: it runs only from ``before`` bytes ahead of an
    anchor to ``after`` bytes past it. A secret all punctuation has no anchor; the pattern
    then runs over the whole output.
    """

    pattern: re.Pattern[bytes]
    anchor: bytes
    before: int
    after: int


def _percent(raw: bytes) -> _Percent | None:
    """``raw``'s percent-encoded forms; None when every one of them is ``raw`` itself."""
    if all(byte in _ALNUM for byte in raw):
        return None
    parts, fixed = [], []  # fixed: a byte's one form, lowered, or None for punctuation
    for byte in raw:
        escape = b"%%%02x" % byte
        if byte in _ALNUM:
            parts.append(bytes([byte]))
            fixed.append(bytes([byte]).lower())
        elif 0x20 <= byte < 0x7F:
            options = [b"(?i:" + escape + b")", re.escape(bytes([byte]))]
            if byte == ord(" "):
                options.append(rb"\+")
            elif byte == ord("/"):
                options.append(rb"\\/")  # then printed inside JSON by PHP's json_encode
            parts.append(b"(?:" + b"|".join(options) + b")")
            fixed.append(None)
        else:
            parts.append(b"(?i:" + escape + b")")
            fixed.append(escape)
    runs, at = [], 0
    for is_fixed, group in itertools.groupby(fixed, key=lambda form: form is not None):
        forms = list(group)
        if is_fixed:
            runs.append((b"".join(forms), at, at + len(forms)))
        at += len(forms)
    anchor, start, end = max(runs, key=lambda run: len(run[0]), default=(b"", 0, 0))
    return _Percent(re.compile(b"".join(parts)), anchor, 3 * start, 3 * (len(raw) - end))


def _percent_spans(data: bytes, lowered: bytes, form: _Percent) -> list[tuple[int, int]]:
    """Where ``data`` (``lowered``: the same, lowered) holds ``form``."""
    if not form.anchor:
        return [match.span() for match in form.pattern.finditer(data)]
    return [match.span() for hit, end in _find_all(lowered, form.anchor)
            for match in form.pattern.finditer(data, max(0, hit - form.before), end + form.after)]


class _Secret:
    """One secret and the forms it is looked for in."""

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        self.literals = {raw, raw.replace(b" ", b"+")}  # '+' for space: quote_plus
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            pass  # not text: no JSON string holds it as such
        else:  # Python's json.dumps escapes non-ASCII by default
            self.literals |= {json.dumps(text)[1:-1].encode(), json.dumps(text, ensure_ascii=False)[1:-1].encode()}
        self.literals |= {form.replace(b"/", b"\\/") for form in self.literals}  # PHP's json_encode
        self.hex = raw.hex().encode()  # looked for in the lowered output: any case matches
        self.percent = _percent(raw)
        self.runs = _base64_runs(raw)
        # The most bytes one match can span: a stream holds back that many.
        self.longest = max(max(map(len, self.literals)), 3 * len(raw),
                           max(len(run.chars) for run in self.runs) + 3)  # the sides, one '\/'


def redact_fields(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (a result's fields: dicts, lists, strings...) with every secret in any string
    replaced by the mark: what a parser decoded from an escaped form is plain again."""
    chosen = [secret for secret in secrets if len(secret) >= SHORTEST]
    if not chosen:
        return value
    redactor = Redactor(chosen)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return redactor.text(item)
        if isinstance(item, dict):
            return {walk(key) if isinstance(key, str) else key: walk(inner) for key, inner in item.items()}
        if isinstance(item, (list, tuple)):
            return type(item)(walk(inner) for inner in item)
        return item

    return walk(value)


class Redactor:
    """Replaces known secret values, in any of their encodings, in a stream of bytes,
    across chunk boundaries.

    ``feed`` holds back the end of each chunk, because a secret may start in one chunk and
    end in the next: as many bytes as the longest form of a secret, and a base64 token
    still running at that point from its start (up to ``_REACH``), because a secret found
    later in it redacts all of it. ``flush`` releases what is held at the end.
    """

    def __init__(self, secrets: Iterable[str | bytes] = ()) -> None:
        self._secrets: dict[bytes, _Secret] = {}
        self._keep = 0
        self._held = b""  # as printed: it is redacted together with what follows it
        self._before: int | None = None  # the last byte released, as printed
        self._open = False  # what was released ended inside a redacted base64 token
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | bytes) -> None:
        """Redact ``secret`` from now on, in each of its encodings."""
        raw = secret.encode() if isinstance(secret, str) else secret
        if len(raw) >= SHORTEST and raw not in self._secrets:
            self._secrets[raw] = _Secret(secret)
            self._keep = max(self._keep, self._secrets[raw].longest)

    @property
    def active(self) -> bool:
        return bool(self._secrets)

    def text(self, value: str) -> str:
        """Redact a whole string at once."""
        return self.bytes(value.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")

    def bytes(self, value: bytes) -> bytes:
        if not self._secrets:
            return value
        return _replaced(value, self._spans(value), len(value))

    def char_spans(self, value: str) -> list[tuple[int, int]]:
        """Where ``value`` holds a secret in any form, as character offsets: for masking what
        is not a stream of bytes (a screen, cell by cell)."""
        if not self._secrets:
            return []
        data = value.encode("utf-8", "surrogateescape")
        ends = [0]  # ends[i]: the byte offset at which character i starts
        for char in value:
            ends.append(ends[-1] + len(char.encode("utf-8", "surrogateescape")))
        return [(bisect.bisect_right(ends, start) - 1, bisect.bisect_left(ends, end))
                for start, end in self._spans(data)]

    def feed(self, chunk: bytes) -> bytes:
        """Redact the next chunk of a stream; returns what is safe to release now."""
        if not self._secrets:
            return chunk
        data, self._held = self._held + chunk, b""
        lead = _token_end(data, 0) if self._open else 0
        spans = self._spans(data, lead, self._before)
        cut = len(data) - self._keep  # a match not yet complete starts after this
        floor = max(0, cut - max(_REACH, self._keep))
        if cut > 0 and data[cut] in _TOKEN:
            cut = _token_start(data, cut, floor)
        for start, end in spans:
            if start < cut < end:  # a match that may yet grow: its base64 token goes on
                cut = max(start, floor)
        if cut <= 0:
            self._held = data
            return b""
        self._held, self._before = data[cut:], data[cut - 1]
        self._open = any(start < cut < end for start, end in spans)
        return _replaced(data, spans, cut, quiet_start=lead > 0)

    def flush(self) -> bytes:
        data, self._held = self._held, b""
        lead = _token_end(data, 0) if self._open else 0
        spans = self._spans(data, lead, self._before)
        self._before, self._open = None, False
        return _replaced(data, spans, len(data), quiet_start=lead > 0)

    def _spans(self, data: bytes, lead: int = 0, before: int | None = None) -> list[tuple[int, int]]:
        """Where ``data`` holds a secret in any form: sorted, overlaps joined.

        Args:
            lead: this many bytes at the start continue a base64 token already redacted.
            before: the byte printed just before ``data``, if any: a base64 run at the very
                start is checked against it.
        """
        found = [(0, lead)] if lead else []
        lowered = data.lower()
        escapes = b"%" in data
        for secret in self._secrets.values():
            for literal in secret.literals:
                found += _find_all(data, literal)
            found += _find_all(lowered, secret.hex)
            if secret.percent and escapes:
                found += _percent_spans(data, lowered, secret.percent)
            for run in secret.runs:
                found += _run_tokens(data, run, before)
        found.sort()
        joined: list[tuple[int, int]] = []
        for start, end in found:
            if joined and start < joined[-1][1]:
                joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
            else:
                joined.append((start, end))
        return joined


def _find_all(data: bytes, needle: bytes) -> list[tuple[int, int]]:
    """Where ``needle`` is in ``data``, left to right, as ``bytes.replace`` would find it."""
    spans = []
    at = data.find(needle)
    while at != -1:
        spans.append((at, at + len(needle)))
        at = data.find(needle, at + len(needle))
    return spans


def _run_tokens(data: bytes, run: _Run, first: int | None) -> list[tuple[int, int]]:
    """The whole base64 tokens holding ``run`` with sides that fit it.

    The whole token, not the run: the characters beside the run carry some of the secret's
    bits. A side cut off by the start or end of what was printed counts as fitting, since a
    truncated token still gives the run away; ``first`` is the byte printed before ``data``.
    """
    spans = []
    at = data.find(run.chars)
    while at != -1:
        end = at + len(run.chars)
        before = data[at - 1] if at else first
        after = data[end] if end < len(data) else None
        if after == ord("\\"):  # a JSON-escaped '/'
            after = data[end + 1] if end + 1 < len(data) else None
        if (not run.before or before is None or before in run.before) and (
                not run.after or after is None or after in run.after):
            spans.append((_token_start(data, at), _token_end(data, end)))
            at = data.find(run.chars, spans[-1][1])  # one search per token, however long
        else:
            at = data.find(run.chars, at + 1)
    return spans


def _token_start(data: bytes, at: int, lowest: int = 0) -> int:
    """Where the base64 token going on at ``at`` starts, or ``lowest`` if before it."""
    while at > lowest:
        window = data[max(lowest, at - _WINDOW):at].translate(_KINDS)
        other = window.rfind(b".")
        if other != -1:
            return at - len(window) + other + 1
        at -= len(window)
    return at


def _token_end(data: bytes, at: int) -> int:
    """Where the base64 token going on at ``at`` ends, its '=' padding included."""
    while at < len(data):
        window = data[at:at + _WINDOW].translate(_KINDS)
        other = window.find(b".")
        if other != -1:
            at += other
            break
        at += len(window)
    return at + len(data[at:at + 2]) - len(data[at:at + 2].lstrip(b"="))


def _replaced(data: bytes, spans: list[tuple[int, int]], upto: int, quiet_start: bool = False) -> bytes:
    """``data[:upto]`` with each span replaced by the mark; with ``quiet_start``, a span at
    the very start by nothing, as it continues one whose mark was already released."""
    out, at = [], 0
    for start, end in spans:
        if start >= upto:
            break
        out += [data[at:start], b"" if quiet_start and start == 0 else MARK]
        at = min(end, upto)
    out.append(data[at:upto])
    return b"".join(out)
