"""``--host ssh://...`` and ``Client(host=...)``: a real sshd on loopback, a real daemon behind it.

The sshd runs as root from a config of the test's own (its host key, one authorized client
key, no password, ``StrictModes no``); the client side gets an ssh config through
``RUNGD_SSH_CONFIG`` that trusts exactly that host key. Skipped when there is no sshd
(``apt-get install openssh-server``) or the test is not root (sshd must switch users).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import psutil
import pytest
import trio

from rungd.aclient import AsyncClient
from rungd.client import Client, ClientError, ConnectFailed
from rungd.ctl.app import _without_host
from rungd.ssh_host import REMOTE_SOCKET, STOP_S, BadHost, SshHost, guarded

SSHD = Path("/usr/sbin/sshd")
RUNGCTL = Path(sys.executable).with_name("rungctl")
NOBODY = "nobody"


@dataclass
class Sshd:
    port: int
    folder: Path
    ssh_config: Path

    def url(self, socket_path: Path | str, user: str = "root") -> str:
        return f"ssh://{user}@127.0.0.1:{self.port}{socket_path}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def sshd(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sshd]:
    """An sshd on 127.0.0.1 that lets root (and nobody) in with one key, and an ssh config for it."""
    if os.geteuid() != 0:
        pytest.skip("sshd must run as root to log users in")
    if not SSHD.exists() or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip("needs OpenSSH: apt-get install openssh-server openssh-client")
    folder = short_tmp / "ssh"
    folder.mkdir()
    folder.chmod(0o755)  # sshd reads the authorized keys as the user logging in
    short_tmp.chmod(0o755)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    port = _free_port()
    (folder / "sshd_config").write_text(
        f"HostKey {folder / 'host_key'}\nListenAddress 127.0.0.1\nPidFile none\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "AllowStreamLocalForwarding yes\nLogLevel VERBOSE\n")
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {(folder / 'host_key.pub').read_text()}")
    ssh_config = folder / "ssh_config"
    ssh_config.write_text(
        f"Host *\n  IdentityFile {folder / 'client_key'}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege separation folder
    with open(folder / "sshd.log", "wb") as log:
        server = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(folder / "sshd_config"), "-p", str(port)],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"sshd did not start: {(folder / 'sshd.log').read_text()[-300:]}")
                time.sleep(0.05)
        monkeypatch.setenv("RUNGD_SSH_CONFIG", str(ssh_config))
        monkeypatch.setenv("RUNGD_REMOTE_RUNGCTL", str(RUNGCTL))
        for name in ("RUNGD_HOST", "RUNGD_SOCKET", "RUNGD_CONFIG"):
            monkeypatch.delenv(name, raising=False)
        yield Sshd(port, folder, ssh_config)
    finally:
        server.terminate()
        server.wait(5)


async def rungctl(*args: str, **env: str) -> trio.CompletedProcess:
    return await trio.run_process([sys.executable, "-m", "rungd.ctl", *args], capture_stdout=True,
                                  capture_stderr=True, check=False, env={**os.environ, **env})


def one_line(done: trio.CompletedProcess) -> str:
    text = done.stderr.decode()
    assert text.count("\n") == 1, text
    return text


# --- through the tunnel: the socket commands and both clients --------------------------------

async def test_rungctl_host_lists_tools_and_calls_one_through_ssh(sshd: Sshd, rungd_daemon) -> None:
    url = sshd.url(rungd_daemon.socket)
    listed = await rungctl("--host", url, "tools")
    assert listed.returncode == 0, listed.stderr
    assert b"inventory_item_show" in listed.stdout
    called = await rungctl("call", "inventory_item_show", "item=widget", "--json", "--host", url)
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["status"] == "ok"
    from_env = await rungctl("tools", RUNGD_HOST=url, RUNGD_SOCKET="/nonexistent/rungd.sock")
    assert from_env.returncode == 0 and b"inventory_item_show" in from_env.stdout, from_env.stderr


async def test_the_daemon_sees_the_ssh_user_and_the_tunnel_goes_with_the_client(sshd: Sshd, rungd_daemon) -> None:
    def talk() -> tuple[int, int, str, Path, Path]:
        with Client(host=sshd.url(rungd_daemon.socket)) as rungd:
            welcome = rungd.hello()
            env = rungd.call("inventory_item_show", {"item": "widget"})
            return welcome.uid, welcome.pid, env.status, rungd.path, rungd.path.parent

    uid, pid, status, local, folder = await trio.to_thread.run_sync(talk)
    # The peer of the daemon's socket is the host's sshd, logged in as root: not this process.
    assert (uid, status) == (0, "ok") and pid != os.getpid()
    assert not folder.exists(), "close() leaves the tunnel's folder behind"
    assert local.name == "rungd.sock"


async def test_async_client_reaches_the_host_on_trio_and_on_asyncio(sshd: Sshd, rungd_daemon) -> None:
    async def go() -> Path:
        async with AsyncClient(host=sshd.url(rungd_daemon.socket)) as rungd:
            assert "inventory_item_show" in {t.name for t in await rungd.list_tools()}
            env = await rungd.call("inventory_item_show", {"item": "widget"})
            assert env.status == "ok"
            return rungd.path.parent

    assert not (await go()).exists()
    assert not (await trio.to_thread.run_sync(lambda: asyncio.run(go()))).exists()


async def test_async_client_starts_ssh_again_after_the_connection_to_the_host_dropped(sshd: Sshd,
                                                                                      rungd_daemon) -> None:
    async with AsyncClient(host=sshd.url(rungd_daemon.socket)) as rungd:
        await rungd.hello()
        guard = rungd._tunnel._aprocess
        [ssh] = psutil.Process(guard.pid).children()
        ssh.kill()  # as a dropped network connection ends it; its guard follows
        with trio.fail_after(5):
            await guard.wait()
        with pytest.raises(ClientError):
            await rungd.hello()
        await rungd.connect()
        assert (await rungd.hello()).uid == 0


# --- the commands that read the host's files run the host's rungctl --------------------------

async def test_tail_status_and_verify_run_the_remote_rungctl(sshd: Sshd, rungd_daemon) -> None:
    env = await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    url, config = sshd.url(rungd_daemon.socket), str(rungd_daemon.config.file)
    tail = await rungctl("--host", url, "--config", config, "tail", "-n", "2", "--call", env.call_id)
    assert tail.returncode == 0, tail.stderr
    assert [line.split()[2] for line in tail.stdout.decode().splitlines()] == ["dispatched", "finished"]
    status = await rungctl("--host", url, "--config", config, "status", env.call_id, "--json")
    assert status.returncode == 0, status.stderr
    assert "received" in [event["event"] for event in json.loads(status.stdout)["history"]]
    verify = await rungctl("--host", url, "--config", config, "ledger", "verify")
    assert verify.returncode == 0 and verify.stdout.startswith(b"ledger ok"), verify.stderr


async def test_remote_arguments_are_quoted_so_the_remote_shell_runs_none(sshd: Sshd, rungd_daemon) -> None:
    marker = sshd.folder / "ran"
    tool = f"x; touch {marker}; $(touch {marker})"
    done = await rungctl("--host", sshd.url(rungd_daemon.socket), "--config", str(rungd_daemon.config.file),
                         "tail", "--tool", tool)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"" and not marker.exists()


async def test_a_remote_rungctl_error_is_relayed_with_its_status(sshd: Sshd, rungd_daemon) -> None:
    done = await rungctl("--host", sshd.url(rungd_daemon.socket), "--config", str(rungd_daemon.config.file),
                         "tail", "--since", "not a time")
    assert done.returncode == 2
    assert one_line(done).startswith("rungctl: 127.0.0.1: --since 'not a time': not a time")


async def test_no_rungctl_on_the_host_says_how_to_name_it(sshd: Sshd, rungd_daemon) -> None:
    done = await rungctl("--host", sshd.url(rungd_daemon.socket), "tail",
                         RUNGD_REMOTE_RUNGCTL="/nonexistent/bin/rungctl")
    assert done.returncode == 3
    assert "RUNGD_REMOTE_RUNGCTL" in one_line(done)


# --- failures: one line each, naming what to fix ---------------------------------------------

async def test_a_wrong_remote_socket_is_one_line_naming_it(sshd: Sshd, rungd_daemon) -> None:
    done = await rungctl("--host", sshd.url("/nonexistent/rungd.sock"), "tools")
    assert done.returncode == 3
    line = one_line(done)
    assert "/nonexistent/rungd.sock" in line and "rungd-callers" in line and "hint:" in line

    def connect() -> ConnectFailed:
        with pytest.raises(ConnectFailed) as caught:
            Client(host=sshd.url("/nonexistent/rungd.sock"))
        return caught.value

    tunnels = set(Path(tempfile.gettempdir()).glob("rungd-ssh-*"))
    failed = await trio.to_thread.run_sync(connect)
    assert failed.reason == "ssh" and str(failed.path) == "/nonexistent/rungd.sock"
    assert set(Path(tempfile.gettempdir()).glob("rungd-ssh-*")) == tunnels, "a failed tunnel left its folder"


async def test_a_socket_the_ssh_user_may_not_open_names_the_group(sshd: Sshd, rungd_daemon) -> None:
    rungd_daemon.socket.chmod(0o660)  # root's: nobody may not connect
    done = await rungctl("--host", sshd.url(rungd_daemon.socket, user=NOBODY), "tools")
    line = one_line(done)
    if "Permission denied (publickey)" in line:
        pytest.skip("this system's sshd does not let nobody log in")
    assert done.returncode == 3
    assert f"the ssh user ({NOBODY})" in line and "group rungd-callers on 127.0.0.1" in line


async def test_an_unknown_host_key_is_refused_with_how_to_accept_it(sshd: Sshd, rungd_daemon) -> None:
    (sshd.folder / "known_hosts").write_text("")
    done = await rungctl("--host", sshd.url(rungd_daemon.socket), "tools")
    assert done.returncode == 3
    line = one_line(done)
    assert "Host key verification failed" in line and "known_hosts" in line


async def test_no_ssh_on_path_says_what_to_install(short_tmp: Path) -> None:
    done = await rungctl("--host", "ssh://ops1", "tools", PATH=str(short_tmp))
    assert done.returncode == 3
    assert "no ssh on PATH" in one_line(done)


async def test_host_with_socket_or_a_bad_url_is_a_usage_error() -> None:
    both = await rungctl("--host", "ssh://ops1", "--socket", "/tmp/x.sock", "tools")
    assert both.returncode == 2 and "give one" in one_line(both)
    bad = await rungctl("tools", RUNGD_HOST="http://ops1")
    assert bad.returncode == 2 and "RUNGD_HOST" in one_line(bad)
    config = await rungctl("--host", "ssh://ops1", "--config", "/etc/rungd/rungd.toml", "tools")
    assert config.returncode == 2 and "in the URL instead: ssh://ops1/run/rungd/rungd.sock" in one_line(config)


# --- parsing ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "expected"), [
    ("ssh://ops1", SshHost("ops1", socket=REMOTE_SOCKET, socket_given=False)),
    ("ssh://alice@ops1:2222", SshHost("ops1", "alice", 2222)),
    ("ssh://alice@ops1/srv/rungd.sock", SshHost("ops1", "alice", None, PurePosixPath("/srv/rungd.sock"), True)),
    ("SSH://[::1]:22/", SshHost("::1", None, 22)),
    ("ssh://ops1/run/my%20rungd.sock", SshHost("ops1", socket=PurePosixPath("/run/my rungd.sock"), socket_given=True)),
])
def test_a_url_gives_host_user_port_and_socket(url: str, expected: SshHost) -> None:
    parsed = SshHost.parse(url)
    assert parsed == expected
    assert SshHost.parse(parsed.url).url == parsed.url


@pytest.mark.parametrize(("url", "says"), [
    ("ops1", "ssh://[USER@]HOST"),
    ("http://ops1", "ssh://[USER@]HOST"),
    ("ssh://alice:secret@ops1", "password"),
    ("ssh://ops1:99999", "port"),
    ("ssh://ops1/a:b.sock", "':'"),
    ("ssh://-oProxyCommand=x", "no host name"),
    ("ssh://ops1?x=1", "query"),
])
def test_a_bad_url_is_refused_with_an_example(url: str, says: str) -> None:
    with pytest.raises(BadHost, match="hint: ") as caught:
        SshHost.parse(url)
    assert says in str(caught.value)


def test_the_remote_command_line_quotes_every_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNGD_REMOTE_RUNGCTL", "sudo -n /opt/rungd/venv/bin/rungctl")
    monkeypatch.delenv("RUNGD_SSH_CONFIG", raising=False)
    argv = SshHost.parse("ssh://alice@ops1:2222").rungctl_argv(["tail", "--tool", "a b; rm -rf /"])
    assert argv[0] == "ssh"
    assert argv[-3:] == ["--", "ops1", "sudo -n /opt/rungd/venv/bin/rungctl tail --tool 'a b; rm -rf /'"]
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "alice" and "-T" in argv


def test_host_is_taken_out_of_the_words_passed_on() -> None:
    assert _without_host(["--host", "ssh://a", "tail", "--host=ssh://b", "-n", "3", "--ho", "ssh://c"]) == \
        ["tail", "-n", "3"]
    assert _without_host(["health", "--", "--host"]) == ["health", "--", "--host"]


def test_the_ssh_of_a_killed_rungctl_dies_with_it() -> None:
    # Issue 31: rungctl --host runs ssh as its child; SIGKILLed, it used to leave ssh running
    # (and the host's rungctl behind it). ssh is armed to be sent SIGTERM when rungctl dies.
    script = ("import os, subprocess; from rungd.ssh_host import dies_with; "
              "p = subprocess.Popen(['sleep', '60'], preexec_fn=dies_with(os.getpid())); "
              "print(p.pid, flush=True); p.wait()")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        raise AssertionError("the child outlived the rungctl that started it")


async def test_a_remote_follow_ends_when_the_local_rungctl_is_killed(sshd: Sshd, rungd_daemon) -> None:
    url, config = sshd.url(rungd_daemon.socket), str(rungd_daemon.config.file)
    await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    local = subprocess.Popen([sys.executable, "-m", "rungd.ctl", "--host", url, "--config", config, "tail", "-f"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert b"inventory_item_show" in await trio.to_thread.run_sync(local.stdout.readline)
        local.kill()
        local.wait()

        def left() -> list[str]:
            found = []
            for proc in psutil.process_iter(["cmdline"]):
                line = " ".join(proc.info["cmdline"] or [])
                if config in line and "tail -f" in line:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        if proc.status() != psutil.STATUS_ZOMBIE:
                            found.append(line)
            return found

        with trio.move_on_after(10):
            while await trio.to_thread.run_sync(left):
                await trio.sleep(0.1)
        assert not await trio.to_thread.run_sync(left), "ssh or the host's rungctl outlived the local rungctl"
    finally:
        local.kill()
        local.wait()
        local.stdout.close()
        local.stderr.close()


# Agents that open a tunnel, say "ready" and wait to be killed: with no other thread; with
# threads, the client opened by one that has ended since (the kernel's PR_SET_PDEATHSIG would
# fire then); and AsyncClient, whose anyio has no hook to run before exec, on both loops.
CLIENT_THEN_WAIT = """
import sys, time
from rungd.client import Client
client = Client(host=sys.argv[1])
client.tool_listing()
print("ready", flush=True)
time.sleep(120)
"""

THREADED_CLIENT_THEN_WAIT = """
import sys, threading, time
from rungd.client import Client
threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
opened = []
opener = threading.Thread(target=lambda: opened.append(Client(host=sys.argv[1])))
opener.start()
opener.join()
opened[0].tool_listing()
print("ready", flush=True)
time.sleep(120)
"""

ASYNC_CLIENT_THEN_WAIT = """
import sys, anyio
from rungd.aclient import AsyncClient
async def main():
    client = await AsyncClient(host=sys.argv[1]).connect()
    await client.hello()
    print("ready", flush=True)
    await anyio.sleep(120)
