"""Starting a call's program, born in its own cgroup, through the daemon's launcher.

The launcher (:mod:`rungd.runner.launcher`, or its compiled twin ``launcher.c`` where the package
was built with a C compiler: :func:`compiled_launcher`) is a small process started once per daemon; it
makes each program with ``clone3(CLONE_INTO_CGROUP | CLONE_PARENT)``, so the program runs its
first instruction inside its call's cgroup (nothing it forks is ever outside it, and no
migration after an idle pause costs the call 7-15 ms) and is the daemon's own child (the daemon
waits for it by pidfd and hears its real exit status). The daemon is never forked: a fork of a
40 MB multithreaded daemon cost each call 3-4 ms of CPU and copy-on-write afterwards.

What the daemon does per program: four pipes, a descriptor of the call's cgroup, one message to
the launcher (argv, environment, folder, limits, user, and the descriptors by SCM_RIGHTS), then
it reads the error pipe: the pid (``P<pid>`` from the launcher as soon as the process is made,
``C<pid>`` from the process itself, in either order: the first tells the pid), then end of
file (the program is running; ``C`` must have come) or ``<errno>:<step>`` (it could not be
started).

:class:`Launcher` keeps the launcher process and up to ``MAX_SPARES`` empty call cgroups
(making and removing one takes the kernel a moment, so the empty cgroup of a call that ended
is a next call's, unless it was killed or changed): the daemon keeps one Launcher on its
reaper (:func:`for_reaper`); code running without a daemon shares one per process.
"""

from __future__ import annotations

import array
import contextlib
import errno
import functools
import hashlib
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import trio

from rungd.system import proctree
from rungd.runner import launcher as _launcher
from rungd.runner.limits import Limits

log = logging.getLogger("rungd.runner")

_LAUNCHER = Path(_launcher.__file__)
_COMPILED = _LAUNCHER.with_name("rungd-launcher")  # built from launcher.c by the package's build hook
MAX_SPARES = 32  # empty call cgroups kept for the next calls (each costs the kernel little)
_REDATE_S = 10.0  # a kept cgroup is dated again this long after it last was (sweeps spare a minute)
_SEND_TIMEOUT_S = 5.0  # the launcher reads at once; one that does not is stuck, and replaced
_PID_TIMEOUT_S = 5.0  # the new process says its pid before anything else
_FS, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


# Ambient capabilities (a daemon given CAP_SETUID and CAP_SETGID to run tools as their
# users): kept for the launcher alone. Capability sets are per thread, and a thread's new
# threads and children inherit them: cleared in the daemon's one thread at start, they are
# in no worker thread and no child (ssh-keygen, a regex parse), and raised only around the
# launcher's start, which clears them again in every program it makes.
_AMBIENT: tuple[int, ...] = ()
_prctl = _launcher._libc.prctl
_CAP_AMBIENT = _launcher._PR_CAP_AMBIENT


