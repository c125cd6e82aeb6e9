"""The launcher: one small process, started once per daemon, that starts every call's program.

It runs as ``python -I -S launcher.py FD`` and imports nothing but the standard library, so it
is a few megabytes, single-threaded, and cheap to copy. For each request the daemon sends on
socket FD (the program's argv, environment, folder, limits and user, its descriptors by
SCM_RIGHTS, and a descriptor of the call's cgroup), it makes one process with ``clone3``:

- ``CLONE_INTO_CGROUP``: the process is *born* in the call's cgroup. Moving a running process
  into a cgroup takes the kernel's threadgroup lock for writing, which after an idle pause
  waits an RCU grace period (7-15 ms); being born there does not, and leaves no window in
  which the program could fork outside its cgroup.
- ``CLONE_PARENT``: the process is the daemon's child, not the launcher's. The daemon waits
  for it by pidfd, reaps it, and hears its real exit status; nothing passes through here.

The new process leaves the daemon's session (``setsid``), lays its descriptors out, switches
user, applies the limits and ``exec``\\ s. Everything it has to say goes down the error pipe
the daemon holds the other end of: first ``C<pid>\\n`` (so the daemon learns the pid even if
this launcher dies meanwhile, and knows the process ran its first line), then, only if the
start failed, ``<errno>:<step>``. End of file on that pipe means the program is running (the
pipe is close-on-exec). The launcher itself writes ``P<pid>\\n`` as soon as ``clone3``
returns, so the daemon need not wait for the new process to be scheduled to learn the pid;
the two lines may land in either order. End of file without the ``C`` line means the process
was killed before its first line (a cgroup once killed kills its newborns). A start that
makes no process at all (EAGAIN, ENOMEM) is reported on the same pipe by the launcher itself.

Where ``clone3`` or ``CLONE_INTO_CGROUP`` is refused (kernels before 5.7, a seccomp filter),
the launcher falls back to ``clone(CLONE_PARENT)`` and the new process joins its cgroup
itself before ``exec``: slower after an idle pause, still before the program's first
instruction.

The daemon also tells the launcher of each call cgroup it makes: when the daemon dies (a
crash, ``kill -9``), the launcher reads end of file, removes those that are empty (the spare
kept for the next call) and exits, so nothing of the daemon's is left in the cgroup tree.

Only the daemon holds the other end of FD; the socket is close-on-exec here and closed in every
new process before anything else, so no program can ask the launcher for anything.

``launcher.c`` is the same launcher compiled (where the package was built with a C compiler): a
copy of a small C process is made and exec'd in about half the time a copy of this one takes.
Both read the wire format below (:func:`encode_start`, :func:`encode_spare`, :func:`decode`);
the daemon uses the compiled one only when it was built from the ``launcher.c`` beside this file
and from this file (its ``--source`` digest covers both: the wire is defined here).

The wire: each message is ``HEADER`` (body length, number of descriptors, big-endian u32 each),
the descriptors riding with its first byte, then the body: ``S`` and a cgroup's path (a spare),
or ``R`` and a start request, big-endian throughout:

    flags u8 (_MKDIR, _CGROUP, _USER, _LIMITS, _NO_NEW_PRIVS, _LABEL)
    targets: count u16, then i32 each (the number each descriptor becomes; -1, exactly once,
        the error pipe; -2, at most once, a terminal the new process makes its controlling
        terminal and keeps no descriptor of); the descriptors come in that order, then the
        cgroup's with _CGROUP
    with _USER: uid u32, gid u32, groups: count u16, then u32 each
    with _LIMITS: which are set, u8 (bit i: the i-th of ``Limits.wire``), then a u64 for each
        set (all ones: RLIM_INFINITY); _NO_NEW_PRIVS counts only with _LIMITS
    with _LABEL (only with _CGROUP): the call's id, a string; once the process is made, the
        launcher writes it to the cgroup's ``user.rungd.call`` attribute (start-up recovery
        reads it: ``rungd.system.proctree.sweep_cgroups``)
    cwd, then argv (count u32, then each), then env (count u32, then name and value each):
    every string a u32 length and its bytes

A request either launcher cannot decode, or whose descriptors did not all come, starts nothing.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import gc
import os
import platform
import resource
import signal
import socket
import struct
import sys
import termios

HEADER = struct.Struct("!II")  # body length, number of descriptors
_INT = struct.Struct("i")
MAX_FDS = 250
MAX_BODY = 64 << 20  # the largest request either launcher reads (argv and env are far below)
MAX_ITEMS = 1 << 20  # arguments and environment entries together (the kernel's own limit is lower)
MAX_TARGET = 1 << 20  # the highest descriptor number a program's descriptor may become (fs.nr_open)
ERROR_PIPE, TERMINAL = -1, -2  # targets that are no number in the program (the wire above)
_MKDIR, _CGROUP, _USER, _LIMITS, _NO_NEW_PRIVS, _LABEL = 1, 2, 4, 8, 16, 32
LABEL_XATTR = b"user.rungd.call"  # launcher.c names it too; rungd.system.proctree reads it
MAX_LABEL = 255  # a call id is far shorter; an attribute's value may be longer
_U8, _U16, _U32, _I32, _U64 = (struct.Struct(f"!{kind}") for kind in "BHIiQ")
_INFINITY = (1 << 64) - 1  # RLIM_INFINITY on the wire
_MAX_LIMIT = (1 << 63) - 1
_MAX_SPARES = 1000

_CLONE_PARENT = 0x0000_8000
_CLONE_INTO_CGROUP = 0x2_0000_0000
_SYS_CLONE3 = 435  # the same number on every architecture (new system calls are shared)
_SYS_CLONE = {"x86_64": 56, "aarch64": 220, "riscv64": 220, "ppc64le": 120, "s390x": 120}.get(platform.machine())
_CLONE_STACK_FIRST = platform.machine() == "s390x"
_PR_SET_NO_NEW_PRIVS = 38
# prctl(PR_CAP_AMBIENT, ...): the child clears the set; the daemon (launch.py) also asks and raises.
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_IS_SET, _PR_CAP_AMBIENT_RAISE, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 1, 2, 4
# capget/capset (glibc's wrappers of the system calls): a header and two 32-bit halves of
# each set, as <linux/capability.h> has them at version 3.
_CAP_VERSION_3 = 0x2008_0522
_CapHeader = ctypes.c_uint32 * 2
_CapData = ctypes.c_uint32 * 6  # (effective, permitted, inheritable) twice


def _clear_inheritable() -> None:
    """Empty this process's inheritable capability set; lowering a set needs no privilege."""
    header, data = _CapHeader(_CAP_VERSION_3, 0), _CapData()
    if _libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capabilities")
    if data[2] or data[5]:
        data[2] = data[5] = 0
        if _libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "capabilities")


