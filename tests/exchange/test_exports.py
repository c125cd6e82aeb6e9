"""Export reads against real files written by the fake legacy exporters, through a real daemon."""

from __future__ import annotations

import csv
import datetime
import json
import os
import time
from pathlib import Path

import trio

from tests.exchange.conftest import fake

# The fakes' rows (tests/fakes/_stock.py): row i is retired when i % 10 == 0, qty i % 50.


def evidence_file(daemon, envelope, suffix: str) -> Path:
    [evidence_id] = [e for e in envelope.evidence if e.endswith(suffix)]
    return daemon.config.state_dir / "evidence" / evidence_id


async def test_a_renamed_column_is_surface_changed_before_any_row_is_returned(rungd_daemon, xfer) -> None:
    await fake("new_release_exporter", "--out", xfer / "exports", "--name", "stock-a.csv", "--release", "4.1")
    old = await rungd_daemon.call("xfer_stock_list", {"cap": 3})
    assert old.status == "ok", old.error
    assert old.fields["returned"] == 3

    await fake("new_release_exporter", "--out", xfer / "exports", "--name", "stock-b.csv", "--release", "4.2")
    os.utime(xfer / "exports" / "stock-b.csv", (time.time() + 5, time.time() + 5))  # surely the newest
    env = await rungd_daemon.call("xfer_stock_list", {"cap": 3})
    assert (env.status, env.error.code, env.outcome, env.next_action) == ("error", "SURFACE_CHANGED", "done", "stop")
    assert env.fields["renamed"] == [["price", "unit_price"]]
    assert env.fields["missing"] == ["price"] and env.fields["added"] == ["unit_price", "warehouse"]
    assert "renamed 'price' -> 'unit_price'" in env.error.message and "warehouse" in env.error.message
    assert "rows" not in env.fields
    assert not [e for e in env.evidence if "rows" in e], "no row may be read, not even into evidence"


async def test_an_added_column_is_tolerated_only_when_the_tool_says_so(rungd_daemon, xfer) -> None:
    await fake("new_release_exporter", "--out", xfer / "exports", "--name", "stock-b.csv", "--release", "4.2")
    # Renamed price is still missing: no policy makes that readable.
    env = await rungd_daemon.call("xfer_stock_list", {"extra": "ignore"})
    assert env.error.code == "SURFACE_CHANGED"
    assert env.fields["missing"] == ["price"]


async def test_an_export_older_than_allowed_is_stale_with_its_as_of(rungd_daemon, xfer) -> None:
    await fake("new_release_exporter", "--out", xfer / "exports", "--name", "stock-a.csv")
    two_hours_ago = time.time() - 7200
    os.utime(xfer / "exports" / "stock-a.csv", (two_hours_ago, two_hours_ago))
    env = await rungd_daemon.call("xfer_stock_list", {"max_age_s": 3600})
    assert (env.error.code, env.outcome, env.error.retry, env.next_action) == ("STALE_EXPORT", "not_started", "no",
                                                                               "stop")
    assert 7100 < env.fields["age_s"] < 7400
    assert env.fields["as_of"] == datetime.datetime.fromtimestamp(int(two_hours_ago), datetime.UTC).isoformat(
    ).replace("+00:00", "Z")

    flagged = await rungd_daemon.call("xfer_stock_list", {"max_age_s": 3600, "stale": "flag", "cap": 1})
    assert flagged.status == "ok" and flagged.fields["stale"] is True
    assert flagged.as_of == env.fields["as_of"]

    fresh = await rungd_daemon.call("xfer_stock_list", {"max_age_s": 10800, "cap": 1})
    assert fresh.status == "ok" and fresh.fields["stale"] is False


async def test_as_of_comes_from_the_file_name_or_a_preamble_line(rungd_daemon, xfer) -> None:
    named = xfer / "exports" / "stock-20240501T0930.csv"
    named.write_text("sku,date,qty,price,status,name\nSKU-1,2024-05-01,3,1.50,active,Widget\n")
    env = await rungd_daemon.call("xfer_stock_list", {"as_of": "name"})
    assert env.status == "ok", env.error
    assert env.as_of == "2024-05-01T09:30:00Z"

    named.unlink()
    (xfer / "exports" / "stock-x.csv").write_text(
        "Stock list\nExported 2024-05-01 11:30:00\nsku,date,qty,price,status,name\nSKU-1,2024-05-01,3,1.50,active,W\n")
    env = await rungd_daemon.call("xfer_stock_list", {"as_of": "preamble", "preamble_lines": 2})
    assert env.status == "ok", env.error
    assert env.as_of == "2024-05-01T09:30:00Z"  # 11:30 in Berlin (CEST) is 09:30 UTC
    assert env.fields["rows"][0]["sku"] == "SKU-1"


