"""A call's outputs, watched through its own epoll (rungd.runner.streams.Outputs)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from rungd.runner.launch import Child
from rungd.runner.streams import Outputs

# Takes a copy of a descriptor of another process (pidfd_getfd, Linux 5.6; the same number on
# every architecture), as a debugger, or root, may.
_GRAB = r'''
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, int(sys.argv[1]), 0)
fd = libc.syscall(438, pidfd, int(sys.argv[2]), 0)
print("held" if fd >= 0 else "refused", flush=True)
time.sleep(10)
'''


class _Kept:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def take(self, chunk: bytes) -> None:
        self.chunks.append(chunk)


async def test_a_pipe_at_its_end_that_another_process_still_holds_does_not_wake_every_wait() -> None:
    # The program closes its stdout and stderr and runs on; a process outside the call holds a
    # copy of the daemon's own end of stdout. The watch must wait, not turn on the loop: a
    # pipe closed while another process holds it would stay in the epoll for good.
    stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
    stderr_r, stderr_w = os.pipe2(os.O_CLOEXEC)
    program = subprocess.Popen(["sh", "-c", "echo said; exec >&- 2>&-; sleep 10"], stdout=stdout_w, stderr=stderr_w)
    os.close(stdout_w)
    os.close(stderr_w)
    holder = subprocess.Popen([sys.executable, "-c", _GRAB, str(os.getpid()), str(stdout_r)], stdout=subprocess.PIPE)
    child = Child(program.pid, os.pidfd_open(program.pid), -1, stdout_r, stderr_r)
    poller = select.epoll()
    try:
        if holder.stdout.readline().strip() != b"held":
            pytest.skip("this host does not let a process take another's descriptor (pidfd_getfd)")
        kept = _Kept()
        outputs = Outputs(poller, child, (kept, _Kept()))
        turns, began = 0, time.monotonic()
        while time.monotonic() - began < 0.5:
            await outputs.wait(0.1)
            turns += 1
        assert b"".join(kept.chunks) == b"said\n"
        assert turns <= 10  # one wait per 0.1 s (and the wakes the output and both ends made)
    finally:
        for process in (program, holder):
            process.kill()
            process.wait()
        holder.stdout.close()
        poller.close()
        child.close_pipes()
        child.close()
