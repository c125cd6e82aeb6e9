"""Export tools in a tool file: a read answered from the newest complete export a program
writes (rung 3), through ``rungd.exchange``. No program runs; the file is the interface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rungd.sdk import CallContext, ConfigError, ErrorRule, Result, ToolInputs, exchange

from rungd_plugins.declarative.columns import field_name, row_model
from rungd_plugins.declarative.schema import ToolSpec

ERRORS = (ErrorRule.core("STALE_EXPORT"), ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("TIMEOUT"),
          exchange.OUTSIDE_ROOTS, exchange.NOT_A_FILE)


def check(path: Path, key: str, spec: ToolSpec) -> None:
    """Load-time checks of an export tool; raises ConfigError naming the file and key."""
    def fail(where: str, problem: str) -> ConfigError:
        return ConfigError(f"{path}: key {key}.{where}: {problem}")

    export = spec.export
    assert export is not None
    if spec.side_effect != "read":
        raise fail("side_effect", "an export tool only reads; imports need a Python plugin (rungd.exchange)")
    if spec.argv or spec.parse.kind != "none":
        raise fail("argv", "an export tool runs no program: drop argv and parse")
    for name in export.optional_columns:
        if name not in export.columns:
            raise fail("export.optional_columns", f"{name!r} is not one of its columns")
    for name, value in spec.inputs.items():
        if value.filter is not None and value.filter.column not in export.columns:
            raise fail(f"inputs.{name}.filter.column", f"{value.filter.column!r} is not one of the export's columns "
                                                       f"({', '.join(export.columns)})")
    if export.as_of != "mtime" and not export.as_of_pattern:
        raise fail("export.as_of_pattern", "as_of from the name or preamble needs a pattern whose group is the time")


def fmt_of(kind: str, delimiter: str, encoding: str, **options: Any) -> Any:
    """The rungd.exchange format a tool file names."""
    if kind == "jsonl":
        return exchange.JsonLines(encoding=encoding, **{k: v for k, v in options.items() if k == "preamble_lines"})
    if kind == "tsv":
        return exchange.Tsv(encoding=encoding, **options)
    return exchange.Csv(delimiter=delimiter, encoding=encoding, **options)


class ExportTool:
    """One export tool of a tool file: its handler, and the count an import tool reads back."""

    def __init__(self, path: Path, name: str, spec: ToolSpec) -> None:
        export_spec = spec.export
        assert export_spec is not None
        self.spec = export_spec
        folder = Path(export_spec.folder)
        folder = folder if folder.is_absolute() else path.parent / folder
        self.export = exchange.Export(exchange.ExportSpec(
            folder=folder,
            pattern=exchange.glob(export_spec.pattern),
            row_model=row_model(f"{name.title().replace('_', '')}Row", export_spec.columns,
                                export_spec.optional_columns),
            format=fmt_of(export_spec.format, export_spec.delimiter, export_spec.encoding,
                          preamble_lines=export_spec.preamble_lines),
            complete=exchange.Complete(stable_s=export_spec.stable_s, lock_names=tuple(export_spec.lock_names),
                                       done_marker=export_spec.done_marker),
            as_of=exchange.AsOf(source=export_spec.as_of, pattern=export_spec.as_of_pattern),
            max_age_s=export_spec.max_age_s,
            stale=export_spec.stale,
            extra_columns=export_spec.extra_columns,
        ), watcher=exchange.Watcher())  # a watched index: finding the newest file never rescans the folder
        self.filtering = {name: value.filter for name, value in spec.inputs.items() if value.filter is not None}
        self.narrow = f"filter with {', '.join(self.filtering)}" if self.filtering else "ask for a narrower export"

    def filters(self, values: dict[str, Any]) -> list[exchange.Filter]:
        return [exchange.Filter(field_name(f.column), f.op, values[name])
                for name, f in self.filtering.items() if values.get(name) is not None]

    async def handle(self, ctx: CallContext, inputs: ToolInputs) -> Result:
        read = await self.export.read(ctx, filters=self.filters(inputs.model_dump()), cap=self.spec.max_rows)
        return read.result(narrow=self.narrow)

    async def count(self, ctx: CallContext, values: dict[str, Any]) -> int:
        """How many rows the newest export holds that match these input values."""
        read = await self.export.read(ctx, filters=self.filters(values), cap=1)
        return read.matched