async def test_no_export_at_all_is_stale(rungd_daemon) -> None:
    env = await rungd_daemon.call("xfer_stock_list", {})
    assert env.error.code == "STALE_EXPORT"
    assert "no export" in env.error.message


async def test_a_half_written_export_is_never_read(rungd_daemon, xfer, background) -> None:
    # 3000 rows, 100 at a time, 40 ms apart: about 1.2 s of writing, flushed as it goes.
    await background.start("slow_exporter", "--out", xfer / "exports", "--name", "stock-slow.csv", "--rows", 3000,
                           "--chunk", 100, "--delay", 0.04)
    with trio.fail_after(10):
        while not (xfer / "exports" / "stock-slow.csv").exists() or not (xfer / "exports" / "stock-slow.csv").stat(
        ).st_size:
            await trio.sleep(0.01)
    env = await rungd_daemon.call("xfer_stock_list", {"cap": 1})
    assert env.status == "ok", env.error
    assert env.fields["scanned"] == 3000
    assert env.fields["bad_rows"] == 0


async def test_a_writer_lock_file_is_waited_for(rungd_daemon, xfer, background) -> None:
    await background.start("slow_exporter", "--out", xfer / "exports", "--name", "stock-l.csv", "--rows", 1000,
                           "--chunk", 50, "--delay", 0.03, "--lock")
    with trio.fail_after(10):
        while not (xfer / "exports" / "stock-l.csv.lck").exists():
            await trio.sleep(0.01)
    env = await rungd_daemon.call("xfer_stock_list", {"complete": "lock", "cap": 1})
    assert env.status == "ok", env.error
    assert env.fields["scanned"] == 1000


async def test_a_done_marker_is_waited_for(rungd_daemon, xfer) -> None:
    await fake("new_release_exporter", "--out", xfer / "exports", "--name", "stock-m.csv", "--rows", 7)

    async def mark_later() -> None:
        await trio.sleep(0.5)
        (xfer / "exports" / "stock-m.done").touch()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(mark_later)
        started = time.monotonic()
        env = await rungd_daemon.call("xfer_stock_list", {"complete": "marker"})
        assert time.monotonic() - started >= 0.45
    assert env.status == "ok", env.error
    assert env.fields["scanned"] == 7


async def test_an_export_whose_marker_never_comes_is_told_before_the_deadline(rungd_daemon, xfer) -> None:
    # A trial's writer stopped mid-export: every read waited to its deadline and said "the
    # process tree was killed" (there is none). Now it says which file, and what it lacks.
    await fake("new_release_exporter", "--out", xfer / "exports", "--name", "stock-n.csv", "--rows", 7)
    env = await rungd_daemon.call("xfer_stock_list", {"complete": "marker"})
    assert env.error is not None and env.error.code == "STALE_EXPORT", env
    assert "stock-n.csv was still not complete" in env.error.message
    assert "its done marker stock-n.done is missing" in env.error.message
    assert (env.outcome, env.error.retry) == ("not_started", "yes"), env


async def test_a_bom_is_skipped_whatever_the_declared_encoding(rungd_daemon, xfer) -> None:
    name = (await fake("bom_latin1_exporter", "--out", xfer / "exports", "--name", "stock-bom.csv",
                       "--encoding", "utf-8-sig")).strip()
    assert (xfer / "exports" / "stock-bom.csv").read_bytes().startswith(b"\xef\xbb\xbf")
    env = await rungd_daemon.call("xfer_stock_list", {"format": "cp1252", "name": "müller"})
    assert env.status == "ok", env.error
    assert env.fields["encoding"] == "utf-8"
    assert env.fields["rows"][0]["name"] == name == "Müller Schraube"
    assert env.fields["rows"][0]["sku"] == "SKU-00002"


async def test_latin1_is_read_when_declared_and_a_changed_surface_when_not(rungd_daemon, xfer) -> None:
    await fake("bom_latin1_exporter", "--out", xfer / "exports", "--name", "stock-l1.csv", "--encoding", "latin-1")
    env = await rungd_daemon.call("xfer_stock_list", {"format": "latin1"})
    assert env.status == "ok", env.error
    assert {r["name"] for r in env.fields["rows"]} >= {"Müller Schraube", "Crème brûlée", "Ørsted Kabel"}

    wrong = await rungd_daemon.call("xfer_stock_list", {"format": "csv"})
    assert wrong.error.code == "SURFACE_CHANGED"
    assert "does not decode as utf-8" in wrong.error.message
    assert "cp1252" in wrong.error.hint


