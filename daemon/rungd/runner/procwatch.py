"""Whether a child is blocked reading its stdin or its terminal, judged from what the kernel
shows in /proc.

When a legacy program goes quiet, rungd must tell a question from a pause. The program's last
output cannot settle that alone: a program may read stdin without printing anything (a silent
read), or print its prompt into a stdio buffer that is only flushed after the answer comes (C
and Python block-buffer stdout on a pipe), so the daemon sees nothing at all; and text that
looks like a question may be printed by a program that then goes on working. The kernel knows:
a program waiting for an answer is blocked in a syscall that reads, or waits to read, the pipe
the daemon holds as the child's stdin. This module reads that evidence:

- ``/proc/PID/task/TID/syscall`` gives the syscall each thread is blocked in and its raw
  arguments (every thread, since a program may read stdin from a thread other than the main);
- read/readv name the fd in their first argument; poll/ppoll and select/pselect6 keep their
  fds in the caller's memory, read through ``/proc/PID/mem``; an epoll instance lists the
  fds it watches, with their event masks, in ``/proc/PID/fdinfo/EPFD``;
- ``/proc/PID/fd/N`` names what an fd refers to: ``pipe:[INODE]`` for a pipe, ``/dev/pts/N``
  for the call's terminal, or ``/dev/tty`` when opened by that name (then the process's
  controlling terminal, field 7 of ``/proc/PID/stat``, says which terminal it is);
- a process stopped in a background group of the terminal (SIGTTIN) shows ``T`` in its stat.

Reading another process's ``syscall`` and ``mem`` needs ptrace access to it: the same uid and a
dumpable process (setuid programs such as sudo are not dumpable), or CAP_SYS_PTRACE. Without it
the process reads as not reading.

Everything here is a snapshot of a process that keeps running: it may exit, close the fd or
return from the syscall between two reads of /proc. Every such race reads as "not reading",
never as an exception; the caller samples again.

Only x86_64 and aarch64 are known (native 64-bit processes; 32-bit compat processes number
their syscalls differently). On any other machine no process is ever seen reading.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable

from rungd.system.proctree import read_file

# poll(2) and epoll(7) share these bits; either one means "wake me when there is data to read".
_READ_EVENTS = 0x001 | 0x040  # POLLIN | POLLRDNORM, EPOLLIN | EPOLLRDNORM

_POLLFD = struct.Struct("=ihh")  # struct pollfd: int fd; short events; short revents


def pipe_inode(fd: int) -> int:
    """The inode number of pipe ``fd`` of this process, which /proc shows as ``pipe:[INODE]``.

    The daemon takes it from its own end of a child's stdin pipe; the child's end has the same
    inode, since both ends belong to one pipe.
    """
    return os.fstat(fd).st_ino


def reading_pipe(pid: int, pipe_ino: int) -> bool:
    """Whether a thread of process ``pid`` is blocked right now waiting to read the pipe.

    Args:
        pid: any process, typically one of a call's process tree.
        pipe_ino: the pipe's inode, from :func:`pipe_inode`.

    Returns:
        True when a thread is in read/readv on an fd for the pipe, or in poll/select/epoll
        waiting for the pipe to become readable. False otherwise, and whenever the process is
        gone, a zombie or not accessible.
    """
    target = f"pipe:[{pipe_ino}]"
    for fd in fds_reading(pid):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue  # the fd was closed after the syscall was read
    return False


def waiting_for_input(pids: Iterable[int], pipe_ino: int | None, terminal: tuple[str, int] | None = None
                      ) -> tuple[int, str] | None:
    """The first of ``pids`` that waits for an answer, and where: ``"stdin"`` (blocked
    reading the pipe) or ``"terminal"`` (blocked reading the call's terminal, or stopped for
    reading it from a background group: SIGTTIN); None when none of them does.

    Args:
        pipe_ino: the stdin pipe's inode (:func:`pipe_inode`); None: stdin is no question
            (closed, or still being fed).
        terminal: the call's terminal, as its path (``/dev/pts/N``) and device number.
    """
    stdin = f"pipe:[{pipe_ino}]" if pipe_ino is not None else None
    for pid in pids:
        if terminal is not None and stopped_on_terminal(pid, terminal[1]):
            return pid, "terminal"
        for fd in fds_reading(pid):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # the fd was closed after the syscall was read
            if link == stdin:
                return pid, "stdin"
            if terminal is not None and (link == terminal[0] or (link == "/dev/tty" and _tty_of(pid) == terminal[1])):
                # Opened as /dev/tty, a descriptor reads back by that name: it is the process's
                # controlling terminal, which is the call's unless it left the call's session.
                return pid, "terminal"
    return None


def hidden(pid: int) -> bool:
    """Whether rungd may not see what the process is blocked in (no ptrace access to it: a
    setuid program such as sudo, for a daemon that is not root), though it is there."""
    try:
        read_file(f"/proc/{pid}/syscall")
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def _stat_fields(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state first); empty if gone."""
    try:
        return read_file(f"/proc/{pid}/stat").rpartition(b")")[2].split()
    except OSError:
        return []


