"""The words by which a program shows it wants a credential or a terminal.

Tried against what real programs print: sudo, passwd, su ("Password:"), ssh and ssh-keygen
("Enter passphrase"), OpenSSL ("Enter PEM pass phrase:"), gpg ("Passphrase:"), smart-card and
token tools ("Enter PIN for 'token':", "passcode"), one-time codes ("Verification code:",
"OTP:"), and git ("Username for 'https://...':").
"""

from __future__ import annotations

import re

# Failures of programs that wanted a terminal for a password: the call needs a credential.
TERMINAL_REQUIRED = re.compile(
    r"terminal is required|no tty present|could not read (username|password)|terminal prompts disabled",
    re.IGNORECASE,
)

# A quiet program blocked on stdin after printing this is asking for a secret.
CREDENTIAL_QUESTION = re.compile(
    r"\b(passw(or)?d|pass ?phrase|passcode|pin|token|secret|user ?name|login"
    r"|otp|one[- ]time (password|code)|(verification|security|authentication|auth|2fa|mfa|totp) code)"
    r"\b[^\n]*[:?]\s*$",
    re.IGNORECASE,
)

# A line in which a program says it could not open or use /dev/tty (in a new session with no
# controlling terminal, opening it fails with ENXIO): bash "/dev/tty: No such device or
# address", dash "cannot open /dev/tty", ssh "can't open /dev/tty", Python "[Errno 6] No such
# device or address: '/dev/tty'".
_TTY_WORDS = re.compile(r"no such device or address|enxio|\bopen", re.IGNORECASE)


def tty_failure(text: str) -> str | None:
    """The line of ``text`` in which a program says it failed to use /dev/tty, or None."""
    for line in text.splitlines():
        if "/dev/tty" in line and _TTY_WORDS.search(line):
            return line.strip()[-200:]
    return None
