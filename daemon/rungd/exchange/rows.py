"""Rows of an export, checked against the tool's pydantic row model: header, types, filters.

The row model is the single truth about an export's columns: its fields (or their
aliases) are the column names, its annotations and constraints the types. From it a
``RowSchema`` does three things:

* ``bind(header)`` compares the export's header with the model before any row is read and
  raises SURFACE_CHANGED with what is missing, added and probably renamed. Columns are
  always mapped by name, never by position.
* ``Binding.check(batch)`` validates a batch of raw records. Pydantic is the judge of
  every value: a value is good exactly when the model's field accepts it, and bad rows
  come back with the column and pydantic's message, never dropped silently.
* ``Filter`` values are typed by the same fields, so ``amount >= "100"`` compares
  decimals, not strings.

Why it is built this way: a million-row export must be read at close to the speed of
Python's csv module, and calling pydantic once per row costs four times the parse. So a
batch is checked column by column, and only what needs pydantic reaches it:

* a text column needs no check; a literal column is checked against its set of values
  in one C-level call; a plain number column is matched, joined, against one strict
  pattern (a subset of what pydantic accepts, giving the same value);
* dates and any other type go to pydantic once per distinct value (remembered across
  batches), and so does any value a shortcut does not accept, so pydantic's verdict and
  message are what a caller sees;
* values are converted only where they are needed: in a filter, in a returned row.

A model with validators of its own (``field_validator``, ``model_validator``) is validated
whole, row by row, through pydantic instead; JSON Lines cells, typed already, go through
pydantic a column at a time. ``tests/exchange/test_rows.py`` checks every path against
csv.reader plus pydantic row by row.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import collections
import itertools
import operator
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from rungd.core.errors import BadInput, SurfaceChanged
from rungd.exchange.formats import FlatBatch, Malformed

# Number cells a shortcut may accept without asking pydantic: each pattern accepts only
# text pydantic accepts too, and the constructor beside it gives the value pydantic gives.
_NUMBER: dict[Any, tuple[str, Callable[[str], Any]]] = {
    int: (r"-?[0-9]{1,18}+", int),
    float: (r"-?[0-9]++(?:\.[0-9]++)?+", float),
    Decimal: (r"-?[0-9]++(?:\.[0-9]++)?+", Decimal),
}
_DATE_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_LAX = pydantic.ConfigDict(strict=False)
# Joins a column's cells so one match checks them all; a cell holding it would make the
# joined text lie about how many cells it has, so the count is checked too.
_SEP = "\x1f"
# Distinct values remembered per column across batches (and calls); beyond this many, new
# values are still checked, just not remembered.
CACHE_LIMIT = 100_000

Kind = Literal["str", "literal", "number", "date", "other"]


@dataclasses.dataclass
class Column:
    """One column of the row model: its name in the file, its field, and how to check it."""

    name: str
    field: str
    kind: Kind
    nullable: bool
    adapter: TypeAdapter[Any]  # list[field type]: validates many values in one call
    pattern: str = ""  # numbers: text pydantic surely accepts, giving what ``convert`` gives
    allowed: frozenset[str] = frozenset()
    convert: Callable[[str], Any] | None = None  # numbers and dates: the constructor
    whole: re.Pattern[str] | None = None  # numbers: matches a column's cells joined by _SEP
    known: dict[Any, Any] = dataclasses.field(default_factory=dict)  # value -> typed value
    refused: dict[Any, str] = dataclasses.field(default_factory=dict)  # value -> pydantic's reason


@dataclasses.dataclass(frozen=True)
class BadRow:
    """One rejected record: where, which column, and pydantic's reason."""

    record: int
    column: str
    message: str
    value: str

    def sample(self) -> dict[str, Any]:
        return {"record": self.record, "column": self.column, "message": self.message, "value": self.value}


