"""Reach the rungd of another host through OpenSSH: ``ssh://[user@]host[:port][/path/to/rungd.sock]``.

    with Client(host="ssh://alice@ops1") as rungd: ...       # or RUNGD_HOST=ssh://alice@ops1
    rungctl --host ssh://alice@ops1:2222/run/rungd/rungd.sock tools

As ``DOCKER_HOST=ssh://`` and libvirt's ``qemu+ssh://`` do, the client runs the user's own
``ssh`` (found on PATH, so their ``~/.ssh/config``, keys and agent apply) and lets OpenSSH
forward a Unix socket: ``ssh -N -L LOCAL:REMOTE``, LOCAL in a 0700 folder of our own.
OpenSSH connects to the remote socket itself, so no remote shell command is run for it.
The host's sshd opens that socket as the ssh user, so the daemon sees the ssh user as the
caller (SO_PEERCRED): that user must be in group rungd-callers there, and the daemon's
``[access]`` decides what it may call. The socket defaults to ``/run/rungd/rungd.sock``,
the installed daemon's.

ssh runs with ``BatchMode=yes``: an agent must never hang on a password or host-key
prompt, so the key must be in the agent (or ``IdentityFile``) and the host key known.

ssh goes with the client that started it, however that one ends. It runs under a guard
(``guarded``), a small Python process whose stdin is a pipe only the client holds: when the
client closes the tunnel or dies (even by SIGKILL, threaded or not, sync or on asyncio or
Trio), the guard reads EOF, or sees the client end through a pidfd, and stops ssh (SIGTERM,
SIGKILL after ``STOP_S``); if the guard itself is killed, the kernel sends ssh SIGTERM
(PR_SET_PDEATHSIG, set safely there: the guard has one thread). ssh writes its stderr where
it did, so its failures read the same. The guard delays ssh's start by its own start-up,
about 20 ms. The ``ssh HOST rungctl`` that ``rungctl --host`` runs for the commands that
read the host's files is armed with ``dies_with`` instead: rungctl has no other thread.

Environment:

    RUNGD_HOST             the host when none is given (``Client()``, ``rungctl`` without
                           --host, --socket or --config)
    RUNGD_SSH_CONFIG       an ssh config file to use instead of ~/.ssh/config (``ssh -F``)
    RUNGD_REMOTE_RUNGCTL   the command ``rungctl --host`` runs on the host for the commands
                           that read its files (default ``rungctl``; split as a shell would,
                           so ``sudo -n /opt/rungd/venv/bin/rungctl`` works)

Errors (one line each, with what to do):

    BadHost        ValueError: the URL is not ``ssh://[user@]host[:port][/socket]``
    TunnelFailed   ssh could not log in or forward to the socket; the clients raise it as
                   ``ConnectFailed`` with reason ``ssh``
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import unquote, urlsplit

import anyio
import anyio.abc

from rungd import protocol

HOST_ENV = "RUNGD_HOST"
SSH_CONFIG_ENV = "RUNGD_SSH_CONFIG"
REMOTE_RUNGCTL_ENV = "RUNGD_REMOTE_RUNGCTL"
REMOTE_SOCKET = PurePosixPath("/run/rungd/rungd.sock")
EXAMPLE = "ssh://alice@ops1.example.com:22/run/rungd/rungd.sock"

READY_S = 20.0  # from starting ssh to the daemon's first answer through it
CONNECT_TIMEOUT_S = 10  # ssh's own bound on the TCP connect (its default is the kernel's, minutes)
STOP_S = 2.0  # what ssh gets to exit after SIGTERM before SIGKILL
_GUARD_S = 1.0  # what the guard gets beyond STOP_S to exit once ssh has
NO_PROGRAM = 127  # the guard's exit status when it could not start ssh (as a shell's)
# How often an open looks for ssh's socket while ssh logs in: a connect to a missing path
# costs microseconds, and at 50 ms a start 20 ms later (the guard's) often cost 50.
_POLL_S = 0.01
# The probe: a hello through the tunnel. ssh accepts the local connection before it asks the
# host's sshd to open the remote socket; only an answer shows that the far end is there.
_HELLO = protocol.frame(protocol.Hello(client="rungd.ssh_host"))

Probe = Literal["waiting", "answered", "closed", "silent"]


class BadHost(ValueError):
    """The host URL is not ``ssh://[user@]host[:port][/socket]``."""


class TunnelFailed(Exception):
    """ssh could not log in to the host, or not reach the daemon's socket there."""


