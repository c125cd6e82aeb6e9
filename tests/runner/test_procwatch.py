"""rungd.runner.procwatch tells a child blocked on its stdin from one that is busy, by evidence.

Every test starts real programs the way rungd does (a new session, stdin, stdout and stderr
pipes) and looks at them through /proc while they run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from rungd.runner import procwatch

FAKES = Path(__file__).parents[1] / "fakes"
SAMPLE_EVERY = 0.05

T = TypeVar("T")

Argv = list[str | Path]
Spawn = Callable[[Argv], subprocess.Popen[bytes]]


def python(code: str) -> Argv:
    return [sys.executable, "-c", code]


# Each waits for stdin among other fds of its own, so the test shows the right fd is found.
POLL_ON_STDIN = python(
    "import os, select; r, w = os.pipe(); p = select.poll();"
    " p.register(r, select.POLLIN); p.register(0, select.POLLIN); p.poll()"
)
# fd 77 lies in the second word of the fd_set bitmap.
SELECT_ON_STDIN = python(
    "import os, select; r, w = os.pipe(); select.select([r, os.dup2(0, 77)], [], [])"
)
EPOLL_ON_STDIN = python(
    "import os, select; r, w = os.pipe(); e = select.epoll();"
    " e.register(r, select.EPOLLIN); e.register(0, select.EPOLLIN); e.poll()"
)
# The main thread waits in futex(); only the other thread is in read().
THREAD_READS_STDIN = python(
    "import sys, threading; t = threading.Thread(target=sys.stdin.readline); t.start(); t.join()"
)

WAITING = {
    "confirm": [FAKES / "confirm"],
    "confirm-on-stderr": [FAKES / "confirm", "--stderr"],
    "password": [FAKES / "password"],
    "undeclared": [FAKES / "undeclared"],
    "silent_read": [FAKES / "silent_read"],
    "buffered_prompt": [FAKES / "buffered_prompt"],
    "eof_yes": [FAKES / "eof_yes"],
    "poll": POLL_ON_STDIN,
    "select": SELECT_ON_STDIN,
    "epoll": EPOLL_ON_STDIN,
    "reader-thread": THREAD_READS_STDIN,
}

NOT_WAITING = {
    **{
        f"busy-{mode}": [FAKES / "busy", "--mode", mode, "--seconds", "10"]
        for mode in ("sleep", "compute", "socket", "progress", "select")
    },
    "reads-its-own-pipe": python("import os; r, w = os.pipe(); os.read(r, 1)"),
    "stdout-full": [FAKES / "flood"],
}


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start programs as rungd does; kill each one's process group and reap it afterwards."""
    children: list[subprocess.Popen[bytes]] = []

    def start(argv: Argv) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        children.append(child)
        return child

    try:
        yield start
    finally:
        for child in children:
            # Once the test has reaped the child its group id may be a stranger's: only
            # signal the group while the (possibly zombie) leader still holds it.
            if child.returncode is None:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            child.wait(timeout=5)
            for stream in (child.stdin, child.stdout, child.stderr):
                stream.close()


def stdin_inode(child: subprocess.Popen[bytes]) -> int:
    return procwatch.pipe_inode(child.stdin.fileno())


def read_targets(pid: int) -> set[str]:
    """What the fds that ``pid`` waits to read refer to, as /proc/PID/fd names them."""
    targets = set()
    for fd in procwatch.fds_reading(pid):
        with contextlib.suppress(OSError):  # the fd may close between the two reads
            targets.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return targets


def wait_for(condition: Callable[[], T], within: float = 2.0) -> T:
    """The first true value of ``condition``, sampled until ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(SAMPLE_EVERY)
    return value


@pytest.mark.parametrize("argv", WAITING.values(), ids=WAITING.keys())
def test_sees_a_program_waiting_for_input_within_a_second(spawn: Spawn, argv: Argv) -> None:
    started = time.monotonic()
    child = spawn(argv)
    inode = stdin_inode(child)
    while procwatch.waiting_for_input([child.pid], inode) != (child.pid, "stdin"):
        assert child.poll() is None, child.stderr.read().decode()
        assert time.monotonic() - started < 1.0, "not seen waiting within a second"
        time.sleep(SAMPLE_EVERY)


@pytest.mark.parametrize("argv", NOT_WAITING.values(), ids=NOT_WAITING.keys())
def test_never_sees_a_busy_program_waiting_for_input(spawn: Spawn, argv: Argv) -> None:
    child = spawn(argv)
    inode = stdin_inode(child)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert procwatch.waiting_for_input([child.pid], inode) is None
        time.sleep(SAMPLE_EVERY)
    assert child.poll() is None, "the program ended, so the window showed nothing"


def test_a_poll_on_a_socket_is_seen_but_is_not_stdin(spawn: Spawn) -> None:
    child = spawn([FAKES / "busy", "--mode", "socket", "--seconds", "10"])
    wait_for(lambda: any(target.startswith("socket:") for target in read_targets(child.pid)))
    assert 0 not in procwatch.fds_reading(child.pid)


def test_finds_the_reader_in_a_process_tree(spawn: Spawn) -> None:
    parent = spawn(python(f"import subprocess; subprocess.run([{str(FAKES / 'confirm')!r}])"))
    inode = stdin_inode(parent)
    reader = wait_for(lambda: psutil.Process(parent.pid).children()).pop().pid
    assert wait_for(lambda: procwatch.waiting_for_input([parent.pid, reader], inode)) == (reader, "stdin")
    assert not procwatch.reading_pipe(parent.pid, inode)  # it is in wait4(), not read()


def test_pipe_inode_names_the_childs_stdin(spawn: Spawn) -> None:
    child = spawn([FAKES / "silent_read"])
    assert os.readlink(f"/proc/{child.pid}/fd/0") == f"pipe:[{stdin_inode(child)}]"


def test_a_zombie_is_not_waiting(spawn: Spawn) -> None:
    child = spawn([FAKES / "exit_with", "0"])
    inode = stdin_inode(child)
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
    assert procwatch.fds_reading(child.pid) == set()
    assert not procwatch.reading_pipe(child.pid, inode)
    assert procwatch.waiting_for_input([child.pid], inode) is None


def test_a_reaped_process_is_not_waiting(spawn: Spawn) -> None:
    child = spawn([FAKES / "silent_read"])
    inode = stdin_inode(child)
    child.kill()
    child.wait(timeout=5)
    assert procwatch.fds_reading(child.pid) == set()
    assert not procwatch.reading_pipe(child.pid, inode)
    assert procwatch.waiting_for_input([child.pid], inode) is None