anyio.run(main, backend=sys.argv[2])
"""


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    running = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
    return running


@pytest.mark.parametrize("agent", [
    pytest.param([CLIENT_THEN_WAIT], id="sync"),
    pytest.param([THREADED_CLIENT_THEN_WAIT], id="sync-threaded"),
    pytest.param([ASYNC_CLIENT_THEN_WAIT, "asyncio"], id="async-asyncio"),
    pytest.param([ASYNC_CLIENT_THEN_WAIT, "trio"], id="async-trio"),
])
async def test_a_killed_clients_tunnel_goes_with_it(sshd: Sshd, rungd_daemon, agent: list[str]) -> None:
    # A Client(host=...) in an agent's process starts ssh for its tunnel; the agent SIGKILLed,
    # its ssh used to stay, forwarding to the host's daemon for nobody; from a threaded agent
    # or an AsyncClient still after ssh was armed with PR_SET_PDEATHSIG where that was safe.
    script, *args = agent
    url = sshd.url(rungd_daemon.socket)
    agent_process = subprocess.Popen([sys.executable, "-c", script, url, *args], stdout=subprocess.PIPE)
    tunnels: list[psutil.Process] = []
    try:
        assert await trio.to_thread.run_sync(agent_process.stdout.readline) == b"ready\n"
        below = psutil.Process(agent_process.pid).children(recursive=True)
        tunnels = [p for p in below if p.name() == "ssh"]
        assert tunnels, "no ssh under the client"
        agent_process.kill()
        agent_process.wait()
        with trio.move_on_after(5):
            while _running(below):
                await trio.sleep(0.05)
        assert not _running(tunnels), "the tunnel's ssh outlived the client that started it"
        assert not _running(below), "the guard outlived the client that started it"
    finally:
        agent_process.kill()
        agent_process.wait()
        agent_process.stdout.close()
        for left in _running(tunnels):  # so that a failure here leaves no ssh for the next test
            left.kill()


# --- the guard itself, with any program: no sshd needed ---------------------------------------

# A threaded agent that starts `sleep` under the guard from a thread that ends, then forks a
# child that keeps a copy of the guard's pipe (as multiprocessing's fork does), and waits.
GUARDED_SLEEP_THEN_WAIT = """
import os, subprocess, sys, threading, time
from rungd.ssh_host import guarded
started = []
starter = threading.Thread(target=lambda: started.append(
    subprocess.Popen(guarded(["sleep", "120"]), stdin=subprocess.PIPE)))
