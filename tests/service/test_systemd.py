"""rungd as a systemd service: the unit and its companions verify, agree with the example
config, and the daemon speaks sd_notify for real (READY, STOPPING, WATCHDOG).

The unit is checked with ``systemd-analyze verify`` from Debian's ``systemd`` package; the
tests that need it skip, saying so, where it is missing. ``verify`` also insists that
ExecStart's program exists, and /opt/rungd/venv/bin/rungd exists only after the install
guide ran. So the shipped file is verified twice:

* always, as a copy whose ExecStart names the ``rungd`` of the environment running the
  tests, the only line that differs (asserted), arguments unchanged;
* as shipped, unchanged, where the install guide's venv exists (CI creates it).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from rungd.system import sdnotify
from rungd.client import Client
from rungd.config import load_config
from rungd.testing import write_config

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "rungd.service"
SYSUSERS = ROOT / "systemd" / "rungd.sysusers"
TMPFILES = ROOT / "systemd" / "rungd.tmpfiles"
EXAMPLE = ROOT / "configs" / "rungd.example.toml"
INSTALLED = Path("/opt/rungd/venv/bin/rungd")
GROUPS = ("rungd-callers", "rungd-operators")

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is missing: apt-get install systemd (Debian's package ships it)",
)


def unit_settings(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, in order, repeated keys kept (no sections)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def seconds(value: str) -> float:
    """A systemd time span like ``30s``, ``2min`` or ``1min 30s``, in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|sec|s|min|m|h)?", value)
    return sum(float(n) * units[u or "s"] for n, u in parts)


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    # --man=no: the unit names no man page; its Documentation is the README.
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          check=False, capture_output=True, text=True, timeout=60)


def this_rungd() -> Path:
    """The ``rungd`` entry point of the environment running the tests."""
    script = Path(sys.executable).parent / "rungd"
    if not script.exists():
        pytest.skip(f"no rungd script next to {sys.executable}; install the project (pip install -e .)")
    return script


# --- the unit and its companions ------------------------------------------------------------


@needs_analyze
def test_unit_verifies_with_execstart_pointing_at_this_install(tmp_path: Path) -> None:
    shipped = UNIT.read_text()
    copy = shipped.replace(f"={INSTALLED} ", f"={this_rungd()} ")
    changed = [(a, b) for a, b in zip(shipped.splitlines(), copy.splitlines(), strict=True) if a != b]
    # Only the command lines change: ExecStartPre and the first ExecReload check the config,
    # ExecStart serves it.
    assert [a.split("=")[0] for a, _ in changed] == ["ExecStartPre", "ExecStart", "ExecReload"], changed
    (tmp_path / "rungd.service").write_text(copy)
    result = verify(tmp_path / "rungd.service")
    # verify exits 0 on some warnings (an unknown key, say): any output at all is a failure.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@needs_analyze
@pytest.mark.skipif(not INSTALLED.exists(), reason=f"{INSTALLED} is missing: the install guide has not run here")
def test_shipped_unit_verifies_unchanged_where_installed() -> None:
    result = verify(UNIT)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None or shutil.which("systemd-tmpfiles") is None,
                    reason="systemd-sysusers/systemd-tmpfiles are missing: apt-get install systemd")
def test_sysusers_and_tmpfiles_apply_to_a_scratch_root(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SYSUSERS)], check=True, capture_output=True)
    passwd = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0] for line in (tmp_path / "etc/group").read_text().splitlines()}
    assert {"rungd", *GROUPS} <= groups
    assert passwd["rungd"][5:] == ["/var/lib/rungd", "/usr/sbin/nologin"]
    subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(TMPFILES)],
                   check=True, capture_output=True)
    assert (tmp_path / "etc/rungd/tools").is_dir()
    assert (tmp_path / "etc/credstore").stat().st_mode & 0o777 == 0o700


