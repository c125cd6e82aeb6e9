"""Issue 31: what the journal says of calls, read from a native-protocol socket the test binds
(systemd is not PID 1 here): every entry about a call carries CALL_ID, REQUEST_ID and
CALLER_UID (the README's journalctl REQUEST_ID=... finds it); errors and unknown outcomes are
warnings, unless the caller's own input was wrong; held and decided calls are journalled."""

from __future__ import annotations

import io
import logging
import os
import socket

import trio

from rungd.config import load_config
from rungd.service.inprocess import start_daemon
from rungd.service.journal import JournalHandler
from rungd.testing import write_config
from tests.service.test_journal import parse_entry


def entries(receiver: socket.socket) -> list[dict[str, str]]:
    found = []
    receiver.setblocking(False)
    while True:
        try:
            found.append(parse_entry(receiver.recv(1 << 20)))
        except BlockingIOError:
            return found


async def test_calls_are_journalled_with_their_request_caller_and_a_priority_by_what_went_wrong(short_tmp) -> None:
    path = short_tmp / "journal.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    handler = JournalHandler(path, fallback=io.StringIO())
    logger = logging.getLogger("rungd.calls")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        config = load_config(write_config(short_tmp, '[gates]\nreversible = "review"\n'))
        async with trio.open_nursery() as nursery:
            daemon = await start_daemon(nursery, config)
            held = await daemon.call("inventory_count_set", {"item": "widget", "count": 5}, request_id="r-held",
                                     wait_s=0.2)
            assert held.status == "pending"
            await daemon.run(lambda client: client.deny(held.call_id, "asked for the wrong count"))
            missing = await daemon.call("inventory_item_show", {"item": "nosuchitem"})
            assert missing.error is not None and missing.next_action == "repair", missing
            daemon.daemon.stop()
        seen = entries(receiver)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.close()
        receiver.close()
    me = str(os.getuid())
    by_message = {entry["MESSAGE"]: entry for entry in seen}
    hold = by_message["call held at its review gate"]
    assert (hold["REQUEST_ID"], hold["CALLER_UID"], hold["CALL_ID"], hold["GATE"]) == ("r-held", me, held.call_id,
                                                                                      "review")
    withdrawn = by_message["call withdrawn: asked for the wrong count"]
    assert (withdrawn["VERDICT"], withdrawn["APPROVER_UID"], withdrawn["REQUEST_ID"]) == ("denied", me, "r-held")
    finished = [entry for entry in seen if entry["MESSAGE"] == "call finished"]
    denied = next(entry for entry in finished if entry["CALL_ID"] == held.call_id)
    assert denied["PRIORITY"] == "4" and denied["REQUEST_ID"] == "r-held" and denied["CALLER_UID"] == me, denied
    wrong_input = next(entry for entry in finished if entry["CALL_ID"] == missing.call_id)
    assert wrong_input["PRIORITY"] == "6" and wrong_input["ERROR_CODE"] == "NOT_FOUND", wrong_input
