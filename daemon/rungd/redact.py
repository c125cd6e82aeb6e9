"""Redaction of credential values from everything that leaves a call.

A credential the daemon hands to a child may come back in its output (an echoed password,
a URL with a token in it). Every byte of output passes through a ``Redactor`` before it
is kept, written as evidence, quoted in an error or returned.
"""

from __future__ import annotations

from collections.abc import Iterable

MARK = b"[REDACTED]"


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
        value = secret.encode() if isinstance(secret, str) else secret
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