def test_unit_and_example_config_agree() -> None:
    unit = unit_settings(UNIT.read_text())
    config = tomllib.loads(EXAMPLE.read_text())
    one = {key: values[-1] for key, values in unit.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert seconds(one["WatchdogSec"]) >= 10
    assert one["ExecStart"] == f"{INSTALLED} serve --config /etc/rungd/rungd.toml"
    assert one["Delegate"] == "yes"
    assert one["KillMode"] == "mixed"  # SIGTERM to the daemon only; it stops the calls itself
    socket_path = Path(config["server"]["socket"])
    assert socket_path.parent == Path("/run") / one["RuntimeDirectory"]
    assert Path(config["state"]["dir"]) == Path("/var/lib") / one["StateDirectory"]
    assert config["server"]["socket_group"] in one["SupplementaryGroups"].split()
    assert config["server"]["socket_mode"] == "0660"
    assert seconds(one["TimeoutStopSec"]) >= config["server"]["shutdown_grace_s"] + 5
    assert one["User"] == "rungd" and "DynamicUser" not in unit
    assert "LoadCredential" in UNIT.read_text()
    sysusers = SYSUSERS.read_text()
    for group in (*GROUPS, one["User"]):
        assert re.search(rf"^[ug]\s+{group}\s", sysusers, re.MULTILINE), group
    assert config["gates"]["operator_groups"] == ["rungd-operators"]
    assert config["access"]["groups"] == ["rungd-callers"]


def test_reload_checks_the_config_before_it_signals() -> None:
    # systemd runs ExecReload= lines in order and stops at the first that fails, so a config
    # or tool file that does not load fails `systemctl reload` instead of a silent SIGHUP.
    unit = unit_settings(UNIT.read_text())
    assert unit["ExecReload"] == [*unit["ExecStartPre"], "/bin/kill -HUP $MAINPID"]
    assert unit["ExecStartPre"] == [f"{INSTALLED} check-config --config /etc/rungd/rungd.toml"]
    # On restart systemd stops the old daemon before ExecStartPre: nothing keeps serving.
    assert "old daemon keeps" not in UNIT.read_text()


async def test_the_reload_check_passes_beside_the_daemon_it_checks(rungd_daemon, capsys, monkeypatch) -> None:
    # ExecReload's check-config runs while the daemon serves: its live socket and state
    # folder must not count against it.
    from rungd import main as rungd_main

    monkeypatch.setattr(rungd_main, "setup_logging", lambda *a, **k: None)
    assert rungd_daemon.socket.is_socket()
    argv = ["check-config", "--config", str(rungd_daemon.config.source)]
    status = await trio.to_thread.run_sync(rungd_main.main, argv)
    assert status == 0, capsys.readouterr().err


def test_every_doc_gives_the_config_one_mode() -> None:
    # rungctl --config must read the config as any operator or caller: 0644, no secret in it.
    readme = (ROOT / "README.md").read_text()
    installs = re.findall(r"install -m (\d+)(?: -g \S+)? configs/rungd\.example\.toml", readme + UNIT.read_text())
    assert installs and set(installs) == {"0644"}, installs
    assert "(mode 0644: it holds no secret)" in EXAMPLE.read_text()
    assert re.search(r"^d\s+/etc/rungd\s+0755 root root", TMPFILES.read_text(), re.MULTILINE)


def test_docs_say_what_running_a_tool_as_another_user_needs_under_the_unit() -> None:
    # The code (declarative/programs.py check_user) loads `user =` only with CAP_SETUID,
    # CAP_SETGID and CAP_CHOWN; the unit empties the bounding set and sets NoNewPrivileges.
    unit = unit_settings(UNIT.read_text())
    assert unit["NoNewPrivileges"] == ["yes"] and unit["CapabilityBoundingSet"] == [""]
    readme = " ".join((ROOT / "README.md").read_text().split())
    guide = " ".join((ROOT / "plugins" / "README.md").read_text().split())
    assert "not there yet" not in readme and "sudo -u` in a tool file is the way" not in readme
    for text in (readme, guide, " ".join(UNIT.read_text().split())):
        assert "CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_CHOWN" in text
        assert "AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_CHOWN" in text
    assert "`NoNewPrivileges=yes` stops every setuid program" in readme
    assert "narrow sudo rule" not in (ROOT / "configs" / "examples" / "apt.toml").read_text()


def test_every_missing_hardening_directive_says_why() -> None:
    text = UNIT.read_text()
    for directive in ("ProtectControlGroups", "PrivateUsers", "MemoryDenyWriteExecute", "ProtectProc"):
        assert re.search(rf"^# RELAXED: not {directive}=", text, re.MULTILINE), directive
    for directive in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                      "RestrictAddressFamilies=", "SystemCallFilter=@system-service", "CapabilityBoundingSet="):
        assert re.search(rf"^{re.escape(directive)}", text, re.MULTILINE), directive