@dataclass(frozen=True)
class SshHost:
    """A parsed ``ssh://`` URL.

    Attributes:
        host: the host name (or an alias of the user's ssh config), or address.
        user: the ssh user; None lets ssh decide (its config, else the local user).
        port: None lets ssh decide.
        socket: the daemon's socket on the host.
        socket_given: whether the URL named the socket (else it is ``REMOTE_SOCKET``).
    """

    host: str
    user: str | None = None
    port: int | None = None
    socket: PurePosixPath = REMOTE_SOCKET
    socket_given: bool = False

    @classmethod
    def parse(cls, url: str) -> SshHost:
        """Read ``ssh://[user@]host[:port][/path/to/rungd.sock]``.

        Raises:
            BadHost: another scheme, no host, a password, a bad port, a query, or a socket
                path ssh cannot forward (one with ``:``).
        """
        wrong = f"{url!r} is not an ssh:// URL rungd can use"
        correct = f"write ssh://[USER@]HOST[:PORT][/SOCKET], e.g. {EXAMPLE}"
        parts = urlsplit(url.strip())
        if parts.scheme.lower() != "ssh" or not parts.netloc:
            raise BadHost(f"{wrong}; hint: {correct}")
        try:
            port = parts.port
        except ValueError:
            raise BadHost(f"{wrong}: the port is not a number from 1 to 65535; hint: {correct}") from None
        if parts.password is not None:
            raise BadHost(f"{wrong}: it holds a password; hint: ssh logs in with your keys and agent: {correct}")
        if parts.query or parts.fragment:
            raise BadHost(f"{wrong}: ssh:// takes no ?query or #fragment; hint: {correct}")
        host = parts.hostname or ""
        if not host or host.startswith("-"):  # a leading dash would be read as an ssh option
            raise BadHost(f"{wrong}: no host name; hint: {correct}")
        path = unquote(parts.path)
        if ":" in path or "\0" in path:  # -L LOCAL:REMOTE splits at the colon
            raise BadHost(f"{wrong}: ssh cannot forward a socket path with ':' in it; hint: {correct}")
        given = path not in ("", "/")
        return cls(host=host, user=unquote(parts.username) if parts.username else None, port=port,
                   socket=PurePosixPath(path) if given else REMOTE_SOCKET, socket_given=given)

    @property
    def url(self) -> str:
        """The URL in full, for messages: ``ssh://alice@ops1:22/run/rungd/rungd.sock``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port is not None else ""
        return f"ssh://{user}{host}{port}{self.socket}"

    def ssh_argv(self, *options: str) -> list[str]:
        """``ssh`` with the user's config (or ``$RUNGD_SSH_CONFIG``), the URL's port and user,
        ``options``, then the host: the caller appends the remote command, if any."""
        return self._ssh("-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", *options)

    def _ssh(self, *options: str) -> list[str]:
        config = os.environ.get(SSH_CONFIG_ENV)
        argv = ["ssh", *(["-F", config] if config else []), *options]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.user:
            argv += ["-l", self.user]
        return [*argv, "--", self.host]

    def forward_argv(self, local: Path) -> list[str]:
        """``ssh -N -L LOCAL:SOCKET``: forward ``local`` to the daemon's socket, and nothing else.

        ``ControlPath=none``: through a shared master connection the forwarding would live in
        the master, beyond this ssh's end and out of our reach.
        """
        return self.ssh_argv("-N", "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
                             "-o", "ControlPath=none", "-L", f"{local}:{self.socket}")

    def rungctl_argv(self, words: list[str]) -> list[str]:
        """``ssh HOST rungctl WORDS``: run the host's own rungctl (``$RUNGD_REMOTE_RUNGCTL``).

        sshd hands the command to the remote user's shell as one line, so every word is
        quoted here: a word with a space, ``;`` or ``$(...)`` in it arrives as one argument
        and is never run. Nothing goes into that line unquoted.
        """
        return [*self.ssh_argv("-T"), shlex.join([*remote_rungctl(), *words])]

    @property
    def try_command(self) -> str:
        """What a person runs to see ssh's side of a failure, as rungd runs ssh (no prompt)."""
        return shlex.join(self._ssh("-o", "BatchMode=yes")) + " true"

    def ssh_missing(self) -> TunnelFailed:
        return TunnelFailed(f"cannot reach rungd at {self.url}: no ssh on PATH; hint: install the OpenSSH client "
                            "(apt-get install openssh-client), or reach a socket on this host with --socket")

    def ssh_failed(self, said: str, status: int | None) -> TunnelFailed:
        """Why ssh exited before the daemon answered: its last line of stderr, and what to do.

        ssh's exit status is 255 for every failure of its own, so its words are all there is
        to tell a refused key from an unknown host key; they choose the hint, not the outcome.
        """
        line = last_line(said)
        if "host key" in line.lower():
            hint = (f"connect once by hand ({shlex.join(self._ssh())}) and check the host key it shows, or add it "
                    "to known_hosts: rungd's ssh never accepts an unknown host key")
        elif "Permission denied (" in line:  # ssh lists the methods it tried: (publickey,password)
            hint = (f"give ssh a key {self.host} accepts for that user, with no prompt: ssh-add it to your agent, or "
                    f"set User and IdentityFile for {self.host} in ~/.ssh/config; then `{self.try_command}` works")
        elif any(words in line for words in ("resolve", "refused", "timed out", "No route", "unreachable")):
            hint = f"check the host name and port in the URL, and that sshd runs on {self.host}"
        else:
            hint = f"`{self.try_command}` shows what ssh needs"
        said_how = f"ssh: {line}" if line else f"ssh exited with status {status}"
        return TunnelFailed(f"cannot reach rungd at {self.url}: {said_how}; hint: {hint}")

    def rungctl_missing(self, said: str) -> TunnelFailed:
        """The host's shell found no rungctl (its exit status 127)."""
        name = remote_rungctl()[0]
        return TunnelFailed(f"{self.url}: the ssh user's shell on {self.host} has no {name!r} ({last_line(said)}); "
                            f"hint: install rungd there with rungctl on that user's PATH, or set {REMOTE_RUNGCTL_ENV} "
                            "to its path there, e.g. /opt/rungd/venv/bin/rungctl")


