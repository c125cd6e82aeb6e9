"""Tools around rungd.exchange for the file-exchange tests, loaded as a plugin file.

The folders live under ``<state>/xfer``: ``exports`` (the fakes in tests/fakes write
there), ``inbox``, ``processed``, ``receipts`` and ``books.jsonl`` (where the fake
importers record what they took). Inputs choose the export's format and rules, so one
tool covers every case a test needs; the daemon does the rest exactly as for a real
plugin (deadlines, commit point, settle, envelope caps).
"""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import trio
from pydantic import BaseModel, Field
from rungd.core.contract import (
    Description,
    ErrorRule,
    Result,
    SettleSpec,
    Timing,
    Tool,
    ToolInputs,
)
from rungd.exchange import (
    NOT_A_FILE,
    OUTSIDE_ROOTS,
    AsOf,
    Complete,
    Csv,
    Export,
    ExportSpec,
    Filter,
    FixedWidth,
    Importer,
    ImportSpec,
    JsonLines,
    Taken,
    Tsv,
    Watcher,
)
from rungd.core.hookspecs import hookimpl


class Stock(BaseModel):
    sku: str
    date: datetime.date
    qty: int
    price: Decimal
    status: Literal["active", "retired"]
    name: str


class Item(BaseModel):
    sku: str
    qty: int


FORMATS: dict[str, tuple[str, Any]] = {
    "csv": (r"stock-.*\.csv", Csv()),
    "cp1252": (r"stock-.*\.csv", Csv(encoding="cp1252")),
    "latin1": (r"stock-.*\.csv", Csv(encoding="latin-1")),
    "tsv": (r"stock-.*\.tsv", Tsv()),
    "jsonl": (r"stock-.*\.jsonl", JsonLines()),
    "fixed": (r"stock-.*\.txt", FixedWidth((("sku", 0, 10), ("date", 10, 21), ("qty", 21, 26), ("price", 26, 36),
                                             ("status", 36, 45), ("name", 45, 70)))),
}
COMPLETE = {
    "stable": Complete(stable_s=0.3),
    "lock": Complete(stable_s=0.0, lock_names=("{name}.lck",), open_handles=False),
    "marker": Complete(stable_s=0.0, done_marker="{stem}.done", open_handles=False),
}
AS_OF = {
    "mtime": AsOf(),
    "name": AsOf("name", pattern=r"stock-(\d{8}T\d{4})", format="%Y%m%dT%H%M", tz="UTC"),
    "preamble": AsOf("preamble", pattern=r"^Exported (.+)$", tz="Europe/Berlin"),
}


def describe(does: str) -> Description:
    return Description(does=does, use_when="testing.", do_not_use_when="not testing.", returns="fields.",
                       on_error="codes.", if_unknown="ask.")


class ListInputs(ToolInputs):
    format: Annotated[Literal["csv", "cp1252", "latin1", "tsv", "jsonl", "fixed"],
                      Field(description="Export format.", examples=["csv"])] = "csv"
    complete: Annotated[Literal["stable", "lock", "marker"], Field(description="Completeness rule.",
                                                                   examples=["stable"])] = "stable"
    as_of: Annotated[Literal["mtime", "name", "preamble"], Field(description="as_of source.",
                                                                 examples=["mtime"])] = "mtime"
    preamble_lines: Annotated[int, Field(ge=0, le=3, description="Lines before the header.", examples=[0])] = 0
    status: Annotated[Literal["active", "retired"] | None, Field(description="Status.", examples=["active"])] = None
    min_price: Annotated[Decimal | None, Field(strict=False, description="Min price.", examples=["10"])] = None
    date_from: Annotated[datetime.date | None, Field(strict=False, description="From.", examples=["2024-01-02"])] = None
    date_to: Annotated[datetime.date | None, Field(strict=False, description="To.", examples=["2024-01-09"])] = None
    name: Annotated[str | None, Field(description="Name contains.", examples=["müller"])] = None
    skus: Annotated[list[str] | None, Field(description="SKUs.", examples=[["SKU-00001"]])] = None
    cap: Annotated[int, Field(ge=0, le=100, description="Row cap.", examples=[5])] = 20
    max_age_s: Annotated[float | None, Field(strict=False, description="Max age.", examples=[3600])] = None
    stale: Annotated[Literal["refuse", "flag"], Field(description="Stale policy.", examples=["refuse"])] = "refuse"
    max_bad_rows: Annotated[int | None, Field(description="Bad row limit.", examples=[10])] = None
    extra: Annotated[Literal["refuse", "ignore"], Field(description="Extra columns.", examples=["refuse"])] = "refuse"
    evidence: Annotated[Literal["csv", "jsonl"], Field(description="Evidence format.", examples=["csv"])] = "csv"


class ItemIn(ToolInputs):
    sku: Annotated[str, Field(description="SKU.", examples=["SKU-1"])]
    qty: Annotated[int, Field(description="Quantity.", examples=[3])]


