"""Imports into a watched folder, taken (or not) by the fake legacy importers, through a real daemon."""

from __future__ import annotations

import json
import os
import time

import trio

ROWS = [{"sku": f"SKU-{i}", "qty": i} for i in range(1, 5)]


def inbox_files(xfer) -> list[str]:
    return sorted(os.listdir(xfer / "inbox"))


def books(xfer) -> list[dict]:
    path = xfer / "books.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def importer(background, xfer, *args) -> None:
    await background.start("partial_importer", "--inbox", xfer / "inbox", "--processed", xfer / "processed",
                           "--books", xfer / "books.jsonl", *args)


async def test_an_import_taken_whole_is_changed_with_both_counts(rungd_daemon, xfer, background) -> None:
    await importer(background, xfer, "--take", "all")
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-1.csv", "rows": ROWS}, request_id="r1")
    assert env.status == "ok", env.error
    assert (env.effect, env.outcome) == ("changed", "done")
    assert env.fields == {"file": "batch-1.csv", "written": 4, "count_before": 0, "count_after": 4, "added": 4,
                          "taken_by": "gone"}
    assert env.verified_by == "books.jsonl counted"
    assert [b["sku"] for b in books(xfer)] == ["SKU-1", "SKU-2", "SKU-3", "SKU-4"]
    assert inbox_files(xfer) == [] and os.listdir(xfer / "processed") == ["batch-1.csv"]


async def test_the_file_the_program_reads_is_the_rows_and_nothing_else(rungd_daemon, xfer) -> None:
    async def take_when_it_appears() -> bytes:
        with trio.fail_after(5):
            while not (xfer / "inbox" / "batch-2.csv").exists():
                await trio.sleep(0.01)
        data = (xfer / "inbox" / "batch-2.csv").read_bytes()
        (xfer / "books.jsonl").write_text("".join(json.dumps({"sku": r["sku"], "file": "batch-2.csv"}) + "\n"
                                                  for r in ROWS))
        os.rename(xfer / "inbox" / "batch-2.csv", xfer / "processed" / "batch-2.csv")
        return data

    async with trio.open_nursery() as nursery:
        seen: list[bytes] = []
        nursery.start_soon(lambda: _collect(seen, take_when_it_appears))
        env = await rungd_daemon.call("xfer_items_import", {"name": "batch-2.csv", "rows": ROWS,
                                                            "taken": "processed"}, request_id="r2")
    assert env.status == "ok", env.error
    assert env.fields["taken_by"] == "processed"
    assert seen == [b"sku,qty\r\nSKU-1,1\r\nSKU-2,2\r\nSKU-3,3\r\nSKU-4,4\r\n"]


async def _collect(seen, fn) -> None:
    seen.append(await fn())


async def test_an_import_taken_in_part_is_import_partial_with_both_counts(rungd_daemon, xfer, background) -> None:
    await importer(background, xfer, "--take", "half")
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-3.csv", "rows": ROWS}, request_id="r3")
    assert (env.status, env.error.code, env.outcome, env.next_action) == ("error", "IMPORT_PARTIAL", "done", "stop")
    assert (env.fields["written"], env.fields["count_before"], env.fields["count_after"]) == (4, 0, 2)
    assert "added 2 of 4" in env.error.message


async def test_an_import_taken_but_adding_nothing_is_import_partial_not_no_change(rungd_daemon, xfer,
                                                                                  background) -> None:
    # The program took the file and added none of the records, which were not there
    # before: that is a failure to report, not "nothing needed to change".
    await importer(background, xfer, "--take", "0")
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-4.csv", "rows": ROWS}, request_id="r4")
    assert (env.error.code, env.effect) == ("IMPORT_PARTIAL", "none")
    assert (env.fields["count_before"], env.fields["count_after"]) == (0, 0)


