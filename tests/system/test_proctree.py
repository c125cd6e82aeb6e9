"""Tests for rungd.system.proctree: whole-tree kills, the subreaper, the reaper and call cgroups.

Every test runs real processes: small inline Python programs, started as the runner starts a
call's child (a new session, ``RUNGD_CALL`` in the environment). Each prints the pids the
test needs to check, one ``name pid`` line each.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator

import psutil
import pytest
import trio

from rungd.system.proctree import TAG_ENV, CallCgroup, Reaper, Tracker, kill_tree, set_child_subreaper, spawning

# Unique per run, so that no leftover of another run counts as this call's.
CALL = f"c{secrets.token_hex(4)}"

# Ignores SIGTERM and double-forks a grandchild into a session of its own, which ignores
# SIGTERM too and holds stdout open.
DOUBLE_FORK = r"""
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(1, f"grandchild {os.getpid()}\n".encode())
        time.sleep(120)
    os._exit(0)
os.write(1, f"root {os.getpid()}\n".encode())
time.sleep(120)
"""

# Ignores SIGTERM and forks 20 children that do too, all in its process group.
TWENTY_CHILDREN = r"""
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for _ in range(20):
    if os.fork() == 0:
        os.write(1, f"child {os.getpid()}\n".encode())
        time.sleep(120)
        os._exit(0)
time.sleep(120)
"""

# On SIGTERM forks an heir into a session of its own, which ignores SIGTERM, and exits.
FORK_ON_SIGTERM = r"""
import os, signal, time
def leave(signum, frame):
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(1, f"heir {os.getpid()}\n".encode())
        time.sleep(120)
    os._exit(0)
signal.signal(signal.SIGTERM, leave)
os.write(1, f"root {os.getpid()}\n".encode())
time.sleep(120)
"""

# A child starts a grandchild with an empty environment (so without the tag) in a session of
# its own, and exits when the test writes a line, leaving the grandchild an orphan.
UNTAGGED_GRANDCHILD = r"""
import os, subprocess, sys, time
GRANDCHILD = "import os, time; os.setsid(); os.write(1, f'grandchild {os.getpid()}\\n'.encode()); time.sleep(120)"
if os.fork() == 0:
    subprocess.Popen([sys.executable, "-c", GRANDCHILD], env={})
    os.write(1, f"parent {os.getpid()}\n".encode())
    sys.stdin.readline()
    os._exit(0)
time.sleep(120)
"""

# Forks a child that starts a grandchild with an empty environment (so without the tag) and
# exits at once: an untagged orphan left in the call's process group, which ignores SIGTERM
# while the root dies of it.
GROUP_ORPHAN = r"""
import os, sys, time
GRANDCHILD = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.write(1, f'grandchild {os.getpid()}\\n'.encode()); time.sleep(120)"
if os.fork() == 0:
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c", GRANDCHILD], {})
    os._exit(0)
time.sleep(120)
"""

# When the test writes a line, double-forks a grandchild that re-executes itself with an empty
# environment: an untagged orphan in another session, born between two snapshots.
VANISHING_GRANDCHILD = r"""
import os, sys, time
GRANDCHILD = "import os, time; os.write(1, f'grandchild {os.getpid()}\\n'.encode()); time.sleep(120)"
sys.stdin.readline()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c", GRANDCHILD], {})
    os._exit(0)
time.sleep(120)
"""

# Forks a child and exits at once, so the child is orphaned; the child exits with status 3
# when the test writes a line.
ORPHANING = r"""
import os, sys
if os.fork() == 0:
    os.write(1, f"orphan {os.getpid()}\n".encode())
    sys.stdin.readline()
    os._exit(3)
"""

SLEEPER = "import time; time.sleep(120)"


def dead(process: psutil.Process) -> bool:
    """Whether ``process`` is gone or a zombie: nothing of it runs any more."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def zombie_children() -> list[int]:
    """The pids of this process's zombie children."""
    zombies = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):  # reaped since the listing
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.append(child.pid)
    return zombies


@pytest.fixture(autouse=True)
def as_a_subreaper() -> None:
    """Run every test as the daemon runs: a child subreaper.

    Orphans then come back to the test process, which reaps them, instead of piling up as
    zombies under a pid 1 that may never reap them (as on a container's init).
    """
    assert set_child_subreaper()


