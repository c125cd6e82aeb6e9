"""verify: a sound ledger passes, and the first thing wrong is named precisely."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from rungd_ledgers import Ledger, verify
from rungd_ledgers.files import MAX_LINE_BYTES
from tests.ledgers.conftest import append_long_line, peak_memory


def write(folder: Path, count: int, *, rotate_bytes: int = 1 << 20) -> None:
    with Ledger.open(folder, rotate_bytes=rotate_bytes) as ledger:
        for n in range(count):
            ledger.append("received", f"call-{n}", "demo.echo", request_id=f"req-{n}", note="x" * 60)


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def reseal(line: bytes, **changes: object) -> bytes:
    """Change fields of a line and give it a hash that matches, as a careful forger would."""
    fields = msgspec.json.decode(line)
    fields.update(changes)
    del fields["hash"]
    body = msgspec.json.encode(fields)
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + b',"hash":"' + digest.encode() + b'"}\n'


@pytest.fixture
def first_file(folder: Path) -> Path:
    write(folder, 10)
    return folder / "ledger-000001.jsonl"


def test_a_sound_ledger_is_ok_across_rotated_files(folder: Path) -> None:
    write(folder, 40, rotate_bytes=1000)

    report = verify(folder)

    assert len(list(folder.glob("ledger-*.jsonl"))) > 3
    assert (report.ok, report.records, report.last_seq, report.problem) == (True, 40, 40, None)


def test_an_empty_ledger_is_ok(folder: Path) -> None:
    Ledger.open(folder).close()

    assert verify(folder).ok and verify(folder).records == 0


def test_one_changed_byte_in_an_earlier_record_is_reported_as_edited(first_file: Path) -> None:
    lines = lines_of(first_file)
    lines[2] = lines[2].replace(b'"call_id":"call-2"', b'"call_id":"call-X"')
    first_file.write_bytes(b"".join(lines))

    report = verify(first_file.parent)

    assert not report.ok and report.problem is not None
    assert (report.problem.kind, report.problem.file, report.problem.line) == ("edited", first_file.name, 3)
    assert report.problem.seq == 3
    assert report.records == 2 and report.last_seq == 2


def test_a_deleted_record_is_reported_as_a_gap(first_file: Path) -> None:
    lines = lines_of(first_file)
    del lines[3]
    first_file.write_bytes(b"".join(lines))

    problem = verify(first_file.parent).problem

    assert problem is not None
    assert (problem.kind, problem.line, problem.seq) == ("gap", 4, 5)
    assert "seq 4 is missing" in problem.explanation


def test_only_the_first_of_several_problems_is_reported(first_file: Path) -> None:
    lines = lines_of(first_file)
    lines[7] = lines[7].replace(b"req-7", b"req-8")
    del lines[1]
    first_file.write_bytes(b"".join(lines))

    problem = verify(first_file.parent).problem

    assert problem is not None and (problem.kind, problem.line) == ("gap", 2)


def test_a_replaced_record_with_a_matching_hash_breaks_the_next_link(first_file: Path) -> None:
    lines = lines_of(first_file)
    lines[4] = reseal(lines[4], note="nothing to see here")
    first_file.write_bytes(b"".join(lines))

    problem = verify(first_file.parent).problem

    assert problem is not None
    assert (problem.kind, problem.line, problem.seq) == ("broken_link", 6, 6)


def test_a_repeated_record_is_a_gap_going_back(first_file: Path) -> None:
    lines = lines_of(first_file)
    lines.insert(5, lines[4])
    first_file.write_bytes(b"".join(lines))

    problem = verify(first_file.parent).problem

    assert problem is not None
    assert (problem.kind, problem.line, problem.seq) == ("gap", 6, 5)
    assert "repeats or goes back" in problem.explanation


def test_a_line_that_is_not_a_record_is_unparseable(first_file: Path) -> None:
    lines = lines_of(first_file)
    lines.insert(2, b'{"hello": "world"}\n')
    first_file.write_bytes(b"".join(lines))

    problem = verify(first_file.parent).problem

    assert problem is not None
    assert (problem.kind, problem.line, problem.seq) == ("unparseable", 3, None)
    assert "not a ledger record" in problem.explanation


def test_a_line_nested_too_deeply_to_decode_is_named_by_verify_and_every_reader(first_file: Path) -> None:
    # An attacker's trial: 200,000 brackets under an unknown key made every reader (verify,
    # rungctl tail and health, the daemon's start) end in RecursionError, naming nothing.
    from rungd_ledgers import LedgerCorrupt, iter_records

    lines = lines_of(first_file)
    lines.insert(2, b'{"v":1,"seq":3,"x":' + b"[" * 200_000 + b"]" * 200_000 + b"}\n")
    first_file.write_bytes(b"".join(lines))

    problem = verify(first_file.parent).problem

    assert problem is not None
    assert (problem.kind, problem.line) == ("unparseable", 3)
    assert "nests too deeply" in problem.explanation
    with pytest.raises(LedgerCorrupt, match="nests too deeply"):
        list(iter_records(first_file.parent))


def test_a_partial_last_line_is_reported_as_torn(first_file: Path) -> None:
    with open(first_file, "ab") as file:
        file.write(b'{"v":1,"seq":11,"ti')

    report = verify(first_file.parent)

    assert report.problem is not None
    assert (report.problem.kind, report.problem.line) == ("torn_last_line", 11)
    assert report.records == 10


@pytest.mark.parametrize(("newline", "kind"), [(True, "unparseable"), (False, "torn_last_line")])
def test_a_line_longer_than_any_record_is_reported_without_being_held_whole(
    first_file: Path, newline: bool, kind: str
) -> None:
    append_long_line(first_file, newline=newline)
    if newline:
        with open(first_file, "ab") as file:
            file.write(lines_of(first_file)[0])  # a record after it: verify stops at the long line

    with peak_memory() as peak:
        report = verify(first_file.parent)

    assert report.problem is not None
    assert (report.problem.kind, report.problem.line, report.records) == (kind, 11, 10)
    if newline:
        assert "longer than any record" in report.problem.explanation
    assert peak.bytes < MAX_LINE_BYTES + (1 << 20), "verify held more of the line than any record can be"


def test_a_problem_in_a_later_file_names_that_file(folder: Path) -> None:
    write(folder, 30, rotate_bytes=1000)
    second = folder / "ledger-000002.jsonl"
    lines = lines_of(second)
    lines[1] = lines[1].replace(b'"tool":"demo.echo"', b'"tool":"demo.ecHo"')
    second.write_bytes(b"".join(lines))

    problem = verify(folder).problem

    assert problem is not None and (problem.kind, problem.file, problem.line) == ("edited", second.name, 2)


def test_the_report_encodes_as_json_for_the_command_line(first_file: Path) -> None:
    first_file.write_bytes(first_file.read_bytes().replace(b"req-1", b"req-!"))

    report = msgspec.json.decode(msgspec.json.encode(verify(first_file.parent)))

    assert report["problem"]["kind"] == "edited" and report["records"] == 1