async def test_a_receipt_or_a_count_change_also_tells_the_file_was_taken(rungd_daemon, xfer) -> None:
    async def receipt_later() -> None:
        with trio.fail_after(5):
            while not (xfer / "inbox" / "batch-5.csv").exists():
                await trio.sleep(0.01)
        (xfer / "books.jsonl").write_text(json.dumps({"sku": "SKU-1", "file": "batch-5.csv"}) + "\n")
        (xfer / "receipts" / "batch-5.ok").write_text("ok")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receipt_later)
        env = await rungd_daemon.call("xfer_items_import", {"name": "batch-5.csv", "rows": ROWS[:1],
                                                            "taken": "receipt"}, request_id="r5")
    assert (env.status, env.effect, env.fields["taken_by"]) == ("ok", "changed", "receipt")

    async def count_later() -> None:
        with trio.fail_after(5):
            while not (xfer / "inbox" / "batch-6.csv").exists():
                await trio.sleep(0.01)
        with open(xfer / "books.jsonl", "a") as f:
            f.write(json.dumps({"sku": "SKU-1", "file": "batch-6.csv"}) + "\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(count_later)
        env = await rungd_daemon.call("xfer_items_import", {"name": "batch-6.csv", "rows": ROWS[:1],
                                                            "taken": "count"}, request_id="r6")
    assert (env.status, env.effect, env.fields["taken_by"]) == ("ok", "changed", "count")


async def test_a_libreoffice_lock_on_the_target_is_locked_and_nothing_is_written(rungd_daemon, xfer,
                                                                                 background) -> None:
    await importer(background, xfer, "--take", "all")
    await background.start("lo_lock_holder", "--target", xfer / "inbox" / "batch-7.csv", "--no-handle",
                           "--user", "alice", "--host", "desk-7", ready="locked")
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-7.csv", "rows": ROWS}, request_id="r7")
    assert (env.error.code, env.outcome, env.error.retry, env.next_action) == ("LOCKED", "not_started", "yes",
                                                                               "retry_later")
    assert "alice on desk-7 since" in env.error.message
    assert env.fields["holders"][0]["what"] == "lock file .~lock.batch-7.csv#"
    assert inbox_files(xfer) == [".~lock.batch-7.csv#"]
    assert books(xfer) == []


async def test_an_open_handle_on_the_programs_data_file_is_locked(rungd_daemon, xfer, background) -> None:
    holder = await background.start("lo_lock_holder", "--target", xfer / "books.jsonl", ready="locked")
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-8.csv", "rows": ROWS, "lock_books": True},
                                  request_id="r8")
    assert env.error.code == "LOCKED"
    whats = {h["what"] for h in env.fields["holders"]}
    assert "lock file .~lock.books.jsonl#" in whats
    assert any(w.startswith("open handle") for w in whats)
    assert f"pid {holder.pid}" in " ".join(h["who"] for h in env.fields["holders"])
    assert inbox_files(xfer) == []


async def test_a_second_import_into_a_busy_folder_is_locked_by_our_own_lock(rungd_daemon, xfer, background) -> None:
    await importer(background, xfer, "--take", "all", "--delay", "1.0")
    results = {}

    async def first() -> None:
        results["first"] = await rungd_daemon.call("xfer_items_import", {"name": "batch-9.csv", "rows": ROWS},
                                                   request_id="r9")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        with trio.fail_after(5):
            while not (xfer / "inbox" / "batch-9.csv").exists():
                await trio.sleep(0.01)
        second = await rungd_daemon.call("xfer_items_import", {"name": "batch-10.csv", "rows": ROWS},
                                         request_id="r10")
    assert second.error.code == "LOCKED"
    assert "importing into this folder right now" in second.error.message
    assert results["first"].effect == "changed"
    assert not (xfer / "processed" / "batch-10.csv").exists()


async def test_a_deadline_before_the_rename_is_not_started_and_leaves_nothing(rungd_daemon, xfer) -> None:
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-11.csv", "rows": ROWS, "slow_count_s": 10},
                                  request_id="r11")
    assert (env.error.code, env.outcome, env.settle) == ("TIMEOUT", "not_started", None)
    assert inbox_files(xfer) == []


async def test_a_file_never_picked_up_is_unknown_after_the_rename_with_the_count_as_settle(
        rungd_daemon, xfer, background) -> None:
    await background.start("never_importer", "--inbox", xfer / "inbox")
    started = time.monotonic()
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-12.csv", "rows": ROWS}, request_id="r12")
    assert (env.error.code, env.outcome, env.next_action) == ("TIMEOUT", "unknown", "reconcile")
    assert time.monotonic() - started < 6
    assert env.settle.tool == "xfer_items_count" and env.settle.inputs == {"name": "batch-12.csv"}
    assert inbox_files(xfer) == ["batch-12.csv"]  # left for the program: it may be half taken
    settled = await rungd_daemon.call(env.settle.tool, env.settle.inputs)
    assert settled.fields["count"] == 0
    repeat = await rungd_daemon.call("xfer_items_import", {"name": "batch-12.csv", "rows": ROWS}, request_id="r12")
    assert repeat.error.code == "RECONCILE_REQUIRED"


async def test_an_earlier_file_still_waiting_is_never_replaced(rungd_daemon, xfer) -> None:
    (xfer / "inbox" / "batch-13.csv").write_bytes(b"sku,qty\r\nOLD,1\r\n")
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-13.csv", "rows": ROWS}, request_id="r13")
    assert (env.error.code, env.outcome) == ("LOCKED", "not_started")
    assert (xfer / "inbox" / "batch-13.csv").read_bytes() == b"sku,qty\r\nOLD,1\r\n"


async def test_a_path_instead_of_a_name_is_bad_input(rungd_daemon, xfer) -> None:
    for name in ("../batch-1.csv", "batch-1.csv/..", "/etc/passwd", "batch-X.csv"):
        env = await rungd_daemon.call("xfer_items_import", {"name": name, "rows": ROWS}, request_id=f"bad{name}")
        assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started"), name
        assert "matching" in env.error.hint
    assert inbox_files(xfer) == []


async def test_a_symlink_out_of_the_roots_is_refused(rungd_daemon, xfer, short_tmp) -> None:
    outside = short_tmp / "outside"
    outside.mkdir()
    (xfer / "inbox" / "batch-14.csv").symlink_to(outside / "batch-14.csv")
    env = await rungd_daemon.call("xfer_items_import", {"name": "batch-14.csv", "rows": ROWS}, request_id="r14")
    assert (env.error.code, env.outcome, env.next_action) == ("OUTSIDE_ROOTS", "not_started", "stop")
    assert list(outside.iterdir()) == []
