"""Logging to the systemd journal in its native protocol, with structured fields.

Under systemd, stdout goes to the journal one *line* at a time: a traceback becomes twenty
entries at the default priority, and ``call_id`` or ``tool`` are words inside the text. The
journal's native protocol fixes both: one datagram per event to
``/run/systemd/journal/socket``, holding ``KEY=VALUE`` lines, so an event is one entry, its
priority comes from the log level, and ``journalctl -u rungd CALL_ID=c-…`` finds it.

    JournalHandler      a logging.Handler sending each record as one journal entry
    journal_fields()    the fields of one record (MESSAGE, PRIORITY, CALL_ID, TOOL, ...)
    encode_fields()     the wire form of a set of fields
    journal_wanted()    whether this process's output goes to the journal ($JOURNAL_STREAM)
    PlainFormatter      one line per record, ``key=value`` pairs after the message (no journal)

Wire form (systemd's "Native Journal Protocol", ``man 7 systemd-journald.socket`` and
https://systemd.io/JOURNAL_NATIVE_PROTOCOL/): ``KEY=value\\n`` for a value without a newline;
``KEY\\n`` + the value's length as a 64-bit little-endian integer + the value + ``\\n``
otherwise (that is how a traceback stays in one field). A datagram too large for the socket
(``EMSGSIZE``) is written to a sealed memfd and the descriptor sent instead, as
``sd_journal_sendv`` does. Keys are upper-case letters, digits and ``_``, not starting with
``_`` (those are the journal's trusted fields) or a digit, at most 64 characters.

No dependency: ``python-systemd`` would do the same, but is a C extension the daemon does not
otherwise need.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import socket
import struct
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Final, TextIO

from rungd.core.vocabulary import INVISIBLE

JOURNAL_SOCKET: Final = Path("/run/systemd/journal/socket")
IDENTIFIER: Final = "rungd"

# syslog priorities (RFC 5424), which journald stores in PRIORITY.
PRIORITY: Final = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

# Attributes a log call passes with ``extra={...}`` and the journal field each becomes. The
# names are those the daemon's log calls already use; a field a person searches on
# (``journalctl CALL_ID=…``) gets a plain upper-case name. ``code`` is ERROR_CODE so it is
# not read as one of the journal's CODE_FILE / CODE_LINE source fields.
EXTRA_FIELDS: Final = {
    "call_id": "CALL_ID",
    "tool": "TOOL",
    "request_id": "REQUEST_ID",
    "caller_uid": "CALLER_UID",
    "caller_pid": "CALLER_PID",
    "status": "STATUS",
    "code": "ERROR_CODE",
}
# ``extra={"journal": {"KEY": value}}`` adds fields of the caller's own choosing, e.g. the
# ledger's anchors (RUNGD_LEDGER_ANCHOR=1, LEDGER_SEQ, LEDGER_HEAD_HASH).
JOURNAL_EXTRA: Final = "journal"

_KEY: Final = re.compile(r"[A-Z0-9][A-Z0-9_]{0,63}")
_F_SEAL_ALL: Final = 0x0001 | 0x0002 | 0x0004 | 0x0008  # F_SEAL_SEAL | SHRINK | GROW | WRITE


def journal_wanted(environ: Mapping[str, str] | None = None, fds: tuple[int, ...] = (2, 1)) -> bool:
    """Whether this process's stdout or stderr is a journal stream.

    systemd sets ``$JOURNAL_STREAM`` to ``DEVICE:INODE`` of the stream it connected; the
    variable alone is inherited by children whose output went elsewhere, so it counts only
    when it names one of ``fds`` (systemd.exec(5), "$JOURNAL_STREAM").
    """
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    for fd in fds:
        try:
            stat = os.fstat(fd)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) == (int(device), int(inode)):
            return True
    return False


def journal_fields(record: logging.LogRecord, identifier: str = IDENTIFIER) -> dict[str, str]:
    """The journal fields of one log record.

    ``MESSAGE`` holds the message and, for ``log.exception``, the whole traceback; the
    other fields are the priority, where the record came from, and the record's extras
    (``EXTRA_FIELDS`` and ``extra={"journal": {...}}``).
    """
    message = record.getMessage()
    if record.exc_info:
        message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    elif record.exc_text:
        message += "\n" + record.exc_text
    if record.stack_info:
        message += "\n" + record.stack_info
    fields = {
        "MESSAGE": message,
        "PRIORITY": str(PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)),
        "SYSLOG_IDENTIFIER": identifier,
        "LOGGER": record.name,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
        "THREAD_NAME": record.threadName or "",
    }
    for attribute, key in EXTRA_FIELDS.items():
        value = getattr(record, attribute, None)
        if value is not None:
            fields[key] = str(value)
    extra = getattr(record, JOURNAL_EXTRA, None)
    if isinstance(extra, Mapping):
        for key, value in extra.items():
            key = str(key).upper()
            if _KEY.fullmatch(key) and value is not None:  # a bad name is dropped, never sent
                fields[key] = str(value)
    return fields


def encode_fields(fields: Mapping[str, str | bytes]) -> bytes:
    """The datagram for one entry: ``KEY=value`` lines, binary-safe form for a value with a newline.

    Raises:
        ValueError: a key is not a valid journal field name.
    """
    parts: list[bytes] = []
    for key, value in fields.items():
        if not _KEY.fullmatch(key):
            raise ValueError(f"{key!r} is not a journal field name: use A-Z, 0-9 and _, not first _ or digit")
        data = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
        name = key.encode("ascii")
        if b"\n" in data:
            parts.append(name + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            parts.append(name + b"=" + data + b"\n")
    return b"".join(parts)


# What would break a log line or act on a terminal (with ``lines``: all of it but the line
# feed and the tab that lay text out).
_UNSAFE = re.compile(f"[{INVISIBLE}]")
_UNSAFE_IN_TEXT = re.compile(f"(?![\t\n])[{INVISIBLE}]")


def visible(value: object, *, lines: bool = False) -> str:
    """A value as one visible piece of a line (a log line, rungctl's output): a tool name, a
    request_id or a program's output cannot forge a line ("\\ninfo rungd: stopped") or send a
    terminal escape (a retitled window, a cleared screen); each such character is escaped.
    With ``lines``, text keeps its line feeds and tabs (a program's output on a terminal)."""
    unsafe = _UNSAFE_IN_TEXT if lines else _UNSAFE
    return unsafe.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), str(value))


