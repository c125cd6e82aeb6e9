"""A call's program cannot outlive its call, take more than its limits, or leave cgroups behind;
and what stops it is reported by its own code."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import psutil
import pytest
import trio

from tests.conftest import FAKES, TEST_PLUGINS


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'fake_tools.py'}"]
"""


def _context(daemon, label: str):
    from rungd.core.contract import CallContext, Caller
    from rungd.service.engine import new_call_id

    tool = daemon.daemon.tools["fake_run"].tool
    state = daemon.config.state_dir
    return CallContext(call_id=new_call_id(), tool=tool, caller=Caller(0, 0, 0), request_id=None,
                       deadline=trio.current_time() + 10, work_dir=state / "work" / label,
                       evidence_dir=state / "evidence",
                       reaper=getattr(getattr(daemon.daemon, "dispatcher", None), "_reaper", None))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_a_process_that_leaves_its_cgroup_session_and_name_dies_with_its_call(
        rungd_daemon, tmp_path: Path) -> None:
    pidfile = tmp_path / "escaped.pid"
    env = await rungd_daemon.call("fake_run_short", {"program": "escapee", "args": [str(pidfile)]})
    assert env.error is not None and env.error.code == "TIMEOUT", env
    escaped = int(pidfile.read_text())
    # The subreaper kills what it adopts from a finished call: at once after the kill, or at
    # its next pass (0.5 s).
    with trio.move_on_after(3):
        while _alive(escaped):
            await trio.sleep(0.05)
    assert not _alive(escaped), "a process that left its call's cgroup survived the call"


async def test_a_ptraced_program_ends_as_a_timeout_not_signal_5(rungd_daemon) -> None:
    env = await rungd_daemon.call("fake_run_short", {"program": "traceme", "args": []})
    assert env.error is not None
    assert env.error.code == "TIMEOUT", env.error


async def test_default_limits_apply_to_every_program_and_are_reported_by_name(rungd_daemon) -> None:
    from rungd import runner

    ctx = _context(rungd_daemon, "limits")
    probe = ("import resource as r; print(r.getrlimit(r.RLIMIT_CORE)[0], r.getrlimit(r.RLIMIT_AS)[0], "
             "r.getrlimit(r.RLIMIT_FSIZE)[0])")
    done = await runner.run(ctx, runner.Program(argv=("python3", "-c", probe)))
    core, address_space, file_size = (int(x) for x in done.stdout.split())
    assert core == 0
    # Address space stays unlimited by default (it breaks JVMs); an operator or a tool sets it.
    assert address_space == resource.RLIM_INFINITY and runner.limits.DEFAULT.address_space_bytes is None
    assert file_size == runner.limits.DEFAULT.file_size_bytes

    from rungd.core.errors import ToolError

    with pytest.raises(ToolError) as caught:
        await runner.run(_context(rungd_daemon, "memory"), runner.Program(
            argv=(str(FAKES / "hog"), "memory", "3000"), limits=runner.Limits(address_space_bytes=1 << 30)))
    assert caught.value.code == "LIMIT_EXCEEDED" and "memory" in caught.value.message


async def test_a_tools_own_file_size_limit_wins_and_a_hit_is_limit_exceeded(rungd_daemon) -> None:
    from rungd import runner
    from rungd.core.errors import ToolError

    ctx = _context(rungd_daemon, "fsize")
    with pytest.raises(ToolError) as caught:
        await runner.run(ctx, runner.Program(argv=(str(FAKES / "hog"), "file", "4"),
                                             limits=runner.Limits(file_size_bytes=1 << 20)))
    assert caught.value.code == "LIMIT_EXCEEDED"
    assert caught.value.fields == {"limit": "file_size"}


async def test_an_argument_too_long_for_the_kernel_is_args_too_long_not_install_the_program(
        rungd_daemon) -> None:
    from rungd import runner
    from rungd.core.errors import RungdError

    ctx = _context(rungd_daemon, "e2big")
    with pytest.raises(RungdError) as caught:
        await runner.run(ctx, runner.Program(argv=("/bin/echo", "x" * (200 << 10))))
    assert caught.value.code == "ARGS_TOO_LONG"
    assert "install" not in caught.value.hint


async def test_out_of_descriptors_at_spawn_is_resource_exhausted(rungd_daemon) -> None:
    import resource

    from rungd import runner
    from rungd.core.errors import RungdError

    ctx = _context(rungd_daemon, "emfile")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hogged = []
    try:
        while True:
            try:
                hogged.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        with pytest.raises(RungdError) as caught:
            await runner.run(ctx, runner.Program(argv=("/bin/true",)))
    finally:
        for fd in hogged:
            os.close(fd)
    assert caught.value.code == "RESOURCE_EXHAUSTED", caught.value
    assert "install" not in caught.value.hint


async def test_no_call_leaves_its_cgroup_behind(rungd_daemon) -> None:
    from rungd.system.proctree import CallCgroup, _own_cgroup, calls_subtree

    if _own_cgroup() is None or not os.access(_own_cgroup(), os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here")
    base = calls_subtree(rungd_daemon.daemon.dispatcher._reaper.cgroup_tag)  # the daemon's own subtree
    calls = [
        await rungd_daemon.call("fake_run", {"program": "exit_with", "args": ["0"]}),
        await rungd_daemon.call("fake_run_short", {"program": "stubborn", "args": []}),
        await rungd_daemon.call("fake_run", {"program": "doublefork", "args": []}),
    ]
    ids = {env.call_id for env in calls}
    left = [CallCgroup(path) for path in base.glob("rungd-*") if CallCgroup(path).call_id() in ids]
    # What is left of them is empty and kept for the next call (it still names the call it
    # held last); the killed one and the one a double fork escaped from are gone.
    spares = {spare.path for spare in rungd_daemon.daemon.dispatcher._reaper.launchers._spares}
    assert all(not cgroup.populated() and cgroup.path in spares for cgroup in left)
    assert len(left) <= 1
    # The call after a killed one runs whole: a cgroup that was killed is never reused (the
    # kernel kills what is born into it), and each call's own cgroup holds only its own.
    assert calls[1].error is not None and calls[1].error.code == "TIMEOUT"
    assert calls[2].status == "ok", calls[2].error
    after = await rungd_daemon.call("fake_run", {"program": "exit_with", "args": ["0"]})
    assert after.status == "ok", after.error


async def test_the_configs_limits_are_every_programs_defaults(rungd_daemon) -> None:
    from rungd import runner

    bounds = rungd_daemon.config.limits
    assert bounds.core_bytes == 0 and bounds.memory_bytes is None
    assert runner.limits.effective(None).address_space_bytes == bounds.memory_bytes
    assert runner.limits.effective(None).file_size_bytes == bounds.file_size_bytes == 16 << 30
    assert runner.limits.effective(runner.Limits(address_space_bytes=8 << 30)).address_space_bytes == 8 << 30
