"""kill -9 aimed at the ledger's fsync itself, and the fsync failing, for real: strace
injects SIGKILL (or EIO) into the daemon's Nth fsync. After a restart every write is
settled exactly once, nothing reported done is lost, and the chain verifies."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rungd_ledgers import verify

from rungd.client import Client, ClientError
from tests.service.test_reliability import DaemonProcess, journal_tools

pytestmark = pytest.mark.skipif(shutil.which("strace") is None,
                                reason="strace is missing: apt-get install strace (.ci/run installs it)")

class TracedDaemon(DaemonProcess):
    """``rungd serve`` under strace, which does ``inject`` to its Nth fsync (all threads)."""

    def __init__(self, folder: Path, toml: str, inject: str) -> None:
        super().__init__(folder, toml)
        self.inject = inject

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync", "-e", f"inject=fsync:{self.inject}",
             sys.executable, "-m", "rungd.main", "serve", "--config", str(self.config)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None:
                return  # died at start-up (an fsync there): the test goes on with a plain daemon
            assert time.monotonic() < deadline, "the traced daemon never listened"
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the daemon itself (SIGTERM to strace would only detach it), then strace."""
        if self.proc is None:
            return
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            children = []  # strace already ended: the daemon it traced was killed at the fsync
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.terminate()
                child.wait(timeout=20)
        super().stop()


def journal(folder: Path) -> tuple[str, Path]:
    tools, effects = journal_tools(folder)
    return f'[plugins]\ntool_dirs = ["{tools}"]\n', effects


def settle_all(daemon: DaemonProcess, requests: list[str]) -> dict[str, tuple[str, str]]:
    outcomes = {}
    with Client(daemon.socket, timeout=30) as client:
        for request in requests:
            inputs = {"entry": request, "pause": 0.0}
            env = client.call("journal_entry_add", inputs, request_id=request, wait_s=20)
            if env.status == "error" and env.error.code == "RECONCILE_REQUIRED":
                env = client.reconcile("journal_entry_add", request)
                if env.outcome == "not_started":  # it never happened: now it may run
                    env = client.call("journal_entry_add", inputs, request_id=request, wait_s=20)
            outcomes[request] = (env.status, env.effect) if env.status == "ok" else (
                env.status, env.effect, env.outcome, env.error.code, env.error.message)
    return outcomes


@pytest.mark.parametrize("nth", [2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("injected", ["signal=SIGKILL", "error=EIO"])
def test_a_kill_or_failure_at_the_nth_fsync_loses_nothing_and_runs_nothing_twice(short_tmp, nth, injected) -> None:
    toml, effects = journal(short_tmp)
    requests = [f"r{i:03d}" for i in range(4)]
    reported_done = set()
    traced = TracedDaemon(short_tmp, toml, f"{injected}:when={nth}")
    traced.start()
    try:
        for request in requests:
            if traced.proc.poll() is not None:
                break
            try:
                with Client(traced.socket, timeout=10) as client:
                    env = client.call("journal_entry_add", {"entry": request, "pause": 0.0}, request_id=request)
            except ClientError:
                break  # killed at the fsync, as aimed
            if env.status == "ok":
                reported_done.add(request)
            else:
                # The fsync failed: nothing new may run, and what did run says so.
                assert env.error.code in ("LEDGER_UNAVAILABLE",) or env.outcome in ("unknown", "done"), env
    finally:
        traced.stop()
    plain = DaemonProcess(short_tmp, toml)
    plain.config = traced.config
    plain.start()
    try:
        outcomes = settle_all(plain, requests)
    finally:
        plain.stop()
    lines = effects.read_text().split() if effects.exists() else []
    assert len(lines) == len(set(lines)), f"a write ran twice: {outcomes}"
    assert set(lines) == set(requests), f"a write was lost: {outcomes}"
    assert reported_done <= set(lines), "a write reported done is not there"
    assert all(status == "ok" and effect in ("changed", "existing") for status, effect in outcomes.values()), outcomes
    report = verify(short_tmp / "state" / "ledger")
    assert report.ok, report.problem
