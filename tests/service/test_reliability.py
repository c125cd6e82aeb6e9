"""Reliability: hostile frames, crowds of idle and slow clients, kill -9 mid-write, a full
disk, and a tool that breaks under the daemon. Bounded in time; loopback and temp folders
only. The long soaks are behind RUNGD_SOAK=1."""

from __future__ import annotations

import os
import random
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rungd_ledgers import iter_records, verify

from rungd import protocol
from rungd.client import Client
from rungd.testing import write_config
from tests.conftest import FAKES, TEST_PLUGINS

SOAK = os.environ.get("RUNGD_SOAK") == "1"


class DaemonProcess:
    """``rungd serve`` as a child process, the way systemd runs it."""

    def __init__(self, folder: Path, toml: str = "", *, log: Path | None = None,
                 wrapper: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.config = write_config(folder, toml)
        self.socket = folder / "rungd.sock"
        self.log = log  # where its output (its log) goes, if anywhere
        self.wrapper = wrapper  # what runs it, as systemd's sandbox would (setpriv ...)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        with open(self.log, "ab") if self.log else open(os.devnull, "wb") as output:
            self.proc = subprocess.Popen(
                [*self.wrapper, sys.executable, "-m", "rungd.main", "serve", "--config", str(self.config)],
                stdout=output, stderr=output)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            assert self.proc.poll() is None, "the daemon exited at start"
            assert time.monotonic() < deadline, "the daemon never listened"
            time.sleep(0.02)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    running = DaemonProcess(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "fake_tools.py"}"]\n')
    running.start()
    try:
        yield running
    finally:
        running.stop()


def serves(sock: Path) -> bool:
    with Client(sock, timeout=10) as client:
        return client.call("inventory_item_show", {"item": "widget"}).status == "ok"


def raw(sock: Path, payload: bytes) -> None:
    """Send ``payload``, read whatever comes back for a moment, hang up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(2)
        conn.connect(str(sock))
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        try:
            while conn.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass


frames = st.one_of(
    st.binary(max_size=64),
    st.binary(max_size=64).map(lambda b: struct.pack(">I", len(b)) + b),
    st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">I", n)),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    ).map(lambda v: (lambda b: struct.pack(">I", len(b)) + b)(msgspec.msgpack.encode(v))),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["hello", "list_tools", "describe", "call", "status", "wait", "pending", "approve",
                                  "deny", "reconcile"])},
        optional={"tool": st.text(max_size=30) | st.integers(-9, 9), "inputs": st.dictionaries(st.text(max_size=8),
                  st.text(max_size=8) | st.integers(-9, 9), max_size=3), "call_id": st.text(max_size=20),
                  "wait_s": st.floats(allow_nan=True) | st.integers(-5, 5), "request_id": st.text(max_size=10)},
    ).map(lambda v: (lambda b: struct.pack(">I", len(b)) + b)(msgspec.msgpack.encode(v))),
)


def test_random_frames_never_stop_the_daemon(daemon: DaemonProcess) -> None:
    @settings(max_examples=1000 if SOAK else 150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(frames, min_size=1, max_size=3))
    def fuzz(batch: list[bytes]) -> None:
        raw(daemon.socket, b"".join(batch))

    fuzz()
    assert serves(daemon.socket)
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_idle_and_slow_clients_do_not_starve_others(daemon: DaemonProcess) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    idle = []
    try:
        for _ in range(1000):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(daemon.socket))
            idle.append(conn)
        slow = idle[:20]
        frame = protocol.frame(protocol.Hello())
        started = time.monotonic()
        for i in range(len(frame) - 1):  # one byte at a time, never finishing the frame
            for conn in slow:
                conn.send(frame[i:i + 1])
            assert serves(daemon.socket)
        assert time.monotonic() - started < 60
    finally:
        for conn in idle:
            conn.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_kill_9_at_random_points_of_many_writes_loses_nothing_and_runs_nothing_twice(short_tmp: Path) -> None:
    """Every write appends its request_id to an effect log; kill -9 the daemon at random
    moments, restart, and settle every request. Each must end changed, existing,
    not_started or unknown-then-reconciled, and no request_id may be in the log twice."""
    tools, effects = journal_tools(short_tmp)
    daemon = DaemonProcess(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n')
    rng = random.Random(7)
    requests = [f"r{i:03d}" for i in range(100 if SOAK else 30)]
    pauses = {request: rng.choice([0.0, 0.3]) for request in requests}
    daemon.start()
    try:
        for request in requests:
            if rng.random() < 0.1:
                daemon.kill9()
                daemon.start()
            with Client(daemon.socket, timeout=10) as client:
                try:
                    client.call("journal_entry_add", {"entry": request, "pause": pauses[request]},
                                request_id=request, wait_s=rng.choice([0.05, 5]))
                except Exception:  # the daemon may die under us: that is the point
                    pass
            if rng.random() < 0.1:
                daemon.kill9()
                daemon.start()
        daemon.stop()
        daemon.start()
        outcomes = {}
        with Client(daemon.socket, timeout=30) as client:
            for request in requests:
                env = client.call("journal_entry_add", {"entry": request, "pause": pauses[request]},
                                  request_id=request, wait_s=20)
                if env.status == "error" and env.error.code == "RECONCILE_REQUIRED":
                    env = client.reconcile("journal_entry_add", request)
                    if env.outcome == "not_started":  # it never happened: now it may run
                        env = client.call("journal_entry_add", {"entry": request, "pause": pauses[request]},
                                          request_id=request, wait_s=20)
                outcomes[request] = (env.status, env.effect, env.error.code if env.error else None)
    finally:
        daemon.stop()
    lines = effects.read_text().split()
    assert len(lines) == len(set(lines)), "a request ran twice"
    assert set(lines) == set(requests), "a request was lost"
    assert all(status == "ok" and effect in ("changed", "existing") for status, effect, _ in outcomes.values()), [
        (k, v) for k, v in outcomes.items() if v[0] != "ok" or v[1] not in ("changed", "existing")]
    assert verify(short_tmp / "state" / "ledger").ok


JOURNAL = """
[program]
name = "journal"
command = "{program}"

[tools.journal_entry_add]
side_effect = "reversible"
argv = ["{{entry}}", "{{pause}}"]
deadline_s = 10
log_fields = ["entry"]   # recovery rebuilds the settle read from logged inputs
[tools.journal_entry_add.description]
does = "Appends one entry."
use_when = "testing."
do_not_use_when = "not testing."
returns = "nothing."
on_error = "TIMEOUT."
if_unknown = "ask."
[tools.journal_entry_add.inputs.entry]
description = "The entry."
example = "r001"
pattern = "^r[0-9]+$"
[tools.journal_entry_add.inputs.pause]
type = "number"
description = "Seconds to pause after writing."
example = 0.0
[tools.journal_entry_add.verify]
tool = "journal_entry_check"
inputs = {{ entry = "{{entry}}" }}
expect = {{ found = "{{entry}}" }}
wait_s = 0

[tools.journal_entry_check]
argv = ["--check", "{{entry}}"]
[tools.journal_entry_check.description]
does = "Checks one entry."
use_when = "testing."
do_not_use_when = "not testing."
returns = "found."
on_error = "TIMEOUT."
if_unknown = "ask."
[tools.journal_entry_check.inputs.entry]
description = "The entry."
example = "r001"
pattern = "^r[0-9]+$"
[tools.journal_entry_check.parse]
kind = "regex"
pattern = '^found: (?P<found>\\S+)$'
fields = {{ found = "string" }}
"""


APPEND = """#!{python}
import os, sys, time
effects = {effects!r}
if sys.argv[1] == "--check":
    lines = open(effects).read().split() if os.path.exists(effects) else []
    print("found: " + (sys.argv[2] if sys.argv[2] in lines else "none"))
    sys.exit(0)
with open(effects, "a") as f:
    f.write(sys.argv[1] + "\\n")
time.sleep(float(sys.argv[2]))
print("appended")
"""


def journal_tools(folder: Path) -> tuple[Path, Path]:
    """A tool folder holding ``JOURNAL`` and the effects log its write appends to.

    ``journal_entry_add`` appends its entry to the log, one line per run (then pauses the
    given seconds), so a request that ran twice shows twice; ``journal_entry_check`` reads
    the log back. Returns (the tool folder, the effects log).
    """
    effects = folder / "effects.log"
    program = folder / "append_once"
    program.write_text(APPEND.format(python=sys.executable, effects=str(effects)))
    program.chmod(0o755)
    tools = folder / "tools"
    tools.mkdir()
    (tools / "journal.toml").write_text(JOURNAL.format(program=program))
    return tools, effects


@pytest.mark.skipif(os.getuid() != 0, reason="mounting a small filesystem needs root")
def test_a_full_disk_refuses_new_calls_and_loses_no_record(short_tmp: Path) -> None:
    state = short_tmp / "state"
    state.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(state)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    daemon = DaemonProcess(short_tmp, "[ledger]\nreserve_bytes = 32768\n")  # a reserve this small disk can hold
    try:
        daemon.start()
        assert serves(daemon.socket)
        filler = state / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        answered, refused = [], []
        with Client(daemon.socket) as client:
            # The ledger's last page may still have room for a few records: call until the
            # daemon refuses, which it must do before anything runs.
            for _ in range(200):
                env = client.call("inventory_item_show", {"item": "widget"})
                (refused if env.error and env.error.code == "LEDGER_UNAVAILABLE" else answered).append(env)
                if len(refused) == 3:
                    break
        assert len(refused) == 3, "the daemon never noticed the full disk"
        assert all(env.outcome == "not_started" and env.error.retry == "yes" for env in refused)
        # Before the ledger refuses, a call either ran (its evidence may be cut short) or
        # could not make its work folder: refused too, before anything ran.
        assert all(env.status == "ok" or (env.outcome == "not_started" and env.error.retry == "yes")
                   for env in answered), [(e.status, e.outcome, e.error) for e in answered if e.status != "ok"]
        filler.unlink()
        assert serves(daemon.socket)  # space is back: calls run again
        daemon.stop()
        report = verify(state / "ledger")
        assert report.ok, report.problem
        records = list(iter_records(state / "ledger"))
        dispatched = {r.call_id for r in records if r.event == "dispatched"}
        # Every answered call was on record before it ran. (One that ran while the disk
        # filled may lack its `finished`: recovery settles it as unknown, never reruns it.)
        assert {env.call_id for env in answered} <= dispatched
        assert not {env.call_id for env in refused} & dispatched  # refused calls never ran
    finally:
        daemon.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_a_program_made_unexecutable_mid_run_fails_cleanly(daemon: DaemonProcess, short_tmp: Path) -> None:
    copy = short_tmp / "fakes"
    copy.mkdir()
    target = copy / "exit_with"
    target.write_bytes((FAKES / "exit_with").read_bytes())
    target.chmod(0o755)
    with Client(daemon.socket) as client:
        ok = client.call("fake_run", {"program": "exit_with", "args": ["0"]})
        assert ok.status == "ok"
        (FAKES / "exit_with").chmod(0o644)
        try:
            broken = client.call("fake_run", {"program": "exit_with", "args": ["0"]})
        finally:
            (FAKES / "exit_with").chmod(0o755)
        assert (broken.error.code, broken.outcome) == ("FAILED", "not_started")
        assert "could not start" in broken.error.message
    assert serves(daemon.socket)
