"""The ledgerbook plugin: rung 3 tools around Ledgerbook, a legacy accounting program.

Ledgerbook (``ledgerbook.py`` in this folder) has no API: it writes invoice exports into a
folder (cp1252, ';' separated, a timestamp in the name) and takes import files from a
watched inbox. The two tools show the whole file-exchange contract:

* ``ledgerbook_invoices_list`` reads the newest complete export, checks its header before
  any row, reports ``as_of`` and refuses one older than an hour, filters with typed inputs,
  returns at most ``limit`` rows and leaves every match on disk as evidence. With
  ``fresh=true`` it first asks Ledgerbook for a new export (a rung 2 run) and waits for it.
* ``ledgerbook_invoices_import`` writes a batch into the inbox atomically under our lock
  and Ledgerbook's lock conventions, runs Ledgerbook's one-shot import, waits until the file
  reached the processed folder, and counts the batch's invoices in a fresh export before
  and after: ``changed``, ``no_change`` or IMPORT_PARTIAL. A deadline after the rename is
  ``unknown``, settled by the list tool counting the batch.

Ledgerbook's folders live under the daemon's state folder: ``<state>/ledgerbook/``.
"""

from __future__ import annotations

import datetime
import sys
import weakref
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rungd.sdk import (
    LCK_LOCK,
    LIBREOFFICE_LOCK,
    OUTSIDE_ROOTS,
    AsOf,
    CallContext,
    Complete,
    Csv,
    Description,
    ErrorRule,
    Export,
    ExportSpec,
    Filter,
    Heading,
    Importer,
    ImportSpec,
    PluginSettings,
    Program,
    Result,
    Roots,
    RuledOut,
    SettleSpec,
    StepDown,
    Taken,
    Timing,
    Tool,
    ToolInputs,
    Watcher,
    check_exit,
    hookimpl,
    run,
)

# A fake accounting program: offered only when a config opts in with
# [plugins.settings.ledgerbook] (the embedded default does), never by default in production.
DEMO_ONLY = True
PROGRAM = Path(__file__).with_name("ledgerbook.py")
MAX_AGE_S = 3600.0
BATCH = Annotated[
    str,
    Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$",
          description="The import batch's name: letters, digits, '-' and '_', at most 32 characters. It names "
          "the file written into Ledgerbook's inbox and tags every invoice of the batch.",
          examples=["may-2024-week2"]),
]


class InvoiceRow(BaseModel):
    """One row of Ledgerbook's invoice export, as the export spells its columns."""

    model_config = ConfigDict(frozen=True)

    invoice: str = Field(alias="Invoice", pattern=r"^INV-[0-9]{4,10}$")
    date: datetime.date = Field(alias="Date")
    customer: str = Field(alias="Customer")
    amount: Decimal = Field(alias="Amount")
    currency: Literal["EUR", "USD"] = Field(alias="Currency")
    status: Literal["open", "paid"] = Field(alias="Status")
    batch: str = Field(alias="Batch")


class ImportRow(BaseModel):
    """One row of a Ledgerbook import file."""

    invoice: str
    date: datetime.date
    customer: str
    amount: Decimal
    currency: Literal["EUR", "USD"]


class ListInputs(ToolInputs):
    customer: Annotated[str | None, Field(min_length=1, max_length=64,
                                          description="Only invoices whose customer name contains this text "
                                          "(any case).", examples=["müller"])] = None
    status: Annotated[Literal["open", "paid"] | None, Field(description="Only open or only paid invoices.",
                                                            examples=["open"])] = None
    date_from: Annotated[datetime.date | None, Field(strict=False, description="Only invoices dated on or after "
                                                     "this day (YYYY-MM-DD).", examples=["2024-04-01"])] = None
    date_to: Annotated[datetime.date | None, Field(strict=False, description="Only invoices dated on or before "
                                                   "this day (YYYY-MM-DD).", examples=["2024-04-30"])] = None
    min_amount: Annotated[Decimal | None, Field(strict=False, ge=0, description="Only invoices of at least this "
                                                "amount, in the invoice's currency.", examples=["500.00"])] = None
    batch: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$",
                                       description="Only invoices imported in this batch.",
                                       examples=["may-2024-week2"])] = None
    limit: Annotated[int, Field(ge=0, le=50, description="At most this many rows in the answer; all matches "
                                "stay in the evidence file.", examples=[20])] = 20
    fresh: Annotated[bool, Field(description="Ask Ledgerbook for a new export first, instead of reading its "
                                 "newest one (takes a few seconds more).", examples=[False])] = False


class InvoiceIn(ToolInputs):
    invoice: Annotated[str, Field(pattern=r"^INV-[0-9]{4,10}$", description="The invoice number, unique in "
                                  "Ledgerbook.", examples=["INV-2001"])]
    date: Annotated[datetime.date, Field(strict=False, description="The invoice date (YYYY-MM-DD).",
                                         examples=["2024-05-14"])]
    customer: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\r\n]+$",
                                   description="The customer's name as Ledgerbook knows it.",
                                   examples=["Müller GmbH"])]
    amount: Annotated[Decimal, Field(strict=False, ge=0, max_digits=12, decimal_places=2,
                                     description="The invoice total, two decimals at most.", examples=["420.00"])]
    currency: Annotated[Literal["EUR", "USD"], Field(description="The invoice currency.", examples=["EUR"])]