def host_from_env() -> SshHost | None:
    """``$RUNGD_HOST``, parsed; None when unset or empty.

    Raises:
        BadHost: it is set to something else than an ssh:// URL.
    """
    url = os.environ.get(HOST_ENV)
    try:
        return SshHost.parse(url) if url else None
    except BadHost as exc:
        raise BadHost(f"{HOST_ENV}: {exc}") from None


def remote_rungctl() -> list[str]:
    """The command that runs rungctl on the host: ``$RUNGD_REMOTE_RUNGCTL``, else ``rungctl``.

    Raises:
        BadHost: the variable does not split into words (an unbalanced quote).
    """
    given = os.environ.get(REMOTE_RUNGCTL_ENV) or "rungctl"
    try:
        words = shlex.split(given)
    except ValueError as exc:
        raise BadHost(f"{REMOTE_RUNGCTL_ENV}={given!r}: {exc}; hint: give a command as a shell reads it, e.g. "
                      "/opt/rungd/venv/bin/rungctl") from None
    return words or ["rungctl"]


def dies_with(parent: int) -> Callable[[], None]:
    """What ssh's process runs before exec: it is sent SIGTERM when ``parent`` (this process)
    dies, even by SIGKILL (PR_SET_PDEATHSIG), so a killed rungctl leaves no ``ssh HOST
    rungctl`` behind (and the host's rungctl, its connection gone, ends too). Only for a
    process with no other thread: a function before exec is unsafe with threads, and the
    kernel sends the signal when the thread that forked dies, not the process. A tunnel,
    which any client may open, runs under ``guarded`` instead. Looked up here, before the fork."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before that: nobody is left to relay to
            os._exit(1)

    return arm


# The guard, run as ``python -I -S -c _GUARD CLIENT_PID STOP_S ARGV...`` by ``guarded``. It
# imports only the standard library, so it is running its program about 20 ms after it was
# started (importing rungd would add 35), and nothing of the client's environment (PYTHONPATH,
# site-packages, the working folder) can change what it runs. ``arm`` is ``dies_with``'s twin:
# the guard cannot import rungd.
_GUARD = """\
# rungd.ssh_host's guard: ends the program below when the client that started it goes
import ctypes, os, select, signal, subprocess, sys

signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the guard quietly, and arm() ends the program
client, stop_s, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
guard, prctl = os.getpid(), ctypes.CDLL(None, use_errno=True).prctl


def arm():  # in the program, before exec: SIGTERM when this guard dies, even by SIGKILL
    prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != guard:  # the guard died before that
        os._exit(1)


try:
    program = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=arm)
except FileNotFoundError:
    sys.exit(127)