@pytest.fixture
def strays() -> Iterator[list[psutil.Process]]:
    """Processes a test learned of: what is left of them is killed, and every orphan reaped."""
    processes: list[psutil.Process] = []
    # Zombies of earlier tests (a subprocess.Popen dropped unwaited: Python reaps it at the next
    # Popen) are not this test's: the suite's order puts these tests after many others.
    earlier = set(zombie_children())
    yield processes
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):  # psutil checks pid and start time
            process.kill()
    deadline = time.monotonic() + 10
    while not all(dead(process) for process in processes) and time.monotonic() < deadline:
        time.sleep(0.01)
    Reaper(owned=set()).reap()  # every child the test spawned has been waited for
    assert [pid for pid in zombie_children() if pid not in earlier] == []


@contextlib.asynccontextmanager
async def started(
    code: str, *, tag: str | None = CALL, reaper: Reaper | None = None
) -> AsyncIterator[trio.Process]:
    """Run ``code`` as the runner runs a call's child; on the way out kill its group and wait.

    Args:
        code: the Python program.
        tag: the call id for ``RUNGD_CALL``, or None for a process of no call.
        reaper: registers the child in its ``owned``, as the runner does.
    """
    env = {name: value for name, value in os.environ.items() if name != TAG_ENV}
    if tag is not None:
        env[TAG_ENV] = tag
    with spawning():
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", code],
            start_new_session=True,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        if reaper:
            reaper.owned.add(process.pid)
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            # Not yet reaped, so the group id is still this call's.
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            await process.stdin.aclose()
            await process.stdout.aclose()
            await process.wait()
            if reaper:
                reaper.owned.discard(process.pid)


async def read_pids(stream: trio.abc.ReceiveStream, count: int) -> dict[str, list[int]]:
    """Read ``count`` ``name pid`` lines: the pids by name."""
    data = b""
    with trio.fail_after(10):
        while data.count(b"\n") < count:
            chunk = await stream.receive_some()
            assert chunk, f"end of output after {data!r}"
            data += chunk
    pids: dict[str, list[int]] = {}
    for line in data.decode().splitlines():
        name, pid = line.split()
        pids.setdefault(name, []).append(int(pid))
    return pids


