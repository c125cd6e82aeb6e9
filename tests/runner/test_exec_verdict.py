"""When the runner hears whether a program's exec worked (issue 32's one wait fewer per read).

A write's program may act from its first instruction, so its exec is heard of before it is
watched, as ever. A read's is heard of at its end, from what the launcher's error pipe holds
by then: a read that could not start still ends ``not_started`` with the kernel's reason, a
read that ran is marked as started (its errors are ``done``, not ``not_started``), and no
descriptor outlives the call either way.

Driven through ``rungd.runner.run`` directly, with real programs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from rungd import runner
from rungd.runner import launch
from rungd.system import proctree
from rungd.core.contract import Caller
from rungd.core.errors import Failed, PromptUnexpected, RungdError
from rungd.service.engine import outcomes
from rungd.service.engine.calls import Call

from tests.runner.test_runner_refusals import TOOL, make_ctx

WRITE = dataclasses.replace(TOOL, side_effect="reversible")


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def _run(ctx, program: runner.Program):
    with trio.fail_after(10):
        return await runner.run(ctx, program)


@pytest.mark.parametrize("tool", [TOOL, WRITE], ids=["read", "write"])
@pytest.mark.parametrize("program, words", [
    (runner.Program(argv=("/nonexistent/rungd-no-such-program",)), "No such file or directory"),
    (runner.Program(argv=("/bin/true",), cwd=Path("/nonexistent/rungd-no-such-folder")),
     "entering its working folder"),
], ids=["exec", "chdir"])
async def test_a_program_that_could_not_start_is_not_started_and_leaks_nothing(short_tmp, tool, program,
                                                                              words) -> None:
    ctx = make_ctx(short_tmp)
    ctx.tool = tool
    await _run(make_ctx(short_tmp), runner.Program(argv=("/bin/true",)))  # the launcher, started once
    before = _fds()
    with pytest.raises(Failed) as failure:
        await _run(ctx, program)
    assert words in failure.value.message
    assert failure.value.outcome == "not_started"
    assert not ctx.may_have_acted() and not ctx.committed
    assert _fds() <= before


async def test_a_read_that_ran_is_marked_started(short_tmp) -> None:
    ctx = make_ctx(short_tmp)
    done = await _run(ctx, runner.Program(argv=("/bin/echo", "hello")))
    assert (done.exit_status, done.stdout) == (0, "hello\n")
    assert ctx.committed  # its commit point is its spawn: its errors would be "done"


async def test_a_read_stopped_at_a_question_is_marked_started(short_tmp) -> None:
    ctx = make_ctx(short_tmp)
    asks = (sys.executable, "-c", "import sys; print('Continue? [y/N] ', end='', flush=True); sys.stdin.readline()")
    with pytest.raises(PromptUnexpected):
        await _run(ctx, runner.Program(argv=asks))
    assert ctx.committed


async def test_a_read_cancelled_at_its_deadline_leaks_no_descriptor(short_tmp) -> None:
    ctx = make_ctx(short_tmp)
    await _run(make_ctx(short_tmp), runner.Program(argv=("/bin/true",)))
    before = _fds()
    with trio.move_on_after(0.3):
        await runner.run(ctx, runner.Program(argv=("/bin/sleep", "30")))
    assert _fds() <= before


@contextlib.asynccontextmanager
async def _reaper() -> AsyncIterator[proctree.Reaper]:
    """A daemon's reaper, running: its own call cgroups, kept and removed as the daemon's."""
    reaper = proctree.Reaper(set())
    reaper.cgroup_tag = f"t{secrets.token_hex(6)}"
    async with trio.open_nursery() as nursery:
        await nursery.start(reaper.run)
        try:
            yield reaper
        finally:
            nursery.cancel_scope.cancel()


async def _kept_spare(folder: Path, reaper: proctree.Reaper) -> proctree.CallCgroup:
    """The empty cgroup a first call leaves its daemon's launcher to keep."""
    first = make_ctx(folder)
    first.reaper = reaper
    await _run(first, runner.Program(argv=("/bin/true",)))
    spares = launch.for_reaper(reaper)._spares
    if not spares:
        pytest.skip("this host gives rungd no cgroups to keep")
    return spares[-1]


def _call_of(folder: Path, reaper: proctree.Reaper, tool):
    ctx = make_ctx(folder)
    ctx.reaper, ctx.tool = reaper, tool
    return ctx


