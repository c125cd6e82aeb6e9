"""``run``: start one program for a call, watch it to its end, and leave nothing behind.

The order matters and is the whole design: credentials are resolved and the call's private
folder made before anything starts (a missing credential starts nothing); the child is
spawned in a new session and joined to the call's cgroup and tracker at once; output is
drained and the program watched beside each other; and whatever happens, the tree is killed
and reaped inside a shielded scope before ``run`` returns or raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import trio

from rungd import proctree
from rungd.contract import CallContext
from rungd.errors import Failed, RungdError
from rungd.redact import Redactor
from rungd.runner.askpass_server import AskpassServer
from rungd.runner.environment import child_env, credential
from rungd.runner.exits import check_terminal
from rungd.runner.limits import preexec
from rungd.runner.program import Completed, Program
from rungd.runner.streams import Stream, drain
from rungd.runner.watch import Watch


@dataclasses.dataclass
class _Scratch:
    """What a call opens before its program starts: the private folder and evidence files."""

    helper: AskpassServer
    out_file: BinaryIO
    err_file: BinaryIO
    evidence: list[str]

    @classmethod
    def open(cls, ctx: CallContext, owner: tuple[int, int] | None = None) -> _Scratch:
        """Raises Failed when the state folder cannot hold them (a full disk, say).

        Args:
            owner: uid and gid of the user the program runs as, when not the daemon's.
        """
        out_id, out_path = ctx.evidence_path("stdout")
        err_id, err_path = ctx.evidence_path("stderr")
        opened: list[Any] = []
        try:
            ctx.work_dir.mkdir(parents=True, exist_ok=True)
            helper = AskpassServer(ctx.work_dir, owner)
            opened.append(helper)
            out_file = open(out_path, "wb")
            opened.append(out_file)
            err_file = open(err_path, "wb")
        except OSError as exc:
            for thing in opened:
                thing.close()
            raise Failed(
                f"rungd cannot prepare the call's folders: {exc.strerror}; nothing was run",
                hint="retry later; the operator must free space in rungd's state folder",
                retry="yes", next_action="retry_later",
            ) from None
        return cls(helper, out_file, err_file, [out_id, err_id])

    def close(self) -> None:
        self.helper.close()
        self.out_file.close()
        self.err_file.close()


def _as_user(user: str | None) -> dict[str, Any]:
    """Popen's switch to ``user``: setgid, setgroups (initgroups' list), setuid, done in the
    child before exec (and before a preexec function, so limits apply to that user)."""
    if user is None:
        return {}
    account = pwd.getpwnam(user)
    return {"user": account.pw_uid, "group": account.pw_gid,
            "extra_groups": os.getgrouplist(account.pw_name, account.pw_gid)}


def _owner(user: str | None) -> tuple[int, int] | None:
    """uid and gid of ``user``, or None for the daemon's own.

    Raises:
        Failed: the account is gone since the tool file was loaded; nothing was run.
    """
    if user is None:
        return None
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise Failed(f"the account {user!r} the tool runs as does not exist; nothing was run",
                     hint="the operator must create it again or fix the tool file's user") from None
    return account.pw_uid, account.pw_gid


async def _spawn(ctx: CallContext, program: Program, credentials: Mapping[str, str],
                 askpass: Mapping[str, str], pass_fds: list[int], cwd: Path) -> trio.Process:
    reaper = ctx.reaper
    with reaper.spawning() if reaper else contextlib.nullcontext():
        proc = await trio.lowlevel.open_process(
            list(program.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=child_env(ctx, program, credentials, askpass),
            cwd=str(program.cwd or cwd),
            preexec_fn=preexec(program.limits) if program.limits else None,
            pass_fds=tuple(pass_fds),
            **_as_user(program.user),
        )
        if reaper:
            reaper.owned.add(proc.pid)
    return proc


async def _start(ctx: CallContext, program: Program, credentials: Mapping[str, str],
                 scratch: _Scratch) -> trio.Process:
    """Spawn the child; on failure close what the call opened and raise Failed."""
    try:
        # A program run as another user works in its own private folder: the call's work
        # folder is the daemon's alone.
        cwd = scratch.helper.folder if program.user is not None else ctx.work_dir
        proc = await _spawn(ctx, program, credentials, scratch.helper.env, scratch.helper.pass_fds, cwd)
    except OSError as exc:
        scratch.close()
        raise Failed(
            f"could not start {program.argv[0]}: {exc.strerror}",
            hint="the operator must install the program or fix the tool's argv",
        ) from None
    finally:
        scratch.helper.release_secrets()  # the child holds its own copies now
    return proc


async def run(ctx: CallContext, program: Program) -> Completed:
    """Run ``program`` for the call ``ctx`` until it exits, asks, or the call is cancelled.

    Returns:
        Completed, with the exit status (negative for a signal) and redacted output.

    Raises:
        PromptUnexpected: the program waited on stdin for an answer nobody declared (or the
            call did not pass its gate for a declared confirmation). The tree is dead.
        AuthRequired: it needs a credential the daemon does not hold (then nothing starts),
            asked for one nobody declared, or asked again after its declared answers (the
            credential was rejected). The asking program never gets an answer, not even an
            empty one: it is held until its tree is killed.
        PromptUnexpected: it tried to ask on /dev/tty, which it cannot have, whatever its exit.
        Failed: the program could not be started (not found, not executable).

    Cancellation: on cancellation (the call's deadline, or daemon shutdown) the whole tree
    is killed inside a shielded scope before the cancellation propagates; ``ctx.committed``
    tells the caller whether the effect may have begun.
    """
    # Every credential the program gets from the start is looked up before anything starts:
    # a program run without one may take its absence as an answer.
    credentials = {var: credential(ctx, name) for var, name in program.env_credentials.items()}
    secret_files = {var: credential(ctx, name) for var, name in program.file_credentials.items()}
    secrets = [*credentials.values(), *secret_files.values()]
    scratch = _Scratch.open(ctx, _owner(program.user))
    for var, secret in secret_files.items():
        scratch.helper.env[var] = scratch.helper.secret_file(var, secret)
    proc = await _start(ctx, program, credentials, scratch)
    if program.commits:
        # The program may act from its first instruction, whatever the declared commit point.
        ctx.mark_spawned()
        if ctx.tool.timing.commit_point == "spawn":
            ctx.mark_committed()
    # Where the daemon may make cgroups (root, or systemd's Delegate=yes), the call gets its
    # own, so the kill reaches every process of it, however it detached (cgroup.kill).
    cgroup = proctree.CallCgroup.create(ctx.call_id)
    if cgroup is not None:
        cgroup.add(proc.pid)
    tracker = proctree.Tracker(ctx.call_id, proc.pid, cgroup=cgroup)
    stdout = Stream("stdout", program.keep_bytes, scratch.out_file, program.evidence_bytes, Redactor(secrets))
    stderr = Stream("stderr", program.keep_bytes, scratch.err_file, program.evidence_bytes, Redactor(secrets))
    watch = Watch(ctx, program, proc, tracker, (stdout, stderr), Redactor(secrets))
    try:
        question = await _supervise(proc, watch, scratch.helper)
    finally:
        with trio.CancelScope(shield=True):
            await _end(ctx, program, proc, tracker, watch, scratch)
    # What was answered on the caller's behalf goes on record (the ledger's answered
    # events), whatever the call ends in.
    ctx.answered.extend(watch.answered)
    # An askpass refusal names the exact question; it beats whatever the program made of it.
    problem = question or watch.refused
    if problem is not None:
        raise problem
    completed = Completed(
        exit_status=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
        stdout=stdout.text(),
        stderr=stderr.text(),
        truncated=stdout.truncated or stderr.truncated,
        stdout_bytes=stdout.total,
        stderr_bytes=stderr.total,
        answered=watch.answered,
        evidence=scratch.evidence,
    )
    check_terminal(completed, program, watch.tty)
    return completed


async def _supervise(proc: trio.Process, watch: Watch, helper: AskpassServer) -> RungdError | None:
    """Drain, feed, serve askpass and watch until the program exits or asks.

    Returns:
        The error its question calls for, or None when it exited by itself.

    Cancellation: every task stops at once; the caller kills the tree.
    """
    stdout, stderr = watch.streams
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, proc.stdout, stdout)
        nursery.start_soon(drain, proc.stderr, stderr)
        nursery.start_soon(helper.serve, watch.tracker.root, watch.askpass_answer)
        # Declared stdin is fed beside the watch: a program that asks before it reads
        # all of it must still be noticed.
        nursery.start_soon(watch.feed_stdin)
        try:
            await watch.until_exit()
        except RungdError as exc:
            # Returned outside the nursery, so callers see the error itself and not an
            # exception group.
            nursery.cancel_scope.cancel()
            return exc
        # The program is gone; a descendant may still hold the pipes open. Give the readers
        # a moment to reach end-of-file, then stop waiting: the sweep kills whoever holds them.
        with trio.move_on_after(0.2):
            for stream in (stdout, stderr):
                await stream.drained.wait()
        nursery.cancel_scope.cancel()
    return None


async def _end(ctx: CallContext, program: Program, proc: trio.Process, tracker: proctree.Tracker,
               watch: Watch, scratch: _Scratch) -> None:
    """Kill what is left of the call, reap it, and close everything the call opened.

    Cancellation: the caller shields it; every wait in it is bounded.
    """
    cgroup, reaper = tracker.cgroup, ctx.reaper
    if not _nothing_left(proc, cgroup, reaper):
        await proctree.kill_tree(tracker, grace_s=program.grace_s, pgid=proc.pid)
    if cgroup is not None:
        cgroup.remove()
    with trio.move_on_after(2):
        await proc.wait()
    if reaper:
        reaper.owned.discard(proc.pid)
        reaper.poke()  # the kill may have left adopted orphans to reap
    for stream in watch.streams:
        stream.close()
    if proc.stdin is not None:
        await proc.stdin.aclose()
    scratch.helper.close()


def _nothing_left(proc: trio.Process, cgroup: proctree.CallCgroup | None, reaper: Any) -> bool:
    """Whether a call that ended by itself provably left no process behind, so the kill
    (which scans every process on the host for the call's tag) can be skipped.

    True only when the program has exited, its cgroup is empty, and the daemon, a child
    subreaper, has no child it did not spawn: an orphan of this call would be one of those.
    """
    if proc.returncode is None or cgroup is None or reaper is None or cgroup.pids():
        return False
    return not (proctree.own_children() - reaper.owned)
