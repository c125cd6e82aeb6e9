"""What one caller can pile up is bounded: held calls per uid, pending pages, results kept."""

from __future__ import annotations

import msgspec

from rungd import protocol
from rungd.client import Client
from rungd.config import load_config
from rungd.testing import start_daemon, write_config
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
