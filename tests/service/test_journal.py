"""rungd.service.journal: each log event reaches the journal socket as one datagram with its fields.

A real AF_UNIX datagram socket stands in for journald; the test parses what arrives with
its own reader of the native protocol, so a mistake in the encoder cannot hide itself.
"""

from __future__ import annotations

import array
import fcntl
import io
import logging
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from rungd.service.journal import JournalHandler, journal_wanted, make_handler


def parse_entry(data: bytes) -> dict[str, str]:
    """Read one native-protocol datagram: KEY=value lines, or KEY\\n<u64 le length><value>\\n."""
    fields: dict[str, str] = {}
    position = 0
    while position < len(data):
        newline = data.index(b"\n", position)
        line = data[position:newline]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            position = newline + 1
        else:
            key = line
            (length,) = struct.unpack_from("<Q", data, newline + 1)
            start = newline + 1 + 8
            value = data[start:start + length]
            assert data[start + length:start + length + 1] == b"\n", "a binary-safe value must end with a newline"
            position = start + length + 1
        assert key.decode() not in fields, f"field {key!r} sent twice"
        fields[key.decode()] = value.decode()
    return fields


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[socket.socket, logging.Logger]]:
    path = tmp_path / "journal.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    receiver.settimeout(5)
    handler = JournalHandler(path, fallback=io.StringIO())
    logger = logging.getLogger(f"rungd.test_journal.{tmp_path.name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        yield receiver, logger
    finally:
        handler.close()
        receiver.close()


def no_more(receiver: socket.socket) -> bool:
    receiver.setblocking(False)
    try:
        receiver.recv(1 << 20)
    except BlockingIOError:
        return True
    return False


def test_a_traceback_is_one_entry_with_priority_and_call_fields(journal: tuple[socket.socket, logging.Logger]) -> None:
    receiver, logger = journal
    try:
        raise RuntimeError("the program vanished\nsecond line of the error")
    except RuntimeError:
        logger.exception("call failed", extra={"call_id": "c-42", "tool": "inventory_item_show",
                                                "request_id": "r-1", "caller_uid": 1000})
    fields = parse_entry(receiver.recv(1 << 20))
    assert no_more(receiver), "one event must be one datagram"
    assert fields["PRIORITY"] == "3"
    assert fields["CALL_ID"] == "c-42"
    assert fields["TOOL"] == "inventory_item_show"
    assert fields["REQUEST_ID"] == "r-1"
    assert fields["CALLER_UID"] == "1000"
    assert fields["SYSLOG_IDENTIFIER"] == "rungd"
    message = fields["MESSAGE"]
    assert message.startswith("call failed\nTraceback (most recent call last):\n")
    assert "raise RuntimeError" in message
    assert message.endswith("RuntimeError: the program vanished\nsecond line of the error")


@pytest.mark.parametrize(("level", "priority"), [(logging.DEBUG, "7"), (logging.INFO, "6"),
                                                  (logging.WARNING, "4"), (logging.CRITICAL, "2")])
def test_priority_follows_the_log_level(journal: tuple[socket.socket, logging.Logger], level: int,
                                        priority: str) -> None:
    receiver, logger = journal
    logger.log(level, "hello %s", "there")
    fields = parse_entry(receiver.recv(1 << 20))
    assert (fields["PRIORITY"], fields["MESSAGE"]) == (priority, "hello there")
    assert "CALL_ID" not in fields


def test_caller_chosen_fields_are_sent_and_bad_names_dropped(journal: tuple[socket.socket, logging.Logger]) -> None:
    receiver, logger = journal
    logger.info("ledger anchor", extra={"journal": {"RUNGD_LEDGER_ANCHOR": 1, "LEDGER_SEQ": 17,
                                                    "_TRUSTED": "x", "bad name": "y"}})
    fields = parse_entry(receiver.recv(1 << 20))
    assert fields["RUNGD_LEDGER_ANCHOR"] == "1"
    assert fields["LEDGER_SEQ"] == "17"
    assert "_TRUSTED" not in fields and "BAD NAME" not in fields


def test_an_entry_too_large_for_a_datagram_goes_through_a_sealed_memfd(
        journal: tuple[socket.socket, logging.Logger]) -> None:
    receiver, logger = journal
    big = "x" * (4 << 20)  # past any datagram size limit (net.core.wmem_max is far smaller)
    logger.warning("big: %s", big, extra={"call_id": "c-big"})
    fds = array.array("i")
    data, ancillary, _, _ = receiver.recvmsg(1 << 16, socket.CMSG_SPACE(fds.itemsize))
    assert data == b"", "the datagram carries only the descriptor"
    for level, kind, payload in ancillary:
        assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
        fds.frombytes(payload[:fds.itemsize])
    (fd,) = fds
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & 0x0008, "journald reads only a memfd sealed against writes"
        fields = parse_entry(os.pread(fd, os.fstat(fd).st_size, 0))
    finally:
        os.close(fd)
    # Compared by length and ends, so a failure does not print 4 MiB.
    message = fields["MESSAGE"]
    assert (len(message), message[:8], message[-3:]) == (len(big) + 5, "big: xxx", "xxx")
    assert fields["CALL_ID"] == "c-big"


def test_without_a_journal_socket_the_event_is_a_plain_line(tmp_path: Path) -> None:
    fallback = io.StringIO()
    handler = JournalHandler(tmp_path / "nobody-listens.sock", fallback=fallback)
    logger = logging.getLogger("rungd.test_journal.fallback")
    logger.handlers[:] = [handler]
    logger.propagate = False
    try:
        logger.error("ledger write failed", extra={"call_id": "c-7", "tool": "t"})
    finally:
        handler.close()
    assert fallback.getvalue() == "error   rungd.test_journal.fallback: ledger write failed call_id=c-7 tool=t\n"


def test_journal_is_used_only_when_journal_stream_names_our_output(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        stat = os.fstat(write_end)
        ours = {"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}
        assert journal_wanted(ours, fds=(write_end,))
        # Inherited from a parent whose output went to the journal, ours does not.
        assert not journal_wanted({"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino + 1}"}, fds=(write_end,))
        assert not journal_wanted({}, fds=(write_end,))
        assert not journal_wanted({"JOURNAL_STREAM": "garbage"}, fds=(write_end,))
    finally:
        os.close(read_end)
        os.close(write_end)


def test_make_handler_logs_plain_lines_outside_systemd(tmp_path: Path) -> None:
    stream = io.StringIO()
    handler = make_handler(environ={}, socket_path=tmp_path / "none.sock", stream=stream)
    assert not isinstance(handler, JournalHandler)
    logger = logging.getLogger("rungd.test_journal.plain")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.warning("disk low", extra={"tool": "x"})
    assert stream.getvalue() == "warning rungd.test_journal.plain: disk low tool=x\n"