@dataclasses.dataclass(frozen=True)
class HeaderDiff:
    """How an export's header differs from the row model's columns."""

    expected: list[str]
    found: list[str]
    missing: list[str]
    added: list[str]
    renamed: list[tuple[str, str]]

    def fields(self) -> dict[str, Any]:
        return {"expected": self.expected, "found": self.found, "missing": self.missing,
                "added": self.added, "renamed": [list(pair) for pair in self.renamed]}

    def summary(self) -> str:
        parts = []
        if self.renamed:
            parts.append("renamed " + ", ".join(f"{a!r} -> {b!r}" for a, b in self.renamed))
        old = {a for a, _ in self.renamed}
        new = {b for _, b in self.renamed}
        if missing := [m for m in self.missing if m not in old]:
            parts.append(f"missing {missing}")
        if added := [a for a in self.added if a not in new]:
            parts.append(f"added {added}")
        return "; ".join(parts) or "no difference"


def _normal(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _first_positions(names: Sequence[str]) -> dict[str, int]:
    positions: dict[str, int] = {}
    for i, name in enumerate(names):
        positions.setdefault(name, i)
    return positions


# Pairs of (missing, added) names compared by similarity; beyond this, only a column at
# the same position counts as renamed, so a header of any width is diffed in linear time.
RENAME_PAIRS = 10_000


def header_diff(expected: Sequence[str], found: Sequence[str]) -> HeaderDiff:
    """Compare two headers. A missing and an added column with similar names, or at the
    same position, are reported as probably renamed.

    Linear in the headers' widths (sets and position maps, not list lookups), plus at most
    ``RENAME_PAIRS`` name comparisons: a 20,000-column header costs milliseconds."""
    at_expected, at_found = _first_positions(expected), _first_positions(found)
    missing = [c for c in expected if c not in at_found]
    added = [c for c in found if c not in at_expected]
    renamed: list[tuple[str, str]] = []
    free = dict.fromkeys(added)  # an ordered set: first similar candidate wins ties, as before
    compare = len(missing) * len(added) <= RENAME_PAIRS
    for old in missing:
        if compare:
            candidates: Sequence[str] = list(free)
        else:
            same = found[at_expected[old]] if at_expected[old] < len(found) else None
            candidates = [same] if same is not None and same in free else []
        best, score = None, 0.0
        for new in candidates:
            ratio = _similarity(old, new) if compare else 0.0
            if at_expected[old] == at_found[new]:
                ratio = max(ratio, 0.6)
            if ratio > score:
                best, score = new, ratio
        if best is not None and score >= 0.6:
            renamed.append((old, best))
            del free[best]
    return HeaderDiff(list(expected), list(found), missing, added, renamed)


def _similarity(old: str, new: str) -> float:
    a, b = _normal(old), _normal(new)
    ratio = difflib.SequenceMatcher(None, a, b).ratio()
    if a and b and (a in b or b in a):
        ratio = max(ratio, 0.8)
    return ratio


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not type(None)]
        inner = functools.reduce(operator.or_, rest)
        return inner, len(rest) < len(args)
    return annotation, False


def _column(name: str, field_name: str, info: pydantic.fields.FieldInfo) -> Column:
    annotation, nullable = _unwrap_optional(info.annotation)
    full = typing.Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    adapter: TypeAdapter[Any] = TypeAdapter(list[full], config=_LAX)  # type: ignore[valid-type]
    column = Column(name, field_name, "other", nullable, adapter)
    constrained = bool(info.metadata)
    literal = typing.get_origin(annotation) is Literal
    if annotation is str and not constrained:
        column.kind = "str"
    elif literal and not constrained and all(type(a) is str for a in typing.get_args(annotation)):
        column.kind = "literal"
        column.allowed = frozenset(typing.get_args(annotation))
    elif annotation in _NUMBER and not constrained:
        column.kind = "number"
        column.pattern, column.convert = _NUMBER[annotation]
        column.whole = re.compile(f"{column.pattern}(?:{_SEP}{column.pattern})*+")
    elif annotation is datetime.date and not constrained:
        column.kind = "date"
        column.convert = datetime.date.fromisoformat
    return column


def _has_own_validators(model: type[BaseModel]) -> bool:
    decorators = model.__pydantic_decorators__
    return bool(decorators.validators or decorators.field_validators or decorators.root_validators
                or decorators.model_validators)


