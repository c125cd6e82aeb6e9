"""Ledger benchmark: group commit against one fsync per record, and replay speed.

    python bench/ledger_bench.py [--dir DIR]

Measures, on this machine and file system, each three times (min / median / max):

* durable appends per second with 1 and 50 writer threads, through ``Ledger.append``
  (group commit) and through a baseline that does one write and one fsync per record under
  a lock, sealing records the same way;
* the latency of a lone append (p50 and p99 of 1,000 sequential appends), for both;
* replaying 1,000,000 events generated once into a temporary folder: the full
  ``IdempotencyIndex.rebuild``, ``iter_records`` alone, and ``json.loads`` per line over the
  same files, and ``verify``. The files were just written, so they come from the page cache.

Takes about a minute; DIR needs about 500 MB free.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

# Run from a checkout without installing the project first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ledgers"))

import msgspec  # noqa: E402

from rungd_ledgers import (  # noqa: E402
    GENESIS,
    SCHEMA_VERSION,
    IdempotencyIndex,
    Ledger,
    Record,
    iter_records,
    verify,
)
from rungd_ledgers.chain import seal  # noqa: E402
from rungd_ledgers.files import file_name  # noqa: E402

REPEATS = 3
REPLAY_EVENTS = 1_000_000
ROTATE_BYTES = 64 * 1024 * 1024
# The baseline pays one fsync per record; fewer records keep its 50-thread run short.
GROUPED_PER_THREAD = {1: 2000, 50: 200}
BASELINE_PER_THREAD = {1: 2000, 50: 40}
LATENCY_APPENDS = 1000

# What a typical call writes: the fields the daemon fills in for a received event.
RECEIVED_FIELDS = {
    "request_id": "req-0001",
    "caller_uid": 1000,
    "caller_pid": 4242,
    "input_digest": "ab" * 32,
    "inputs": {"host": "db1", "service": "postgres"},
}


class OneFsyncPerRecord:
    """The baseline: every append writes and fsyncs its own record, one at a time.

    Records are sealed exactly as the ledger seals them; only the ledger's type-checking
    round trip (a few microseconds) is left out, which flatters the baseline slightly.
    """

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        self._fd = os.open(folder / file_name(1), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self._lock = threading.Lock()
        self._seq, self._hash = 0, GENESIS

    def append(self, event: str, call_id: str, tool: str, **fields: object) -> Record:
        draft = _draft(event, call_id, tool, fields)
        with self._lock:
            record, line = seal(draft, seq=self._seq + 1, prev=self._hash, time=time.time())
            os.write(self._fd, line)
            os.fsync(self._fd)
            self._seq, self._hash = record.seq, record.hash
        return record

    def close(self) -> None:
        os.close(self._fd)


Appender = Callable[..., Record]


def records_per_second(append: Appender, threads: int, per_thread: int) -> float:
    def write(thread: int) -> None:
        for n in range(per_thread):
            append("received", f"call-{thread}-{n}", "demo.restart", **RECEIVED_FIELDS)

    workers = [threading.Thread(target=write, args=(n,)) for n in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * per_thread / (time.perf_counter() - start)


def latencies_ms(append: Appender) -> tuple[float, float]:
    samples = []
    for n in range(LATENCY_APPENDS):
        start = time.perf_counter()
        append("received", f"call-{n}", "demo.restart", **RECEIVED_FIELDS)
        samples.append((time.perf_counter() - start) * 1000)
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49], cuts[98]


def measure_appends(work: Path, results: dict[str, list[float]]) -> None:
    for repeat in range(REPEATS):
        for threads in (1, 50):
            with Ledger.open(work / f"grouped-{repeat}-{threads}") as ledger:
                rate = records_per_second(ledger.append, threads, GROUPED_PER_THREAD[threads])
            results[f"group commit, {threads} thread(s) (records/s)"].append(rate)
            baseline = OneFsyncPerRecord(work / f"baseline-{repeat}-{threads}")
            rate = records_per_second(baseline.append, threads, BASELINE_PER_THREAD[threads])
            baseline.close()
            results[f"one fsync per record, {threads} thread(s) (records/s)"].append(rate)
        with Ledger.open(work / f"latency-{repeat}") as ledger:
            p50, p99 = latencies_ms(ledger.append)
        results["group commit, lone append p50 (ms)"].append(p50)
        results["group commit, lone append p99 (ms)"].append(p99)
        baseline = OneFsyncPerRecord(work / f"baseline-latency-{repeat}")
        p50, p99 = latencies_ms(baseline.append)
        baseline.close()
        results["one fsync per record, lone append p50 (ms)"].append(p50)
        results["one fsync per record, lone append p99 (ms)"].append(p99)


def generate(folder: Path, events: int) -> None:
    """Write ``events`` sealed records as a daemon would, rotating files, without fsyncs.

    Each call is received, dispatched and finished with a result; one in ten is held and
    approved first. Every call carries a request_id, the worst case for the index.
    """
    folder.mkdir()
    number, size, seq, prev, now = 1, 0, 0, GENESIS, time.time()
    out = open(folder / file_name(number), "wb")  # replaced on rotation below
    call = 0
    while seq < events:
        call_id, request_id = f"call-{call:08d}", f"req-{call:08d}"
        result = {"call_id": call_id, "status": "ok", "outcome": "done", "fields": {"n": call}}
        steps: list[tuple[str, dict[str, object]]] = [("received", RECEIVED_FIELDS)]
        if call % 10 == 0:
            steps += [("held", {}), ("approved", {"approver_uid": 1001})]
        steps += [
            ("dispatched", {}),
            ("finished", {"outcome": "done", "effect": "changed", "result": result}),
        ]
        for event, fields in steps[: events - seq]:
            seq += 1
            fields = {**fields, "request_id": request_id}
            record, line = seal(_draft(event, call_id, "demo.restart", fields), seq=seq, prev=prev, time=now)
            prev = record.hash
            out.write(line)
            size += len(line)
            if size >= ROTATE_BYTES:
                out.close()
                number, size = number + 1, 0
                out = open(folder / file_name(number), "wb")
        call += 1
    out.close()


def _draft(event: str, call_id: str, tool: str, fields: dict[str, object]) -> Record:
    """A record ready for ``seal``, built the way ``Ledger.append`` builds one."""
    return Record(
        v=SCHEMA_VERSION, seq=0, time=0.0, event=event, call_id=call_id, tool=tool, prev=GENESIS, **fields
    )


def json_loads_per_line(folder: Path) -> int:
    count = 0
    for path in sorted(folder.glob("ledger-*.jsonl")):
        with open(path, "rb") as file:
            for line in file:
                json.loads(line)
                count += 1
    return count


def measure_replay(work: Path, results: dict[str, list[float]]) -> None:
    folder = work / "replay"
    start = time.perf_counter()
    generate(folder, REPLAY_EVENTS)
    megabytes = sum(path.stat().st_size for path in folder.iterdir()) / 1e6
    print(f"generated {REPLAY_EVENTS:,} events, {megabytes:.0f} MB, in {time.perf_counter() - start:.1f} s")
    runs: list[tuple[str, Callable[[], object]]] = [
        ("IdempotencyIndex.rebuild", lambda: IdempotencyIndex.rebuild(folder)),
        ("iter_records only", lambda: sum(1 for _ in iter_records(folder))),
        ("json.loads per line", lambda: json_loads_per_line(folder)),
        ("verify", lambda: verify(folder)),
    ]
    for _ in range(REPEATS):
        for name, run in runs:
            start = time.perf_counter()
            run()
            results[f"replay 1M events, {name} (s)"].append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: the temp folder)")
    args = parser.parse_args()
    # Measurements in the order they were first taken, each a list of one value per repeat.
    results: defaultdict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="ledger-bench-", dir=args.dir) as work:
        print(
            f"{work}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"msgspec {msgspec.__version__}, {REPEATS} repeats"
        )
        measure_appends(Path(work), results)
        measure_replay(Path(work), results)
    width = max(len(name) for name in results)
    print(f"\n{'':{width}}  {'min':>10}  {'median':>10}  {'max':>10}")
    for name, values in results.items():
        low, mid, high = min(values), statistics.median(values), max(values)
        number = "{:>10,.0f}" if "records/s" in name else "{:>10.3f}"
        print(f"{name:{width}}  " + "  ".join(number.format(value) for value in (low, mid, high)))


if __name__ == "__main__":
    main()
