"""Columns of the files a tool file reads and writes (rung 3): types, and the row model."""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Mapping
from typing import Annotated, Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

# The types a tool file names for an input, a parsed field or a column.
TYPES: dict[str, type] = {
    "string": str, "integer": int, "number": float, "decimal": decimal.Decimal, "boolean": bool,
    "date": datetime.date, "datetime": datetime.datetime,
}


def field_name(column: str) -> str:
    """A Python name for a column header ("Item No." -> "item_no"); the header stays its alias."""
    name = re.sub(r"\W+", "_", column.strip().lower()).strip("_")
    return name if name and not name[0].isdigit() else f"c_{name}"


def row_model(name: str, columns: Mapping[str, str], optional: list[str], *, described: bool = False) -> type[BaseModel]:
    """One row of a file: a field per column, keyed by the header (its alias), typed.

    Validation is lax: a cell (or a record a model sends as JSON) carries dates and
    decimals as text.
    """
    fields: dict[str, Any] = {}
    for column, kind in columns.items():
        info = Field(alias=column, description=f"the {column} column" if described else None)
        if column in optional:
            fields[field_name(column)] = (Annotated[TYPES[kind] | None, info], None)
        else:
            fields[field_name(column)] = (Annotated[TYPES[kind], info], ...)
    return pydantic.create_model(name, __config__=ConfigDict(extra="forbid", frozen=True), **fields)
