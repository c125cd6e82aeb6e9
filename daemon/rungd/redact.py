"""Redaction of credential values from everything that leaves a call.

A credential the daemon hands to a child may come back in its output (an echoed password,
a URL with a token in it). Every byte of output passes through a ``Redactor`` before it
is kept, written as evidence, quoted in an error or returned.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterable
from typing import Any

MARK = b"[REDACTED]"


def forms(secret: str) -> set[str]:
    """A secret as programs print it: as is, JSON-escaped (PHP's json_encode escapes '/',
    Python's json.dumps non-ASCII), percent-encoded, base64. A parser decodes each of them
    back to the secret, so the output is redacted in every form, not only the plain one."""
    found = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
             urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    found |= {form.replace("/", "\\/") for form in list(found)}
    raw = secret.encode()
    for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
        found |= {encoded, encoded.rstrip("=")}
    return found


def redact_fields(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (a result's fields: dicts, lists, strings...) with every secret in any string
    replaced by the mark: what a parser decoded from an escaped form is plain again."""
    chosen = [secret for secret in secrets if len(secret) >= 4]
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
    """Replaces known secret values in a stream of bytes, across chunk boundaries.

    ``feed`` holds back the last ``longest - 1`` bytes of each chunk, because a secret may
    start in one chunk and end in the next; ``flush`` releases them at the end.
    """

    def __init__(self, secrets: Iterable[str | bytes] = ()) -> None:
        self._secrets: list[bytes] = []
        self._held = b""
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | bytes) -> None:
        """Redact ``secret`` from now on; a text secret in each of its printed ``forms`` too."""
        for form in forms(secret) if isinstance(secret, str) else (secret,):
            value = form.encode() if isinstance(form, str) else form
            # Very short values would redact ordinary text and protect nothing.
            if len(value) >= 4 and value not in self._secrets:
                self._secrets.append(value)
        self._secrets.sort(key=len, reverse=True)

    @property
    def active(self) -> bool:
        return bool(self._secrets)

    def text(self, value: str) -> str:
        """Redact a whole string at once."""
        return self.bytes(value.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")

    def bytes(self, value: bytes) -> bytes:
        for secret in self._secrets:
            value = value.replace(secret, MARK)
        return value

    def feed(self, chunk: bytes) -> bytes:
        """Redact the next chunk of a stream; returns what is safe to release now."""
        if not self._secrets:
            return chunk
        data = self.bytes(self._held + chunk)
        keep = len(self._secrets[0]) - 1
        if keep <= 0 or len(data) <= keep:
            self._held = data if keep > 0 else b""
            return b"" if keep > 0 else data
        self._held = data[-keep:]
        return data[:-keep]

    def flush(self) -> bytes:
        held, self._held = self.bytes(self._held), b""
        return held
