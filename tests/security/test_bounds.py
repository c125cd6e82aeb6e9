"""What one caller can pile up is bounded: held calls per uid, pending pages, results kept."""

from __future__ import annotations

import os

import msgspec
import pytest
from rungd_ledgers import MAX_LINE_BYTES, iter_records

from rungd import protocol
from rungd.client import Client
from rungd.config import load_config
from rungd.core.contract import Caller
from rungd.core.errors import BadInput
from rungd.testing import STUB_DESCRIPTION, serve_tool_file, start_daemon, write_config
from tests.conftest import TEST_PLUGINS

HELD = f"""
[gates]
max_held_per_uid = 3

[plugins]
files = ["{TEST_PLUGINS / 'fake_tools.py'}"]
"""


async def test_held_calls_per_caller_are_capped_and_pending_pages(nursery, short_tmp) -> None:
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, HELD)))
    held = [await daemon.call("fake_records_delete", {"program": "argv_echo"}, request_id=f"h{n}", wait_s=0.05)
            for n in range(3)]
    assert all(env.next_action == "wait_approval" for env in held)
    over = await daemon.call("fake_records_delete", {"program": "argv_echo"}, request_id="h3", wait_s=0.05)
    assert (over.error.code, over.outcome) == ("BUSY", "not_started")

    def pages(client: Client) -> list[protocol.HeldCalls]:
        first = client.request(protocol.Pending(limit=2))
        second = client.request(protocol.Pending(after=first.next_after, limit=2))
        return [first, second]

    first, second = await daemon.run(pages)
    assert (len(first.calls), first.total, len(second.calls), second.next_after) == (2, 3, 1, None)
    assert [c.call_id for c in first.calls + second.calls] == [env.call_id for env in held]
    assert [h.call_id for h in await daemon.run(Client.pending)] == [env.call_id for env in held]
    daemon.daemon.stop()


async def test_finished_results_in_memory_are_capped(nursery, short_tmp) -> None:
    config = load_config(write_config(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "echo_tools.py"}"]\n'))
    config = config.model_copy(update={"server": config.server.model_copy(update={"max_results": 100})})
    daemon = await start_daemon(nursery, config)

    def many(client: Client) -> list[str]:
        return [client.call("test_text_echo", {"text": str(n)}).call_id for n in range(150)]

    ids = await daemon.run(many)
    known = [call_id for call_id in ids if daemon.daemon.dispatcher.calls.get(call_id) is not None]
    assert len(known) <= 101 and ids[-1] in known and ids[0] not in known
    assert msgspec.json.encode(daemon.daemon.dispatcher.status(ids[-1]))  # the newest still answers
    daemon.daemon.stop()


LOGGED = """
[program]
name = "echo"
command = "/bin/echo"

[tools.echo_note_show]
argv = ["{text}"]
log_fields = ["text"]
[tools.echo_note_show.description]
%s
[tools.echo_note_show.inputs.text]
description = "The note."
example = "a"
max_length = 4194304
"""


async def test_a_logged_input_too_long_for_a_ledger_line_is_refused_before_anything_is_recorded(
        nursery, short_tmp) -> None:
    # server.max_frame_bytes may be raised to 64 MiB, past what a ledger line may be: a logged
    # input that long would write a record the daemon's own start-up refuses as corrupt.
    daemon = await serve_tool_file(nursery, short_tmp, LOGGED % STUB_DESCRIPTION)
    caller = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    with pytest.raises(BadInput, match="longer than a ledger record may hold"):
        daemon.daemon.dispatcher.admission.admit("echo_note_show", {"text": "x" * (2 << 20)}, caller)
    ok = await daemon.call("echo_note_show", {"text": "short"})
    assert ok.status == "ok", ok.error
    records = list(iter_records(daemon.config.state_dir / "ledger"))
    assert records and max(len(msgspec.json.encode(r)) for r in records) < MAX_LINE_BYTES
    daemon.daemon.stop()