def keep_ambient_for_launcher() -> tuple[int, ...]:
    """Take the ambient capabilities this process was started with out of it, keeping them
    for its launcher. Call once at start, while the process has one thread.

    Returns:
        The capabilities kept (numbers), none where there were none or the kernel has no
        ambient set.
    """
    global _AMBIENT
    held = tuple(cap for cap in range(64) if _prctl(_CAP_AMBIENT, _launcher._PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1)
    if held and _prctl(_CAP_AMBIENT, _launcher._PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) == 0:
        _AMBIENT = held
    return _AMBIENT


@contextlib.contextmanager
def _ambient_for_the_launcher() -> Iterator[None]:
    """The kept ambient capabilities, in this thread only, while the launcher is started."""
    raised = [cap for cap in _AMBIENT if _prctl(_CAP_AMBIENT, _launcher._PR_CAP_AMBIENT_RAISE, cap, 0, 0) == 0]
    try:
        yield
    finally:
        if raised:
            _prctl(_CAP_AMBIENT, _launcher._PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def _encode(text: str | bytes | os.PathLike[str]) -> bytes:
    """os.fsencode, without its lookups for the common case (a call encodes a few dozen)."""
    return text.encode(_FS, _FS_ERRORS) if type(text) is str else os.fsencode(text)


def _encode_env(env: Mapping[str, str]) -> dict[bytes, bytes]:
    """The environment as the wire carries it: str.encode for a few dozen strings, no call of
    :func:`_encode` per name and value."""
    try:
        return {name.encode(_FS, _FS_ERRORS): value.encode(_FS, _FS_ERRORS) for name, value in env.items()}
    except AttributeError:  # bytes or paths among them
        return {_encode(name): _encode(value) for name, value in env.items()}


def source_digest() -> str:
    """What a compiled launcher built from this source says to ``--source``: a digest of
    launcher.c and of launcher.py, which defines the wire both read (hatch_build.py embeds it)."""
    digest = hashlib.sha256(_LAUNCHER.with_suffix(".c").read_bytes())
    digest.update(_LAUNCHER.read_bytes())
    return digest.hexdigest()[:16]


def own_files() -> list[tuple[Path, str]]:
    """rungd's own files that run every program, for :func:`rungd.service.daemon.check_sources`: the
    package (its folder: the Python launcher, the askpass helper's source, every module) and the
    compiled launcher where one was built."""
    files = [(_LAUNCHER.parent.parent, "rungd's own code"), (_LAUNCHER, "the Python launcher")]
    if _COMPILED.exists():
        files.append((_COMPILED, "the compiled launcher"))
    return files


@functools.cache
def compiled_launcher() -> Path | None:
    """The compiled launcher, if it was built from the launcher.c and launcher.py beside it (a
    launcher built from another source may speak another wire): else None, and the Python one
    is used.

    Asked once per process: the binary prints the digest of its source (``--source``).
    """
    if not _COMPILED.exists():
        return None
    try:
        wanted = source_digest()
        said = subprocess.run([str(_COMPILED), "--source"], capture_output=True, timeout=5, check=False,
                              env={}, cwd="/").stdout.strip().decode("ascii", "replace")
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("the compiled launcher %s cannot be run (%s); using the Python launcher", _COMPILED, exc)
        return None
    if said != wanted:
        log.warning("the compiled launcher %s was built from another source (%s, not %s); using the "
                    "Python launcher; hint: reinstall rungd to rebuild it", _COMPILED, said or "nothing", wanted)
        return None
    return _COMPILED


class SpawnError(OSError):
    """The program could not be started (``exec``, or what precedes it); ``errno`` says why."""


class LostStart(OSError):
    """The program was made, but the daemon could not hold on to it (no descriptor for its
    pidfd): it was killed at once, and may have run its first instructions."""


class Pipe:
    """Our end of one of a program's pipes: non-blocking, and closed at once by :meth:`close`
    (a Trio stream closes at its next checkpoint, which costs a call a turn of the loop each).

    The runner reads stdout and stderr with :meth:`read` when the call's own poller says so
    (:class:`rungd.runner.streams.Outputs`); :meth:`receive_some` and :meth:`send_all` wait
    through Trio for code that reads or writes one pipe alone.
    """

    def __init__(self, fd: int) -> None:
        if fd >= 0:  # -1: no pipe (a screen program's stdio is its terminal)
            os.set_blocking(fd, False)
        self._fd = fd
        self._waited = False  # Trio was asked to wait on it: it must hear of the close

    def fileno(self) -> int:
        return self._fd

    def read(self, size: int = 1 << 16) -> bytes | None:
        """What the pipe holds now, up to ``size`` bytes: b"" at end of file (or once closed),
        None when nothing is there yet."""
        if self._fd < 0:
            return b""
        try:
            return os.read(self._fd, size)
        except BlockingIOError:
            return None
        except OSError:  # EIO and the like: nothing more will come
            return b""

    async def receive_some(self, size: int = 1 << 16) -> bytes:
        """Wait for output and return it; b"" at end of file.

        Raises:
            trio.ClosedResourceError: the pipe was closed meanwhile.
        """
        while (chunk := self.read(size)) is None:
            self._waited = True
            await trio.lowlevel.wait_readable(self._fd)
        return chunk

    async def send_all(self, data: bytes) -> None:
        """Write all of ``data``, waiting while the pipe is full.

        Raises:
            trio.BrokenResourceError: the program closed its end (it exited, say).
            trio.ClosedResourceError: this end was closed.

        Cancellation: stops at once; part of ``data`` may have been written.
        """
        view = memoryview(data)
        while view:
            if self._fd < 0:
                raise trio.ClosedResourceError("the pipe was closed")
            try:
                view = view[os.write(self._fd, view):]
            except BlockingIOError:
                self._waited = True
                await trio.lowlevel.wait_writable(self._fd)
            except OSError as exc:  # EPIPE: nobody reads any more
                raise trio.BrokenResourceError(exc.strerror) from exc

    def close(self) -> None:
        """Close it now; a task waiting on it wakes with ClosedResourceError. Safe twice."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            if self._waited:  # else Trio never held it (a system call saved per pipe and call)
                with contextlib.suppress(RuntimeError):  # outside Trio: nobody can be waiting on it
                    trio.lowlevel.notify_closing(fd)
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class Child:
    """A program started by the launcher: the interface of ``trio.Process`` the runner uses.

    Its exit is learned from its pidfd, which becomes readable only when the process has
    exited; only then is it reaped (``waitid``). A stopped or ptrace-stopped child is
    therefore still running, never "killed by signal 5".
    """

    def __init__(self, pid: int, pidfd: int, stdin: int, stdout: int, stderr: int, *,
                 start: int | None = None, output: int = -1) -> None:
        self.pid = pid
        self.start = start  # its start time in clock ticks, when the spawn knows it (proctree.start_between)
        self._pidfd = pidfd
        self._waited = False  # as Pipe's
        self._returncode: int | None = None
        self.stdin = Pipe(stdin)
        self.stdout = Pipe(stdout)
        self.stderr = Pipe(stderr)
        self.output = Pipe(output)  # a screen program's answer descriptor (Screen.output_fd), or none

    def pidfd(self) -> int:
        """The pidfd, readable once the program has exited; -1 once it is reaped."""
        return self._pidfd

    def close_pipes(self) -> None:
        for pipe in (self.stdin, self.stdout, self.stderr, self.output):
            pipe.close()

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: the signal that killed it), or None while it runs."""
        if self._returncode is None and self._pidfd >= 0 and _readable(self._pidfd):
            self._reap()
        return self._returncode

    def exited(self) -> None:
        """The pidfd said it exited (the caller's own epoll did): reap it if it can be reaped
        now, without asking the pidfd again as :attr:`returncode` does."""
        if self._returncode is None and self._pidfd >= 0:
            self._reap()

    async def wait(self) -> int:
        """Wait until the program exits and return its status.

        Cancellation: stops waiting; the program is not touched.
        """
        while self._returncode is None:
            try:
                self._waited = True
                await trio.lowlevel.wait_readable(self._pidfd)
            except trio.ClosedResourceError:
                continue  # another task reaped it meanwhile (through returncode)
            if self._returncode is None and not self._reap():
                # Exited, but a tracer has not collected it yet: the parent may reap it only
                # after that, so look again shortly instead of blocking in waitid.
                await trio.sleep(0.01)
        return self._returncode

    def _reap(self) -> bool:
        """Reap the child if it can be reaped now; True once its exit status is known.

        Called once the pidfd says the process exited. Never blocks (WNOHANG): a child
        traced by another process can be reaped by its parent only after the tracer has
        collected it, and waiting for that here would stop the whole event loop.
        """
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: report a kill, not success
            self._returncode = -signal.SIGKILL
        else:
            if info is None:
                return False
            self._returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        proctree.SPAWNED.discard(self.pid)
        self.close()
        return True

    def close(self) -> None:
        """Release the pidfd (once reaped, or for a child that will not be waited for)."""
        if self._pidfd >= 0:
            fd, self._pidfd = self._pidfd, -1
            if self._waited:
                with contextlib.suppress(RuntimeError):  # outside Trio: nobody can be waiting on it
                    trio.lowlevel.notify_closing(fd)  # wakes a task waiting on it, which then sees why
            os.close(fd)


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _readable(fd: int) -> bool:
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class Started:
    """A program the launcher made, until its ``exec`` is known to have succeeded or failed.

    ``child`` is the daemon's own child from the start; :meth:`exec_result` (or, once it has
    exited, :meth:`verdict_now`) says whether the program ran. Whoever gets one must either
    hear that or kill and wait for ``child``, and :meth:`close` it.
    """

    def __init__(self, child: Child, err_r: int, said: bytes) -> None:
        self.child = child
        self._err_r = err_r
        self._said = said  # all the pipe said so far, the pid's first line included
        self._made_at = time.monotonic()
        self._killed_unstarted = False  # by verdict_now: it never ran its first line in time

    async def exec_result(self) -> None:
        """Wait for the verdict: end of file (exec succeeded) or an errno.

        Raises:
            SpawnError: exec (or chdir, or a limit) failed; the process exits 127 at once.
            OSError: EAGAIN: the process was killed before its first line, or did not run it
                within a few seconds (its cgroup frozen, the host overloaded): nothing ran.

        Cancellation: closes the pipe and lets the cancellation through; the caller kills
        the child.
        """
        try:
            # Its first line comes at once (it is a copy of the launcher); exec may take long.
            data, ended = await _read_until(self._err_r, self._said, _PID_TIMEOUT_S, _began)
            if not ended and not _began(data):
                # Killed before anything is said of it: it might have begun just now. What the
                # pipe says until the process is gone tells whether it ran at all.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child.pid, signal.SIGKILL)  # our unreaped child: the pid is its own
                data, _ = await _read_until(self._err_r, data, 2.0, lambda said: False)
                raise _unstarted(data)
            if not ended:
                data, _ = await _read_until(self._err_r, data, math.inf, lambda said: False)
        finally:
            self.close()
        if (failure := _exec_failure(data)) is not None:
            raise failure

    def verdict_now(self, *, exited: bool = False) -> bool | OSError:
        """What the pipe says of the exec now, without a wait: True once it worked, the error
        that kept the program from starting (as :meth:`exec_result` raises them), or False
        while it does not say yet. The pipe is closed once it has said.

        Args:
            exited: the process has exited, so all it will ever write is there: what it
                said decides, even before the end of file (which also waits for the
                launcher to close its own copy of the pipe).
        """
        if self._err_r < 0:
            return False
        data, ended = _read_now(self._err_r, self._said, lambda said: False)
        self._said = data
        if not ended and not exited:
            if not self._killed_unstarted and not _began(data) and \
                    time.monotonic() - self._made_at > _PID_TIMEOUT_S:
                # As exec_result: a process that has not run its first line in a few seconds
                # (its cgroup frozen, the host overloaded) is killed, and said not to have run
                # once its exit is heard (verdict_now(exited=True)).
                self._killed_unstarted = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child.pid, signal.SIGKILL)  # our unreaped child: the pid is its own
            return False
        self.close()
        if self._killed_unstarted:  # as exec_result says it, whatever came meanwhile
            return _unstarted(data)
        return _exec_failure(data) or True

    def close(self) -> None:
        """Close the error pipe, for a child killed before its verdict was heard; safe twice."""
        if self._err_r >= 0:
            fd, self._err_r = self._err_r, -1
            os.close(fd)


async def _read_until(fd: int, data: bytes, timeout: float, enough: Callable[[bytes], bool], *,
                      shield: bool = False) -> tuple[bytes, bool]:
    """Read the error pipe onto ``data`` until ``enough(data)``, end of file, or ``timeout``
    seconds (shielded from cancellation with ``shield``); returns what was read and whether
    the pipe ended. What is there already is taken without a turn of the loop."""
    data, ended = _read_now(fd, data, enough)
    if ended is not None:
        return data, ended
    if timeout == math.inf and not shield:  # no scope to make: one costs a call about 15 us
        return await _wait_and_read(fd, data, enough)
    with trio.CancelScope(deadline=trio.current_time() + timeout, shield=shield):
        return await _wait_and_read(fd, data, enough)
    return data, False


async def _wait_and_read(fd: int, data: bytes, enough: Callable[[bytes], bool]) -> tuple[bytes, bool]:
    """:func:`_read_until`'s waits, under the caller's scope."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        data, ended = _read_now(fd, data, enough)
        if ended is not None:
            return data, ended


def _read_now(fd: int, data: bytes, enough: Callable[[bytes], bool]) -> tuple[bytes, bool | None]:
    """Read what the pipe holds onto ``data`` until ``enough(data)`` or end of file; whether it
    ended, or None when it is empty before either."""
    while not enough(data):
        try:
            chunk = os.read(fd, 512)
        except BlockingIOError:
            return data, None
        if not chunk:
            return data, True
        data += chunk
    return data, False


def _unstarted(said: bytes) -> OSError:
    """The error of a process killed for not running its first line in time: a lost start
    if it said it began meanwhile (it may have run its first instructions), else EAGAIN."""
    why = f"the program's process did not start within {_PID_TIMEOUT_S:g} s (its cgroup frozen, " \
          "or the host overloaded); it was killed"
    return LostStart(errno.EAGAIN, why) if b"C" in _lines(said) else OSError(errno.EAGAIN, why)


def _exec_failure(said: bytes) -> OSError | None:
    """What kept the program from running, by all the error pipe said up to its end; None
    when its exec worked."""
    if (failure := _PID_LINE.sub(b"", said)):
        return _error(failure)
    if b"C" not in _lines(said):  # made, and killed before its first line (a killed cgroup kills newborns)
        return OSError(errno.EAGAIN, "the program's process was killed as it was made")
    return None


def _has_pid_line(said: bytes) -> bool:
    return _PID_LINE.search(said) is not None


def _began(said: bytes) -> bool:
    """Whether the new process ran its first line (it said C), or a failure was said."""
    return b"C" in _lines(said) or bool(_PID_LINE.sub(b"", said))


def _lines(data: bytes) -> set[bytes]:
    """Which pid's lines the error pipe said: P (the launcher's), C (the process's own)."""
    return {found.group(1) for found in _PID_LINE.finditer(data)}


# A pid's line on the error pipe, the launcher's (P) or the process's own (C); a failure is
# "<errno>:<step>", never with a newline.
_PID_LINE = re.compile(rb"([PC])(\d+)\n")


class _Request:
    """One message to the launcher, as far as it has been written."""

    def __init__(self, body: bytes, fds: list[int]) -> None:
        self.data = memoryview(_launcher.HEADER.pack(len(body), len(fds)) + body)
        self.ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []

    def write_now(self, sock: socket.socket) -> bool:
        """Write what the socket takes without waiting; True once all of it is written."""
        while self.data:
            try:
                sent = sock.sendmsg([self.data], self.ancillary)
            except BlockingIOError:
                return False
            self.data, self.ancillary = self.data[sent:], []  # the descriptors go with the first byte only
        return True


def _date(cgroup: proctree.CallCgroup) -> None:
    """Set a kept cgroup's mtime, if it was last set more than _REDATE_S ago (a system call on
    cgroupfs saved on most calls): a start-up sweep, this daemon's or another's in the same
    cgroup, removes only empty call cgroups left unchanged for a minute."""
    if time.monotonic() - cgroup.dated > _REDATE_S:
        with contextlib.suppress(OSError):
            os.utime(cgroup.path)
            cgroup.dated = time.monotonic()


def _kill_and_reap(pid: int) -> None:
    """SIGKILL and reap our own child ``pid`` (its pid cannot be reused before the reap)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _error(data: bytes) -> SpawnError:
    code, _, where = data.decode("utf-8", "replace").partition(":")
    number = int(code) if code.isdigit() else errno.EIO
    return SpawnError(number, os.strerror(number), where)


class Launcher:
    """The launcher process of one daemon (or of one process without a daemon).

    Args:
        owned: the reaper's set of the daemon's own children (the launcher and every program
            it makes join it at once, so none is ever reaped or killed as a stray), or None.
        reaper: the daemon's reaper, which removes the cgroups of ended calls that are not reused.
    """

    def __init__(self, owned: set[int] | None, reaper: proctree.Reaper | None = None, *,
                 compiled: bool | None = None) -> None:
        self._owned = owned
        self._compiled = compiled
        self._reaper = reaper
        self._tag = reaper.cgroup_tag if reaper is not None else None  # where its cgroups go
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        # Empty call cgroups kept for the next calls, and those the running launcher was told of.
        self._spares: list[proctree.CallCgroup] = []
        self._told: set[Path] = set()
        self._untold: list[Path] = []  # made, not told yet: told with the next request
        self._closed = False
        self._lock: trio.Lock | None = None  # requests never interleave on the socket
        self._lock_run: object = None

    def start(self) -> None:
        """Start the launcher process if it is not running; it exits when the daemon closes its
        end of the socket, or dies.

        Raises:
            OSError: no socket or no process could be made (EMFILE, EAGAIN, ENOMEM).
        """
        if self._process is not None and self._process.poll() is None:
            return
        self._stop_process()
        command = self.command()  # asks the compiled launcher its source first: no capability for that
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with _ambient_for_the_launcher():
                process = subprocess.Popen(
                    [*command, str(theirs.fileno())],
                    pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    env={}, cwd="/", start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)  # every send is awaited, bounded, never a stall of the loop
        self._process, self._sock = process, ours
        proctree.SPAWNED.add(process.pid)
        if self._owned is not None:
            self._owned.add(process.pid)
        self._told = set()  # a new launcher knows nothing yet
        self._untold += [spare.path for spare in self._spares if spare.path not in self._untold]

    def command(self) -> list[str]:
        """How the launcher process is started: the compiled one where it was built from this
        source (unless ``compiled`` said no), else the Python one.

        Raises:
            OSError: ``compiled`` is True and there is no usable compiled launcher.
        """
        binary = compiled_launcher() if self._compiled is not False else None
        if binary is not None:
            return [str(binary)]
        if self._compiled:
            raise OSError(errno.ENOENT, f"no compiled launcher built from this launcher.c at {_COMPILED}")
        return [sys.executable, "-I", "-S", str(_LAUNCHER)]

    async def refill(self) -> None:
        """Make the next call's cgroup ahead of time, and start the launcher if it is not running.

        Short of anything, the next call makes its own (and says why if it cannot).
        """
        if self._closed:
            return
        if not self._spares and (spare := proctree.CallCgroup.spare(self._tag)) is not None:
            self._untold.append(spare.path)
            self._spares.append(spare)
        for spare in self._spares:
            _date(spare)  # kept idle: still no leftover for another daemon's start-up sweep
        with contextlib.suppress(OSError):
            await self._send(None, [])  # starts the launcher if need be, and tells it of the spare

    def drop_vanished(self) -> None:
        """Forget the spare cgroups removed under the daemon (another daemon's start-up sweep)."""
        self._spares = [spare for spare in self._spares if spare.path.exists()]

    def cgroup(self) -> proctree.CallCgroup | None:
        """The cgroup for the next program: a spare one, else a new one (None where the
        daemon may not make cgroups)."""
        while self._spares:
            spare = self._spares.pop()
            try:
                gone = spare.events() == b""  # read through the descriptor it holds: a moment
            except OSError:
                gone = False  # cannot tell now: the spawn will say
            if not gone:
                return spare
            # Removed under the daemon (another daemon's start-up sweep takes every idle spare
            # at once): the launcher would find no cgroup behind its descriptor.
            spare.close()
            self.drop_vanished()
        made = proctree.CallCgroup.spare(self._tag)
        if made is not None and self._reaper is not None:
            self._untold.append(made.path)  # told with this call's request
        return made

    def give_back(self, cgroup: proctree.CallCgroup, events: bytes | None = None) -> None:
        """Take back a call's cgroup once its call has ended: an empty one is kept for a next
        call (relabelled then; up to MAX_SPARES, as many as calls ran at once), any other is
        retired to the reaper, which removes it.

        Args:
            cgroup: the call's cgroup; its processes are gone or dying.
            events: its ``cgroup.events``, if the caller read them just now.
        """
        # Only as it was made: a program may have frozen its cgroup, made cgroups inside it or
        # enabled controllers for them, and the next call's program must not be born into that.
        if len(self._spares) < MAX_SPARES and not self._closed and cgroup.reusable(events):
            _date(cgroup)  # it names this call until the next call's program relabels it
            self._spares.append(cgroup)
            return
        self._told.discard(cgroup.path)
        if self._reaper is not None:
            self._reaper.retire(cgroup)
        else:
            cgroup.remove()

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, limits: Limits | None,
                    pass_fds: Sequence[int], user: tuple[int, int, list[int]] | None,
                    cgroup: proctree.CallCgroup | None, *, make_cwd: bool = False,
                    label: str | None = None, terminal: int | None = None, stdio_on_terminal: bool = False,
                    output_fd: int | None = None) -> Started:
        """Have the launcher make the program; returns once its pid is known.

        The caller hears the exec's verdict next (:meth:`Started.exec_result`). Descriptors are made here, so
        EMFILE/ENFILE surface here as OSError; so does a launcher that could not make a
        process (EAGAIN, ENOMEM): then nothing was started. ``make_cwd``: the new process
        makes ``cwd`` (0700, and its parents) before it starts there; a failure says
        ``workdir``. ``label``: the call's id, which the launcher writes on ``cgroup`` once the
        process is made (for start-up recovery). ``terminal``: a pseudo-terminal's
        descriptor, which the new process makes its controlling terminal (and keeps none of);
        with ``stdio_on_terminal`` it is also its stdin, stdout and stderr (a screen
        program), and the child has no pipes. ``output_fd``: the program gets a pipe's write
        end as that descriptor (dialog's ``--output-fd``), whose read end is ``Child.output``.

        Cancellation: shielded until the pid is known (a few milliseconds); a process made
        is then returned all the same, for the caller to kill, unless the cancellation came
        before the request was sent.
        """
        made: list[int] = []
        with proctree.spawning():  # no reaper of this process may take it for a stray meanwhile
            stdin_w = stdout_r = stderr_r = output_r = -1
            try:
                if stdio_on_terminal and terminal is not None:
                    stdin_r = stdout_w = stderr_w = terminal
                else:
                    stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
                    made += [stdin_r, stdin_w]
                    stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
                    made += [stdout_r, stdout_w]
                    stderr_r, stderr_w = os.pipe2(os.O_CLOEXEC)
                    made += [stderr_r, stderr_w]
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                made += [err_r, err_w]
                os.set_blocking(err_r, False)  # read at once, waited on only when empty
                fds = [stdin_r, stdout_w, stderr_w, err_w, *pass_fds]
                targets = [0, 1, 2, _launcher.ERROR_PIPE, *pass_fds]
                if output_fd is not None:
                    output_r, output_w = os.pipe2(os.O_CLOEXEC)
                    made += [output_r, output_w]
                    fds.append(output_w)
                    targets.append(output_fd)
                if terminal is not None:
                    fds.append(terminal)
                    targets.append(_launcher.TERMINAL)
                if cgroup is not None:
                    fds.append(cgroup.fd())  # held by the cgroup, which serves call after call
                try:
                    body = _launcher.encode_start(
                        [_encode(arg) for arg in argv],
                        _encode_env(env),
                        _encode(cwd), mkdir=make_cwd, limits=limits.wire() if limits is not None else None,
                        user=user, targets=targets, cgroup=cgroup is not None,
                        label=label.encode() if label is not None and cgroup is not None else None)
                except _launcher.Unencodable as exc:  # nothing was started
                    code = errno.E2BIG if exc.where == "exec" else errno.EINVAL
                    raise SpawnError(code, f"{os.strerror(code)} ({exc})", exc.where) from None
                if len(body) > _launcher.MAX_BODY:
                    raise SpawnError(errno.E2BIG, os.strerror(errno.E2BIG), "exec")
                sent_at = proctree.boottime_ns()  # the process is made after this...
                await self._send(body, fds)
            except BaseException:
                for fd in made:
                    os.close(fd)
                raise
            for fd in made:
                if fd not in (stdin_w, stdout_r, stderr_r, err_r, output_r):
                    os.close(fd)
            said, ended = await self._pid_line(err_r)
            start = proctree.start_between(sent_at, proctree.boottime_ns())  # ...and before its pid is heard
            found = _PID_LINE.search(said)
            pid = found.group(2) if found else b""
            if not pid:
                _close(stdin_w, stdout_r, stderr_r, err_r, output_r)
                if said:
                    raise _error(said)  # the launcher could not make a process (EAGAIN...)
                if ended:  # made, and killed before its first word (a killed cgroup kills newborns)
                    raise OSError(errno.EAGAIN, "the program's process was killed as it was made")
                # Stopped, frozen or too slow: replaced, so the next call does not wait too.
                self._stop_process(kill=True)
                raise OSError(errno.EAGAIN, "the launcher did not start the program in time")
            pid_n = int(pid)
            try:
                pidfd = os.pidfd_open(pid_n)  # the daemon's own child: its pid is ours until reaped
            except OSError as exc:
                _kill_and_reap(pid_n)
                _close(stdin_w, stdout_r, stderr_r, err_r, output_r)
                raise LostStart(exc.errno, exc.strerror) from None
            proctree.SPAWNED.add(pid_n)
            if self._owned is not None:
                self._owned.add(pid_n)
        return Started(Child(pid_n, pidfd, stdin_w, stdout_r, stderr_r, start=start, output=output_r), err_r, said)

    async def _send(self, body: bytes | None, fds: list[int]) -> None:
        """Hand a request to the launcher (after the cgroups it was not told of yet), starting
        it first if need be; ``body`` None sends only those.

        Bounded and shielded: a launcher that does not read within a few seconds (stopped,
        frozen) is killed and replaced once, and a request is never left half-written. A
        launcher that did not read the whole request started nothing for it.

        Raises:
            OSError: no launcher took it (EAGAIN), or none could be started.
        """
        if self._lock is None or self._lock_run is not trio.lowlevel.current_trio_token():
            self._lock, self._lock_run = trio.Lock(), trio.lowlevel.current_trio_token()
        try:
            self._lock.acquire_nowait()  # free nearly always: no turn of the loop to take it
        except trio.WouldBlock:
            await self._lock.acquire()
        try:
            await self._send_held(body, fds)
        finally:
            self._lock.release()

    async def _send_held(self, body: bytes | None, fds: list[int]) -> None:
        """:meth:`_send`, holding the lock."""
        for attempt in (1, 2):
            # One that died is found by the send (EPIPE) and replaced: no waitpid per call.
            if attempt == 2 or self._process is None or self._process.returncode is not None:
                self.start()
            assert self._sock is not None
            untold = [path for path in self._untold if path not in self._told]
            requests = [_Request(_launcher.encode_spare(os.fsencode(path)), []) for path in untold]
            if body is not None:
                requests.append(_Request(body, fds))
            try:
                # Nearly always taken at once; a full socket is waited on, bounded.
                if not all(request.write_now(self._sock) for request in requests):
                    with trio.CancelScope(shield=True, deadline=trio.current_time() + _SEND_TIMEOUT_S) as scope:
                        for request in requests:
                            while not request.write_now(self._sock):
                                await trio.lowlevel.wait_writable(self._sock)
                    if scope.cancelled_caught:
                        raise OSError(errno.ETIMEDOUT, "the launcher did not read")
            except OSError:
                self._stop_process(kill=True)
                if attempt == 2:
                    raise OSError(errno.EAGAIN, "the launcher did not take the request") from None
                continue
            self._told.update(untold)
            self._untold.clear()
            return

    async def _pid_line(self, err_r: int) -> tuple[bytes, bool]:
        """What the error pipe says up to the pid's line, and whether it ended (end of file)
        before that; bounded: neither in a few seconds means the launcher is stuck.

        Cancellation: shielded (a process made must be known, to be killed).
        """
        return await _read_until(err_r, b"", _PID_TIMEOUT_S, _has_pid_line, shield=True)

    def _stop_process(self, *, kill: bool = False) -> None:
        """Let the launcher go (it exits on end of file) and reap it, killing one that lingers;
        with ``kill``, at once (a launcher that stopped answering)."""
        process, sock = self._process, self._sock
        self._process = self._sock = None
        if sock is not None:
            sock.close()
        if process is None:
            return
        try:
            process.wait(timeout=0 if kill else 0.5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        proctree.SPAWNED.discard(process.pid)
        if self._owned is not None:
            self._owned.discard(process.pid)

    def close(self) -> None:
        """Stop the launcher and remove the spare cgroups; for good."""
        self._closed = True
        self._stop_process()
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.remove()
        proctree.remove_subtree(self._tag)  # a call's cgroup still in it (or another launcher's spare) keeps it

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


_SHARED: Launcher | None = None


def for_reaper(reaper: proctree.Reaper | None) -> Launcher:
    """The launcher of the daemon that owns ``reaper``; without one, this process's own."""
    global _SHARED
    if reaper is None:
        if _SHARED is None or _SHARED._closed:
            _SHARED = Launcher(None)
        return _SHARED
    if reaper.launchers is None:
        reaper.launchers = Launcher(reaper.owned, reaper)
    return reaper.launchers