def test_example_config_loads_with_its_groups_and_tool_folder_swapped(tmp_path: Path) -> None:
    # The loader checks that the groups exist and the tool folder is a folder: on a test
    # machine, the test's own group and a scratch folder stand in for them.
    import grp

    mine = grp.getgrgid(os.getgid()).gr_name
    text = EXAMPLE.read_text()
    for group in GROUPS:
        assert f'"{group}"' in text
        text = text.replace(f'"{group}"', f'"{mine}"')
    assert '"/etc/rungd/tools"' in text
    (tmp_path / "tools").mkdir()
    text = text.replace('"/etc/rungd/tools"', f'"{tmp_path / "tools"}"')
    (tmp_path / "rungd.toml").write_text(text)
    result = subprocess.run([str(this_rungd()), "check-config", "--config", str(tmp_path / "rungd.toml")],
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "socket:    /run/rungd/rungd.sock" in result.stdout
    assert "state:     /var/lib/rungd" in result.stdout


def test_example_config_loads_as_shipped_where_installed() -> None:
    import grp

    missing = [g for g in GROUPS if not any(e.gr_name == g for e in grp.getgrall())]
    if missing:
        pytest.skip(f"groups {missing} do not exist here (systemd-sysusers systemd/rungd.sysusers makes them)")
    if not Path("/etc/rungd/tools").is_dir():
        pytest.skip("/etc/rungd/tools does not exist here (systemd-tmpfiles --create systemd/rungd.tmpfiles makes it)")
    config = load_config(EXAMPLE)
    assert config.server.socket == Path("/run/rungd/rungd.sock")


# --- sd_notify, in process ------------------------------------------------------------------


@pytest.fixture
def notify_socket(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's, named in $NOTIFY_SOCKET."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(short_tmp / "notify.sock"))
    sock.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_tmp / "notify.sock"))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def test_notify_is_a_no_op_outside_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    assert (sdnotify.ready(), sdnotify.stopping(), sdnotify.watchdog()) == (False, False, False)
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")  # a form this client does not speak
    assert sdnotify.ready() is False


def test_notify_sends_one_datagram_with_status(notify_socket: socket.socket) -> None:
    assert sdnotify.ready(status="listening on /run/rungd/rungd.sock\nsecond line dropped")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=listening on /run/rungd/rungd.sock"
    assert sdnotify.stopping() and notify_socket.recv(4096) == b"STOPPING=1"
    assert sdnotify.watchdog() and notify_socket.recv(4096) == b"WATCHDOG=1"


def test_notify_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"rungd-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready()
        assert sock.recv(4096) == b"READY=1"


def test_notify_to_a_socket_nobody_reads_returns_false(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_tmp / "nobody.sock"))
    assert sdnotify.ready() is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [("", "", None), ("0", "", None), ("junk", "", None), ("30000000", "", 30.0),
     ("30000000", "self", 30.0), ("30000000", "1", None)],
)
def test_watchdog_interval_is_ours_only(monkeypatch: pytest.MonkeyPatch, usec: str, pid: str,
                                        expected: float | None) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)
    assert sdnotify.watchdog_interval() == expected