starter.start()
starter.join()
forked = os.fork()
if forked == 0:
    time.sleep(120)
    os._exit(0)
print(started[0].pid, forked, flush=True)
time.sleep(120)
"""


def test_the_guards_program_dies_with_a_killed_threaded_client_even_when_a_fork_holds_its_pipe() -> None:
    agent = subprocess.Popen([sys.executable, "-c", GUARDED_SLEEP_THEN_WAIT], stdout=subprocess.PIPE)
    below: list[psutil.Process] = []
    try:
        guard_pid, forked = map(int, agent.stdout.readline().split())
        below.append(psutil.Process(forked))
        guard = psutil.Process(guard_pid)
        deadline = time.monotonic() + 5
        while not guard.children() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [p.name() for p in guard.children()] == ["sleep"]
        below += [guard, *guard.children()]
        agent.kill()
        agent.wait()
        _, left = psutil.wait_procs(below[1:], timeout=5)
        assert not left, "the guarded program outlived its client"
    finally:
        agent.kill()
        agent.wait()
        agent.stdout.close()
        for process in _running(below):  # the fork, and what a failure left
            process.kill()


def test_closing_the_guards_stdin_ends_its_program_at_once_and_gives_its_status() -> None:
    guard = subprocess.Popen(guarded(["sleep", "120"]), stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 5
        while not psutil.Process(guard.pid).children() and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        guard.stdin.close()
        assert guard.wait(STOP_S) == 128 + 15  # sleep's SIGTERM, as a shell says it
        assert time.monotonic() - started < 1
    finally:
        guard.kill()
        guard.wait()
    # Its stdin held open (run() would close it at once), the program ends on its own.
    for argv, status in (([sys.executable, "-c", "raise SystemExit(3)"], 3), (["/nonexistent/ssh"], 127)):
        with subprocess.Popen(guarded(argv), stdin=subprocess.PIPE) as guard:
            assert guard.wait(5) == status


def test_a_killed_guard_takes_its_program_with_it() -> None:
    with subprocess.Popen(guarded(["sleep", "120"]), stdin=subprocess.PIPE) as guard:
        deadline = time.monotonic() + 5
        while not psutil.Process(guard.pid).children() and time.monotonic() < deadline:
            time.sleep(0.01)
        [program] = psutil.Process(guard.pid).children()
        guard.kill()
    _, left = psutil.wait_procs([program], timeout=5)
    for process in left:
        process.kill()
    assert not left, "the guard's program outlived it"