async def _in_a_frozen_cgroup(folder: Path, reaper: proctree.Reaper, tool):
    """A call whose program is made in a kept cgroup that is frozen (by an operator, say): it
    never gets to its exec."""
    ((await _kept_spare(folder, reaper)).path / "cgroup.freeze").write_text("1")
    return _call_of(folder, reaper, tool)


@pytest.mark.parametrize("tool", [TOOL, WRITE], ids=["read", "write"])
async def test_a_kept_cgroup_removed_under_the_daemon_is_replaced(short_tmp, tool) -> None:
    # Another daemon's start-up sweep removes idle spares: the next call must get another
    # cgroup, not the dead one's descriptor.
    async with _reaper() as reaper:
        (await _kept_spare(short_tmp, reaper)).path.rmdir()
        done = await _run(_call_of(short_tmp, reaper, tool), runner.Program(argv=("/bin/echo", "hi")))
        assert (done.exit_status, done.stdout) == (0, "hi\n")


@pytest.mark.parametrize("tool", [TOOL, WRITE], ids=["read", "write"])
async def test_a_call_cancelled_before_its_program_could_exec_leaks_nothing(short_tmp, tool) -> None:
    # The kept cgroup is frozen (by an operator, say): the program is made in it and never
    # gets to its exec; the call is cancelled meanwhile.
    async with _reaper() as reaper:
        ctx = await _in_a_frozen_cgroup(short_tmp, reaper, tool)
        before = _fds()
        with trio.move_on_after(0.5) as scope:
            await runner.run(ctx, runner.Program(argv=("/bin/true",)))
        assert scope.cancelled_caught
        assert _fds() <= before and ctx.call_id not in proctree.RUNNING


@pytest.mark.parametrize("tool", [TOOL, WRITE], ids=["read", "write"])
async def test_a_program_that_never_runs_its_first_line_is_not_started_within_seconds(short_tmp, tool) -> None:
    # Made in a frozen cgroup, it never gets to its exec: after a few seconds it is killed
    # and said not to have run, for a read (whose exec is heard as it is watched) as for a
    # write; not left to the call's deadline.
    async with _reaper() as reaper:
        ctx = await _in_a_frozen_cgroup(short_tmp, reaper, tool)
        before = _fds()
        with trio.fail_after(launch._PID_TIMEOUT_S + 5), pytest.raises(RungdError) as failure:
            await runner.run(ctx, runner.Program(argv=("/bin/true",)))
        assert failure.value.code == "RESOURCE_EXHAUSTED", failure.value
        assert "did not start within" in failure.value.message
        assert "out of descriptors" not in failure.value.message  # not the kernel's generic EAGAIN
        assert failure.value.outcome == "not_started" and not ctx.may_have_acted()
        assert _fds() <= before and ctx.call_id not in proctree.RUNNING


async def test_a_writes_read_back_that_cannot_start_after_its_act_leaves_the_outcome_unknown(short_tmp) -> None:
    # The act ran; the read-back the write makes after it (commits=False) could not start.
    # That program did not run, but the call may have acted: the envelope must not say
    # not_started (a caller would retry an act that happened).
    ctx = make_ctx(short_tmp)
    ctx.tool = WRITE
    await _run(ctx, runner.Program(argv=("/bin/true",)))
    with pytest.raises(Failed) as failure:
        await _run(ctx, runner.Program(argv=("/nonexistent/rungd-read-back",), commits=False))
    call = Call.new(WRITE.name, "r-1", Caller(0, 0, 0))
    envelope = outcomes.error_envelope(call, failure.value, tool=WRITE, ctx=ctx)
    assert envelope.outcome == "unknown" and envelope.error.retry != "yes", envelope


@pytest.mark.parametrize("commits", [True, False], ids=["program-that-may-act", "read-back"])
async def test_a_lost_start_of_a_program_that_may_act_leaves_the_outcome_to_the_boundary(short_tmp, commits) -> None:
    # Killed at once, but it may have run its first instructions: wherever a start is lost
    # (no pidfd, no watch, no first line in time after saying it began), a write's program
    # is marked spawned, so the boundary says unknown, not not_started.
    from rungd.runner.execute import _spawn_error

    ctx = make_ctx(short_tmp)
    ctx.tool = WRITE
    error = _spawn_error(ctx, runner.Program(argv=("/bin/true",), commits=commits),
                         launch.LostStart(11, "lost"))
    assert ctx.may_have_acted() is commits
    assert not error.outcome_declared
