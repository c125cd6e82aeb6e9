"""Shared fixtures: every test gets its own short temp folder; the daemon fixtures come
from ``rungd.testing``, the same ones plugin authors use. After every test, no process
started for a call may survive."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio

pytest_plugins = ["rungd.testing"]

TESTS = Path(__file__).parent
FAKES = TESTS / "fakes"
TEST_PLUGINS = TESTS / "plugin_fixtures"
# Call ids the daemon mints (rungd.service.engine.new_call_id); other tag values are not ours.
CALL_ID = re.compile(r"^c[0-9a-f]{16,}$")


async def record_loop_gaps(gaps: list[float], every_s: float) -> None:
    """Sleep ``every_s`` over and over, appending how long each sleep really took: a gap far
    above ``every_s`` is the event loop stalled (run it beside the code under test)."""
    last = trio.current_time()
    while True:
        await trio.sleep(every_s)
        now = trio.current_time()
        gaps.append(now - last)
        last = now


def nest_folders(folder: Path, depth: int) -> None:
    """Folders nested ``depth`` deep in ``folder``, as a program may leave them: past a
    recursive removal's reach, and past any path's."""
    at = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=at)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=at)
        os.close(at)
        at = deeper
    os.close(at)


def tagged_processes() -> list[psutil.Process]:
    """Live (not zombie) descendants of this test process that carry a rungd call tag.

    The test daemons make this process a child subreaper, so a call's orphans (a double
    fork) are re-parented here and still count as descendants; other processes on the
    machine are none of our business.
    """
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if CALL_ID.match(proc.environ().get("RUNGD_CALL", "")) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True)
def no_survivors() -> Iterator[None]:
    """Fail any test that leaves a process of a call running."""
    yield
    survivors = tagged_processes()
    for proc in survivors:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not survivors, f"processes outlived their call: {[p.pid for p in survivors]}"


def _call_cgroups() -> set[str]:
    """The per-call cgroups (``rungd-<call_id>``) this test process's daemons and launchers
    made, by path: those in the subtrees this process made (``rungd-p<pid>``, and each
    ``rungd-d<tag>`` it marked with its pid), never another rungd's on the host."""
    from rungd.system.proctree import OWNER_XATTR, _own_cgroup

    base = _own_cgroup()
    if base is None:
        return set()
    mine = str(os.getpid()).encode()
    found = set()
    for subtree in base.glob("rungd-[dp]*"):
        try:
            ours = subtree.name == f"rungd-p{os.getpid()}" or os.getxattr(subtree, OWNER_XATTR) == mine
        except OSError:
            ours = False
        if ours:
            found |= {str(path.relative_to(base)) for path in subtree.glob("rungd-*")}
    return found


def _run_as_folders() -> set[Path]:
    """The daemons' run-as folders in /tmp (rungd.runner.askpass_server.RunAsFolder)."""
    return set(Path(tempfile.gettempdir()).glob(".rungd-as-*"))


def _subtrees() -> set[Path]:
    """The daemons' and processes' subtrees of call cgroups (rungd.system.proctree.calls_subtree)."""
    from rungd.system.proctree import _own_cgroup

    base = _own_cgroup()
    return set(base.glob("rungd-[dp]*")) if base is not None else set()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_CGROUPS_BEFORE] = _call_cgroups()
    session.config.stash[_SUBTREES_BEFORE] = _subtrees()
    session.config.stash[_RUN_AS_BEFORE] = _run_as_folders()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if it left per-call cgroups behind: every call's cgroup must go with it."""
    # A daemon the tests killed (kill -9, a crash aimed at an fsync) leaves its run-as folder
    # for its next start to sweep; the tests' daemons never start again in the same folder.
    for folder in _run_as_folders() - session.config.stash.get(_RUN_AS_BEFORE, set()):
        shutil.rmtree(folder, ignore_errors=True)
    before = session.config.stash.get(_CGROUPS_BEFORE, set())
    deadline = time.monotonic() + 3  # a daemon still stopping may be removing its last ones
    while (left := _call_cgroups() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        session.config.get_terminal_writer().line(
            f"FAILED: the run left {len(left)} per-call cgroup(s) behind: {sorted(left)[:5]}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    # A daemon the tests killed outright may leave its subtree, empty, for its next start's
    # sweep (a minute later, any daemon's); the tests' daemons never start again: the run
    # removes the empty ones it made (one holding a cgroup was reported above, and stays).
    for subtree in _subtrees() - session.config.stash.get(_SUBTREES_BEFORE, set()):
        with contextlib.suppress(OSError):
            subtree.rmdir()


_CGROUPS_BEFORE = pytest.StashKey[set[str]]()
_RUN_AS_BEFORE = pytest.StashKey[set[Path]]()
_SUBTREES_BEFORE = pytest.StashKey[set[Path]]()