class ImportInputs(ToolInputs):
    batch: BATCH
    invoices: Annotated[list[InvoiceIn], Field(min_length=1, max_length=200,
                                               description="The invoices to import, 1 to 200.",
                                               examples=[[{"invoice": "INV-2001", "date": "2024-05-14",
                                                           "customer": "Müller GmbH", "amount": "420.00",
                                                           "currency": "EUR"}]])]


STALE = ErrorRule("STALE_EXPORT", "no", "repair", "call again with fresh=true to have Ledgerbook write a new export",
                  "Ledgerbook's newest export is older than an hour, or there is none yet")


class Ledgerbook:
    """The two tools, bound to one Ledgerbook whose folders are under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.books = root / "books.csv"
        self.exports = root / "exports"
        self.inbox = root / "inbox"
        self.processed = root / "processed"
        self.watcher = Watcher()
        weakref.finalize(self, self.watcher.close)
        roots = Roots(root)
        self.export = Export(ExportSpec(
            folder=self.exports,
            pattern=r"invoices-\d{8}T\d{6}\.\d{3}Z\.csv",
            row_model=InvoiceRow,
            format=Csv(delimiter=";", encoding="cp1252"),
            roots=roots,
            complete=Complete(stable_s=0.2, lock_names=("{name}.lck",)),
            as_of=AsOf("name", pattern=r"invoices-(\d{8}T\d{6}\.\d{3})Z", format="%Y%m%dT%H%M%S.%f", tz="UTC"),
            max_age_s=MAX_AGE_S,
            stale_hint=STALE.hint,
            stale_next_action="repair",
            newest_by="name",
        ), watcher=self.watcher)
        self.importer = Importer(ImportSpec(
            folder=self.inbox,
            row_model=ImportRow,
            lock_file=root / "locks" / "inbox.lock",
            format=Csv(encoding="cp1252"),
            name_pattern=r"batch-[A-Za-z0-9][A-Za-z0-9_-]{0,31}\.csv",
            roots=roots,
            conventions=(LIBREOFFICE_LOCK, LCK_LOCK),
            lock_targets=(self.books,),
            taken=Taken(gone=True, processed=self.processed),
        ), watcher=self.watcher)

    def _argv(self, *args: str) -> tuple[str, ...]:
        return (sys.executable, str(PROGRAM), *args, "--books", str(self.books))

    async def fresh_export(self, ctx: CallContext) -> Path:
        """Have Ledgerbook write a new export now (rung 2) and return it once it appeared.

        Cancellation: the runner kills Ledgerbook's tree on the call's deadline; a
        half-written export is left for the next read to wait on or skip.
        """

        async def run_export() -> None:
            self.exports.mkdir(parents=True, exist_ok=True)
            done = await run(ctx, Program(argv=self._argv("export", "--out", str(self.exports))))
            check_exit(done, {})

        return await self.export.wait_newer(await self.export.newest(), run_export)

    async def invoices_list(self, ctx: CallContext, inputs: ListInputs) -> Result:
        """The list tool: the newest (or a fresh) export, filtered and capped."""
        path = await self.fresh_export(ctx) if inputs.fresh else None
        filters = [Filter(field, op, value) for field, op, value in (
            ("customer", "contains", inputs.customer), ("status", "eq", inputs.status),
            ("date", "ge", inputs.date_from), ("date", "le", inputs.date_to),
            ("amount", "ge", inputs.min_amount), ("batch", "eq", inputs.batch)) if value is not None]
        read = await self.export.read(ctx, filters=filters, cap=inputs.limit, cap_bytes=2600, path=path)
        return read.result(narrow="narrow with customer, status, date_from/date_to, min_amount or batch")

    async def count_batch(self, ctx: CallContext, batch: str) -> int:
        """The read-back: how many invoices of ``batch`` a fresh export holds."""
        path = await self.fresh_export(ctx)
        read = await self.export.read(ctx, filters=[Filter("batch", "eq", batch)], cap=0, path=path)
        return read.matched

    async def invoices_import(self, ctx: CallContext, inputs: ImportInputs) -> Result:
        """The import tool: the batch through the inbox, counted before and after."""
        rows = [ImportRow(**invoice.model_dump()) for invoice in inputs.invoices]

        async def process_imports() -> None:
            # Ledgerbook takes its inbox when asked; a scheduled run would do the same.
            done = await run(ctx, Program(argv=self._argv(
                "import", "--inbox", str(self.inbox), "--processed", str(self.processed))))
            check_exit(done, {})

        result = await self.importer.run(
            ctx, f"batch-{inputs.batch}.csv", rows,
            count=lambda c: self.count_batch(c, inputs.batch),
            verified_by="the batch's invoices counted in a fresh Ledgerbook export, before and after (rung 3)",
            after_write=process_imports,
        )
        result.fields["batch"] = inputs.batch
        return result


def tools(root: Path) -> list[Tool]:
    """The ledgerbook tools for a Ledgerbook kept under ``root``."""
    book = Ledgerbook(root)
    # A desktop accounting program: no API and no command line that adds invoices; its
    # export and its watched inbox are the doors that work with nobody at its screen.
    ruled_out = (RuledOut(1, "present", "Ledgerbook has no API"),
                 RuledOut(2, "present", "its command line only converts files; it cannot list or add invoices"))
    list_heading = Heading(3, ruled_out, (StepDown("SURFACE_CHANGED", count=2, to="stop: a person checks the "
                                                   "export's columns after a Ledgerbook update"),),
                           climb="a Ledgerbook release with an invoice API")
    import_heading = Heading(
        3, ruled_out,
        (StepDown(("SURFACE_CHANGED", "IMPORT_PARTIAL"), count=2, within_s=86400,
                  to="rung 5, Ledgerbook's import dialog, under review"),
         StepDown("UNEXPECTED_STATE", to="stop: something else changes the batch")),
        climb="a Ledgerbook release with an invoice API -> rung 1", attempts=2)
    list_tool = Tool(
        name="ledgerbook_invoices_list",
        description=Description(
            does="Lists invoices from Ledgerbook's newest invoice export, filtered; changes nothing. The export's "
            "time is in as_of; exports older than an hour are refused.",
            use_when="you need invoices of a customer, a period, a status or an import batch, or to check what a "
            "batch import added.",
            do_not_use_when="you want to add invoices; use ledgerbook_invoices_import.",
            returns="rows (invoice, date, customer, amount, currency, status, batch), returned, matched, "
            "scanned, bad_rows, export; truncated with evidence when more match than limit.",
            on_error="STALE_EXPORT: call again with fresh=true. SURFACE_CHANGED: the export format changed, "
            "stop and tell a person. OUTSIDE_ROOTS: stop. TIMEOUT: retry once.",
            if_unknown="if you do not know the customer's exact name, filter with part of it; do not guess "
            "invoice numbers.",
        ),
        inputs=ListInputs,
        outputs={"rows": "matching invoices, at most limit", "returned": "rows in this answer",
                 "matched": "rows that passed the filters", "scanned": "records in the export",
                 "bad_rows": "records that do not fit the row model (counted, sampled in bad_samples)",
                 "export": "the export file's name", "stale": "older than allowed (never true: refused)"},
        handler=book.invoices_list,
        errors=(STALE, ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("UNEXPECTED_STATE"),
                ErrorRule.core("TIMEOUT"), OUTSIDE_ROOTS),
        timing=Timing(deadline_s=30, commit_point="callback"),
        cap_bytes=4096,
        log_fields=("customer", "status", "batch", "fresh"),
        heading=list_heading,
        lint_waivers={"errors.auth_required_missing": "Ledgerbook runs as the daemon's user and never asks for a credential"},
    )
    import_tool = Tool(
        name="ledgerbook_invoices_import",
        description=Description(
            does="Imports a batch of new invoices into Ledgerbook through its inbox folder and counts the batch "
            "before and after. A write, undone by voiding the batch in Ledgerbook; a repeat with the same "
            "request_id changes nothing more.",
            use_when="the user asked to record new invoices in Ledgerbook.",
            do_not_use_when="you only want to read invoices; use ledgerbook_invoices_list.",
            returns="batch, file, written, count_before, count_after, added, and effect changed (all added) "
            "or no_change (all were there already).",
            on_error="LOCKED: someone has Ledgerbook's files open, retry later. IMPORT_PARTIAL: fewer arrived "
            "than were sent, stop and tell a person. OUTSIDE_ROOTS: stop. TIMEOUT, outcome unknown: run the "
            "settle read first.",
            if_unknown="if you do not know an invoice's number, date, amount or currency, ask the user; never "
            "invent them.",
        ),
        inputs=ImportInputs,
        outputs={"batch": "the batch name", "file": "the file written into the inbox",
                 "written": "invoices written", "count_before": "the batch's invoices before",
                 "count_after": "the batch's invoices after, read back", "added": "count_after - count_before",
                 "taken_by": "how Ledgerbook was seen taking the file"},
        handler=book.invoices_import,
        side_effect="reversible",
        errors=(ErrorRule.core("LOCKED"), ErrorRule.core("IMPORT_PARTIAL"), ErrorRule.core("UNEXPECTED_STATE"),
                STALE, ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("TIMEOUT"), OUTSIDE_ROOTS),
        timing=Timing(deadline_s=30, commit_point="callback",
                      settle=SettleSpec("ledgerbook_invoices_list", {"batch": "$batch", "fresh": True, "limit": 0})),
        cap_bytes=2048,
        concurrency=1,
        log_fields=("batch",),
        heading=import_heading,
        lint_waivers={"errors.auth_required_missing": "Ledgerbook runs as the daemon's user and never asks for a credential"},
    )
    return [list_tool, import_tool]


@hookimpl
def rungd_register_tools(register: Callable[[Tool], None], settings: PluginSettings) -> None:
    for tool in tools(settings.state_dir):
        register(tool)
