"""Starting a call's program born in its own cgroup, from a launcher forked ahead of time.

Moving a running process into a cgroup (a write to ``cgroup.procs``) takes the kernel's
threadgroup lock for writing; after ~100 ms without a migration that waits an RCU grace period,
7-15 ms, longer than everything else a call costs. Python cannot pass ``CLONE_INTO_CGROUP`` to
clone3 (neither ``subprocess`` nor ``os.posix_spawn`` can), so the runner keeps a *launcher*
ready instead: a fork of the daemon that

1. leaves the daemon's session (``setsid``), closes every descriptor it inherited but its own
   socket (another call's pipes held here would keep that call from end-of-file), resets every
   signal disposition and the signal mask;
2. writes its own pid into a spare call cgroup (paying the migration in its own time, not the
   call's) and says it is ready;
3. waits for one spawn request on its socket (argv, environment, folder, limits, and the
   descriptors by SCM_RIGHTS), lays the descriptors out, applies the limits and ``exec``\\ s.

The program therefore runs its first instruction inside the call's cgroup: nothing it forks is
ever outside it, and there is no window between spawn and cgroup move. The launcher is a direct
child of the daemon, known by pid and pidfd from the moment of the fork, so the reaper never
takes it for a stray and :class:`Child` can wait for the program without ever polling
``waitpid`` on a live process (which would report a ptrace stop as an exit: "signal 5").

One launcher is kept ready per daemon (:class:`Launchers`); a call that finds none forks one
at once. A launcher whose daemon dies reads end-of-file and exits.

Errors from ``exec`` (not found, E2BIG...) come back through a close-on-exec pipe, as
``subprocess`` does: end-of-file on it means the program is running.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import marshal
import os
import resource
import signal
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

from rungd import proctree
from rungd.runner.limits import Limits, apply_limits

_HEADER = struct.Struct("!II")  # body length, number of descriptors
_MAX_FDS = 250
_READY, _NO_CGROUP = b"R", b"N"


class SpawnError(OSError):
    """``exec`` (or what precedes it in the launcher) failed; ``errno`` says why."""


class Child:
    """A program started by a launcher: the interface of ``trio.Process`` the runner uses.

    Its exit is learned from its pidfd, which becomes readable only when the process has
    exited; only then is it reaped (``waitid``). A stopped or ptrace-stopped child is
    therefore still running, never "killed by signal 5".
    """

    def __init__(self, pid: int, pidfd: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._returncode: int | None = None
        self.stdin: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(stdin)
        self.stdout: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(stdout)
        self.stderr: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(stderr)

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: the signal that killed it), or None while it runs."""
        if self._returncode is None and self._pidfd >= 0 and _readable(self._pidfd):
            self._reap()
        return self._returncode

    async def wait(self) -> int:
        """Wait until the program exits and return its status.

        Cancellation: stops waiting; the program is not touched.
        """
        while self._returncode is None:
            try:
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
            with contextlib.suppress(RuntimeError):  # outside Trio: nobody can be waiting on it
                trio.lowlevel.notify_closing(fd)  # wakes a task waiting on it, which then sees why
            os.close(fd)


