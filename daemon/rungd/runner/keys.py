"""The bytes a named key sends on a terminal of a given type, from the host's terminfo.

A screen program reads keys as the terminal sends them, and knows what each one looks like
from the same terminfo entry its ``TERM`` names: in keypad mode Down is ``ESC O B`` on xterm,
and a hand-written ``ESC [ B`` can read as a lone Escape (which closes a dialog). So named keys
are looked up in the host's terminfo (``infocmp``, run once per terminal type), never spelled
out here; only keys no terminfo entry describes (Enter, Tab, Escape, Space, Ctrl-letter) are
fixed, as every terminal sends them.

The cursor keys (and Home, End) are the one place a terminal's own state matters: terminfo
gives them in application mode (``smkx``, which curses sends when it turns the keypad on);
until a program turns that on, a terminal sends them in normal mode, ``ESC [`` instead of
``ESC O``. :meth:`Key.sent` picks the form the program asked for.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess

from rungd.runner.environment import DEFAULT_PATH
from rungd.system import trust

# Named keys and the terminfo capability each one is.
_CAPABILITIES = {
    "Up": "kcuu1", "Down": "kcud1", "Left": "kcub1", "Right": "kcuf1", "Home": "khome", "End": "kend",
    "PageUp": "kpp", "PageDown": "knp", "Insert": "kich1", "Delete": "kdch1", "Backspace": "kbs",
    "BackTab": "kcbt", **{f"F{n}": f"kf{n}" for n in range(1, 13)},
}
# Keys every terminal sends the same way.
_FIXED = {"Enter": b"\r", "Tab": b"\t", "Escape": b"\x1b", "Space": b" "}
# Keys a terminal sends as ESC O x in application mode and ESC [ x in normal mode (DECCKM).
_CURSOR = frozenset({"Up", "Down", "Left", "Right", "Home", "End"})
_CTRL = re.compile(r"^Ctrl-([A-Z])$")
# Alt (Meta) with a letter or digit: Escape, then the key, as xterm sends it (metaSendsEscape).
_ALT = re.compile(r"^Alt-([A-Za-z0-9])$")

NAMES = (*_FIXED, *_CAPABILITIES, "Ctrl-A ... Ctrl-Z", "Alt-A ... Alt-Z, Alt-a ... Alt-z, Alt-0 ... Alt-9")


class UnknownKey(ValueError):
    """A key name rungd does not know, or one the terminal type has no entry for."""


@dataclasses.dataclass(frozen=True)
class Key:
    name: str
    application: bytes  # as terminfo gives it (keypad mode)
    normal: bytes  # what the terminal sends before the program turns keypad mode on

    def sent(self, keypad: bool) -> bytes:
        """What the terminal sends for this key, with the program's cursor-key mode
        (DECCKM, which curses sets through ``smkx``) on or off."""
        return self.application if keypad else self.normal


def key(term: str, name: str) -> Key:
    """The key called ``name`` on a terminal of type ``term``.

    Raises:
        UnknownKey: the name is none of :data:`NAMES`, the host's terminfo has no entry for
            ``term``, or the entry does not describe this key; the message says which.
    """
    if name in _FIXED:
        return Key(name, _FIXED[name], _FIXED[name])
    if (ctrl := _CTRL.match(name)) is not None:
        byte = bytes([ord(ctrl.group(1)) - ord("A") + 1])
        return Key(name, byte, byte)
    if (alt := _ALT.match(name)) is not None:
        sent = b"\x1b" + alt.group(1).encode()
        return Key(name, sent, sent)
    capability = _CAPABILITIES.get(name)
    if capability is None:
        raise UnknownKey(f"{name!r} is no key rungd knows; known: {', '.join(NAMES)}")
    value = capabilities(term).get(capability)
    if value is None:
        raise UnknownKey(f"the terminal type {term!r} has no {name} key (terminfo {capability}) on this host")
    normal = b"\x1b[" + value[2:] if name in _CURSOR and value.startswith(b"\x1bO") else value
    return Key(name, value, normal)


@functools.cache
def capabilities(term: str) -> dict[str, bytes]:
    """The string capabilities of ``term``'s terminfo entry, as the bytes they stand for.

    Raises:
        UnknownKey: no entry for ``term`` (or no trusted ``infocmp``) on this host.
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}", term):
        raise UnknownKey(f"{term!r} is no terminal type name")
    program = shutil.which("infocmp", path=DEFAULT_PATH)
    try:
        if program is None:
            raise FileNotFoundError("not found on PATH")
        # The daemon runs it as itself: it must be a program only root could have put there.
        trust.Trust().program(program, DEFAULT_PATH)
    except (OSError, trust.Untrusted) as exc:
        raise UnknownKey(f"rungd cannot read the host's terminfo: infocmp: {exc}; the operator must install "
                         "ncurses-bin") from None
    env = {"PATH": DEFAULT_PATH, "LC_ALL": "C"}
    env.update((k, v) for k, v in os.environ.items() if k in ("TERMINFO", "TERMINFO_DIRS"))
    try:
        done = subprocess.run([program, "-1", "-x", term], capture_output=True, timeout=10, env=env,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownKey(f"rungd cannot read the host's terminfo: {exc}") from None
    if done.returncode != 0:
        raise UnknownKey(f"the host's terminfo has no entry for the terminal type {term!r} "
                         "(infocmp found none); pick one it has, such as xterm-256color or vt100")
    found: dict[str, bytes] = {}
    for line in done.stdout.decode("latin-1").splitlines():
        name, eq, value = line.strip().rstrip(",").partition("=")
        if eq and line.startswith("\t"):
            found[name] = _unescape(value)
    return found


_ESCAPES = {"E": b"\x1b", "e": b"\x1b", "n": b"\n", "r": b"\r", "t": b"\t", "b": b"\b", "f": b"\f", "s": b" ",
            "l": b"\n", ":": b":", "^": b"^", "\\": b"\\", ",": b","}


def _unescape(value: str) -> bytes:
    """A terminfo source string (terminfo(5): \\E, ^X, \\nnn octal...) as bytes."""
    out, i = bytearray(), 0
    while i < len(value):
        char = value[i]
        if char == "^" and i + 1 < len(value):
            out.append(0x7F if value[i + 1] == "?" else ord(value[i + 1].upper()) & 0x1F)
            i += 2
        elif char == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt.isdigit():
                digits = re.match(r"[0-7]{1,3}", value[i + 1:])
                number = int(digits.group(0), 8) if digits else 0
                out.append(0x80 if number == 0 else number & 0xFF)  # \0 stands for a NUL sent as 0200
                i += 1 + (len(digits.group(0)) if digits else 1)
            else:
                out += _ESCAPES.get(nxt, nxt.encode("latin-1"))
                i += 2
        else:
            out += char.encode("latin-1")
            i += 1
    return bytes(out)