class RowSchema:
    """The columns of a row model, and the checks built from them.

    Args:
        model: the tool's row model. Each field is a column; its name in the file is the
            field's alias when it has one. Validation is lax (a cell is text: "12" is an
            int), whatever the model's own strictness; an empty cell is None for a field
            that allows None.
    """

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self.columns: list[Column] = []
        for field_name, info in model.model_fields.items():
            alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
            self.columns.append(_column(alias or field_name, field_name, info))
        self.names = [c.name for c in self.columns]
        self.by_field = {c.field: c for c in self.columns}
        self.whole_rows = _has_own_validators(model)
        self.row_adapter: TypeAdapter[Any] = TypeAdapter(list[model])  # type: ignore[valid-type]

    def bind(self, found: Sequence[str], *, extra: Literal["refuse", "ignore"] = "refuse",
             where: str = "the export", text: bool = True) -> Binding:
        """Map the model's columns onto the file's header, by name.

        Args:
            found: the header as the file spells it.
            extra: whether columns the model does not know make the header differ.
            where: the file's name, for the message.
            text: every cell is text (CSV, TSV, fixed-width; not JSON Lines).

        Raises:
            SurfaceChanged: a column is missing (or, with ``extra="refuse"``, added), or a
                name is repeated. Fields: expected, found, missing, added, renamed.
        """
        diff = header_diff(self.names, found)
        repeated = sorted(c for c, n in collections.Counter(found).items() if n > 1)
        if diff.missing or repeated or (diff.added and extra == "refuse"):
            summary = diff.summary() if not repeated else f"repeated columns {repeated}; {diff.summary()}"
            raise SurfaceChanged(
                f"the header of {where} differs from what the tool expects: {summary}",
                hint="no row was read. The program's export format changed (a new release?); a person must "
                f"update the tool's row model. Expected columns: {', '.join(self.names)}",
                outcome="done",
                fields=diff.fields(),
            )
        at = _first_positions(found)
        return Binding(self, [at[c] for c in self.names], len(found), text=text)


