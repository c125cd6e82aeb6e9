"""Export tools in a tool file: rung 3 with no Python, against real files on disk."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rungd.core.errors import ConfigError
from rungd_plugins.declarative import read_tool_file

TOOL_FILE = """
[program]
name = "erp"
command = "true"              # the program that writes the exports; nothing runs it here

[tools.erp_stock_list]
[tools.erp_stock_list.description]
does = "Lists stock levels from the ERP's nightly export. Changes nothing."
use_when = "you need how many units of an item are in stock."
do_not_use_when = "you need live numbers; the export is nightly."
returns = "rows (item_no, qty, updated), matched, as_of."
on_error = "STALE_EXPORT (stop), SURFACE_CHANGED (stop)."
if_unknown = "ask the user which item."

[tools.erp_stock_list.export]
folder = "exports"
pattern = "stock-*.csv"
delimiter = ";"
encoding = "cp1252"
columns = { "Item No." = "string", "Qty" = "integer", "Updated" = "date", "Note" = "string" }
optional_columns = ["Note"]
max_age_s = MAX_AGE
stable_s = 0.2
max_rows = 2

[tools.erp_stock_list.inputs.item]
description = "Only this item number."
example = "A-100"
required = false
pattern = "^[A-Z]-[0-9]+$"
filter = { column = "Item No.", op = "eq" }

[tools.erp_stock_list.inputs.min_qty]
type = "integer"
description = "Only items with at least this many units."
example = 5
required = false
filter = { column = "Qty", op = "ge" }
"""


def setup(short_tmp: Path, header: str = "Item No.;Qty;Updated;Note", max_age: str = "3600") -> Path:
    tools = short_tmp / "tools"
    (tools / "exports").mkdir(parents=True)
    (tools / "erp.toml").write_text(TOOL_FILE.replace("MAX_AGE", max_age))
    rows = [header, "A-100;12;2024-05-01;Müller", "A-200;3;2024-05-01;", "B-300;40;2024-05-02;Straße", "C-1;x;2024-05-02;"]
    export = tools / "exports" / "stock-20240502.csv"
    export.write_bytes(("\r\n".join(rows) + "\r\n").encode("cp1252"))
    old = time.time() - 5
    os.utime(export, (old, old))
    return tools


@pytest.fixture
def rungd_config_toml(short_tmp: Path) -> str:
    return f'[plugins]\ntool_dirs = ["{setup(short_tmp)}"]\n'


async def test_export_rows_are_typed_filtered_and_capped(rungd_daemon) -> None:
    env = await rungd_daemon.call("erp_stock_list", {"min_qty": 5})
    assert env.status == "ok", env.error
    rows = env.fields["rows"]
    assert [r["Item No."] if "Item No." in r else r["item_no"] for r in rows] == ["A-100", "B-300"]
    assert env.fields["bad_rows"] == 1  # "x" is not a quantity: counted, never silently dropped
    assert env.as_of is not None
    one = await rungd_daemon.call("erp_stock_list", {"item": "B-300"})
    assert one.fields["matched"] == 1
    everything = await rungd_daemon.call("erp_stock_list", {})
    assert everything.truncated and "filter with item, min_qty" in everything.narrow


async def test_a_renamed_column_is_caught_before_any_row(short_tmp, nursery) -> None:
    from rungd.config import load_config
    from rungd.testing import start_daemon, write_config

    tools = setup(short_tmp, header="Item No.;Quantity;Updated;Note")
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n')))
    env = await daemon.call("erp_stock_list", {})
    assert (env.error.code, env.next_action) == ("SURFACE_CHANGED", "stop")
    said = env.error.message + env.error.hint + str(env.fields)
    assert "Qty" in said and "Quantity" in said  # what was expected and what was found
    assert "rows" not in env.fields
    daemon.daemon.stop()


async def test_an_old_export_is_stale(short_tmp, nursery) -> None:
    from rungd.config import load_config
    from rungd.testing import start_daemon, write_config

    tools = setup(short_tmp, max_age="1")
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n')))
    env = await daemon.call("erp_stock_list", {})
    assert env.error.code == "STALE_EXPORT"
    daemon.daemon.stop()


def test_an_export_tool_cannot_write_or_filter_unknown_columns(short_tmp) -> None:
    tools = setup(short_tmp)
    path = tools / "erp.toml"
    path.write_text(path.read_text().replace('filter = { column = "Qty"', 'filter = { column = "Quantity"'))
    with pytest.raises(ConfigError, match="'Quantity' is not one of the export's columns"):
        read_tool_file(path)
    path.write_text(TOOL_FILE.replace("MAX_AGE", "60").replace("[tools.erp_stock_list.description]",
                                                               'side_effect = "reversible"\n[tools.erp_stock_list.description]'))
    with pytest.raises(ConfigError, match="only reads"):
        read_tool_file(path)


def test_the_shipped_examples_load(tmp_path) -> None:
    from rungd.config import embedded_configs

    for path in sorted((embedded_configs() / "examples").glob("*.toml")):
        assert read_tool_file(path).tools, path