def _tty_of(pid: int) -> int | None:
    """The device number of the process's controlling terminal (0: none), None if gone."""
    fields = _stat_fields(pid)
    return int(fields[4]) if len(fields) > 5 else None


def stopped_on_terminal(pid: int, device: int) -> bool:
    """Whether the process is stopped while its controlling terminal is ``device`` and its
    group is not the terminal's foreground group: a background reader stopped by SIGTTIN (or
    a writer by SIGTTOU), which waits for a person who will never come.

    Readable for any process (no ptrace access needed): the state, group and terminal are in
    /proc/PID/stat. The state is looked at first: a stopped reader still shows its read in
    its syscall file.
    """
    fields = _stat_fields(pid)
    if len(fields) < 6 or fields[0] != b"T":
        return False
    pgrp, tty_nr, tpgid = int(fields[2]), int(fields[4]), int(fields[5])
    return tty_nr == device and pgrp != tpgid


def fds_reading(pid: int) -> set[int]:
    """The fds that some thread of ``pid`` is blocked waiting to read, right now.

    Threads share one fd table (every threading library creates them so), so the fds of all
    threads are numbers in ``/proc/PID/fd``. Empty when no thread is in a reading syscall, and
    when the process is gone, a zombie or not accessible.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return set()
    fds: set[int] = set()
    for tid in tids:
        fds |= _task_fds_reading(f"/proc/{pid}/task/{tid}")
    return fds


def _task_fds_reading(task: str) -> set[int]:
    """The fds one thread (``task``, its /proc directory) is blocked waiting to read."""
    try:
        fields = read_file(f"{task}/syscall").split()
        # "NR ARG0..ARG5 SP PC" in a syscall; "running"; or "-1 SP PC" when blocked outside
        # one. Neither of the last two starts with a digit.
        if not fields or not fields[0].isdigit():
            return set()
        fds_of = _WAITING_SYSCALLS.get(int(fields[0]))
        if fds_of is None:
            return set()
        return set(fds_of(task, [int(arg, 16) for arg in fields[1:7]]))
    except OSError:
        return set()  # the thread exited, or we may not look at it


def _read_fd(task: str, args: list[int]) -> Iterable[int]:
    """read(fd, buf, count) and readv(fd, iov, iovcnt)."""
    return (args[0],)


def _polled_fds(task: str, args: list[int]) -> Iterable[int]:
    """poll(fds, nfds, timeout) and ppoll(fds, nfds, tmo, sigmask, sigsetsize)."""
    pollfds, nfds = args[0], args[1]
    data = _read_memory(task, pollfds, nfds * _POLLFD.size)
    # The kernel ignores entries with a negative fd; they are how a caller disables one.
    return (fd for fd, events, _ in _POLLFD.iter_unpack(data) if fd >= 0 and events & _READ_EVENTS)


def _selected_fds(task: str, args: list[int]) -> Iterable[int]:
    """select(nfds, readfds, writefds, exceptfds, timeout) and pselect6 (same first two)."""
    nfds, readfds = args[0], args[1]
    if nfds == 0 or readfds == 0:
        return ()  # select with no read set is how some programs sleep
    # An fd_set is an array of unsigned longs with fd N at bit N % 64 of long N // 64; on a
    # little-endian machine that is bit N of the bytes read as one little-endian integer.
    bits = int.from_bytes(_read_memory(task, readfds, (nfds + 7) // 8), "little")
    return (fd for fd in range(nfds) if bits >> fd & 1)


def _epolled_fds(task: str, args: list[int]) -> Iterable[int]:
    """epoll_wait(epfd, events, maxevents, timeout), epoll_pwait and epoll_pwait2."""
    fds = []
    with open(f"{task}/fdinfo/{args[0]}") as f:
        for line in f:
            # "tfd:        0 events:       19 data: ...": the target fd, then its mask in hex
            fields = line.split()
            if fields[:1] == ["tfd:"] and int(fields[3], 16) & _READ_EVENTS:
                fds.append(int(fields[1]))
    return fds


def _read_memory(task: str, address: int, size: int) -> bytes:
    """``size`` bytes at ``address`` in the thread's memory; empty if they cannot all be read."""
    fd = os.open(f"{task}/mem", os.O_RDONLY)
    try:
        data = os.pread(fd, size, address)
    finally:
        os.close(fd)
    return data if len(data) == size else b""