class Binding:
    """A row schema bound to one file's header: where each column sits in a record."""

    def __init__(self, schema: RowSchema, positions: list[int], width: int, *, text: bool = True) -> None:
        self.schema = schema
        self.positions = positions
        self.width = width
        self.text = text
        self.in_order = positions == list(range(width))
        self._used = set(positions)
        self._pick = operator.itemgetter(*positions) if len(positions) > 1 else (lambda r: (r[positions[0]],))

    def check(self, batch: list[Any], first_record: int) -> Checked:
        """Validate one batch of raw records.

        Args:
            batch: records as a ``Reader`` yields them.
            first_record: the 1-based number of ``batch[0]`` in the file.

        Returns:
            A ``Checked`` batch: the good records' positions, the bad ones with reasons,
            and typed access to any cell.
        """
        if isinstance(batch, FlatBatch) and not self.schema.whole_rows:
            # Well shaped by construction: check the columns straight from their slices.
            checked = self._check_columns(batch, lambda i: first_record + i,
                                          cells=[batch.column(p) if p in self._used else () for p in range(self.width)])
            checked.record = lambda position: first_record + position
            checked.plain = True
            return checked
        width = self.width
        # A Malformed record has length 0, so one C-level pass tells whether all are well shaped.
        shaped = batch if set(map(len, batch)) <= {width} else [
            r for r in batch if type(r) is list and len(r) == width]
        bad: list[BadRow] = []
        numbers: list[int] | None = None
        if len(shaped) != len(batch):
            numbers = []
            for index, row in enumerate(batch):
                if type(row) is list and len(row) == width:
                    numbers.append(first_record + index)
                else:
                    reason = row.reason if isinstance(row, Malformed) else f"{len(row)} fields, expected {width}"
                    bad.append(BadRow(first_record + index, "", reason, _show(row)))

        def number(position: int) -> int:
            return numbers[position] if numbers is not None else first_record + position

        if self.schema.whole_rows:
            checked = self._check_whole(shaped, number)
        else:
            checked = self._check_columns(shaped, number)
        checked.bad[:0] = bad
        checked.record = number
        return checked

    def _check_columns(self, shaped: Sequence[Sequence[Any]], number: Callable[[int], int],
                       cells: Sequence[Sequence[Any]] | None = None) -> Checked:
        if cells is None:
            cells = list(zip(*shaped)) if shaped else [() for _ in range(self.width)]
        typed: list[Typed] = []
        rejected: dict[int, BadRow] = {}
        for column, position in zip(self.schema.columns, self.positions):
            values = cells[position]
            column_typed, errors = _check_column(column, values, self.text)
            typed.append(column_typed)
            for index, message in errors.items():
                if index not in rejected:
                    rejected[index] = BadRow(number(index), column.name, message, _show(values[index]))
        bad = [rejected[i] for i in sorted(rejected)]
        good = range(len(shaped)) if not rejected else [i for i in range(len(shaped)) if i not in rejected]
        return Checked(self, shaped, typed, good, bad)

    def _check_whole(self, shaped: list[list[Any]], number: Callable[[int], int]) -> Checked:
        columns = self.schema.columns
        dicts = [{c.name: (None if c.nullable and row[p] == "" else row[p]) for c, p in zip(columns, self.positions)}
                 for row in shaped]
        adapter = self.schema.row_adapter
        rejected: dict[int, BadRow] = {}
        try:
            models = adapter.validate_python(dicts)
        except pydantic.ValidationError as exc:
            for err in exc.errors(include_url=False):
                index = int(err["loc"][0])
                if index not in rejected:
                    column = str(err["loc"][1]) if len(err["loc"]) > 1 else ""
                    rejected[index] = BadRow(number(index), column, err["msg"], _show(err.get("input")))
            keep = [i for i in range(len(dicts)) if i not in rejected]
            models = [None] * len(dicts)
            for index, model in zip(keep, adapter.validate_python([dicts[i] for i in keep])):
                models[index] = model
        bad = [rejected[i] for i in sorted(rejected)]
        good = [i for i in range(len(shaped)) if i not in rejected]
        typed = [Typed([getattr(m, c.field) if m is not None else None for m in models]) for c in columns]
        return Checked(self, shaped, typed, good, bad)


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else "" if isinstance(value, Malformed) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Typed:
    """The typed values of one column of a batch, converted only when asked for.

    Args:
        cells: the column's cells as read (None: take them from ``rows`` at ``position``
            when first needed).
        convert: cell -> value (None: the cell is its own value).
        nullable: an empty cell is None.
    """

    __slots__ = ("_cells", "_column", "convert", "nullable", "position", "rows")

    def __init__(self, cells: Sequence[Any] | None, convert: Callable[[Any], Any] | None = None,
                 nullable: bool = False, *, rows: Sequence[Sequence[Any]] = (), position: int = 0) -> None:
        self._cells = cells
        self.convert = convert
        self.nullable = nullable
        self.rows = rows
        self.position = position
        self._column: Sequence[Any] | None = None

    @property
    def cells(self) -> Sequence[Any]:
        if self._cells is None:
            self._cells = list(map(operator.itemgetter(self.position), self.rows))
        return self._cells

    def at(self, i: int) -> Any:
        value = self._cells[i] if self._cells is not None else self.rows[i][self.position]
        if self.nullable and value == "":
            return None
        return self.convert(value) if self.convert is not None else value

    def column(self) -> Sequence[Any]:
        """Every value of the column, typed."""
        if self._column is None:
            convert, cells = self.convert, self.cells
            if self.nullable:
                self._column = [None if v == "" else convert(v) if convert else v for v in cells]
            elif convert is not None:
                self._column = list(map(convert, cells))
            else:
                self._column = cells
        return self._column


