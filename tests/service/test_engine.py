"""The call engine end to end: what a tool raises reaches the client whole, through the
one boundary, and a reconcile that cannot decide says why in an envelope."""

from __future__ import annotations

import textwrap
import types
from pathlib import Path

import pytest
import trio

from rungd.client import Client

PROBE = '''
from typing import Annotated, Any
from pydantic import Field
from rungd.sdk import (Description, Result, SettleSpec, Timing, Tool, ToolError, ToolInputs, ErrorRule,
                       hookimpl)

def describe(does):
    return Description(does=does, use_when="testing.", do_not_use_when="not testing.", returns="fields.",
                       on_error="codes.", if_unknown="reconcile.")

class Item(ToolInputs):
    item: Annotated[str, Field(max_length=20, description="An item.", examples=["w"])]

async def stuck(ctx: Any, inputs: Item) -> Result:
    ctx.mark_committed()
    raise ToolError("HALF_DONE", "the program stopped half way", fields={"seen": "half", "item": inputs.item})

async def hang(ctx: Any, inputs: Item) -> Result:
    import trio
    ctx.mark_spawned()  # as the runner does when the program starts
    await trio.sleep(10)
    raise AssertionError("the deadline should have stopped it")

async def show(ctx: Any, inputs: Item) -> Result:
    return Result(fields={"other": "no count here"})

@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="probe_item_set", description=describe("Sets an item."), inputs=Item,
                  outputs={"done": "yes"}, handler=stuck, side_effect="reversible",
                  errors=(ErrorRule("HALF_DONE", "no", "stop", hint="look at the item"),),
                  timing=Timing(settle=SettleSpec("probe_item_show", {"item": "$item"}, {"count": 1}))))
    register(Tool(name="probe_item_hang", description=describe("Hangs before its confirmation."), inputs=Item,
                  outputs={"done": "yes"}, handler=hang, side_effect="reversible",
                  timing=Timing(deadline_s=0.5, commit_point="confirmation",
                                settle=SettleSpec("probe_item_show", {"item": "$item"}))))
    register(Tool(name="probe_item_show", description=describe("Shows an item."), inputs=Item,
                  outputs={"other": "something"}, handler=show))
'''


@pytest.fixture
def rungd_config_toml(short_tmp: Path) -> str:
    plugin = short_tmp / "probe_tools.py"
    plugin.write_text(textwrap.dedent(PROBE))
    return f'[plugins]\nfiles = ["{plugin}"]\n'


async def test_fields_and_settle_of_a_tools_error_reach_the_client(rungd_daemon) -> None:
    env = await rungd_daemon.call("probe_item_set", {"item": "w"}, request_id="r1")
    assert (env.status, env.error.code, env.outcome) == ("error", "HALF_DONE", "unknown")
    assert env.fields == {"seen": "half", "item": "w"}
    assert env.error.hint == "look at the item"  # the tool's table fills what the raiser left out
    assert env.settle is not None and (env.settle.tool, env.settle.inputs) == ("probe_item_show", {"item": "w"})
    # The repeat is answered from the ledger, with the same settle read.
    again = await rungd_daemon.call("probe_item_set", {"item": "w"}, request_id="r1")
    assert again.error.code == "RECONCILE_REQUIRED" and again.settle.tool == "probe_item_show"


async def test_a_reconcile_that_cannot_decide_answers_an_envelope_with_what_it_found(rungd_daemon) -> None:
    await rungd_daemon.call("probe_item_set", {"item": "w"}, request_id="r2")
    env = await rungd_daemon.run(Client.reconcile, "probe_item_set", "r2")
    assert (env.status, env.outcome, env.error.code) == ("error", "unknown", "RECONCILE_REQUIRED")
    assert env.fields == {"other": "no count here"}  # what the settle read found
    assert env.settle is not None and env.settle.tool == "probe_item_show"
    assert env.next_action == "reconcile"


async def test_a_write_whose_program_ran_is_unknown_before_its_commit_point_without_a_deciding_read(
        rungd_daemon) -> None:
    # Declared: nothing happens before a confirmation. But the program ran, and nothing read
    # the state back (the settle read declares no expected fields): the truth is unknown.
    env = await rungd_daemon.call("probe_item_hang", {"item": "w"}, request_id="r3")
    assert (env.error.code, env.outcome, env.next_action) == ("TIMEOUT", "unknown", "reconcile")
    assert env.settle is not None and env.settle.tool == "probe_item_show"