# Syscalls that block waiting to read, by number, with how to find the fds they wait on.
#
# pread64/preadv are left out: on a pipe they fail at once with ESPIPE (seen here), so they
# never block on one.
#
# What /proc/PID/task/TID/syscall showed on Linux 6.18 x86_64 for Python 3.11 children started
# in a new session with stdin, stdout and stderr pipes:
#   input(), sys.stdin.readline(), getpass.getpass() without a tty: "0 0x0 BUF 0x2000 ..."
#   a reader thread while the main thread joins it: main "202 ..." (futex), reader "0 0x0 ..."
#   select.poll() on fd 0: "7 PTR 0x1 0xffffffff ..."; a socket accept() with a timeout is
#     "7 PTR 0x1 0x2710 ..." too, so the pollfd array must be read to tell them apart
#   select.select([0], [], []): "270 0x1 PTR 0x0 ..." (glibc implements select with pselect6)
#   select.select([], [], [], 10): "270 0x0 0x0 0x0 0x0 ..." (a sleep)
#   select.epoll() on fd 0: "232 0x3 ..." with "tfd: 0 events: 19 ..." in fdinfo/3 (hex:
#     EPOLLIN | EPOLLERR | EPOLLHUP)
#   time.sleep(): "230 ..." (clock_nanosleep); a busy loop: "running"; accept(): "288 ...";
#   a full stdout pipe: "1 0x1 ..." (write); a zombie: "-1 0x0 0x0"
_Finder = Callable[[str, list[int]], Iterable[int]]
_SYSCALLS: dict[str, dict[int, _Finder]] = {
    "x86_64": {
        0: _read_fd,  # read
        19: _read_fd,  # readv
        7: _polled_fds,  # poll
        271: _polled_fds,  # ppoll
        23: _selected_fds,  # select
        270: _selected_fds,  # pselect6
        232: _epolled_fds,  # epoll_wait
        281: _epolled_fds,  # epoll_pwait
        441: _epolled_fds,  # epoll_pwait2
    },
    # The generic table: no poll, select or epoll_wait, only their newer forms.
    "aarch64": {
        63: _read_fd,  # read
        65: _read_fd,  # readv
        73: _polled_fds,  # ppoll
        72: _selected_fds,  # pselect6
        22: _epolled_fds,  # epoll_pwait
        441: _epolled_fds,  # epoll_pwait2
    },
}
_WAITING_SYSCALLS = _SYSCALLS.get(os.uname().machine, {})
