"""Signals against ``rungd serve`` as systemd runs it: every terminating signal is handled
or ignored on purpose, and SIGHUP reloads tool files without dropping a held approval."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rungd.client import Client
from rungd.config import embedded_configs
from tests.conftest import TEST_PLUGINS
from tests.service.test_reliability import DaemonProcess


def test_usr1_usr2_and_alrm_are_ignored_and_the_daemon_keeps_serving(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "echo_tools.py"}"]\n')
    daemon.start()
    try:
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
            daemon.proc.send_signal(sig)
            time.sleep(0.2)
            assert daemon.proc.poll() is None, f"{sig.name} ended the daemon"
            with Client(daemon.socket) as client:
                assert client.call("test_text_echo", {"text": sig.name}).status == "ok"
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0  # SIGTERM still stops it, cleanly
    assert not daemon.socket.exists()


def test_sighup_reloads_tool_files_and_keeps_held_approvals(short_tmp: Path) -> None:
    tools = short_tmp / "tools"
    tools.mkdir()
    daemon = DaemonProcess(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "fake_tools.py"}"]\n'
                                      f'tool_dirs = ["{tools}"]\n')
    daemon.start()
    try:
        with Client(daemon.socket) as client:
            held = client.call("fake_records_delete", {"program": "argv_echo"}, request_id="h1", wait_s=0.1)
            assert held.next_action == "wait_approval"
            assert "host_disk_usage_show" not in {t.name for t in client.list_tools()}
            shutil.copy(embedded_configs() / "tools" / "host.toml", tools / "host.toml")
            daemon.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "host_disk_usage_show" not in {t.name for t in client.list_tools()}:
                assert time.monotonic() < deadline, "SIGHUP did not load the new tool file"
                time.sleep(0.1)
            assert [h.call_id for h in client.pending()] == [held.call_id]  # still held
            assert client.call("host_disk_usage_show", {"mount": "/"}).status == "ok"
            (tools / "host.toml").write_text("this is [not toml")
            daemon.proc.send_signal(signal.SIGHUP)  # a broken file changes nothing
            time.sleep(1)
            assert daemon.proc.poll() is None
            assert "host_disk_usage_show" in {t.name for t in client.list_tools()}
    finally:
        daemon.stop()


def test_sighup_applies_access_and_says_which_other_sections_wait_for_a_restart(short_tmp: Path) -> None:
    log = short_tmp / "daemon.log"
    daemon = DaemonProcess(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "echo_tools.py"}"]\n', log=log)
    daemon.start()
    try:
        with Client(daemon.socket) as client:
            assert client.call("test_text_echo", {"text": "before"}).status == "ok"
            text = daemon.config.read_text()
            daemon.config.write_text(text.replace("[server]\n", "[server]\nmax_frame_bytes = 500000\n", 1)
                                     + "\n[access.tools.test_text_echo]\nuids = [12345]\n")
            daemon.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "test_text_echo" in {t.name for t in client.list_tools()}:
                assert time.monotonic() < deadline, "SIGHUP did not apply the new [access]"
                time.sleep(0.1)
            refused = client.call("test_text_echo", {"text": "after"})
            assert refused.error is not None and refused.error.code == "UNKNOWN_TOOL"
            assert client.hello().max_frame != 500000  # [server] waits for a restart...
        said = log.read_text()
        assert "reload: [server] changed in" in said and "apply at the next start only" in said  # ...and says so
    finally:
        daemon.stop()


def test_sighup_reads_the_config_as_start_did_rungd_socket_and_all(short_tmp: Path) -> None:
    # Started with $RUNGD_CONFIG and $RUNGD_SOCKET: a reload that read the file as if given
    # by --config dropped $RUNGD_SOCKET and warned of a [server] change nobody made.
    daemon = DaemonProcess(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "echo_tools.py"}"]\n')
    socket, log = short_tmp / "elsewhere.sock", short_tmp / "daemon.log"
    env = dict(os.environ, RUNGD_CONFIG=str(daemon.config), RUNGD_SOCKET=str(socket))
    with open(log, "wb") as output:
        proc = subprocess.Popen([sys.executable, "-m", "rungd.main", "serve"], env=env, stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        proc.send_signal(signal.SIGHUP)
        while "reloaded" not in log.read_text():
            assert time.monotonic() < deadline + 10, log.read_text()
            time.sleep(0.05)
        with Client(socket) as client:
            assert client.call("test_text_echo", {"text": "still here"}).status == "ok"
        assert "changed in" not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
