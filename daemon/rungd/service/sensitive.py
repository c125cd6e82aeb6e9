"""Sensitive inputs: the program gets them; everyone else sees only their mark.

An input marked sensitive (``json_schema_extra={"sensitive": True}`` on a ``ToolInputs``
field, ``sensitive = true`` in a tool file) is a value nobody should read off a screen or a
ledger: a new account's initial password, a PIN. The program gets it, as an argument or on
stdin. Everywhere else a call's inputs show (``pending`` and what an approver signs, the
ledger's input digest and logged inputs, the envelope), it is its mark::

    "<sensitive hmac:1a2b3c4d5e6f>"

which says that it was set, with the first 48 bits of an HMAC-SHA256 of the value under
the daemon's own key. The same value always gives the same mark, so an approver can see
that two requests carry the same password, and a repeat of a request still matches its
first call's digest. Keyed, because a plain hash of a four-digit PIN is found by trying
10,000 values; without the key there is nothing to try them against.

The key is 32 random bytes in ``STATE/sensitive.key``, made once (mode 0600) and kept across
restarts, so a mark means the same value tomorrow. The daemon does not start with a key file
another user could read or replace: whoever reads it can try PINs again.

While the call runs, each sensitive value is also one of its secrets
(``CallContext.secrets``): the Redactor takes it out of the program's output and evidence,
the result's fields and error messages, as it does a credential. A value shorter than
``redact.SHORTEST`` characters is too short to look for, like a credential that short.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from rungd.core.contract import ToolInputs
from rungd.core.errors import ConfigError

KEY_FILE = "sensitive.key"
_KEY_BYTES = 32
# Hex digits of the HMAC a mark shows: 48 bits tell two values apart, and are short to compare.
_SHOWN_HEX = 12


class Marks:
    """Marks sensitive inputs with a digest keyed by the daemon's own key.

    Args:
        key: the secret key (``of_state`` reads or makes it).
    """

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def of_state(cls, state_dir: Path) -> Marks:
        """The marks of the daemon whose state folder is ``state_dir``, its key made the
        first time. Blocking (a small file): call it at start-up.

        Raises:
            ConfigError: the key file is not a private file of rungd's user holding a key.
        """
        return cls(_key(state_dir / KEY_FILE))

    def mark(self, value: str) -> str:
        """What shows instead of ``value``: ``<sensitive hmac:1a2b3c4d5e6f>``."""
        digest = hmac.new(self._key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return f"<sensitive hmac:{digest[:_SHOWN_HEX]}>"

    def shown(self, inputs: ToolInputs) -> ToolInputs:
        """``inputs`` as they may be shown and kept: each sensitive value that is set replaced
        by its mark. The same object when the tool has no sensitive input set.

        What it returns is for showing, digesting and logging only; a program run with it
        would get the marks as its password.
        """
        marked = {name: self.mark(value) for name in inputs.sensitive_fields()
                  if isinstance(value := getattr(inputs, name), str)}
        return inputs.model_copy(update=marked) if marked else inputs


def values(inputs: ToolInputs) -> list[str]:
    """The sensitive values ``inputs`` carry: the call's secrets, to be redacted."""
    return [value for name in inputs.sensitive_fields() if isinstance(value := getattr(inputs, name), str) and value]


def _key(path: Path) -> bytes:
    """The key in ``path``, or a new one written there when there is none."""
    try:
        # O_NONBLOCK: a FIFO planted there must not hold the start; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return _new_key(path)
    except OSError as exc:  # ELOOP: a symlink, which O_NOFOLLOW refuses
        raise _refused(path, f"cannot be opened as a plain file ({exc.strerror})", f"remove it: rm {path}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refused(path, "is not a regular file", f"remove it: rm {path}")
        if info.st_uid != os.geteuid():
            raise _refused(path, f"is owned by uid {info.st_uid}, not rungd's user (uid {os.geteuid()})",
                           f"chown {os.geteuid()} {path}, or remove it")
        if info.st_mode & 0o077:
            raise _refused(path, f"is open to group or others (mode {stat.S_IMODE(info.st_mode):04o})",
                           f"chmod 600 {path}")
        key = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != _KEY_BYTES:
        raise _refused(path, f"holds {len(key)} bytes, not a key of {_KEY_BYTES}", f"remove it: rm {path}")
    return key


def _new_key(path: Path) -> bytes:
    """Write a new key to ``path`` whole, or read the one another start wrote first."""
    key = secrets.token_bytes(_KEY_BYTES)
    # Written aside and linked into place: the key file is never seen half written, and a
    # key already there is never replaced (marks already shown keep meaning what they say).
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(staging, path)
    except FileExistsError:
        return _key(path)
    finally:
        staging.unlink(missing_ok=True)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return key


def _refused(path: Path, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{path} {problem}; it keys the marks that stand for sensitive inputs, and whoever reads "
                       f"it can test guesses of a PIN against them; hint: {fix} (rungd makes a new key when there "
                       "is none; marks shown before then no longer match)")
