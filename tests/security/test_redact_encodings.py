"""A credential printed encoded is redacted as surely as a plain one: base64 wherever it
starts inside a longer token (Basic auth encodes ``user:secret``), hex in either case,
percent-encoded however an encoder chose to escape it; in a whole string and in a stream
cut anywhere."""

from __future__ import annotations

import base64
import random
import re
import string
import urllib.parse
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from rungd.redact import MARK, Redactor

# How programs print bytes, each as a reader decodes it back.
ENCODINGS: dict[str, Callable[[bytes], bytes]] = {
    "base64": base64.b64encode,
    "base64 unpadded": lambda raw: base64.b64encode(raw).rstrip(b"="),
    "urlsafe base64": base64.urlsafe_b64encode,
    "urlsafe base64 unpadded": lambda raw: base64.urlsafe_b64encode(raw).rstrip(b"="),
    "base64 in PHP's JSON": lambda raw: base64.b64encode(raw).replace(b"/", b"\\/"),
    "hex": lambda raw: raw.hex().encode(),
    "HEX": lambda raw: raw.hex().upper().encode(),
    "quote": lambda raw: urllib.parse.quote(raw, safe="").encode(),
    "quote keeping '/'": lambda raw: urllib.parse.quote(raw).encode(),
    "quote_plus": lambda raw: urllib.parse.quote_plus(raw).encode(),
    "quote, hex digits in mixed case": lambda raw: re.sub(
        "%..", lambda escape: escape[0].lower() if escape.start() % 2 else escape[0],
        urllib.parse.quote(raw, safe="")).encode(),
}

BASE64_TOKEN = re.compile(rb"[A-Za-z0-9+/_-]+")
HEX_TOKEN = re.compile(rb"[0-9A-Fa-f]+")