except OSError as exc:
    print(f"cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
    sys.exit(126)
# EOF on stdin: the client closed it, or died. A child the client forked without exec may hold
# the pipe open after it, so the client's own end (a pidfd, from Linux 5.3) counts too.
watch, tick = select.poll(), None
watch.register(0, select.POLLIN)
try:
    watch.register(os.pidfd_open(program.pid), select.POLLIN)
    watch.register(os.pidfd_open(client), select.POLLIN)
except OSError:
    tick = 100  # ms: without pidfds, look at the program and the client this often
while program.poll() is None and os.getppid() == client:
    ready = dict(watch.poll(tick))
    if ready.keys() - {0} or (0 in ready and not os.read(0, 512)):
        break
if program.poll() is None:
    program.terminate()
    try:
        program.wait(stop_s)
    except subprocess.TimeoutExpired:
        program.kill()
status = program.wait()
sys.exit(status if status >= 0 else 128 - status)
"""


def guarded(argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` under a guard which ends it with this process.

    Start it with stdin a pipe (``subprocess.PIPE``: the end left here is close-on-exec, so
    no program this process starts holds it) and keep that end open while ``argv`` should
    run. When it closes, or this process ends (even by SIGKILL, whatever its threads or
    event loop), the guard sends ``argv`` SIGTERM, SIGKILL after ``STOP_S``. It exits when
    ``argv`` does, with its status (128 + N for signal N; ``NO_PROGRAM`` when there is no
    such program, 126 when it cannot be run). ``argv``'s stdin is /dev/null, its stdout
    and stderr the guard's; the guard runs under ``sys.executable``.
    """
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), f"{STOP_S:g}", *argv]


