"""The words by which a program shows it wants a credential or a terminal."""

from __future__ import annotations

import re

# Failures of programs that wanted a terminal for a password: the call needs a credential.
TERMINAL_REQUIRED = re.compile(
    r"terminal is required|no tty present|could not read (username|password)|terminal prompts disabled",
    re.IGNORECASE,
)
# A quiet program blocked on stdin after printing this is asking for a secret.
CREDENTIAL_QUESTION = re.compile(r"(password|passphrase|passcode|token|pin|secret|username)\b[^\n]*[:?]\s*$",
                                 re.IGNORECASE)