def recoverable(output: bytes, raw: bytes) -> list[str]:
    """How a reader could still get ``raw`` back from ``output``: plain, percent-decoded, or
    decoded from any base64 or hex token left in it, read from any starting character."""
    ways = []
    if raw in output:
        ways.append("plain")
    if raw in urllib.parse.unquote_to_bytes(output) or raw in urllib.parse.unquote_to_bytes(
            output.replace(b"+", b" ")):
        ways.append("percent")
    for token in BASE64_TOKEN.findall(output.replace(b"\\/", b"/")):
        token = token.replace(b"-", b"+").replace(b"_", b"/")
        for skip in range(4):
            part = token[skip:]
            part = part[: len(part) - (len(part) % 4 == 1)]  # a lone last character holds no byte
            if raw in base64.b64decode(part + b"=" * (-len(part) % 4)):
                ways.append(f"base64 from character {skip}")
    for token in HEX_TOKEN.findall(output):
        for skip in range(2):
            part = token[skip:]
            if raw in bytes.fromhex(part[: len(part) // 2 * 2].decode()):
                ways.append(f"hex from digit {skip}")
    return ways


def streamed(redactor: Redactor, data: bytes, cuts: list[int]) -> bytes:
    """``data`` through ``redactor`` as a stream, in chunks that end at ``cuts``."""
    bounds = [0, *sorted(cut % (len(data) + 1) for cut in cuts), len(data)]
    out = b"".join(redactor.feed(data[start:end]) for start, end in zip(bounds, bounds[1:], strict=False))
    return out + redactor.flush()


SECRETS = st.one_of(st.text(alphabet=string.printable, min_size=4, max_size=64),
                    st.text(min_size=4, max_size=64))
# Around it: text that may run on into the encoded token (base64 and hex characters), or not.
TEXT = st.one_of(st.text(alphabet=string.printable, max_size=30), st.text(max_size=30))


@settings(max_examples=600, deadline=None)
@given(secret=SECRETS, encoding=st.sampled_from(sorted(ENCODINGS)),
       prefix=st.binary(max_size=5), suffix=st.binary(max_size=5),
       before=TEXT, after=TEXT, cuts=st.lists(st.integers(0, 500), max_size=6))
def test_no_encoding_of_a_secret_survives_redaction_wherever_it_starts(
        secret, encoding, prefix, suffix, before, after, cuts) -> None:
    # The secret's bytes start 0 to 5 bytes into what is encoded, as in "user:secret".
    raw = secret.encode()
    data = before.encode() + ENCODINGS[encoding](prefix + raw + suffix) + after.encode()
    whole = Redactor([secret]).bytes(data)
    assert recoverable(whole, raw) == [], whole
    # Cut anywhere, a stream keeps back what it must and redacts the same.
    assert streamed(Redactor([secret]), data, cuts) == whole


def test_basic_auth_is_redacted_whole_whatever_the_user_name() -> None:
    secret = "s3cr3t-Pa55"
    # User names of every length modulo 3 put the password at each base64 alignment.
    for user in ("", "a", "ab", "abc", "user", "admin", "deploy@example.org"):
        header = b"Authorization: Basic " + base64.b64encode(f"{user}:{secret}".encode())
        assert Redactor([secret]).bytes(header + b"\r\n") == b"Authorization: Basic [REDACTED]\r\n", user


def test_hex_of_a_secret_is_redacted_in_either_case() -> None:
    secret = "k3y?<>ok"
    for printed in ("6b33793f3c3e6f6b", "6B33793F3C3E6F6B", "6B33793f3C3e6F6b"):
        assert Redactor([secret]).bytes(f"key={printed};".encode()) == b"key=[REDACTED];", printed


def test_percent_encoding_is_redacted_however_the_encoder_escaped_it() -> None:
    secret = "p@ss/w rd!(x)~"
    printed = [urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret), urllib.parse.quote_plus(secret),
               "p%40ss%2fw%20rd!(x)~",  # lowercase hex digits, and what encodeURIComponent keeps
               "p%40ss%2Fw+rd%21%28x%29%7e"]
    for form in printed:
        assert Redactor([secret]).bytes(f"GET /?pw={form} HTTP/1.1".encode()) == b"GET /?pw=[REDACTED] HTTP/1.1", form


def test_a_base64_match_agrees_with_the_secret_on_every_bit() -> None:
    # A 4-byte secret behind "abc:" leaves only 4 characters wholly its own (6 to 9); the
    # characters on either side are checked too, so a match pins all 32 bits, as a plain
    # match does.
    secret = "pa5$"
    token = base64.b64encode(b"abc:" + secret.encode() + b"!")
    assert Redactor([secret]).bytes(b"x " + token + b" y") == b"x " + MARK + b" y"
    # The same run beside a character that disagrees with the secret's first bits is not it.
    alphabet = (string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/").encode()
    wrong = bytearray(token)
    wrong[5] = alphabet[alphabet.index(wrong[5]) ^ 1]
    assert recoverable(bytes(wrong), secret.encode()) == []
    assert Redactor([secret]).bytes(bytes(wrong)) == bytes(wrong)
    # Random base64 (a key, an image in an export) is left alone by short secrets.
    blob = base64.b64encode(random.Random(27).randbytes(96_000))
    assert Redactor(["pa5$", "abcd", "1234", "ŝeĉ"]).bytes(blob) == blob


def test_a_stream_redacts_a_long_token_holding_a_secret_to_its_end() -> None:
    secret = "correct horse battery"
    token = base64.b64encode(random.Random(1).randbytes(30_000) + secret.encode() + random.Random(2).randbytes(30_000))
    data = b"export: " + token + b"\nnext line\n"
    redactor = Redactor([secret])
    out = b""
    for start in range(0, len(data), 1000):
        out += redactor.feed(data[start:start + 1000])
        if MARK not in out:  # what is held back stays bounded, however long the token runs
            assert start + 1000 - len(out) < 10_000
    out += redactor.flush()
    assert recoverable(out, secret.encode()) == []
    # The token is cut where the stream could no longer hold it, and redacted from there to its end.
    assert out.endswith(MARK + b"\nnext line\n") and out.count(MARK) == 1
    assert token[len(token) // 2:] not in out