async def test_every_answer_the_runner_gave_is_an_answered_ledger_event(nursery, short_tmp) -> None:
    from rungd_ledgers import iter_records

    from rungd.config import load_config
    from rungd.testing import start_daemon, write_config

    daemon = await start_daemon(nursery, load_config(write_config(short_tmp)))
    env = await daemon.call("inventory_count_set", {"item": "widget", "count": 42}, request_id="a1")
    assert env.status == "ok", env.error
    events = [(r.event, r.note) for r in iter_records(daemon.config.state_dir / "ledger") if r.call_id == env.call_id]
    answered = [note for event, note in events if event == "answered"]
    assert len(answered) == 1 and answered[0].startswith("confirmation")  # the [y/N] the demo asks
    assert [event for event, _ in events].index("answered") < [event for event, _ in events].index("finished")
    daemon.daemon.stop()


async def test_a_reads_records_are_synced_within_a_second_and_a_writes_before_its_answer(nursery, short_tmp) -> None:
    from rungd_ledgers import iter_records

    from rungd.config import load_config
    from rungd.testing import start_daemon, write_config

    daemon = await start_daemon(nursery, load_config(write_config(short_tmp)))
    ledger = daemon.daemon.audit.ledger
    env = await daemon.call("inventory_item_show", {"item": "widget"})
    assert env.status == "ok", env.error
    # Written before the answer (a crash of the daemon loses nothing)...
    events = [r.event for r in iter_records(daemon.config.state_dir / "ledger") if r.call_id == env.call_id]
    assert events == ["received", "dispatched", "finished"]
    # ...and synced by the daemon itself within a second, with no other call to do it.
    with trio.fail_after(3):
        while ledger.unsynced:
            await trio.sleep(0.05)
    env = await daemon.call("inventory_count_set", {"item": "widget", "count": 41}, request_id="w1")
    assert env.status == "ok", env.error
    assert not ledger.unsynced  # a write's records are durable before its caller hears
    daemon.daemon.stop()


async def test_a_repeat_joining_a_call_that_ends_unknown_is_reconcile_required(rungd_daemon) -> None:
    import trio

    results = {}

    async def one(name: str) -> None:
        results[name] = await rungd_daemon.call("probe_item_hang", {"item": "w"}, request_id="r4")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "first")
        await trio.sleep(0.2)
        nursery.start_soon(one, "repeat")
    assert results["first"].outcome == "unknown"
    repeat = results["repeat"]
    assert (repeat.error.code, repeat.outcome, repeat.next_action) == ("RECONCILE_REQUIRED", "unknown", "reconcile")
    assert repeat.settle is not None and repeat.settle.tool == "probe_item_show"


async def test_a_daemon_that_is_stopping_starts_no_new_call(rungd_daemon) -> None:
    import trio

    from rungd.client import Client

    def on_an_open_connection() -> str:
        with Client(rungd_daemon.socket) as client:
            client.hello()
            rungd_daemon.daemon.dispatcher.stopping = True  # as shutdown() sets it first thing
            env = client.call("probe_item_show", {"item": "w"})
            return env.error.code if env.error else env.status

    assert await trio.to_thread.run_sync(on_an_open_connection) == "BUSY"


def test_one_callers_flood_forgets_its_own_results_not_anothers() -> None:
    # An unprivileged caller sending 20,000 bad requests used to push root's one-minute-old
    # result out of the table (UNKNOWN_CALL long before keep_results_s).
    from rungd.core.contract import Caller
    from rungd.service.engine.calls import Call, CallTable

    table = CallTable(3600, lambda caller: caller.uid == 0, max_results=400)
    root, flooder = Caller(uid=0, gid=0, pid=1), Caller(uid=65534, gid=65534, pid=2)
    kept = Call.new("inventory_item_show", None, root)
    kept.envelope = object()  # type: ignore[assignment]  # finished: only its presence matters here
    table.add(kept)
    running = Call.new("slow_show", None, flooder)
    table.add(running)  # still running: never forgotten
    for _ in range(1000):
        noise = Call.new("no_such_tool", None, flooder)
        noise.envelope = object()  # type: ignore[assignment]
        table.add(noise)
    assert table.get(kept.call_id) is kept and table.get(running.call_id) is running
    assert sum(1 for call in table if call.caller.uid == 65534) == 100  # a quarter of max_results


def test_calls_running_at_once_are_bounded_per_caller_and_in_all() -> None:
    from rungd.service.engine.slots import Slots
    from rungd.core.errors import Busy

    tool = types.SimpleNamespace(name="slow_show", concurrency=None)
    slots = Slots(max_running=5, max_per_uid=2)
    slots.take(tool, 1000)
    slots.take(tool, 1000)
    with pytest.raises(Busy, match="your limit"):
        slots.take(tool, 1000)
    slots.take(tool, 0)  # root is held only to the total
    slots.take(tool, 0)
    slots.take(tool, 1001)
    with pytest.raises(Busy, match="rungd already runs 5 calls"):
        slots.take(tool, 0)
    slots.release(tool, 1000)
    slots.take(tool, 1000)  # a slot freed is a slot to take