class ImportInputs(ToolInputs):
    name: Annotated[str, Field(max_length=80, description="File name.", examples=["batch-1.csv"])]
    rows: Annotated[list[ItemIn], Field(description="Rows.", examples=[[{"sku": "SKU-1", "qty": 3}]])]
    taken: Annotated[Literal["gone", "processed", "receipt", "count"],
                     Field(description="Taken signal.", examples=["gone"])] = "gone"
    slow_count_s: Annotated[float, Field(strict=False, ge=0, description="Delay of the first count.",
                                         examples=[0])] = 0
    lock_books: Annotated[bool, Field(description="Books are a lock target.", examples=[False])] = False


class CountInputs(ToolInputs):
    name: Annotated[str, Field(max_length=80, description="File name.", examples=["batch-1.csv"])]


class Xfer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.watcher = Watcher()

    def export(self, inputs: ListInputs) -> Export:
        pattern, fmt = FORMATS[inputs.format]
        if inputs.preamble_lines:
            fmt = type(fmt)(**{**fmt.__dict__, "preamble_lines": inputs.preamble_lines})
        return Export(ExportSpec(
            folder=self.root / "exports", pattern=pattern, row_model=Stock, format=fmt,
            complete=COMPLETE[inputs.complete], as_of=AS_OF[inputs.as_of], max_age_s=inputs.max_age_s,
            stale=inputs.stale, max_bad_rows=inputs.max_bad_rows, extra_columns=inputs.extra,
            evidence=inputs.evidence,
        ), watcher=self.watcher)

    async def stock_list(self, ctx: Any, inputs: ListInputs) -> Result:
        filters = [Filter(f, op, v) for f, op, v in (
            ("status", "eq", inputs.status), ("price", "ge", inputs.min_price), ("date", "ge", inputs.date_from),
            ("date", "le", inputs.date_to), ("name", "contains", inputs.name), ("sku", "in", inputs.skus),
        ) if v is not None]
        read = await self.export(inputs).read(ctx, filters=filters, cap=inputs.cap, cap_bytes=6000)
        result = read.result(narrow="filter by status, price or date")
        result.fields["encoding"] = read.encoding
        return result

    def count_file(self, name: str) -> int:
        books = self.root / "books.jsonl"
        if not books.exists():
            return 0
        return sum(1 for line in books.read_text().splitlines() if json.loads(line)["file"] == name)

    async def items_import(self, ctx: Any, inputs: ImportInputs) -> Result:
        taken = {
            "gone": Taken(),
            "processed": Taken(gone=False, processed=self.root / "processed"),
            "receipt": Taken(gone=False, receipt="{stem}.ok", receipt_folder=self.root / "receipts"),
            "count": Taken(gone=False, count_changed=True, count_poll_s=0.2),
        }[inputs.taken]
        importer = Importer(ImportSpec(
            folder=self.root / "inbox", row_model=Item, lock_file=self.root / "locks" / "inbox.lock",
            name_pattern=r"batch-[0-9a-z-]{1,20}\.csv", roots=None,
            lock_targets=(self.root / "books.jsonl",) if inputs.lock_books else (),
            taken=taken,
        ), watcher=self.watcher)
        delays = [inputs.slow_count_s]

        async def count(_ctx: Any) -> int:
            if delays:
                await trio.sleep(delays.pop())
            return self.count_file(inputs.name)

        rows = [Item(sku=r.sku, qty=r.qty) for r in inputs.rows]
        return await importer.run(ctx, inputs.name, rows, count=count, verified_by="books.jsonl counted")

    async def items_count(self, ctx: Any, inputs: CountInputs) -> Result:
        return Result(fields={"name": inputs.name, "count": self.count_file(inputs.name)})


@hookimpl
def rungd_register_tools(register: Any, settings: Any) -> None:
    # The daemon's state folder, where the tests' ``xfer`` fixture looks (settings.state_dir
    # is this plugin's own folder inside it).
    xfer = Xfer(settings.state_dir.parent / "xfer")
    for folder in ("exports", "inbox", "processed", "receipts"):
        (xfer.root / folder).mkdir(parents=True, exist_ok=True)
    register(Tool(name="xfer_stock_list", description=describe("Reads the stock export."), inputs=ListInputs,
                  outputs={"rows": "rows"}, handler=xfer.stock_list, cap_bytes=16384,
                  errors=(ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("STALE_EXPORT"), OUTSIDE_ROOTS, NOT_A_FILE),
                  timing=Timing(deadline_s=10, commit_point="callback")))
    register(Tool(name="xfer_items_import", description=describe("Imports items."), inputs=ImportInputs,
                  outputs={"count_after": "count"}, handler=xfer.items_import, side_effect="reversible",
                  errors=(ErrorRule.core("LOCKED"), ErrorRule.core("IMPORT_PARTIAL"), OUTSIDE_ROOTS, NOT_A_FILE),
                  timing=Timing(deadline_s=3, commit_point="callback",
                                settle=SettleSpec("xfer_items_count", {"name": "$name"}))))
    register(Tool(name="xfer_items_count", description=describe("Counts imported items."), inputs=CountInputs,
                  outputs={"count": "count"}, handler=xfer.items_count))