_RLIMITS = (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC,
            resource.RLIMIT_FSIZE, resource.RLIMIT_CORE)


class _CloneArgs(ctypes.Structure):  # struct clone_args, CLONE_ARGS_SIZE_VER2 (88 bytes)
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls",
        "set_tid", "set_tid_size", "cgroup")]


# The GIL stays held across the call (PyDLL): the new process resumes exactly where this one was.
_libc = ctypes.PyDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class Unencodable(ValueError):
    """A request no launcher can carry (a limit or an id out of range, too many items);
    ``where`` is the step a launcher would have failed at."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(why)
        self.where = where


def encode_spare(path: bytes) -> bytes:
    """The body telling the launcher of a call cgroup it removes if the daemon dies."""
    return b"S" + path


def encode_start(argv: list[bytes], env: dict[bytes, bytes], cwd: bytes, *, mkdir: bool,
                 limits: tuple[object, ...] | None, user: tuple[int, int, list[int]] | None,
                 targets: list[int], cgroup: bool, label: bytes | None = None) -> bytes:
    """The body of a start request (its descriptors go beside it: one per target, then the
    cgroup's when ``cgroup``); ``label``: the call's id, for the cgroup (with ``cgroup`` only).

    Raises:
        Unencodable: a value the wire (and the kernel) cannot take.
    """
    if not _targets_fit(targets):
        raise Unencodable("start", "descriptors out of range")
    if not argv or len(argv) + len(env) > MAX_ITEMS:
        raise Unencodable("exec", "too many arguments")
    flags = (_MKDIR if mkdir else 0) | (_CGROUP if cgroup else 0)
    parts = [b"", _U16.pack(len(targets)), *map(_I32.pack, targets)]
    if user is not None:
        flags |= _USER
        uid, gid, groups = user
        if not all(0 <= n < 0xFFFF_FFFF for n in (uid, gid, *groups)) or len(groups) > 0xFFFF:
            raise Unencodable("user", "a user or group id out of range")
        parts += [_U32.pack(uid), _U32.pack(gid), _U16.pack(len(groups)), *map(_U32.pack, groups)]
    if limits is not None:
        flags |= _LIMITS
        *values, no_new_privs = limits
        present, chosen = 0, []
        for bit, value in enumerate(values):
            if value is None:
                continue
            if not (value == resource.RLIM_INFINITY or 0 <= value <= _MAX_LIMIT):  # type: ignore[operator]
                raise Unencodable("limits", f"a limit out of range: {value}")
            present |= 1 << bit
            chosen.append(_U64.pack(_INFINITY if value == resource.RLIM_INFINITY else value))
        parts += [_U8.pack(present), *chosen]
        if no_new_privs:
            flags |= _NO_NEW_PRIVS
    if label is not None:
        if not _label_fits(label, cgroup):
            raise Unencodable("cgroup", "a label for no cgroup, or not a call id")
        flags |= _LABEL
        parts += [_U32.pack(len(label)), label]
    parts[0] = b"R" + _U8.pack(flags)
    parts += [_U32.pack(len(cwd)), cwd, _U32.pack(len(argv))]
    for arg in argv:
        parts += [_U32.pack(len(arg)), arg]
    parts.append(_U32.pack(len(env)))
    for name, value in env.items():
        parts += [_U32.pack(len(name)), name, _U32.pack(len(value)), value]
    return b"".join(parts)


def _targets_fit(targets: list[int]) -> bool:
    """Whether a request's targets can go on the wire (checked by the sender and again by the
    launcher): one error pipe, at most one terminal, every other a descriptor number."""
    return (0 < len(targets) <= MAX_FDS and targets.count(ERROR_PIPE) == 1 and targets.count(TERMINAL) <= 1
            and all(TERMINAL <= t <= MAX_TARGET for t in targets))


def _label_fits(label: bytes, cgroup: bool) -> bool:
    """Whether a label can go on the wire (checked by the sender and again by the launcher)."""
    return cgroup and 0 < len(label) <= MAX_LABEL and b"\0" not in label


class _Reader:
    """Reads a body front to back; any read past its end is a ValueError."""

    def __init__(self, body: bytes) -> None:
        self.body, self.at = body, 1

    def take(self, kind: struct.Struct) -> int:
        if self.at + kind.size > len(self.body):
            raise ValueError("a field runs past the request")
        (value,) = kind.unpack_from(self.body, self.at)
        self.at += kind.size
        return value

    def string(self) -> bytes:
        size = self.take(_U32)
        if self.at + size > len(self.body):
            raise ValueError("a string runs past the request")
        self.at += size
        return self.body[self.at - size:self.at]


def decode(body: bytes) -> dict:
    """A body as the launcher acts on it: ``{"spare": path}``, or a start request's fields.

    Raises:
        ValueError: not a body encode_start or encode_spare made.
    """
    if body[:1] == b"S":
        return {"spare": body[1:]}
    if body[:1] != b"R":
        raise ValueError("not a request")
    read = _Reader(body)
    flags = read.take(_U8)
    targets = [read.take(_I32) for _ in range(read.take(_U16))]
    user = limits = None
    if flags & _USER:
        uid, gid = read.take(_U32), read.take(_U32)
        user = (uid, gid, [read.take(_U32) for _ in range(read.take(_U16))])
    if flags & _LIMITS:
        present = read.take(_U8)
        if present >> len(_RLIMITS):
            raise ValueError("a limit no launcher knows")
        values: list[object] = [None] * len(_RLIMITS)
        for bit in range(len(_RLIMITS)):
            if present & (1 << bit):
                value = read.take(_U64)
                values[bit] = resource.RLIM_INFINITY if value == _INFINITY else value
        limits = (*values, bool(flags & _NO_NEW_PRIVS))
    label = read.string() if flags & _LABEL else None
    if label is not None and not _label_fits(label, bool(flags & _CGROUP)):
        raise ValueError("a label for no cgroup, or not a call id")
    cwd = read.string()
    argv = [read.string() for _ in range(read.take(_U32))]
    env = {}
    for _ in range(read.take(_U32)):
        name = read.string()
        env[name] = read.string()
    if read.at != len(body) or not argv or not _targets_fit(targets) or flags >> 6:
        raise ValueError("a malformed request")
    return {"targets": targets, "user": user, "limits": limits, "cwd": cwd, "argv": argv, "env": env,
            "mkdir": bool(flags & _MKDIR), "cgroup": bool(flags & _CGROUP), "label": label}


def apply_limits(limits: tuple[object, ...]) -> None:
    """Apply limits in the wire order of ``rungd.runner.limits.Limits.wire`` to this process."""
    *values, no_new_privs = limits
    for which, value in zip(_RLIMITS, values):
        if value is not None:
            try:
                resource.setrlimit(which, (value, value))
            except ValueError as exc:  # what the kernel said, as launcher.c reports it
                raise OSError(errno.EPERM if "not allowed" in str(exc) else errno.EINVAL, str(exc)) from None
    if no_new_privs and _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")


def serve(sock_fd: int) -> None:
    """Start what the daemon asks for until it closes the socket (or dies); then remove the
    call cgroups it was told of, and the daemon's subtree they were in (those in use or gone
    stay as they are)."""
    os.set_inheritable(sock_fd, False)
    conn = socket.socket(fileno=sock_fd)
    spares: set[bytes] = set()
    try:
        _serve(conn, sock_fd, spares)
    finally:
        # Then the daemon's subtree each was in (rungd.system.proctree.calls_subtree), once
        # empty: a daemon killed outright leaves no folder of its own in the cgroup tree.
        for path in [*spares, *{os.path.dirname(path) for path in spares}]:
            if path in spares or os.path.basename(path).startswith(b"rungd-"):
                try:
                    os.rmdir(path)
                except OSError:
                    pass  # in use after all, or gone: the daemon's next start sweeps what is left


def _serve(conn: socket.socket, sock_fd: int, spares: set[bytes]) -> None:
    clone3 = True
    while True:
        try:
            header, fds = _receive(conn)
        except OSError:
            return
        if len(header) < HEADER.size:
            return  # the daemon closed the socket: it is stopping, or gone
        size, count = HEADER.unpack(header)
        if size > MAX_BODY:
            return  # no daemon of ours sends this: stop, and the daemon starts another
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                return
            body += chunk
        try:
            spec = decode(body)
            if "spare" in spec:  # a cgroup the daemon made: removed here if the daemon dies
                if len(spares) >= _MAX_SPARES:  # forget those removed since
                    spares.intersection_update({path for path in spares if os.path.exists(path)})
                spares.add(spec["spare"])
                continue
            if not len(spec["targets"]) + spec["cgroup"] <= count <= len(fds):
                raise ValueError("the request's descriptors did not all come")  # never start without one
            clone3 = _start(spec, fds[:count], sock_fd, clone3)
        except Exception as exc:  # noqa: BLE001 - a bad request must not stop the launcher
            _say(f"rungd launcher: a request failed: {exc!r}")
        finally:
            for fd in fds:
                os.close(fd)


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """A request's header and its descriptors, received close-on-exec (socket.recv_fds of
    Python 3.11 drops the flag that asks for it)."""
    size = socket.CMSG_LEN(MAX_FDS * _INT.size)
    header, ancillary, _, _ = conn.recvmsg(HEADER.size, size, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [fd for (fd,) in _INT.iter_unpack(data[:len(data) - len(data) % _INT.size])]
    return header, fds


def _start(spec: dict, fds: list[int], sock_fd: int, clone3: bool) -> bool:
    """Make one process for ``spec``; returns whether clone3 may be tried next time."""
    targets = spec["targets"]
    err_w = fds[targets.index(ERROR_PIPE)]
    cgroup_fd = fds[len(targets)] if spec["cgroup"] else -1
    pid, join = -1, cgroup_fd
    if clone3:
        # No exit_signal: with CLONE_PARENT the kernel takes ours (SIGCHLD), and refuses any other.
        args = _CloneArgs(flags=_CLONE_PARENT)
        if cgroup_fd >= 0:
            args.flags |= _CLONE_INTO_CGROUP
            args.cgroup = cgroup_fd
        pid = _syscall(_SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
        failure = ctypes.get_errno() if pid < 0 else 0
        if pid >= 0:
            join = -1
        elif failure in (errno.ENOSYS, errno.E2BIG):
            clone3 = _SYS_CLONE is None  # no clone3 here (an old kernel, a seccomp filter): clone from now on
        elif cgroup_fd < 0 or failure not in (errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBUSY,
                                              errno.ENODEV, errno.ENOENT):
            _report(err_w, failure, "start")
            return clone3
        # else: this cgroup could not be entered at birth; clone, and join it before exec (its
        # own error then says why, if it cannot be joined either)
    if pid < 0:
        if _SYS_CLONE is None:
            _report(err_w, errno.ENOSYS, "start")
            return clone3
        flags = _CLONE_PARENT | signal.SIGCHLD
        # s390x takes the stack first and the flags second; every other architecture the flags first.
        pid = _syscall(_SYS_CLONE, 0, flags, 0, 0, 0) if _CLONE_STACK_FIRST else _syscall(_SYS_CLONE, flags, 0, 0, 0, 0)
        if pid < 0:
            _report(err_w, ctypes.get_errno(), "start")
            return clone3
    if pid == 0:  # pragma: no cover - the new process: never returns
        try:
            os.close(sock_fd)
            os.write(err_w, b"C%d\n" % os.getpid())
            _exec(spec, fds[:len(targets)], join)
        finally:
            os._exit(127)
    try:
        os.write(err_w, b"P%d\n" % pid)  # at once: the new process may not run for a while
    except OSError:
        pass  # the daemon gave up on this call: nobody is listening
    if spec["label"] is not None and cgroup_fd >= 0:
        _label(cgroup_fd, spec["label"])
    return clone3


def _label(cgroup_fd: int, label: bytes) -> None:
    """Name the call a cgroup now holds, for a start-up after a crash; here, beside the new
    process's start rather than on the daemon's path (a cgroup's attributes take the kernel
    tens of microseconds each). Without user attributes on cgroups (kernels before 5.7),
    recovery kills by the call's tag."""
    try:
        os.setxattr(cgroup_fd, LABEL_XATTR, label)
    except OSError:
        pass