def last_line(text: str) -> str:
    """The last line of ssh's stderr that says something, to quote inside a message: without
    ssh's own ``ssh: `` and a closing full stop (ssh ends its lines with CR LF on a terminal)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1].removeprefix("ssh: ").rstrip(".") if lines else ""


class Tunnel:
    """One ``ssh -N -L`` forwarding a private local socket to the daemon's socket on a host.

    ``open`` (or ``await aopen``) starts ssh and returns the local socket once the daemon
    has answered through it; ``close`` (``aclose``) stops ssh and removes the folder. The
    folder (0700, made by ``mkdtemp``) also holds ssh's stderr, read to explain a failure.
    ssh runs under a guard (``guarded``), so it stops when this process dies, even by
    SIGKILL; only the folder stays behind then, with ssh's stderr in it.

    Args:
        host: where to go.
        ready_s: how long ssh may take to log in and reach the daemon.
    """

    def __init__(self, host: SshHost, ready_s: float = READY_S) -> None:
        self.host = host
        self.ready_s = ready_s
        self.folder: Path | None = None
        self.local: Path | None = None
        # The guard: ssh's parent, which ends it when its stdin, held only here, closes.
        self._process: subprocess.Popen[bytes] | None = None
        self._aprocess: anyio.abc.Process | None = None

    @property
    def running(self) -> bool:
        """Whether ssh still runs (a dropped connection ends it: then open again)."""
        if self._process is not None:
            return self._process.poll() is None
        return self._aprocess is not None and self._aprocess.returncode is None

    def _prepare(self) -> tuple[list[str], Path]:
        if not sys.executable:  # a program embedding Python that does not say where it is
            raise TunnelFailed(f"cannot reach rungd at {self.host.url}: sys.executable is empty, and ssh runs under a "
                               "Python guard that ends it with this process; hint: run the client under a Python "
                               "interpreter (a venv's bin/python)")
        self.folder = Path(tempfile.mkdtemp(prefix="rungd-ssh-"))
        self.local = self.folder / "rungd.sock"
        return guarded(self.host.forward_argv(self.local)), self.folder / "ssh.log"

    def open(self) -> Path:
        """Start ssh and wait (bounded) until the daemon answers through the local socket.

        Returns:
            The local socket, which a ``Client`` connects to.

        Raises:
            TunnelFailed: ssh is missing, failed, or the daemon did not answer in time;
                nothing is left running.
        """
        argv, log = self._prepare()
        try:
            with open(log, "wb") as stderr:  # the guard and ssh keep their own copies of the descriptor
                # In our process group, so a Ctrl-C or a closed terminal ends it with us. Nothing
                # runs here before exec (unsafe with threads): the guard's pipe does the rest.
                self._process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                 stderr=stderr)
            deadline = time.monotonic() + self.ready_s
            while True:
                exited = self._process.poll() is not None
                state = "waiting" if exited else _probe(self.local, deadline - time.monotonic())
                if exited or state != "waiting" or time.monotonic() >= deadline:
                    break
                time.sleep(_POLL_S)
            if state != "answered":
                raise self._failure(state, self._process.poll())
        except BaseException:
            self.close()
            raise
        return self.local

    async def aopen(self) -> Path:
        """``open`` for async code (asyncio or Trio).

        Cancellation: ssh is stopped and the folder removed before the cancellation goes on.
        """
        argv, log = self._prepare()
        try:
            with open(log, "wb") as stderr:
                self._aprocess = await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                          stderr=stderr)
            deadline = anyio.current_time() + self.ready_s
            while True:
                exited = self._aprocess.returncode is not None
                state = "waiting" if exited else await _aprobe(self.local, deadline - anyio.current_time())
                if exited or state != "waiting" or anyio.current_time() >= deadline:
                    break
                await anyio.sleep(_POLL_S)
            if state != "answered":
                raise self._failure(state, self._aprocess.returncode)
        except BaseException:
            await self.aclose()
            raise
        return self.local

    def close(self) -> None:
        """Stop ssh (SIGTERM, then SIGKILL after ``STOP_S``) and remove the folder; idempotent."""
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None
            process.stdin.close()  # EOF: the guard stops ssh, then exits
            try:
                process.wait(STOP_S + _GUARD_S)
            except subprocess.TimeoutExpired:
                process.kill()  # and the kernel sends ssh SIGTERM
                process.wait()
        self._remove_folder()

    async def aclose(self) -> None:
        """``close`` for async code.

        Cancellation: shielded, and bounded by ``STOP_S`` and a second, plus the wait after a
        SIGKILL.
        """
        process, self._aprocess = self._aprocess, None
        with anyio.CancelScope(shield=True):
            if process is not None:
                assert process.stdin is not None
                await process.stdin.aclose()  # EOF: the guard stops ssh, then exits
                with anyio.move_on_after(STOP_S + _GUARD_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()  # and the kernel sends ssh SIGTERM
                await process.aclose()
        self._remove_folder()

    def _remove_folder(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def _failure(self, state: Probe, status: int | None) -> TunnelFailed:
        said = self._ssh_said()
        where = f"cannot reach rungd at {self.host.url}"
        line = last_line(said)
        if state == "closed":  # ssh took the connection, then its channel to the socket failed
            if "prohibited" in line:
                return TunnelFailed(f"{where}: the sshd on {self.host.host} does not forward Unix sockets (ssh: "
                                    f"{line}); hint: allow it in that sshd_config: AllowStreamLocalForwarding yes, "
                                    "and no DisableForwarding")
            user = f"the ssh user ({self.host.user})" if self.host.user else "the ssh user"
            return TunnelFailed(f"{where}: ssh logged in, but the sshd on {self.host.host} could not connect to "
                                f"{self.host.socket} (ssh: {line or 'open failed'}); hint: check that rungd runs there "
                                "and serves that socket (`systemctl status rungd`; server.socket in its config goes in "
                                f"the URL's path), and that {user} may open it: the ssh user must be in group "
                                f"rungd-callers on {self.host.host}")
        if state == "silent":
            return TunnelFailed(f"{where}: ssh reached {self.host.socket}, but nothing answered there within "
                                f"{self.ready_s:g} s; hint: is that rungd's socket (server.socket in its config), and "
                                f"is rungd well (`systemctl status rungd` on {self.host.host})?")
        if status == NO_PROGRAM:  # the guard found no ssh to run
            return self.host.ssh_missing()
        if status is None:  # still running at the deadline, the socket never forwarded
            return TunnelFailed(f"{where}: ssh did not log in and forward within {self.ready_s:g} s"
                                f"{f' (ssh: {line})' if line else ''}; hint: `{self.host.try_command}` shows "
                                "where it waits")
        return self.host.ssh_failed(said, status)

    def _ssh_said(self) -> str:
        if self.folder is None:
            return ""
        try:
            with open(self.folder / "ssh.log", "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 4096))
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""


def _probe(local: Path | None, timeout: float) -> Probe:
    """Say hello through the tunnel: ``answered``, ``closed`` (ssh's channel failed),
    ``silent`` (no answer in ``timeout``) or ``waiting`` (ssh does not listen yet)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(max(timeout, _POLL_S))
        try:
            sock.connect(str(local))
        except (FileNotFoundError, ConnectionRefusedError):
            return "waiting"
        try:
            sock.sendall(_HELLO)
            return "answered" if sock.recv(1) else "closed"
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        except TimeoutError:
            return "silent"


async def _aprobe(local: Path | None, timeout: float) -> Probe:
    """``_probe`` for async code."""
    try:
        stream = await anyio.connect_unix(str(local))
    except (FileNotFoundError, ConnectionRefusedError):
        return "waiting"
    async with stream:
        with anyio.move_on_after(max(timeout, _POLL_S)):
            try:
                await stream.send(_HELLO)
                await stream.receive(1)
                return "answered"
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError, BrokenPipeError):
                return "closed"
    return "silent"
