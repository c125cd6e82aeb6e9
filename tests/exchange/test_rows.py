"""The export reader's shortcuts give exactly what csv.reader and pydantic, row by row, give."""

from __future__ import annotations

import csv
import datetime
import io
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError, field_validator
from pydantic_core import to_jsonable_python
from rungd.core.errors import BadInput, SurfaceChanged
from rungd.exchange import formats
from rungd.exchange.formats import Csv, FlatBatch, open_reader
from rungd.exchange.rows import _NUMBER, Filter, Predicate, RowSchema, header_diff


class Row(BaseModel):
    sku: str
    qty: int
    price: Decimal
    day: datetime.date
    status: Literal["open", "paid"]
    note: str | None
    rate: float | None


class Checked(Row):
    @field_validator("qty")
    @classmethod
    def positive(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must not be negative")
        return value


HEADER = list(Row.model_fields)
NUMBERS = st.sampled_from(["0", "7", "-3", "007", " 5", "1_000", "5.0", "x", "", "12345678901234567890", "1e3",
                           "-0", "3.25", ".5", "-", "+4"])
DATES = st.sampled_from(["2024-01-31", "2024-02-29", "2023-02-29", "2024-13-01", "20240101", "", "2024-1-1"])
STATUS = st.sampled_from(["open", "paid", "Open", "", "closed"])
TEXT = st.text(alphabet=st.sampled_from(list('ab ,;"\r\n\tü')), max_size=6)
RECORD = st.one_of(
    st.tuples(TEXT, NUMBERS, NUMBERS, DATES, STATUS, TEXT, NUMBERS).map(list),
    st.lists(TEXT, min_size=1, max_size=9),  # records of the wrong width
)


def reference(path: Path, model: type[BaseModel]) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
    """csv.reader, then pydantic one row at a time: what the reader must agree with."""
    good, bad = [], []
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f) if r]
    for number, row in enumerate(rows[1:], 1):
        if len(row) != len(HEADER):
            bad.append(number)
            continue
        values = dict(zip(HEADER, row))
        for nullable in ("note", "rate"):
            values[nullable] = values[nullable] or None
        try:
            good.append((number, to_jsonable_python(model.model_validate(values).model_dump())))
        except ValidationError:
            bad.append(number)
    return good, bad


