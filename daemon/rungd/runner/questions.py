"""The words by which a program shows it wants a credential or a terminal.

Tried against what real programs print: sudo, passwd, su ("Password:"), ssh and ssh-keygen
("Enter passphrase"), OpenSSL ("Enter PEM pass phrase:"), gpg ("Passphrase:"), smart-card and
token tools ("Enter PIN for 'token':", "passcode"), one-time codes ("Verification code:",
"OTP:"), and git ("Username for 'https://...':").
"""

from __future__ import annotations

import re

# Failures of programs that wanted a terminal for a password: the call needs a credential.
# sudo "a terminal is required to read the password", "no tty present"; git "could not read
# Username", "terminal prompts disabled"; gpg through its agent, whose pinentry finds no
# terminal for the passphrase: "error creating passphrase: Operation cancelled", "signing
# failed: Inappropriate ioctl for device", "problem with the agent: Inappropriate ioctl for
# device" (ENOTTY: the agent uses a terminal for nothing but the passphrase).
TERMINAL_REQUIRED = re.compile(
    r"terminal is required|no tty present|could not read (username|password)|terminal prompts disabled"
    r"|error creating pass ?phrase"
    r"|\b(sign\w*|decrypt\w*|pass ?phrase|pinentry|agent)\b[^\n]*: inappropriate ioctl for device",
    re.IGNORECASE,
)

# A program's own statement, before it reached for /dev/tty, that it needs a credential: gpg's
# status lines (--status-fd) "[GNUPG:] NEED_PASSPHRASE ...", "[GNUPG:] GET_HIDDEN ...", and
# gpg 1's "You need a passphrase to unlock the secret key". The words "cannot open /dev/tty"
# alone do not say what for: gpg prints them for a passphrase and for "Continue? (Y/n)" alike.
CREDENTIAL_NEEDED = re.compile(
    r"^\[GNUPG:\] (NEED_PASSPHRASE\w*|GET_HIDDEN)\b|\bneeds? an? (pass ?phrase|password|pin)\b",
    re.IGNORECASE | re.MULTILINE,
)

# A quiet program blocked on stdin after printing this is asking for a secret.
CREDENTIAL_QUESTION = re.compile(
    r"\b(passw(or)?d|pass ?phrase|passcode|pin|token|secret|user ?name|login"
    r"|otp|one[- ]time (password|code)|(verification|security|authentication|auth|2fa|mfa|totp) code)"
    r"\b[^\n]*[:?]\s*$",
    re.IGNORECASE,
)

# A field or a choice: a default in brackets just before the end ("User name [root]:", "Key
# file [/etc/key.pem]?") or a yes/no choice ("(y/n)", "[Y/n]"). Such a question wants a value
# typed, never a secret, whatever it mentions ("Reset the password? [y/N]", "password file
# [none]:"): its shape says so, not a word.
_FIELD = re.compile(r"\[[^\]\n]*\]\s*[:?]?\s*$|[(\[]\s*(y|yes)\s*/\s*(n|no)\s*[)\]]", re.IGNORECASE)


def is_credential_question(question: str) -> bool:
    """Whether a question a program is blocked on asks for a secret by its words: its last
    line (the prompt; ``question`` is all it printed since the last answer) names one and ends
    as a prompt does, and is no field with a default nor a yes/no choice."""
    lines = question.splitlines()
    last = lines[-1] if lines else ""
    return bool(CREDENTIAL_QUESTION.search(last)) and not _FIELD.search(last)


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