class PlainFormatter(logging.Formatter):
    """One line per record for a terminal or a file: level, logger, message, ``key=value``.

    A traceback follows on the lines after; used where there is no journal.
    """

    def format(self, record: logging.LogRecord) -> str:
        line = visible(record.getMessage())
        for attribute in EXTRA_FIELDS:
            value = getattr(record, attribute, None)
            if value is not None:
                line += f" {attribute}={visible(value)}"
        extra = getattr(record, JOURNAL_EXTRA, None)
        if isinstance(extra, Mapping):
            line += "".join(f" {visible(str(k).lower())}={visible(v)}" for k, v in extra.items() if v is not None)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return f"{record.levelname.lower():7} {record.name}: {line}"


class JournalHandler(logging.Handler):
    """Send each log record to the journal as one entry with structured fields.

    Args:
        socket_path: journald's native socket; a test binds its own and passes it.
        identifier: ``SYSLOG_IDENTIFIER`` of every entry.
        fallback: where a record goes, as a plain line, when the journal does not take it
            (socket gone, journald restarting, its queue full); ``sys.stderr`` by default.

    Never blocks: the socket is non-blocking, and a datagram the journal cannot take at
    once goes to ``fallback`` instead of holding up the event loop that logged it.
    """

    def __init__(self, socket_path: str | os.PathLike[str] = JOURNAL_SOCKET, *, identifier: str = IDENTIFIER,
                 fallback: TextIO | None = None) -> None:
        super().__init__()
        self.socket_path = os.fspath(socket_path)
        self.identifier = identifier
        self.fallback = fallback
        self._plain = PlainFormatter()
        # Not connected: sendto per datagram keeps working when journald restarts and binds
        # its socket anew, where a connected socket would answer ECONNREFUSED forever.
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = encode_fields(journal_fields(record, self.identifier))
            self.send(data)
        except OSError:
            self._emit_plain(record)
        except Exception:  # a formatting bug: logging's own report, never an exception to the caller
            self.handleError(record)

    def send(self, data: bytes) -> None:
        """Send one entry's datagram; through a sealed memfd when it is too large for one.

        Raises:
            OSError: the journal did not take it (no socket, queue full, ...).
        """
        try:
            self._sock.sendto(data, self.socket_path)
        except OSError as error:
            if error.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(data)

    def _send_memfd(self, data: bytes) -> None:
        fd = os.memfd_create("rungd-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            # journald only reads a memfd sealed against change (sd_journal_sendv does this).
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _F_SEAL_ALL)
            self._sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))], 0,
                               self.socket_path)
        finally:
            os.close(fd)

    def _emit_plain(self, record: logging.LogRecord) -> None:
        try:
            stream = self.fallback or sys.stderr
            stream.write(self._plain.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            super().close()


def make_handler(*, environ: Mapping[str, str] | None = None, socket_path: str | os.PathLike[str] = JOURNAL_SOCKET,
                 stream: TextIO | None = None) -> logging.Handler:
    """The daemon's log handler: the journal when output goes there, plain lines otherwise.

    Args:
        environ: the environment to look for ``$JOURNAL_STREAM`` in (``os.environ``).
        socket_path: journald's native socket.
        stream: where plain lines go (``sys.stdout``).
    """
    if journal_wanted(environ) and os.path.exists(socket_path):
        return JournalHandler(socket_path, fallback=stream or sys.stdout)
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(PlainFormatter())
    return handler