def ours(path: Path, model: type[BaseModel]) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
    """The reader, binding and checks as ``Export.read`` uses them, in small batches."""
    schema = RowSchema(model)
    good, bad = [], []
    with open_reader(Csv(), path) as reader:
        binding = schema.bind(reader.header)
        seen = 0
        for batch in reader.batches(7, width=binding.width):
            checked = binding.check(batch, seen + 1)
            good += [(checked.record(i), checked.row(i)) for i in checked.good]
            bad += [b.record for b in checked.bad]
            seen += len(batch)
    return good, sorted(bad)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few dozen bytes, so records cross chunk boundaries in every example."""
    monkeypatch.setattr(formats, "CHUNK_BYTES", 48)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(RECORD, max_size=25), crlf=st.booleans(), model=st.sampled_from([Row, Checked]))
def test_reading_agrees_with_csv_and_pydantic_row_by_row(tmp_path: Path, records, crlf, model) -> None:
    path = tmp_path / "export.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\r\n" if crlf else "\n").writerows([HEADER, *records])
    expected_good, expected_bad = reference(path, model)
    got_good, got_bad = ours(path, model)
    assert got_bad == expected_bad
    assert got_good == expected_good


PLAIN = st.text(alphabet=st.sampled_from(list("ab ;ü-0\x00")), max_size=5)
PLAIN_RECORD = st.one_of(
    st.tuples(PLAIN, NUMBERS, NUMBERS, DATES, STATUS, PLAIN, NUMBERS).map(list),
    st.lists(PLAIN, min_size=1, max_size=9),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(PLAIN_RECORD, max_size=25), crlf=st.booleans(), model=st.sampled_from([Row, Checked]))
def test_plain_exports_read_in_flat_batches_agree_too(tmp_path: Path, records, crlf, model) -> None:
    # No quote, comma or line break inside a cell: most chunks take the FlatBatch path.
    path = tmp_path / "export.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\r\n" if crlf else "\n").writerows([HEADER, *records])
    assert ours(path, model) == reference(path, model)


class One(BaseModel):
    sku: str


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(st.one_of(PLAIN, st.just("")), max_size=30), crlf=st.booleans())
def test_a_one_column_export_skips_empty_lines_as_csv_does(tmp_path: Path, cells, crlf) -> None:
    path = tmp_path / "one.csv"
    newline = "\r\n" if crlf else "\n"
    path.write_text("sku" + newline + newline.join(cells) + newline, encoding="utf-8", newline="")
    with open(path, newline="", encoding="utf-8") as f:
        expected = [r[0] for r in csv.reader(f) if r][1:]
    with open_reader(Csv(), path) as reader:
        binding = RowSchema(One).bind(reader.header)
        got = []
        for batch in reader.batches(4, width=binding.width):
            checked = binding.check(batch, 1)
            got += [checked.row(i)["sku"] for i in checked.good]
    assert got == expected


def test_the_fast_path_is_taken_for_plain_exports(tmp_path: Path) -> None:
    path = tmp_path / "plain.csv"
    lines = ["sku,qty,price,day,status,note,rate"] + [f"S{i},{i},{i}.5,2024-01-0{1 + i % 9},open,,2.5"
                                                     for i in range(50)]
    path.write_text("\r\n".join(lines) + "\r\n")
    schema = RowSchema(Row)
    with open_reader(Csv(), path) as reader:
        binding = schema.bind(reader.header)
        batches = list(reader.batches(10, width=binding.width))
    assert all(isinstance(b, FlatBatch) for b in batches)
    assert sum(map(len, batches)) == 50


def test_filters_are_typed_by_the_field() -> None:
    schema = RowSchema(Row)
    with pytest.raises(BadInput, match="day"):
        Predicate(schema, [Filter("day", "ge", "not a date")])
    with pytest.raises(ValueError, match="unknown field"):
        Predicate(schema, [Filter("nope", "eq", 1)])


def test_header_diff_names_probable_renames() -> None:
    diff = header_diff(["sku", "qty", "price", "status"], ["sku", "quantity", "unit_price", "status", "warehouse"])
    assert diff.missing == ["qty", "price"]
    assert diff.added == ["quantity", "unit_price", "warehouse"]
    assert diff.renamed == [("qty", "quantity"), ("price", "unit_price")]


def test_a_header_change_is_caught_before_the_first_row(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("sku,qty,cost,day,status,note,rate\nS1,1,2,2024-01-01,open,,\n")
    with open_reader(Csv(), path) as reader:
        with pytest.raises(SurfaceChanged) as caught:
            RowSchema(Row).bind(reader.header, where="x.csv")
        assert reader.records == 0
    assert caught.value.fields["renamed"] == [["price", "cost"]]


def test_a_csv_split_by_chunks_matches_csv_reader_exactly(tmp_path: Path) -> None:
    text = 'a,b\r\n1,"x\r\ny"\r\n2,z\r\n\r\n3,"q""uote"\n4,w'
    path = tmp_path / "q.csv"
    path.write_bytes(text.encode())
    with open_reader(Csv(), path) as reader:
        rows = [r for b in reader.batches(2) for r in b]
    expected = [r for r in csv.reader(io.StringIO(text, newline="")) if r][1:]
    assert rows == expected


FILTERS = st.lists(st.sampled_from([
    Filter("qty", "ge", 3), Filter("qty", "lt", "7"), Filter("status", "eq", "paid"), Filter("note", "contains", "A"),
    Filter("day", "le", "2024-02-01"), Filter("price", "gt", "0.5"), Filter("rate", "ge", 0),
    Filter("sku", "in", ["a", "b", "ab"]), Filter("note", "eq", None), Filter("sku", "prefix", "a"),
]), max_size=3)


def expected_match(row: dict[str, Any], f: Filter) -> bool:
    typed = Row.model_validate(row)
    value = getattr(typed, f.field)
    target = f.value
    if f.op == "contains":
        return value is not None and target.casefold() in str(value).casefold()
    if f.op == "prefix":
        return value is not None and str(value).casefold().startswith(target.casefold())
    if f.op == "in":
        return value in target
    target = Row.model_validate({**_example(), f.field: target}).__dict__[f.field] if target is not None else None
    if f.op == "eq":
        return value == target
    if value is None:
        return False
    return {"ge": value >= target, "lt": value < target, "le": value <= target, "gt": value > target}[f.op]


def _example() -> dict[str, Any]:
    return {"sku": "s", "qty": 1, "price": "1", "day": "2024-01-01", "status": "open", "note": None, "rate": None}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(RECORD, max_size=25), filters=FILTERS)
def test_filters_select_what_python_comparisons_select(tmp_path: Path, records, filters) -> None:
    path = tmp_path / "export.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([HEADER, *records])
    expected_good, _ = reference(path, Row)
    expected = [n for n, row in expected_good if all(expected_match(row, f) for f in filters)]
    schema = RowSchema(Row)
    predicate = Predicate(schema, filters)
    got = []
    with open_reader(Csv(), path) as reader:
        binding = schema.bind(reader.header)
        seen = 0
        for batch in reader.batches(5, width=binding.width):
            checked = binding.check(batch, seen + 1)
            got += [checked.record(i) for i in predicate.apply(checked)]
            seen += len(batch)
    assert got == expected


@settings(max_examples=500, deadline=None)
@given(text=st.one_of(st.from_regex(r"-?[0-9]{1,30}(\.[0-9]{1,30})?", fullmatch=True),
                      st.text(alphabet=st.sampled_from(list("0123456789.-+_e ")), max_size=12)))
def test_number_shortcuts_accept_only_what_pydantic_accepts_with_the_same_value(text) -> None:
    for kind, (pattern, convert) in _NUMBER.items():
        if re.fullmatch(pattern, text):
            assert convert(text) == TypeAdapter(kind).validate_python(text), (kind, text)
