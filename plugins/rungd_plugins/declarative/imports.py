"""Import tools in a tool file: a write that drops a file into the folder a program
imports from (rung 3), through ``rungd.exchange``: validated rows, locks respected, an
atomic rename as the commit point, and a count read back before and after."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field
from rungd.sdk import CallContext, ConfigError, ErrorRule, Result, ToolInputs, exchange

from rungd_plugins.declarative.columns import row_model
from rungd_plugins.declarative.exports import fmt_of
from rungd_plugins.declarative.schema import ImportFileSpec, ToolSpec
from rungd_plugins.declarative.templates import substitute

ERRORS = tuple(ErrorRule.core(code) for code in ("LOCKED", "IMPORT_PARTIAL", "UNEXPECTED_STATE", "TIMEOUT",
                                                   "SURFACE_CHANGED", "STALE_EXPORT")) + (
    exchange.OUTSIDE_ROOTS, exchange.NOT_A_FILE)
Count = Callable[[CallContext, dict[str, Any]], Awaitable[int]]


def check(path: Path, key: str, spec: ToolSpec, specs: dict[str, ToolSpec]) -> None:
    """Load-time checks of an import tool; raises ConfigError naming the file and key."""
    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: key {key}.{where}: {problem}")

    spec_import = spec.import_
    assert spec_import is not None
    if spec.side_effect == "read":
        raise fail("side_effect", "an import changes what the program holds: reversible, visible or irreversible")
    if spec.argv or spec.parse.kind != "none" or spec.verify is not None:
        raise fail("argv", "an import tool runs no program and is read back through import.count: "
                           "drop argv, parse and verify")
    if spec_import.rows_input in spec.inputs:
        raise fail(f"inputs.{spec_import.rows_input}", "the rows input is made from import.columns; do not declare it")
    target = specs.get(spec_import.count.tool)
    if target is None or target.side_effect != "read":
        raise fail("import.count.tool", f"{spec_import.count.tool!r} must be a read tool of this same file")
    if target.export is None and (spec_import.count.field is None
                                  or spec_import.count.field not in target.parse.fields
                                  or target.parse.fields[spec_import.count.field] != "integer"):
        raise fail("import.count.field", f"name the integer field {spec_import.count.tool} parses as the count")
    for name in spec_import.optional_columns:
        if name not in spec_import.columns:
            raise fail("import.optional_columns", f"{name!r} is not one of its columns")


def record_model(tool: str, spec: ImportFileSpec) -> type[BaseModel]:
    """One record of the file, keyed by column header: what the model sends and what is written."""
    return row_model(f"{tool.title().replace('_', '')}Record", spec.columns, spec.optional_columns, described=True)


def rows_field(spec: ImportFileSpec, model: type[BaseModel]) -> tuple[Any, Any]:
    return (Annotated[list[model], Field(min_length=1, max_length=spec.max_rows,  # type: ignore[valid-type]
                                         description=spec.rows_description, examples=[spec.rows_example])], ...)


class ImportTool:
    """One import tool of a tool file."""

    def __init__(self, path: Path, name: str, spec: ToolSpec, model: type[BaseModel], count: Count) -> None:
        spec_import = spec.import_
        assert spec_import is not None
        self.spec = spec_import

        def under(value: str | None) -> Path | None:
            if value is None:
                return None
            return Path(value) if Path(value).is_absolute() else path.parent / value

        folder = under(spec_import.folder)
        assert folder is not None
        # Our lock lives beside the watched folder, never in it: the program must not see it.
        lock = under(spec_import.lock_file) or folder.parent / f".{folder.name}.rungd-lock"
        taken = spec_import.taken
        self.importer = exchange.Importer(exchange.ImportSpec(
            folder=folder,
            row_model=model,
            lock_file=lock,
            format=fmt_of(spec_import.format, spec_import.delimiter, spec_import.encoding,
                          **({"bom": spec_import.bom} if spec_import.format != "jsonl" else {})),
            name_pattern=spec_import.name_pattern,
            lock_targets=tuple(p for p in (under(t) for t in spec_import.lock_targets) if p is not None),
            taken=exchange.Taken(gone=taken.gone, processed=under(taken.processed), receipt=taken.receipt,
                                 receipt_folder=under(taken.receipt_folder)),
        ), watcher=exchange.Watcher())
        self.count = count
        self.verified_by = f"{spec_import.count.tool} counted before and after the import (rung 3)"

    async def handle(self, ctx: CallContext, inputs: ToolInputs) -> Result:
        rows = getattr(inputs, self.spec.rows_input)
        values = {k: v for k, v in inputs.model_dump().items() if k != self.spec.rows_input}
        name = str(substitute(self.spec.file_name, values))
        count_inputs = {k: substitute(v, values) for k, v in self.spec.count.inputs.items()}

        async def count(ctx: CallContext) -> int:
            return await self.count(ctx, count_inputs)

        return await self.importer.run(ctx, name, rows, count=count, verified_by=self.verified_by)
