"""The record format: input digests, schema evolution, and values surviving the round trip."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rungd_ledgers import GENESIS, Ledger, Record, input_digest, iter_records, verify

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(), json_values, max_size=5)


@given(json_objects)
def test_input_digest_ignores_key_order_at_every_depth(inputs: dict[str, Any]) -> None:
    reordered = {key: _reverse_keys(value) for key, value in reversed(inputs.items())}

    assert input_digest("demo.echo", reordered) == input_digest("demo.echo", inputs)


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reverse_keys(inner) for key, inner in reversed(value.items())}
    return value


def test_input_digest_tells_tools_and_inputs_apart() -> None:
    digest = input_digest("demo.restart", {"host": "db1"})

    assert len(digest) == 64 and int(digest, 16) >= 0
    assert digest != input_digest("demo.stop", {"host": "db1"})
    assert digest != input_digest("demo.restart", {"host": "db2"})
    assert digest != input_digest("demo.restart", {"host": "db1", "force": False})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(inputs=json_objects, result=json_objects, note=st.text())
def test_any_json_values_read_back_as_written(
    ledger: Ledger, folder: Path, inputs: dict[str, Any], result: dict[str, Any], note: str
) -> None:
    written = ledger.append("finished", "call-1", "demo.echo", inputs=inputs, result=result, note=note)

    [read] = iter_records(folder, since_seq=written.seq - 1)

    assert read == written
    assert (read.inputs, read.result, read.note) == (inputs, result, note)


def test_a_newer_writers_unknown_fields_are_read_and_verified(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    folder.mkdir()
    newer = {
        "v": 2,
        "seq": 1,
        "time": 1.5,
        "event": "received",
        "call_id": "call-1",
        "tool": "demo.echo",
        "tenant": "blue",
        "prev": GENESIS,
    }
    (folder / "ledger-000001.jsonl").write_bytes(_sealed_line(newer))

    [record] = iter_records(folder)

    assert (record.v, record.call_id, record.request_id) == (2, "call-1", None)
    assert verify(folder).ok
    with Ledger.open(folder) as ledger:
        assert ledger.append("received", "call-2", "demo.echo").prev == record.hash
    assert verify(folder).ok


def test_a_line_with_only_the_required_fields_gets_every_default() -> None:
    minimal = b'{"v":1,"seq":1,"time":1.0,"event":"received","call_id":"c","tool":"t","prev":"0"}'

    record = msgspec.json.decode(minimal, type=Record)

    assert (record.inputs, record.result) == ({}, None)
    assert (record.request_id, record.outcome, record.hash) == (None, None, "")


def test_a_field_this_version_no_longer_has_is_ignored_on_read() -> None:
    # pids was defined by the first schema and never written; a line holding it still reads.
    line = b'{"v":1,"seq":1,"time":1,"event":"dispatched","call_id":"c","tool":"t","prev":"","pids":[[7,12]]}'

    record = msgspec.json.decode(line, type=Record)

    assert (record.event, record.call_id) == ("dispatched", "c") and not hasattr(record, "pids")


def _sealed_line(fields: dict[str, Any]) -> bytes:
    """Seal a line the way the ledger documents it, independently of its code."""
    body = msgspec.json.encode(fields)
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"hash":"' + digest.encode() + b'"}\n'