def test_a_flood_of_made_up_names_is_counted_in_bounded_memory() -> None:
    from rungd.service.engine.rejections import Rejections

    rejections = Rejections()
    assert rejections.leave_out(1000, "UNKNOWN_TOOL", "name_0")
    for i in range(1, 5000):
        assert not rejections.leave_out(1000, "UNKNOWN_TOOL", f"name_{i}")
    assert len(rejections._left_out[1000].tools) == 101  # 100 names, then "(other names)"
    summary = rejections.summary(1000)
    assert summary.startswith("5000 more refused calls of uid 1000") and "'(other names)' x4900" in summary
    assert rejections.summary(1000) is None  # said once


async def test_a_call_whose_connection_is_cancelled_while_it_is_recorded_keeps_no_slot_or_request_id(
        nursery, short_tmp) -> None:
    # A shutdown cancels the connections after the calls end; a start cancelled while its
    # records were written used to keep its slot (a shutdown waits for every slot) and its
    # request_id (a retry of it would wait forever on a call that never runs).
    import os

    from rungd.config import load_config
    from rungd.core.contract import Caller
    from rungd.testing import start_daemon, write_config

    daemon = await start_daemon(nursery, load_config(write_config(short_tmp)))
    dispatcher = daemon.daemon.dispatcher
    caller = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    with trio.CancelScope() as scope:
        scope.cancel()
        await dispatcher.start("inventory_count_set", {"item": "widget", "count": 7}, "cut-1", caller)
    assert scope.cancelled_caught
    (call,) = [call for call in dispatcher.calls if call.request_id == "cut-1"]
    assert call.envelope is not None and call.envelope.error.code == "BUSY"
    assert call.envelope.outcome == "not_started"
    with trio.fail_after(2):
        await dispatcher.slots.wait_idle()
    env = await daemon.call("inventory_count_set", {"item": "widget", "count": 7}, request_id="cut-1")
    assert env.status == "ok", env.error
    daemon.daemon.stop()


async def test_a_start_cancelled_once_its_records_are_written_runs_and_says_so(nursery, short_tmp) -> None:
    # A ledger outage had just ended, so writing the call's records also writes the outage's
    # note; a cancellation then must not tell the caller that nothing was recorded or run.
    import os
    import time

    import trio.testing

    from rungd.config import load_config
    from rungd.core.contract import Caller
    from rungd.testing import start_daemon, write_config

    daemon = await start_daemon(nursery, load_config(write_config(short_tmp)))
    dispatcher = daemon.daemon.dispatcher
    caller = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    dispatcher.audit._outage = (time.time() - 5, 1)  # the ledger refused appends until now
    with trio.CancelScope() as scope:
        async def cancel_while_recording() -> None:
            await trio.testing.wait_all_tasks_blocked()  # start() waits on the ledger's thread
            scope.cancel()

        nursery.start_soon(cancel_while_recording)
        call = await dispatcher.start("inventory_count_set", {"item": "widget", "count": 7}, "cut-2", caller)
    with trio.fail_after(10):
        await call.done.wait()
    assert call.envelope is not None and call.envelope.status == "ok", call.envelope
    env = await daemon.call("inventory_count_set", {"item": "widget", "count": 7}, request_id="cut-2")
    assert env.status == "ok" and env.call_id != call.call_id  # answered as a repeat of the first
    daemon.daemon.stop()


async def test_repeats_cancelled_while_recorded_end_and_hold_nothing(rungd_daemon) -> None:
    # A repeat joining a running call, and one refused after it, cancelled (a shutdown) while
    # their records are written: each ends, holds no claim or slot, and the joined one does
    # not say that nothing was started (its first call may act).
    import os

    from rungd.core.contract import Caller

    dispatcher = rungd_daemon.daemon.dispatcher
    caller = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    first = await dispatcher.start("probe_item_hang", {"item": "w"}, "r-1", caller)
    for _ in ("joined", "refused"):
        with trio.CancelScope() as scope:
            scope.cancel()
            await dispatcher.start("probe_item_hang", {"item": "w"}, "r-1", caller)
        assert scope.cancelled_caught
        if _ == "joined":
            await first.done.wait()  # ends unknown at its deadline, so the next is refused
    joined, refused = [call for call in dispatcher.calls if call.request_id == "r-1" and call is not first]
    assert (joined.envelope.error.code, joined.envelope.outcome) == ("INTERRUPTED", "unknown")
    assert (refused.envelope.error.code, refused.envelope.outcome) == ("RECONCILE_REQUIRED", "unknown")
    assert not dispatcher.requests._running
    with trio.fail_after(2):
        await dispatcher.slots.wait_idle()
