"""What a file or a tool file can make rung 3 and the declarative parsers do: bounded work.

A 20,000-column header, a 16 MB line, a JSON value nested a hundred thousand deep, a
catastrophically backtracking pattern, an export folder deleted and recreated: each ends
in bounded time with a clear code, and the event loop and Trio's default thread limiter
(which the ledger uses) stay free.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import trio

from rungd.core.errors import ConfigError, SurfaceChanged
from rungd.exchange.formats import Csv, JsonLines, Limits, Stopped, open_reader
from rungd.exchange.patterns import catastrophic
from rungd.exchange.rows import header_diff
from rungd_plugins.declarative.parse import check_pattern, parse_off_loop, parse_output
from rungd_plugins.declarative.schema import ParseSpec
from tests.conftest import record_loop_gaps
from tests.exchange.conftest import rungd_config_toml, xfer  # noqa: F401  (the fixtures)

HEADER = "sku,date,qty,price,status,name\n"
ROW = "SKU-1,2024-05-01,3,1.50,active,Widget\n"




def write_export(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text)
    then = time.time() - 30
    os.utime(folder / name, (then, then))


async def test_an_export_folder_deleted_and_recreated_is_watched_again(rungd_daemon, xfer) -> None:
    write_export(xfer / "exports", "stock-a.csv", HEADER + ROW)
    first = await rungd_daemon.call("xfer_stock_list", {})
    assert first.status == "ok", first.error
    shutil.rmtree(xfer / "exports")
    (xfer / "exports").mkdir()
    write_export(xfer / "exports", "stock-b.csv", HEADER + ROW + ROW)
    again = await rungd_daemon.call("xfer_stock_list", {})
    assert again.status == "ok", again.error
    assert (again.fields["export"], again.fields["scanned"]) == ("stock-b.csv", 2)


async def test_an_export_folder_moved_away_and_replaced_is_watched_again(rungd_daemon, xfer) -> None:
    write_export(xfer / "exports", "stock-a.csv", HEADER + ROW)
    assert (await rungd_daemon.call("xfer_stock_list", {})).status == "ok"
    os.rename(xfer / "exports", xfer / "exports.old")
    (xfer / "exports").mkdir()
    write_export(xfer / "exports", "stock-c.csv", HEADER + ROW)
    again = await rungd_daemon.call("xfer_stock_list", {})
    assert again.status == "ok" and again.fields["export"] == "stock-c.csv", again.error


async def test_a_20000_column_header_is_refused_at_once_naming_the_limit(rungd_daemon, xfer) -> None:
    columns = ["sku", "date", "qty", "price", "status", "name"] + [f"c{i}" for i in range(20_000)]
    write_export(xfer / "exports", "stock-a.csv", ",".join(columns) + "\n")
    start = time.monotonic()
    envelope = await rungd_daemon.call("xfer_stock_list", {})
    elapsed = time.monotonic() - start
    assert (envelope.error.code, envelope.next_action) == ("SURFACE_CHANGED", "stop"), envelope.error
    assert "max_columns" in envelope.error.message and "20006 columns" in envelope.error.message
    assert elapsed < 2.0


def test_a_header_diff_of_20000_columns_is_linear() -> None:
    expected = [f"col{i}" for i in range(20_000)]
    found = [f"col{i}" for i in range(10, 20_000)] + [f"new{i}" for i in range(10)]
    start = time.monotonic()
    diff = header_diff(expected, found)
    assert time.monotonic() - start < 0.5
    assert diff.missing == [f"col{i}" for i in range(10)] and len(diff.added) == 10


async def test_a_16_mb_line_is_refused_naming_the_limit_without_rescanning(rungd_daemon, xfer) -> None:
    write_export(xfer / "exports", "stock-a.csv", HEADER + "x" * (16 << 20) + "\n")
    start = time.monotonic()
    envelope = await rungd_daemon.call("xfer_stock_list", {})
    elapsed = time.monotonic() - start
    assert envelope.error.code == "SURFACE_CHANGED", envelope.error
    assert "max_line_chars" in envelope.error.message and "the tool's export limits" in envelope.error.hint
    assert elapsed < 3.0


def test_a_long_line_under_the_limit_is_read_in_linear_time(short_tmp: Path) -> None:
    path = short_tmp / "wide.csv"
    path.write_text("a,b\n" + "x" * (8 << 20) + ",y\n")
    start = time.monotonic()
    with open_reader(Csv(), path, limits=Limits(max_line_chars=16 << 20)) as reader:
        [batch] = list(reader.batches(10, width=2))
    assert len(batch[0][0]) == 8 << 20
    assert time.monotonic() - start < 1.5


def test_a_stop_request_ends_a_read_at_its_next_chunk(short_tmp: Path) -> None:
    path = short_tmp / "big.csv"
    path.write_text("a,b\n" + "1,2\n" * 200_000)
    stop = threading.Event()
    with open_reader(Csv(), path, stop=stop) as reader:
        batches = reader.batches(1000, width=2)
        next(batches)
        stop.set()
        with pytest.raises(Stopped):
            for _ in batches:
                pass


def test_a_json_lines_record_nested_too_deep_is_a_bad_row_not_a_crash(short_tmp: Path) -> None:
    path = short_tmp / "deep.jsonl"
    path.write_text('{"a": 1}\n' + '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with open_reader(JsonLines(), path) as reader:
        records = [r for batch in reader.batches(10) for r in batch]
    assert len(records) == 2 and "nested too deep" in records[1].reason


def test_a_special_file_given_by_path_is_never_opened(short_tmp: Path) -> None:
    fifo = short_tmp / "export.csv"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(Exception, match="FIFO"), open_reader(Csv(), fifo):
        pass
    assert time.monotonic() - start < 1


CATASTROPHIC = [r"(a+)+$", r"(a|a)*$", r"(.*)*x", r"^(\w+\s?)*$", r"(a|aa)+$", r"(x+x+)+y"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_pattern_is_refused_at_load_naming_file_and_key(pattern: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_pattern(Path("/etc/rungd/tools/app.toml"), "tools.app_disk_show.parse.pattern", pattern)
    message = str(caught.value)
    assert message.startswith("/etc/rungd/tools/app.toml: key tools.app_disk_show.parse.pattern: ")
    assert "backtrack" in message and "hint:" in message


@pytest.mark.parametrize("pattern", [r"(\d+\.){3}\d+", r"(?:\s+\w+)*", r"^(?P<used>\d+) (?P<free>\d+)$",
                                     r"(?:a++)+", r"Do you want to continue\? \[Y/n\]$", r"(?P<k>\w+)=(?P<v>.*)"])
def test_common_patterns_pass_the_check(pattern: str) -> None:
    assert catastrophic(pattern) is None


def test_a_catastrophic_pattern_never_runs_even_without_the_load_check() -> None:
    spec = ParseSpec(kind="regex", pattern=r"^(?P<v>(a+)+)$", fields={"v": "string"})
    start = time.monotonic()
    with pytest.raises(SurfaceChanged, match="refused"):
        parse_output(spec, "a" * 30 + "!")
    assert time.monotonic() - start < 0.5


def test_json_output_nested_too_deep_is_surface_changed() -> None:
    with pytest.raises(SurfaceChanged):
        parse_output(ParseSpec(kind="json", fields={"a": "string"}), "[" * 100_000 + "]" * 100_000)


async def test_a_slow_parse_is_abandoned_at_its_bound_and_the_loop_stays_free() -> None:
    # Polynomial, so the static check lets it through; on this output it runs for minutes.
    pattern = r"(?P<a>.*)x(?P<b>.*)y(?P<c>.*)z"
    assert catastrophic(pattern) is None
    spec = ParseSpec(kind="regex", pattern=pattern, fields={"a": "string"})
    gaps: list[float] = []
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(record_loop_gaps, gaps, 0.02)
        with pytest.raises(SurfaceChanged, match="longer than"):
            await parse_off_loop(spec, "xy" * 3000, timeout_s=0.5)
        nursery.cancel_scope.cancel()
    assert time.monotonic() - start < 1.5
    assert max(gaps) < 0.3
    assert trio.to_thread.current_default_thread_limiter().borrowed_tokens == 0


def test_the_refusal_explains_itself() -> None:
    reason = catastrophic(r"(a+)+$")
    assert reason is not None and "repeat inside a repeat" in reason
    assert re.compile(r"(a++)+$")  # the rewrite the hint suggests compiles