async def read_to_end(stream: trio.abc.ReceiveStream) -> None:
    """Read until end of file, which comes once no process holds the stream's pipe open."""
    with trio.fail_after(10):
        while await stream.receive_some():
            pass


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait, up to 10 s, until ``condition()`` holds."""
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)


async def test_sigterm_ignoring_double_forked_tree_dies_completely(
    strays: list[psutil.Process],
) -> None:
    async with started(DOUBLE_FORK) as process:
        tracker = Tracker(CALL, process.pid)
        pids = await read_pids(process.stdout, 2)
        strays += [psutil.Process(pid) for pid in pids["root"] + pids["grandchild"]]

        report = await kill_tree(tracker, grace_s=0.3, pgid=process.pid)

        assert report.survivors == []
        assert all(dead(stray) for stray in strays)
        assert report.method == "signals"
        assert report.elapsed_ms >= 300  # SIGTERM was ignored: the kill waited out the grace
        assert report.after_sigkill_ms is not None and report.after_sigkill_ms < 2000
        await read_to_end(process.stdout)  # the grandchild no longer holds stdout
        assert await process.wait() == -signal.SIGKILL


async def test_twenty_children_ignoring_sigterm_all_die(strays: list[psutil.Process]) -> None:
    async with started(TWENTY_CHILDREN) as process:
        tracker = Tracker(CALL, process.pid)
        pids = await read_pids(process.stdout, 20)
        strays += [psutil.Process(pid) for pid in [process.pid, *pids["child"]]]

        report = await kill_tree(tracker, grace_s=0.2, pgid=process.pid)

        assert report.survivors == []
        assert report.signalled == 21
        assert all(dead(stray) for stray in strays)


async def test_child_forked_while_dying_from_sigterm_is_killed(
    strays: list[psutil.Process],
) -> None:
    async with started(FORK_ON_SIGTERM) as process:
        tracker = Tracker(CALL, process.pid)
        await read_pids(process.stdout, 1)

        report = await kill_tree(tracker, grace_s=0.5, pgid=process.pid)

        heir = psutil.Process((await read_pids(process.stdout, 1))["heir"][0])
        strays.append(heir)
        assert report.survivors == []
        assert dead(heir)
        assert report.after_sigkill_ms is not None  # the heir ignored SIGTERM
        await read_to_end(process.stdout)


async def test_untagged_orphan_seen_in_an_earlier_snapshot_is_killed(
    strays: list[psutil.Process],
) -> None:
    async with started(UNTAGGED_GRANDCHILD) as process:
        tracker = Tracker(CALL, process.pid)
        pids = await read_pids(process.stdout, 2)
        parent = psutil.Process(pids["parent"][0])
        grandchild = psutil.Process(pids["grandchild"][0])
        strays += [parent, grandchild]
        tracker.snapshot()
        assert grandchild.pid in {member.pid for member in tracker.members()}

        await process.stdin.send_all(b"go\n")
        await eventually(lambda: dead(parent))
        assert grandchild.ppid() != parent.pid  # an orphan now: no longer of the root's tree

        report = await kill_tree(tracker, grace_s=0.2, pgid=process.pid)

        assert report.survivors == []
        assert dead(grandchild)


async def test_untagged_orphan_in_the_process_group_is_killed(
    strays: list[psutil.Process],
) -> None:
    async with started(GROUP_ORPHAN) as process:
        tracker = Tracker(CALL, process.pid)
        grandchild = psutil.Process((await read_pids(process.stdout, 1))["grandchild"][0])
        strays.append(grandchild)
        await eventually(lambda: grandchild.ppid() == os.getpid())
        tracker.snapshot()
        assert grandchild.pid not in {member.pid for member in tracker.members()}

        report = await kill_tree(tracker, grace_s=0.2, pgid=process.pid)

        assert report.survivors == []
        assert dead(grandchild)
        assert report.after_sigkill_ms is not None  # the root died of SIGTERM, the orphan did not
        assert await process.wait() == -signal.SIGTERM


async def test_processes_of_no_call_or_another_call_are_never_signalled(
    strays: list[psutil.Process],
) -> None:
    async with (
        started(DOUBLE_FORK) as process,
        # Started after the call's child, so its start time does not rule them out.
        started(SLEEPER, tag=None) as stranger,
        started(SLEEPER, tag="c-other") as neighbour,
    ):
        tracker = Tracker(CALL, process.pid)
        pids = await read_pids(process.stdout, 2)
        strays += [psutil.Process(pid) for pid in pids["root"] + pids["grandchild"]]

        report = await kill_tree(tracker, grace_s=0.1, pgid=process.pid)

        assert report.survivors == []
        assert {stranger.pid, neighbour.pid}.isdisjoint(m.pid for m in tracker.members())
        for bystander in stranger, neighbour:
            assert bystander.poll() is None
            assert not dead(psutil.Process(bystander.pid))


async def test_reaper_reaps_adopted_orphan_but_leaves_owned_child_to_trio(
    strays: list[psutil.Process],
) -> None:
    earlier = set(zombie_children())  # other tests' (see strays)
    reaper = Reaper(owned=set(), interval_s=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.run)
        async with (
            started("raise SystemExit(7)", reaper=reaper) as owned,
            started(ORPHANING, reaper=reaper) as process,
        ):
            orphan = psutil.Process((await read_pids(process.stdout, 1))["orphan"][0])
            strays.append(orphan)
            assert await process.wait() == 0
            await eventually(lambda: orphan.ppid() == os.getpid())

            await process.stdin.send_all(b"go\n")
            await eventually(lambda: not orphan.is_running())

            # The owned child was a zombie all along, through many reaping passes.
            assert owned.pid in zombie_children()
            assert await owned.wait() == 7
        nursery.cancel_scope.cancel()
    assert [pid for pid in zombie_children() if pid not in earlier] == []


async def test_call_cgroup_kill_takes_an_untagged_orphan_the_tracker_never_saw(
    strays: list[psutil.Process],
) -> None:
    cgroup = CallCgroup.create(f"c{secrets.token_hex(4)}")
    if cgroup is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.kill here")
    try:
        async with started(VANISHING_GRANDCHILD) as process:
            assert cgroup.add(process.pid)
            tracker = Tracker(CALL, process.pid, cgroup=cgroup)
            await process.stdin.send_all(b"go\n")
            grandchild = psutil.Process((await read_pids(process.stdout, 1))["grandchild"][0])
            strays.append(grandchild)
            await eventually(lambda: grandchild.ppid() == os.getpid())
            without_cgroup = Tracker(CALL, process.pid)
            without_cgroup.snapshot()
            assert grandchild.pid not in {member.pid for member in without_cgroup.members()}
            assert grandchild.pid in cgroup.pids()

            report = await kill_tree(tracker, grace_s=0.2, pgid=process.pid)

            assert report.method == "cgroup"
            assert report.survivors == []
            assert dead(grandchild)
            assert cgroup.pids() == []
            assert cgroup.remove()
    finally:
        cgroup.kill()
        with trio.move_on_after(10):
            while cgroup.pids():
                await trio.sleep(0.01)
        cgroup.remove()


async def test_reaper_never_steals_the_status_of_children_in_the_daemons_own_session() -> None:
    # A plugin's subprocess.run, or ssh-keygen checking a signature, is a child of the
    # daemon in its own session: its exit status belongs to whoever started it.
    set_child_subreaper()
    reaper = Reaper(set(), interval_s=0.001)
    statuses = []
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.run)

        def run_false() -> None:
            for _ in range(40):
                statuses.append(subprocess.run(["false"]).returncode)

        await trio.to_thread.run_sync(run_false)
        nursery.cancel_scope.cancel()
    assert statuses == [1] * 40


def test_sweep_clears_its_own_subtree_and_never_another_daemons() -> None:
    # Issue 31: each daemon's call cgroups live in a subtree of its own (rungd-d<tag>): its
    # start-up sweep empties its own, and another daemon in the same cgroup loses nothing.
    from rungd.system.proctree import _own_cgroup, calls_subtree, sweep_cgroups

    base = _own_cgroup()
    if base is None or not os.access(base, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here")
    mine, theirs, killed = (f"t{secrets.token_hex(6)}" for _ in range(3))
    own, other, left = calls_subtree(mine), calls_subtree(theirs), calls_subtree(killed)
    made = [own, other, left]
    for subtree in made:
        subtree.mkdir()
    crashed, running, spare = (own / f"rungd-c{secrets.token_hex(8)}" for _ in range(3))
    their_spare = other / f"rungd-s{secrets.token_hex(8)}"
    old, fresh = base / f"rungd-c{secrets.token_hex(8)}", base / f"rungd-c{secrets.token_hex(8)}"  # an older layout's
    sleepers = {}
    for path in (crashed, running, spare, their_spare, old, fresh):
        path.mkdir()
    for path in (crashed, running):
        sleepers[path] = subprocess.Popen(["sleep", "60"])
        (path / "cgroup.procs").write_text(f"{sleepers[path].pid}\n")
    an_hour_ago = time.time() - 3600
    for path in (old, their_spare, other, left):
        os.utime(path, (an_hour_ago, an_hour_ago))
    try:
        sweep_cgroups([crashed.name.removeprefix("rungd-")], mine)
        assert not crashed.exists() and sleepers[crashed].wait(timeout=5) == -signal.SIGKILL
        assert not spare.exists()  # its own, empty: gone however young
        assert running.exists() and sleepers[running].poll() is None  # holds a process, no recovered call's
        assert their_spare.exists() and other.exists()  # another daemon's: untouched however old
        assert not left.exists()  # the empty subtree of a daemon killed outright: nobody's
        assert not old.exists() and fresh.exists()  # beside the subtrees: empty and a minute old
    finally:
        for proc in sleepers.values():
            proc.kill()
            proc.wait()
        for path in (fresh, running, their_spare, *made):
            for _ in range(50):
                with contextlib.suppress(FileNotFoundError):
                    try:
                        path.rmdir()
                    except OSError:  # emptied by the kills above a moment later
                        time.sleep(0.05)
                        continue
                break
