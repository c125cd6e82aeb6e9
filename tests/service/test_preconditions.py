"""Expected revisions on the demo write: a stale expected_count is CONFLICT and changes
nothing; a fresh one acts; calls on one item never interleave between check and act."""

from __future__ import annotations

import trio

from rungd.service.engine.preconditions import ResourceLocks


async def test_a_stale_expected_count_is_a_conflict_and_changes_nothing(rungd_daemon) -> None:
    read = await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    count = int(read.fields["count"])
    moved = await rungd_daemon.call("inventory_count_set", {"item": "widget", "count": count + 5,
                                                            "expected_count": count}, request_id="p1")
    assert (moved.status, moved.effect) == ("ok", "changed")
    stale = await rungd_daemon.call("inventory_count_set", {"item": "widget", "count": 1,
                                                            "expected_count": count}, request_id="p2")
    assert (stale.error.code, stale.outcome, stale.next_action) == ("CONFLICT", "not_started", "repair")
    assert stale.fields["current"]["count"] in (count + 5, str(count + 5))
    again = await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    assert int(again.fields["count"]) == count + 5  # nothing changed
    # The same stale request cannot resolve it: the check runs again and finds the same.
    repeat = await rungd_daemon.call("inventory_count_set", {"item": "widget", "count": 1,
                                                             "expected_count": count}, request_id="p2")
    assert repeat.error.code == "CONFLICT"
    # Without expected_count the write acts whatever the count is.
    blind = await rungd_daemon.call("inventory_count_set", {"item": "widget", "count": 7}, request_id="p3")
    assert (blind.status, blind.effect) == ("ok", "changed")


async def test_two_writes_expecting_the_same_count_one_wins_the_other_conflicts(rungd_daemon) -> None:
    read = await rungd_daemon.call("inventory_item_show", {"item": "gadget"})
    count = int(read.fields["count"])
    results = []

    async def write(new: int, rid: str) -> None:
        results.append(await rungd_daemon.call("inventory_count_set", {
            "item": "gadget", "count": new, "expected_count": count}, request_id=rid))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write, count + 1, "race-a")
        nursery.start_soon(write, count + 2, "race-b")
    codes = sorted((env.error.code if env.error else "ok") for env in results)
    assert codes in (["CONFLICT", "ok"], ["BUSY", "ok"]), codes  # never both acting on one read


async def test_a_resource_lock_serialises_its_holders_and_is_forgotten_after() -> None:
    locks = ResourceLocks()
    order = []

    async def holder(name: str) -> None:
        async with locks.hold("item:x"):
            order.append(f"{name} in")
            await trio.sleep(0.05)
            order.append(f"{name} out")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder, "a")
        await trio.sleep(0.01)
        nursery.start_soon(holder, "b")
    assert order == ["a in", "a out", "b in", "b out"]
    assert not locks._locks  # nothing kept once nobody holds or waits