async def test_tsv_with_a_bom_reads_like_csv(rungd_daemon, xfer) -> None:
    await fake("bom_latin1_exporter", "--out", xfer / "exports", "--name", "stock-t.tsv", "--encoding", "utf-8-sig",
               "--delimiter", "\t")
    env = await rungd_daemon.call("xfer_stock_list", {"format": "tsv", "status": "retired"})
    assert env.status == "ok", env.error
    assert [(r["sku"], r["name"]) for r in env.fields["rows"]] == [("SKU-00000", "Widget"),
                                                                    ("SKU-00010", "Ørsted Kabel")]


async def test_json_lines_are_typed_and_bad_records_counted(rungd_daemon, xfer) -> None:
    lines = [
        {"sku": "SKU-1", "date": "2024-01-03", "qty": 4, "price": "2.50", "status": "active", "name": "Widget"},
        {"sku": "SKU-2", "date": "2024-01-04", "qty": "many", "price": 3, "status": "active", "name": "Gadget"},
        {"sku": "SKU-3", "date": "2024-01-05", "qty": 1, "price": 1.25, "status": "retired"},
        {"sku": "SKU-4", "date": "2024-01-06", "qty": 7, "price": 9, "status": "active", "name": "Bolt"},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\nnot json\n"
    (xfer / "exports" / "stock-1.jsonl").write_text(text)
    env = await rungd_daemon.call("xfer_stock_list", {"format": "jsonl"})
    assert env.status == "ok", env.error
    assert [r["sku"] for r in env.fields["rows"]] == ["SKU-1", "SKU-4"]
    assert env.fields["rows"][0]["price"] == "2.50" and env.fields["rows"][1]["qty"] == 7
    assert (env.fields["scanned"], env.fields["bad_rows"]) == (5, 3)
    samples = {s["record"]: s for s in env.fields["bad_samples"]}
    assert samples[2]["column"] == "qty" and "integer" in samples[2]["message"]
    assert "missing ['name']" in samples[3]["message"]
    assert "not JSON" in samples[5]["message"]


async def test_fixed_width_columns_are_read_by_position_and_checked_by_header(rungd_daemon, xfer) -> None:
    def line(*cells: str) -> str:
        widths = (10, 11, 5, 10, 9, 25)
        return "".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() + "\n"

    text = line("sku", "date", "qty", "price", "status", "name")
    text += line("SKU-1", "2024-01-03", "4", "2.50", "active", "Widget")
    text += line("SKU-2", "2024-01-04", "x", "3.00", "active", "Gadget")
    text += line("SKU-3", "2024-01-05", "1", "1.25", "retired", "Crème")
    (xfer / "exports" / "stock-1.txt").write_text(text, encoding="cp1252")
    env = await rungd_daemon.call("xfer_stock_list", {"format": "fixed"})
    assert env.status == "ok", env.error
    assert [(r["sku"], r["qty"], r["name"]) for r in env.fields["rows"]] == [("SKU-1", 4, "Widget"),
                                                                              ("SKU-3", 1, "Crème")]
    assert env.fields["bad_samples"] == [{"record": 2, "column": "qty", "value": "x",
                                          "message": "Input should be a valid integer, unable to parse string as an "
                                                     "integer"}]


async def test_bad_rows_are_counted_and_sampled_never_dropped_silently(rungd_daemon, xfer) -> None:
    rows = ["sku,date,qty,price,status,name", "SKU-1,2024-01-03,4,2.50,active,Widget",
            "SKU-2,2024-02-30,4,2.50,active,Gadget", "SKU-3,2024-01-03,-1x,2.50,active,Nut",
            "SKU-4,2024-01-03,4,2.50,lost,Bolt", "SKU-5,2024-01-03,4", "SKU-6,2024-01-03,4,2.50,active,Ok"]
    (xfer / "exports" / "stock-bad.csv").write_text("\n".join(rows) + "\n")
    env = await rungd_daemon.call("xfer_stock_list", {})
    assert env.status == "ok", env.error
    assert [r["sku"] for r in env.fields["rows"]] == ["SKU-1", "SKU-6"]
    assert (env.fields["scanned"], env.fields["matched"], env.fields["bad_rows"]) == (6, 2, 4)
    by_record = {s["record"]: (s["column"], s["value"]) for s in env.fields["bad_samples"]}
    assert by_record == {2: ("date", "2024-02-30"), 3: ("qty", "-1x"), 4: ("status", "lost"),
                         5: ("", "['SKU-5', '2024-01-03', '4']")}
    bad = evidence_file(rungd_daemon, env, "bad_rows.jsonl").read_text().splitlines()
    assert len(bad) == 4

    strict = await rungd_daemon.call("xfer_stock_list", {"max_bad_rows": 2})
    assert strict.error.code == "SURFACE_CHANGED"
    assert strict.fields["bad_rows"] == 4  # the whole batch is counted before the limit is judged


async def test_rows_are_capped_truncated_and_all_matches_left_as_evidence(rungd_daemon, xfer) -> None:
    await fake("slow_exporter", "--out", xfer / "exports", "--name", "stock-big.csv", "--rows", 2000, "--chunk", 2000,
               "--delay", 0)
    env = await rungd_daemon.call("xfer_stock_list", {"status": "active", "min_price": "100", "cap": 5})
    assert env.status == "ok", env.error
    expected = [i for i in range(2000) if i % 10 and (i % 1000) / 4 >= 100]
    assert env.fields["matched"] == len(expected)
    assert env.fields["returned"] == 5 and [r["sku"] for r in env.fields["rows"]] == [
        f"SKU-{i:05d}" for i in expected[:5]]
    assert env.truncated is True
    assert f"{len(expected)} rows matched" in env.narrow and "evidence" in env.narrow
    with open(evidence_file(rungd_daemon, env, "rows.csv"), newline="") as f:
        written = list(csv.reader(f))
    assert written[0] == ["sku", "date", "qty", "price", "status", "name"]
    assert [r[0] for r in written[1:]] == [f"SKU-{i:05d}" for i in expected]


async def test_typed_filters_compare_dates_numbers_and_sets(rungd_daemon, xfer) -> None:
    await fake("slow_exporter", "--out", xfer / "exports", "--name", "stock-f.csv", "--rows", 200, "--chunk", 200,
               "--delay", 0)
    env = await rungd_daemon.call("xfer_stock_list", {"date_from": "2024-01-02", "date_to": "2024-01-03",
                                                      "cap": 100})
    assert env.status == "ok", env.error
    assert {r["date"] for r in env.fields["rows"]} == {"2024-01-02", "2024-01-03"}
    assert env.fields["matched"] == len([i for i in range(200) if i % 31 in (1, 2)])
    env = await rungd_daemon.call("xfer_stock_list", {"skus": ["SKU-00007", "SKU-00150", "SKU-99999"]})
    assert [r["sku"] for r in env.fields["rows"]] == ["SKU-00007", "SKU-00150"]
    env = await rungd_daemon.call("xfer_stock_list", {"min_price": "9.5", "status": "active", "cap": 100})
    assert all(float(r["price"]) >= 9.5 for r in env.fields["rows"])


async def test_json_lines_evidence_holds_typed_rows(rungd_daemon, xfer) -> None:
    await fake("slow_exporter", "--out", xfer / "exports", "--name", "stock-e.csv", "--rows", 30, "--chunk", 30,
               "--delay", 0)
    env = await rungd_daemon.call("xfer_stock_list", {"status": "retired", "evidence": "jsonl", "cap": 1})
    rows = [json.loads(line) for line in evidence_file(rungd_daemon, env, "rows.jsonl").read_text().splitlines()]
    assert [r["sku"] for r in rows] == ["SKU-00000", "SKU-00010", "SKU-00020"]
    assert rows[1] == {"sku": "SKU-00010", "date": "2024-01-11", "qty": 10, "price": "2.50", "status": "retired",
                       "name": "Ørsted Kabel"}


async def test_a_newer_export_being_written_is_waited_for_not_skipped(rungd_daemon, xfer, background) -> None:
    await fake("slow_exporter", "--out", xfer / "exports", "--name", "stock-old.csv", "--rows", 10, "--chunk", 10,
               "--delay", 0)
    first = await rungd_daemon.call("xfer_stock_list", {"cap": 0})  # the watch index exists from here on
    assert first.fields["export"] == "stock-old.csv"
    await background.start("slow_exporter", "--out", xfer / "exports", "--name", "stock-new.csv", "--rows", 2000,
                           "--chunk", 100, "--delay", 0.04)
    with trio.fail_after(10):
        while not (xfer / "exports" / "stock-new.csv").exists():
            await trio.sleep(0.01)
    env = await rungd_daemon.call("xfer_stock_list", {"cap": 0})
    assert env.status == "ok", env.error
    assert (env.fields["export"], env.fields["scanned"]) == ("stock-new.csv", 2000)


def test_a_file_opened_outside_the_roots_is_refused_even_after_a_swap(tmp_path) -> None:
    import os

    import pytest

    from rungd.exchange.paths import OutsideRoots, Roots

    inside = tmp_path / "exports"
    inside.mkdir()
    secret = tmp_path / "secret.toml"
    secret.write_text('token = "hunter2"')
    link = inside / "stock.csv"
    link.symlink_to(secret)  # what the checked path became after the check
    roots = Roots(inside)
    fd = os.open(link, os.O_RDONLY)
    try:
        with pytest.raises(OutsideRoots):
            roots.check_open(fd, link)
    finally:
        os.close(fd)