def _report(err_w: int, code: int, where: str) -> None:
    try:
        os.write(err_w, f"{code or errno.EIO}:{where}".encode())
    except OSError:
        pass  # the daemon gave up on this call: nobody is listening


def _exec(spec: dict, fds: list[int], join_cgroup: int) -> None:  # pragma: no cover - a new process
    """In the new process: leave the session, lay descriptors out, join, switch user, exec."""
    targets = spec["targets"]
    err_w = -1
    where = "start"
    try:
        os.setsid()  # its own session and group: the call's kill signals the group
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        # Lift every received descriptor above the numbers it must end up at, so laying them
        # out never overwrites one not placed yet; the lifted copies are close-on-exec.
        floor = max([2, *targets]) + 1
        lifted = [_dupfd(fd, floor) for fd in fds]
        err_w = lifted[targets.index(ERROR_PIPE)]
        for fd in fds:
            os.close(fd)  # received close-on-exec already; closed all the same
        for fd, target in zip(lifted, targets):
            if target >= 0:
                os.dup2(fd, target, inheritable=True)
        if TERMINAL in targets:
            # The daemon's pseudo-terminal becomes this session's controlling terminal: the
            # program reaches it by opening /dev/tty, and holds no descriptor of it until then
            # (the lifted copy closes at exec). Done as root, before the user switch: opening
            # /dev/tty needs no right on the terminal's own node.
            where = "terminal"
            fcntl.ioctl(lifted[targets.index(TERMINAL)], termios.TIOCSCTTY, 0)
        if join_cgroup >= 0:
            where = "cgroup"
            procs = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=join_cgroup)
            os.write(procs, b"0")
        if spec["user"] is not None:  # as subprocess does: groups, gid, then uid
            where = "user"
            uid, gid, groups = spec["user"]
            os.setgroups(groups)
            os.setregid(gid, gid)
            os.setreuid(uid, uid)
        if spec["mkdir"]:
            # As the program's user: a folder made for another account is that account's from
            # the start, with no moment in which the daemon's user owns it (and its other
            # programs could swap it) and no chown to follow a planted link.
            where = "workdir"
            os.makedirs(spec["cwd"], 0o700, exist_ok=True)
        # As the program's user: its folder is its own (0700), which a daemon that is not root
        # (or root without CAP_DAC_OVERRIDE) may not enter.
        where = "chdir"
        os.chdir(spec["cwd"])
        # Capabilities the daemon was given to switch users are not the program's (launcher.c
        # says why); EINVAL: a kernel without ambient capabilities has none to pass on.
        where = "capabilities"
        if _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            raise OSError(ctypes.get_errno(), "ambient capabilities")
        _clear_inheritable()  # a file with inheritable file capabilities would gain them
        where = "limits"
        if spec["limits"] is not None:
            apply_limits(spec["limits"])
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
        # too; end of file on the pipe alone would read as a successful exec.
        code = getattr(exc, "errno", None) or errno.EINVAL
        _report(err_w if err_w >= 0 else fds[targets.index(ERROR_PIPE)], code, where)


def _dupfd(fd: int, floor: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)


def _say(text: str) -> None:
    try:
        os.write(2, text.encode() + b"\n")
    except OSError:
        pass


def main() -> None:
    """Become the launcher of the daemon that started this process."""
    sock_fd = int(sys.argv[1])
    gc.disable()  # nothing here lives long enough to need it; and no collection in a new process
    # No parent-death signal: the daemon's end of the socket is its lifeline (only the daemon
    # holds it), and end of file lets it remove the spare cgroup before it goes.
    # What programs inherit: default dispositions and an empty mask. SIGPIPE stays ignored
    # here (a daemon that gave up on a call closes its end of the error pipe) and is reset in
    # each new process before exec.
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    serve(sock_fd)


if __name__ == "__main__":
    main()