async def test_run_watchdog_pings_at_half_the_interval(notify_socket: socket.socket,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    notify_socket.setblocking(False)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(sdnotify.run_watchdog) == 0.2
        await trio.sleep(0.55)  # pings at 0, 0.1, ..., 0.5
        nursery.cancel_scope.cancel()
    pings = []
    while True:
        try:
            pings.append(notify_socket.recv(4096))
        except BlockingIOError:
            break
    assert set(pings) == {b"WATCHDOG=1"}
    assert 4 <= len(pings) <= 7  # a loaded machine may delay a sleep, never add a ping


async def test_run_watchdog_returns_at_once_without_a_watchdog(notify_socket: socket.socket) -> None:
    async with trio.open_nursery() as nursery:
        assert await nursery.start(sdnotify.run_watchdog) is None


# --- sd_notify, from a real `rungd serve` ---------------------------------------------------


class Notifications:
    """What a daemon subprocess sent to our stand-in for systemd's notify socket."""

    def __init__(self, sock: socket.socket, daemon: subprocess.Popen[bytes]) -> None:
        self.sock = sock
        self.daemon = daemon

    def next(self, timeout: float = 15) -> tuple[bytes, float]:
        """The next datagram and when it arrived (time.monotonic)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(4096), time.monotonic()
        except TimeoutError:
            output = self.daemon.stdout.read().decode() if self.daemon.poll() is not None else "(running)"
            raise AssertionError(f"no notification within {timeout} s; daemon output: {output}") from None

    def until(self, prefix: bytes, timeout: float = 15) -> tuple[bytes, list[bytes]]:
        """Read until a datagram starting with ``prefix``; returns it and those before it."""
        before = []
        deadline = time.monotonic() + timeout
        while True:
            message, _ = self.next(max(0.1, deadline - time.monotonic()))
            if message.startswith(prefix):
                return message, before
            before.append(message)


def start_serving(short_tmp: Path, env_extra: dict[str, str], notify_name: str) -> tuple[
        subprocess.Popen[bytes], socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify_name.replace("@", "\0", 1) if notify_name.startswith("@") else notify_name)
    env = {**os.environ, "NOTIFY_SOCKET": notify_name, **env_extra}
    for name in ("WATCHDOG_USEC", "WATCHDOG_PID"):
        if name not in env_extra:
            env.pop(name, None)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "rungd.main", "serve", "--config", str(write_config(short_tmp))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )
    return daemon, sock


def stop(daemon: subprocess.Popen[bytes], sock: socket.socket) -> None:
    daemon.kill()
    daemon.wait()
    daemon.stdout.close()
    sock.close()


@pytest.mark.parametrize("where", ["path", "abstract"])
def test_serve_reports_ready_once_listening_and_stopping_on_sigterm(short_tmp: Path, where: str) -> None:
    name = str(short_tmp / "notify.sock") if where == "path" else f"@rungd-test-{os.getpid()}-{time.monotonic_ns()}"
    daemon, sock = start_serving(short_tmp, {}, name)
    notes = Notifications(sock, daemon)
    try:
        _, before = notes.until(b"READY=1")
        assert before == []  # nothing else first, and no watchdog pings without WATCHDOG_USEC
        with Client(short_tmp / "rungd.sock") as client:  # READY=1 means it already listens
            assert client.hello()
        daemon.send_signal(signal.SIGTERM)
        stopping, _ = notes.until(b"STOPPING=1", timeout=10)
        assert stopping.split(b"\n")[0] == b"STOPPING=1"
        assert daemon.wait(timeout=20) == 0
    finally:
        stop(daemon, sock)


def test_serve_pings_the_watchdog_at_half_its_interval(short_tmp: Path) -> None:
    daemon, sock = start_serving(short_tmp, {"WATCHDOG_USEC": "1000000"}, str(short_tmp / "notify.sock"))
    notes = Notifications(sock, daemon)
    try:
        notes.until(b"READY=1")
        arrivals = []
        while len(arrivals) < 5:
            message, at = notes.next(timeout=5)
            if message == b"WATCHDOG=1":
                arrivals.append(at)
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        # Every 0.5 s; a noisy machine stretches a gap, but never to the 1 s systemd allows.
        assert all(0.3 < gap < 1.0 for gap in gaps), gaps
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0
    finally:
        stop(daemon, sock)


def test_serve_ignores_a_watchdog_meant_for_another_process(short_tmp: Path) -> None:
    daemon, sock = start_serving(short_tmp, {"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"},
                                 str(short_tmp / "notify.sock"))
    notes = Notifications(sock, daemon)
    try:
        _, before = notes.until(b"READY=1")
        time.sleep(0.5)
        sock.setblocking(False)
        after = []
        with pytest.raises(BlockingIOError):
            while True:
                after.append(sock.recv(4096))
        assert b"WATCHDOG=1" not in before + after
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=20)
        stop(daemon, sock)