def _check_column(column: Column, values: Sequence[Any], text: bool) -> tuple[Typed, dict[int, str]]:
    """Check one column of a batch.

    Returns:
        ``(typed, errors)``: the column's typed values, and each rejected position mapped
        to pydantic's message.
    """
    if not text:
        return _each(column, values)
    nullable = column.nullable
    present: Sequence[Any] = [v for v in values if v != ""] if nullable and "" in values else values
    if column.kind == "str":
        return Typed(values, None, nullable), {}
    if column.kind == "literal":
        if column.allowed.issuperset(present):
            return Typed(values, None, nullable), {}
        errors = _distinct(column, set(present) - column.allowed)
        return Typed(values, None, nullable), _positions(values, errors)
    if column.kind == "number" and present and column.whole is not None:
        joined = _SEP.join(present)
        if joined.count(_SEP) == len(present) - 1 and column.whole.fullmatch(joined):
            return Typed(values, column.convert, nullable), {}
    errors = _distinct(column, set(present))
    known = column.known
    return Typed(values, known.__getitem__ if not errors else known.get, nullable), _positions(values, errors)


def _distinct(column: Column, distinct: set[Any]) -> dict[Any, str]:
    """Check distinct text values, remembering each verdict on the column.

    Returns:
        The refused values among ``distinct``, each with pydantic's message.
    """
    known, refused = column.known, column.refused
    if known.keys() >= distinct:
        return {}  # every value seen and accepted before: the usual case for dates and codes
    new = [v for v in distinct if v not in known and v not in refused]
    if new:
        if column.kind == "date" and column.convert is not None:
            unsure = []
            for value in new:
                try:
                    if not _DATE_RE.fullmatch(value):
                        raise ValueError(value)
                    known[value] = column.convert(value)
                except ValueError:
                    unsure.append(value)
            new = unsure
        if new:
            good, bad = _by_pydantic(column, new)
            known.update(good)
            refused.update(bad)
        if len(known) > CACHE_LIMIT or len(refused) > CACHE_LIMIT:
            # Forget everything but this batch's values, so memory stays flat on a
            # high-cardinality column; later batches simply ask pydantic again.
            column.known = {v: known[v] for v in distinct if v in known}
            column.refused = {v: refused[v] for v in distinct if v in refused}
    return {v: column.refused[v] for v in distinct if v in column.refused}


def _positions(values: Sequence[Any], errors: dict[Any, str]) -> dict[int, str]:
    if not errors:
        return {}
    return {i: errors[v] for i, v in enumerate(values) if v in errors}


def _each(column: Column, values: Sequence[Any]) -> tuple[Typed, dict[int, str]]:
    """Validate every value of a column in one pydantic call (JSON values, typed already)."""
    inputs = [None if column.nullable and v == "" else v for v in values]
    errors: dict[int, str] = {}
    try:
        typed = column.adapter.validate_python(inputs)
    except pydantic.ValidationError as exc:
        for err in exc.errors(include_url=False):
            errors.setdefault(int(err["loc"][0]), err["msg"])
        keep = [i for i in range(len(inputs)) if i not in errors]
        typed = [None] * len(inputs)
        for index, value in zip(keep, column.adapter.validate_python([inputs[i] for i in keep])):
            typed[index] = value
    return Typed(typed), errors


def _by_pydantic(column: Column, values: list[Any]) -> tuple[dict[Any, Any], dict[Any, str]]:
    """Validate values through the field's own pydantic type, in one call when all pass."""
    try:
        return dict(zip(values, column.adapter.validate_python(values))), {}
    except pydantic.ValidationError as exc:
        errors: dict[Any, str] = {}
        for err in exc.errors(include_url=False):
            errors.setdefault(values[int(err["loc"][0])], err["msg"])
        good = [v for v in values if v not in errors]
        return dict(zip(good, column.adapter.validate_python(good))), errors


