"""Import tools in a tool file: rung 3 writes with no Python, against a real importer
(tests/fakes/partial_importer) polling a real folder."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rungd.config import load_config
from rungd.core.errors import ConfigError
from rungd.testing import start_daemon, write_config
from rungd_plugins.declarative import read_tool_file
from tests.conftest import FAKES

COUNT = '''
    import json, sys
    books = sys.argv[1]
    try:
        lines = [json.loads(l) for l in open(books) if l.strip()]
    except FileNotFoundError:
        lines = []
    print(f"count: {len(lines)}")
'''

TOOL_FILE = """
[program]
name = "stock"
command = "{counter}"

[tools.stock_books_count]
argv = ["{books}"]
[tools.stock_books_count.description]
does = "Counts the records in the stock program's books. Changes nothing."
use_when = "you need to know how many records it holds."
do_not_use_when = "you want to add records; use stock_records_import."
returns = "count."
on_error = "SURFACE_CHANGED (stop), TIMEOUT (retry once)."
if_unknown = "ask the user."
[tools.stock_books_count.parse]
kind = "key_value"
fields = {{ count = "integer" }}

[tools.stock_records_import]
side_effect = "reversible"
deadline_s = 15
[tools.stock_records_import.description]
does = "Adds stock records to the stock program through its import folder. A write; a repeat with the same request_id adds nothing more."
use_when = "the user asks to record stock movements."
do_not_use_when = "you only want to count; use stock_books_count."
returns = "file, written, count_before, count_after, taken_by."
on_error = "LOCKED (retry later), IMPORT_PARTIAL (stop; tell a person), TIMEOUT with outcome unknown (count before any retry)."
if_unknown = "ask the user for the sku and quantity; never invent them."
[tools.stock_records_import.inputs.batch]
description = "A name for this batch of records."
example = "b1"
pattern = "^[a-z0-9]{{1,16}}$"
[tools.stock_records_import.import]
folder = "{inbox}"
file_name = "orders-{{batch}}.csv"
columns = {{ sku = "string", qty = "integer" }}
rows_input = "records"
rows_description = "The records to add: sku and quantity."
rows_example = [{{ sku = "SKU-00001", qty = 3 }}]
taken = {{ gone = true }}
count = {{ tool = "stock_books_count", field = "count" }}
"""


@pytest.fixture
def setup(short_tmp: Path, fake_program) -> dict[str, Path]:
    paths = {name: short_tmp / name for name in ("inbox", "processed", "tools")}
    for folder in paths.values():
        folder.mkdir()
    paths["books"] = short_tmp / "books.jsonl"
    counter = fake_program("count_books", COUNT)
    (paths["tools"] / "stock.toml").write_text(TOOL_FILE.format(counter=counter, books=paths["books"],
                                                                inbox=paths["inbox"]))
    return paths


@pytest.fixture
def importer(setup: dict[str, Path], request) -> Iterator[subprocess.Popen[bytes]]:
    take = getattr(request, "param", "all")
    proc = subprocess.Popen([sys.executable, str(FAKES / "partial_importer"), "--inbox", str(setup["inbox"]),
                             "--processed", str(setup["processed"]), "--books", str(setup["books"]), "--take", take],
                            stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def daemon_for(nursery, short_tmp: Path, tools: Path):
    return await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n')))


RECORDS = [{"sku": "SKU-1", "qty": 2}, {"sku": "SKU-2", "qty": 5}, {"sku": "SKU-3", "qty": 1}]


async def test_an_import_is_written_taken_and_counted(nursery, short_tmp, setup, importer) -> None:
    daemon = await daemon_for(nursery, short_tmp, setup["tools"])
    env = await daemon.call("stock_records_import", {"batch": "b1", "records": RECORDS}, request_id="i1")
    assert (env.status, env.effect) == ("ok", "changed"), env.error
    assert (env.fields["count_before"], env.fields["count_after"], env.fields["written"]) == (0, 3, 3)
    assert (setup["processed"] / "orders-b1.csv").exists()
    definition = daemon.daemon.tools["stock_records_import"].tool
    assert definition.timing.commit_point == "callback"
    assert definition.input_schema()["properties"]["records"]["maxItems"] == 1000
    daemon.daemon.stop()


@pytest.mark.parametrize("importer", ["half"], indirect=True)
async def test_a_partial_import_is_reported_with_both_counts(nursery, short_tmp, setup, importer) -> None:
    daemon = await daemon_for(nursery, short_tmp, setup["tools"])
    env = await daemon.call("stock_records_import", {"batch": "b2", "records": RECORDS}, request_id="i2")
    assert env.error.code == "IMPORT_PARTIAL", env.error
    assert (env.fields["count_before"], env.fields["count_after"]) == (0, 1)
    daemon.daemon.stop()


async def test_a_file_a_person_has_open_is_never_written(nursery, short_tmp, setup) -> None:
    (setup["inbox"] / ".~lock.orders-b3.csv#").write_text(",alice,desk-7,2024-05-14T10:00:00,alice;")
    daemon = await daemon_for(nursery, short_tmp, setup["tools"])
    env = await daemon.call("stock_records_import", {"batch": "b3", "records": RECORDS}, request_id="i3")
    assert (env.error.code, env.outcome) == ("LOCKED", "not_started")
    assert "alice" in str(env.fields) + env.error.message + env.error.hint
    assert not (setup["inbox"] / "orders-b3.csv").exists()
    daemon.daemon.stop()


async def test_bad_records_are_bad_input_and_touch_nothing(nursery, short_tmp, setup) -> None:
    daemon = await daemon_for(nursery, short_tmp, setup["tools"])
    env = await daemon.call("stock_records_import", {"batch": "b4", "records": [{"sku": "S", "qty": "many"}]},
                            request_id="i4")
    assert env.error.code == "BAD_INPUT"
    assert list(setup["inbox"].iterdir()) == []
    daemon.daemon.stop()


def test_an_import_must_count_through_a_read_of_its_file(setup) -> None:
    path = setup["tools"] / "stock.toml"
    path.write_text(path.read_text().replace('count = { tool = "stock_books_count", field = "count" }',
                                             'count = { tool = "stock_records_import" }'))
    with pytest.raises(ConfigError, match="must be a read tool"):
        read_tool_file(path)


def test_a_dry_run_writes_nothing_into_a_real_import_folder(short_tmp, setup) -> None:
    # Found by an attack: eval's dry run stood in for programs, but an import whose count read
    # answered went on to write the model's rows into the real watched folder, for the real
    # importer to take. Now an import refuses before anything, whatever its reads say.
    from rungd.authoring.dryrun import evaluate_dry
    from rungd.authoring.evalharness import Task

    def model(request):
        if any(m["role"] == "tool" for m in request["messages"]):
            return {"text": "done"}
        return {"tool_calls": [{"id": "t1", "name": "stock_records_import",
                                "arguments": {"batch": "b7", "records": RECORDS, "request_id": "dry-7"}}]}

    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{setup["tools"]}"]\n'))
    report, _ = evaluate_dry(config, [Task("imp", "Record these", "stock_records_import", {"batch": "b7"})], model)
    [record] = report.records
    assert record.outcome.startswith("error not_started FAILED"), record.outcome
    assert list(setup["inbox"].iterdir()) == []
