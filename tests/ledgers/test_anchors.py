"""Anchors: a chain rewritten consistently passes the hash checks, and fails against the
anchors published before the rewrite."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest

from rungd_ledgers import GENESIS, Anchor, AnchorFileError, Ledger, iter_records, prune, read_anchors, verify
from rungd_ledgers.chain import seal
from rungd_ledgers.files import ledger_files

DAY = 86400.0


def write(folder: Path, notes: list[str], *, rotate_bytes: int = 1 << 20) -> list[tuple[int, str]]:
    """One record per note; returns (seq, hash) after each, as an anchor would publish it."""
    heads = []
    with Ledger.open(folder, rotate_bytes=rotate_bytes) as ledger:
        for number, note in enumerate(notes):
            record = ledger.append("received", f"c-{number}", "tool_a", note=note)
            heads.append((record.seq, record.hash))
    return heads


def forge(real: Path, forged: Path, *, seq: int, note: str) -> None:
    """What a host root can do: change one record and re-seal every record after it, times kept."""
    forged.mkdir()
    prev, lines = GENESIS, []
    for record in iter_records(real):
        draft = msgspec.structs.replace(record, note=note) if record.seq == seq else record
        sealed, line = seal(draft, seq=record.seq, prev=prev, time=record.time)
        prev = sealed.hash
        lines.append(line)
    (forged / "ledger-000001.jsonl").write_bytes(b"".join(lines))


def journal_line(seq: int, hash: str, **more: object) -> str:
    """An entry as `journalctl -o json` prints it: every value a string."""
    return json.dumps({"__REALTIME_TIMESTAMP": "1767225600000000", "_SYSTEMD_UNIT": "rungd.service",
                       "MESSAGE": f"ledger anchor seq={seq}", "RUNGD_LEDGER_ANCHOR": "1",
                       "LEDGER_SEQ": str(seq), "LEDGER_HEAD_HASH": hash, **more})


def test_a_consistently_rewritten_chain_contradicts_the_first_anchor_after_the_change(tmp_path: Path) -> None:
    notes = [f"event {n}" for n in range(20)]
    heads = write(tmp_path / "real", notes)
    anchors = [Anchor(seq, hash, line=n) for n, (seq, hash) in enumerate(heads[4::5], start=1)]  # 5, 10, 15, 20
    forge(tmp_path / "real", tmp_path / "forged", seq=8, note="nothing happened here")

    assert verify(tmp_path / "forged").ok, "the rewrite is consistent: the chain alone cannot tell"
    report = verify(tmp_path / "forged", anchors)
    assert report.problem is not None and report.problem.kind == "contradicts_anchor"
    assert report.problem.seq == 10, "seq 5 still matches; seq 10 is the first anchor after the change"
    assert (report.records, report.last_seq) == (5, 5), "sound: what the anchor that agreed vouches for"
    assert "the anchor at line 2" in report.problem.explanation
    assert report.anchors_checked == 2

    good = verify(tmp_path / "real", anchors)
    assert good.ok and good.anchors_checked == 4


def test_an_anchor_past_the_end_means_records_were_cut_off(tmp_path: Path) -> None:
    heads = write(tmp_path / "real", [f"e{n}" for n in range(10)])
    write(tmp_path / "short", [f"e{n}" for n in range(6)])
    report = verify(tmp_path / "short", [Anchor(*heads[-1])])
    assert report.problem is not None and report.problem.kind == "anchor_beyond_end"
    assert "ends at seq 6" in report.problem.explanation


def test_anchors_are_read_from_a_journal_export_and_other_entries_are_skipped(tmp_path: Path) -> None:
    heads = write(tmp_path / "ledger", ["a", "b", "c"])
    export = tmp_path / "anchors.json"
    export.write_text("\n".join([
        json.dumps({"MESSAGE": "listening on /run/rungd/rungd.sock", "PRIORITY": "6"}),
        journal_line(*heads[1], LEDGER_RECORD_TIME="1767225599.5"),
        # journalctl writes a value that is not UTF-8 as a list of byte values.
        journal_line(heads[2][0], list(heads[2][1].encode())),  # type: ignore[arg-type]
        json.dumps({"seq": heads[0][0], "hash": heads[0][1]}),
        "",
    ]))
    anchors = read_anchors(export.read_bytes().splitlines())
    assert [(a.seq, a.hash, a.line) for a in anchors] == [(2, heads[1][1], 2), (3, heads[2][1], 3),
                                                          (1, heads[0][1], 4)]
    assert anchors[0].time == "1767225599.5" and anchors[0].sent == 1767225600.0
    assert verify(tmp_path / "ledger", anchors).anchors_checked == 3


@pytest.mark.parametrize("line", ["not json", journal_line(3, "abc"), json.dumps({"seq": 0, "hash": "0" * 64})])
def test_a_bad_anchor_line_is_named(line: str) -> None:
    with pytest.raises(AnchorFileError, match="line 2"):
        read_anchors(["", line])


def test_an_anchor_at_the_end_of_a_pruned_file_is_checked_against_the_pruned_record(folder: Path) -> None:
    with Ledger.open(folder, rotate_bytes=2048) as ledger:
        for number in range(40):
            ledger.append("received", f"c-{number}", "tool_a", note="y" * 60)
        later = time.time() + 100 * DAY
        result = prune(ledger, now=later, keep_seconds=DAY, max_total_bytes=None, protect_since=later)
    assert result.record is not None
    end = result.record.pruned[0]
    assert len(ledger_files(folder)) == 1
    right = verify(folder, [Anchor(end.last_seq, end.last_hash), Anchor(1, "f" * 64)])
    assert right.ok, right.problem
    assert (right.anchors_checked, right.anchors_pruned) == (1, 1)
    wrong = verify(folder, [Anchor(end.last_seq, "e" * 64)])
    assert wrong.problem is not None and wrong.problem.kind == "contradicts_anchor"