class Checked:
    """A validated batch: which records are good, why the others are bad, typed access.

    Attributes:
        rows: the well-shaped records (lists of cells), as read.
        good: positions in ``rows`` of the records every column accepted.
        bad: the rejected records, in file order, with column and reason.
    """

    def __init__(self, binding: Binding, rows: Sequence[Sequence[Any]], typed: list[Typed], good: Sequence[int],
                 bad: list[BadRow]) -> None:
        self.binding = binding
        self.rows = rows
        self.typed = typed
        self.good = good
        self.bad = bad
        self.plain = False  # a FlatBatch: cells hold no quote, delimiter or line break
        self._index = {c.field: i for i, c in enumerate(binding.schema.columns)}
        # record(i): the 1-based number in the file of the record at position i.
        self.record: Callable[[int], int] = lambda position: position + 1

    def column(self, field: str) -> Typed:
        """The typed values of ``field`` in this batch."""
        return self.typed[self._index[field]]

    def row(self, i: int) -> dict[str, Any]:
        """The record at position ``i`` as JSON-ready typed values, keyed by field name."""
        return {column.field: to_jsonable_python(typed.at(i))
                for column, typed in zip(self.binding.schema.columns, self.typed)}

    def lines(self, positions: Sequence[int]) -> Iterator[str]:
        """For a plain batch of a comma-separated file: each record as its line of cells, in
        the model's column order (the file's own line when the order is the same)."""
        if self.binding.in_order and isinstance(self.rows, FlatBatch):
            return map(self.rows.lines.__getitem__, positions)
        return map(",".join, self.raw(positions))

    def raw(self, positions: Sequence[int]) -> Iterator[Sequence[Any]]:
        """The records' cells in the model's column order, as the file had them."""
        if self.binding.in_order:
            return (self.rows[i] for i in positions)
        pick = self.binding._pick
        return (pick(self.rows[i]) for i in positions)


Op = Literal["eq", "ne", "lt", "le", "gt", "ge", "in", "contains", "prefix"]


@dataclasses.dataclass(frozen=True)
class Filter:
    """One typed condition on a field: ``Filter("amount", "ge", "100.00")``.

    The value is validated by the field's own type when the filter is bound, so a filter
    on a date takes a date (or its ISO text) and compares dates. A None value (an empty
    cell of a nullable field) never matches an ordering comparison. ``contains`` and
    ``prefix`` compare text without regard to case.
    """

    field: str
    op: Op
    value: Any


class Predicate:
    """Filters bound to a row schema, applied batch by batch.

    Raises:
        BadInput: a filter's value is not valid for its field (the message says why).
        ValueError: a filter names a field the model does not have (a bug in the tool).
    """

    def __init__(self, schema: RowSchema, filters: Sequence[Filter]) -> None:
        self.tests: list[tuple[str, Callable[[Any], bool]]] = []
        for f in filters:
            column = schema.by_field.get(f.field)
            if column is None:
                raise ValueError(f"filter on unknown field {f.field!r}; fields: {list(schema.by_field)}")
            try:
                self.tests.append((f.field, _test(column, f)))
            except pydantic.ValidationError as exc:
                message = exc.errors(include_url=False)[0]["msg"]
                raise BadInput(f"filter on {f.field}: {f.value!r} is not valid: {message}",
                               hint=f"give {f.field} a value of the export's type") from None

    def apply(self, checked: Checked) -> Sequence[int]:
        """Positions of the good records that pass every filter, in file order."""
        keep: Sequence[int] = checked.good
        for field, test in self.tests:
            values = checked.column(field).column()
            if isinstance(keep, range):
                keep = list(itertools.compress(keep, map(test, values)))
            else:
                keep = list(itertools.compress(keep, map(test, map(values.__getitem__, keep))))
        return keep


# "value OP target" as a C-level partial of the target: lt(value, target) is gt(target, value).
_FLIPPED: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.gt, "le": operator.ge, "gt": operator.lt,
    "ge": operator.le,
}


def _test(column: Column, f: Filter) -> Callable[[Any], bool]:
    def typed(value: Any) -> Any:
        return column.adapter.validate_python([value])[0]

    if f.op == "in":
        if not isinstance(f.value, (list, tuple, set, frozenset)):
            raise TypeError(f"filter 'in' on {f.field!r} needs a list of values")
        return frozenset(typed(v) for v in f.value).__contains__
    if f.op in ("contains", "prefix"):
        if not isinstance(f.value, str):
            raise TypeError(f"filter {f.op!r} on {f.field!r} needs text")
        needle = f.value.casefold()
        if f.op == "contains":
            return lambda v: v is not None and needle in str(v).casefold()
        return lambda v: v is not None and str(v).casefold().startswith(needle)
    target = typed(f.value)
    compare = functools.partial(_FLIPPED[f.op], target)
    if column.nullable and f.op not in ("eq", "ne"):
        return lambda v: v is not None and compare(v)
    return compare