def _readable(fd: int) -> bool:
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class Launcher:
    """One forked launcher, waiting (in its cgroup) to become a call's program.

    Build with :meth:`fork`; then :meth:`ready` (async) and :meth:`spawn` once.
    """

    def __init__(self, pid: int, pidfd: int, sock: socket.socket, cgroup: proctree.CallCgroup | None,
                 owned: set[int] | None) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.sock = sock
        self.cgroup = cgroup
        self._owned = owned
        self._ready: bool | None = None

    @classmethod
    def fork(cls, owned: set[int] | None) -> Launcher:
        """Fork a launcher (in the calling thread) into a new spare cgroup, if one can be made.

        Args:
            owned: the reaper's set of the daemon's own children; the launcher joins it at
                once, so it is never reaped or killed as a stray.

        Raises:
            OSError: no socket or no process could be made (EMFILE, EAGAIN, ENOMEM).
        """
        cgroup = proctree.CallCgroup.spare()
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            if cgroup is not None:
                cgroup.remove()
            raise
        try:
            pid = os.fork()
        except OSError:
            parent.close()
            child.close()
            if cgroup is not None:
                cgroup.remove()
            raise
        if pid == 0:  # pragma: no cover - runs in the launcher, which never returns
            try:
                _launcher(child.fileno(), cgroup.path if cgroup else None)
            except BaseException as exc:
                with contextlib.suppress(BaseException):
                    os.write(2, f"rungd launcher: {exc!r}\n".encode())
            finally:
                os._exit(127)
        proctree.SPAWNED.add(pid)
        if owned is not None:
            owned.add(pid)
        child.close()
        pidfd = os.pidfd_open(pid)
        parent.setblocking(False)
        return cls(pid, pidfd, parent, cgroup, owned)

    async def ready(self) -> bool:
        """Wait until the launcher is in its cgroup; False if it died (it is then reaped)."""
        if self._ready is None:
            await trio.lowlevel.wait_readable(self.sock.fileno())
            try:
                answer = self.sock.recv(1)
            except OSError:
                answer = b""
            if answer == _NO_CGROUP and self.cgroup is not None:
                self.cgroup.remove()
                self.cgroup = None
            self._ready = answer in (_READY, _NO_CGROUP)
            if not self._ready:
                self.discard()
        return self._ready

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, limits: Limits | None,
              pass_fds: Sequence[int], user: tuple[int, int, list[int]] | None = None) -> tuple[Child, int]:
        """Hand the launcher what to ``exec``; returns the child and the read end of its error pipe.

        The caller awaits :func:`exec_result` on that pipe. Descriptors are made here, so
        EMFILE/ENFILE surface here as OSError.
        """
        made: list[int] = []
        try:
            stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
            made += [stdin_r, stdin_w]
            stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
            made += [stdout_r, stdout_w]
            stderr_r, stderr_w = os.pipe2(os.O_CLOEXEC)
            made += [stderr_r, stderr_w]
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            made += [err_r, err_w]
            body = marshal.dumps({
                "argv": [os.fsencode(arg) for arg in argv],
                "env": {os.fsencode(k): os.fsencode(v) for k, v in env.items()},
                "cwd": os.fsencode(cwd),
                "limits": _limits_tuple(limits),
                "user": user,
                "targets": [0, 1, 2, -1, *pass_fds],
            })
            fds = [stdin_r, stdout_w, stderr_w, err_w, *pass_fds]
            self.sock.setblocking(True)
            socket.send_fds(self.sock, [_HEADER.pack(len(body), len(fds))], fds)
            self.sock.sendall(body)
        except BaseException:
            for fd in made:
                os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()
        for fd in (stdin_r, stdout_w, stderr_w, err_w):
            os.close(fd)
        child = Child(self.pid, self.pidfd, stdin_w, stdout_r, stderr_r)
        return child, err_r

    def discard(self) -> None:
        """Stop and reap a launcher that will not be used; remove its cgroup."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, self.pid, os.WEXITED)
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        proctree.SPAWNED.discard(self.pid)
        if self._owned is not None:
            self._owned.discard(self.pid)
        if self.cgroup is not None:
            self.cgroup.remove()


async def exec_result(err_r: int) -> None:
    """Wait for the launcher's verdict: end-of-file (exec succeeded) or an errno.

    Raises:
        SpawnError: exec (or chdir, or a limit) failed; ``errno`` and ``strerror`` say why.

    Cancellation: closes the pipe and lets the cancellation through; the caller kills the child.
    """
    try:
        await trio.lowlevel.wait_readable(err_r)
        data = b""
        while chunk := os.read(err_r, 512):
            data += chunk
    finally:
        os.close(err_r)
    if data:
        code, _, where = data.decode("utf-8", "replace").partition(":")
        number = int(code) if code.isdigit() else errno.EIO
        raise SpawnError(number, os.strerror(number), where)


def _limits_tuple(limits: Limits | None) -> tuple[object, ...] | None:
    if limits is None:
        return None
    return (limits.cpu_s, limits.address_space_bytes, limits.open_files, limits.processes,
            limits.file_size_bytes, limits.core_bytes, limits.no_new_privs)


class Launchers:
    """Keeps one launcher ready for the next call, so that call pays neither fork nor migration.

    The daemon keeps one on its reaper (:func:`for_reaper`); it lives as long as the reaper.
    A spare launcher whose socket closes (the daemon exits, crashes or drops it) leaves its
    cgroup, removes it and exits.

    Args:
        owned: the reaper's set of the daemon's own children, or None without a reaper.
        keep_spare: fork the next call's launcher ahead of time.
    """

    def __init__(self, owned: set[int] | None, *, keep_spare: bool = True) -> None:
        self._owned = owned
        self._keep_spare = keep_spare
        self._spare: Launcher | None = None
        self._closed = False  # the daemon stopped: a call still ending forks no spare

    def take(self) -> Launcher:
        """The launcher for this call: the one kept ready, else one forked now.

        Raises:
            OSError: as :meth:`Launcher.fork`.
        """
        spare, self._spare = self._spare, None
        if spare is not None and _readable(spare.pidfd):  # it died meanwhile (killed by hand?)
            spare.discard()
            spare = None
        return spare if spare is not None else Launcher.fork(self._owned)

    def refill(self) -> None:
        """Fork the next call's launcher, if none is kept; it moves into its cgroup in its own
        time. Short of descriptors or processes, the next call forks its own."""
        if self._keep_spare and self._spare is None and not self._closed:
            with contextlib.suppress(OSError):
                self._spare = Launcher.fork(self._owned)

    def close(self) -> None:
        """Let the spare launcher go: it removes its own cgroup and exits; it is reaped here
        (bounded: one that lingers is killed, and its cgroup removed for it)."""
        self._closed = True
        spare, self._spare = self._spare, None
        if spare is None:
            return
        spare.sock.close()
        import select

        poller = select.poll()
        poller.register(spare.pidfd, select.POLLIN)
        if not poller.poll(500):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(spare.pidfd, signal.SIGKILL)
        spare.discard()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def for_reaper(reaper: proctree.Reaper | None) -> Launchers:
    """The launchers of the daemon that owns ``reaper``; without one, a launcher per call."""
    if reaper is None:
        return Launchers(None, keep_spare=False)
    if reaper.launchers is None:
        reaper.launchers = Launchers(reaper.owned)
    return reaper.launchers


# --- what runs in the launcher ----------------------------------------------------------------


def _launcher(sock: int, cgroup: Path | None) -> None:  # pragma: no cover - a forked process
    """Become ready in ``cgroup``, then exec what the daemon asks. Never returns normally."""
    gc.disable()  # a collected daemon object must not close a descriptor laid out for exec
    os.setsid()  # leave the daemon's session and group: a Ctrl-C there is not for us
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    os.closerange(3, sock)
    os.closerange(sock + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    answer = _NO_CGROUP
    if cgroup is not None:
        try:
            fd = os.open(cgroup / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0": the writing process itself
            finally:
                os.close(fd)
            answer = _READY
        except OSError:
            pass
    os.write(sock, answer)
    conn = socket.socket(fileno=sock)  # kept: a collected socket object closes its descriptor
    try:
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, _MAX_FDS)
    except ConnectionResetError:  # closed before it read our "ready"
        header, fds = b"", []
    if len(header) < _HEADER.size:
        _leave(cgroup if answer == _READY else None)  # the daemon went away, or does not need us
    size, count = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = os.read(sock, size - len(body))
        if not chunk:
            _leave(cgroup if answer == _READY else None)
        body += chunk
    spec = marshal.loads(body)
    _exec(spec, fds[:count])


def _leave(cgroup: Path | None) -> None:  # pragma: no cover - a forked process
    """Exit, removing the spare cgroup this launcher sat in: nobody else will."""
    if cgroup is not None:
        with contextlib.suppress(OSError):
            fd = os.open(cgroup.parent / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
            os.rmdir(cgroup)
    os._exit(0)


def _exec(spec: dict, fds: list[int]) -> None:  # pragma: no cover - a forked process
    targets = spec["targets"]
    err_w = -1
    # Lift every received descriptor above the numbers it must end up at, so laying them out
    # never overwrites one not placed yet.
    floor = max([2, *targets]) + 1
    lifted = []
    for fd in fds:
        lifted.append(_fcntl_dupfd(fd, floor))
        os.close(fd)
    where = "exec"
    try:
        for fd, target in zip(lifted, targets):
            if target < 0:
                err_w = fd  # close-on-exec: end-of-file tells the daemon exec succeeded
            else:
                os.dup2(fd, target, inheritable=True)
        where = "chdir"
        os.chdir(spec["cwd"])
        if spec["user"] is not None:  # as subprocess does: groups, gid, then uid
            where = "user"
            uid, gid, groups = spec["user"]
            os.setgroups(groups)
            os.setregid(gid, gid)
            os.setreuid(uid, uid)
        where = "limits"
        if spec["limits"] is not None:
            apply_limits(Limits(*spec["limits"]))
        where = "exec"
        argv, env = spec["argv"], spec["env"]
        program = argv[0]
        if b"/" in program:
            candidates = [program]
        else:
            path = env.get(b"PATH", os.defpath.encode())
            candidates = [os.path.join(folder or b".", program) for folder in path.split(b":")]
        failure: OSError | None = None
        for candidate in candidates:
            try:
                os.execve(candidate, argv, env)
            except OSError as exc:
                # As execvp: keep looking after "not here"; remember the first other reason.
                if failure is None or (failure.errno in (errno.ENOENT, errno.ENOTDIR)
                                       and exc.errno not in (errno.ENOENT, errno.ENOTDIR)):
                    failure = exc
        raise failure or OSError(errno.ENOENT, "not found")
    except Exception as exc:  # noqa: BLE001 - any failure here must reach the daemon as one
        # Not only OSError: a NUL in argv or env is a ValueError, a limit above the hard one
        # too; end-of-file on the pipe would read as a successful exec.
        code = getattr(exc, "errno", None) or errno.EINVAL
        with contextlib.suppress(OSError):
            os.write(err_w, f"{code}:{where}".encode())
    os._exit(127)


def _fcntl_dupfd(fd: int, floor: int) -> int:  # pragma: no cover - a forked process
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
