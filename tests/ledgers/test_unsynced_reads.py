"""A read's first records are written without their own fsync; the next synced append covers them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rungd_ledgers import Ledger
from rungd_ledgers.reader import iter_records


def test_unsynced_records_are_written_at_once_and_made_durable_by_the_next_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger.open(tmp_path / "ledger", reserve_bytes=0)
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    ledger.append_many([("received", "c1", "t", {}), ("dispatched", "c1", "t", {})], sync=False)
    assert fsyncs == []
    # Written to the kernel already: a crash of the daemon alone loses nothing.
    assert [r.event for r in iter_records(tmp_path / "ledger")] == ["received", "dispatched"]
    ledger.append("finished", "c1", "t")
    assert len(fsyncs) == 1
    ledger.close()
    assert [r.event for r in iter_records(tmp_path / "ledger")] == ["received", "dispatched", "finished"]
