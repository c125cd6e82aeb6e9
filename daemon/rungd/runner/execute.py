"""``run``: start one program for a call, watch it to its end, and leave nothing behind.

The order matters and is the whole design: credentials are resolved and the call's private
folder made before anything starts (a missing credential starts nothing); the child is
spawned in a new session, born in the call's cgroup and registered with its tracker at once;
one task then takes its output, notices its exit and watches for questions, through an epoll
of the call's own (a task more only to feed declared stdin or serve a private askpass
endpoint); and whatever happens, the tree is killed and reaped inside a shielded scope before
``run`` returns or raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import pwd
import select
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, BinaryIO

import trio

from rungd.system import proctree, trust
from rungd.core.contract import CallContext
from rungd.core.errors import Failed, RungdError, ToolError
from rungd.redact import Redactor
from rungd.runner.askpass_server import AskpassServer, CallAskpass
from rungd.runner.environment import DEFAULT_PATH, child_env, credential
from rungd.runner.exits import check_limits, check_terminal
from rungd.runner import launch, limits, procwatch
from rungd.runner.program import Completed, Program, credential_file_marker
from rungd.runner.screen import Cast, Screen, Session
from rungd.runner.streams import Outputs, Stream
from rungd.runner.terminal import Terminal
from rungd.runner.watch import Watch

log = logging.getLogger("rungd.runner")

# Programs found trusted, re-checked at each call by a stat of each entry on their path.
_TRUSTED = trust.Trust()
# Paths a tool fixes in argv, by the account it runs as (who may own them too).
_TRUSTED_FOR: dict[int, trust.Trust] = {}


@dataclasses.dataclass
class _Scratch:
    """What a call opens before its program starts: its askpass handle (and private folder),
    the epoll its output is watched through; and the evidence files, opened at a stream's
    first byte (:meth:`evidence_file`)."""

    helper: AskpassServer | CallAskpass
    poller: select.epoll
    terminal: Terminal | None
    ctx: CallContext
    evidence: list[str]
    files: list[BinaryIO]

    @classmethod
    def open(cls, ctx: CallContext, program: Program, owner: tuple[int, int] | None = None) -> _Scratch:
        """Raises Failed when the state folder cannot hold them (a full disk, say), and
        RESOURCE_EXHAUSTED when the host has no descriptor or terminal left.

        Args:
            owner: uid and gid of the user the program runs as, when not the daemon's.
        """
        try:
            poller = select.epoll()
        except OSError as exc:  # EMFILE, ENFILE, ENOMEM
            raise _spawn_error(ctx, Program(argv=(ctx.tool.name,)), exc) from None
        terminal = None
        if program.terminal != "none":
            try:
                terminal = Terminal() if program.screen is None else \
                    Terminal(program.screen.rows, program.screen.columns, screen=True)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EAGAIN, errno.ENOMEM):
                    # Out of descriptors, or every pseudo-terminal of the host in use: this call waits.
                    poller.close()
                    if exc.errno == errno.ENOSPC:
                        exc = OSError(errno.EAGAIN, "no pseudo-terminal is free on the host (kernel.pty.max)")
                    raise _spawn_error(ctx, program, exc) from None
                if program.screen is not None:  # a screen program has nothing else to run on
                    poller.close()
                    raise Failed(f"{ctx.tool.name} is a screen program, and no pseudo-terminal can be made on this "
                                 f"host ({exc.strerror}); nothing was run", outcome="not_started",
                                 hint="the operator must give the daemon /dev/ptmx and /dev/pts") from None
                # A host (or sandbox) with no pseudo-terminals at all: programs get none, as
                # with terminal = "none", and their own words tell what they tried.
                _no_terminals(exc)
        try:
            # The daemon's one askpass endpoint serves every call: its own user's programs
            # (whose new process makes the work folder it starts in) and another account's
            # (a folder of its run-as folder, made by the launcher as that account). Without
            # a daemon a call gets a private folder of its own, inside the work folder.
            if ctx.askpass is not None:
                helper: AskpassServer | CallAskpass = ctx.askpass.for_call(owner)
            else:
                ctx.work_dir.mkdir(parents=True, exist_ok=True)
                helper = AskpassServer(ctx.work_dir, owner)
        except OSError as exc:
            poller.close()
            if terminal is not None:
                terminal.close()
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise _spawn_error(ctx, Program(argv=(ctx.tool.name,)), exc) from None
            if exc.errno == errno.EPERM and owner is not None:
                # Not space: the right to give the program's user a folder of its own.
                raise Failed(f"rungd may not give the account the tool runs as a working folder ({exc.strerror}); "
                             "nothing was run", retry="no", outcome="not_started",
                             hint="the operator must grant rungd CAP_CHOWN beside CAP_SETUID and CAP_SETGID (the "
                             "README's drop-in for user = tools), or run the tool as rungd's own user") from None
            raise _for_call(ctx, _no_folders(exc)) from None
        return cls(helper, poller, terminal, ctx, [], [])

    def evidence_file(self, label: str) -> Callable[[], BinaryIO]:
        """What opens the evidence file ``label`` when a stream first needs it.

        Raises (when called):
            OSError: the state folder cannot hold it; the stream notes it, the call goes on.
        """
        def open_it() -> BinaryIO:
            evidence_id, path = self.ctx.evidence_path(label)
            file = open(path, "wb")
            self.evidence.append(evidence_id)
            self.files.append(file)
            return file

        return open_it

    def close(self) -> None:
        """Close the askpass server, the poller, the terminal and the evidence files; safe to
        call twice. The call's processes are killed first: closing a terminal is no stop."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self.helper.close()
        self.poller.close()
        if self.terminal is not None:
            self.terminal.close()
        for file in self.files:
            file.close()


_SAID_NO_TERMINALS: list[bool] = []


def _no_terminals(exc: OSError) -> None:
    """Say once per daemon that calls run without a terminal, and why."""
    if not _SAID_NO_TERMINALS:
        _SAID_NO_TERMINALS.append(True)
        log.warning("no pseudo-terminal can be made here (%s): programs run with no terminal, as tools with "
                    "terminal = \"none\" do; hint: give the daemon /dev/ptmx and /dev/pts (systemd's "
                    "PrivateDevices= keeps them)", exc.strerror or exc)


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


def _user_ids(user: str | None) -> tuple[int, int, list[int]] | None:
    """uid, gid and groups (initgroups' list) to switch to before exec, or None."""
    switch = _as_user(user)
    return (switch["user"], switch["group"], switch["extra_groups"]) if switch else None


async def _start(ctx: CallContext, program: Program, credentials: Mapping[str, str],
                 scratch: _Scratch) -> tuple[launch.Started, proctree.Tracker]:
    """Have the program made, born in the call's cgroup, with its tracker registered at once;
    whether its ``exec`` worked is :func:`_running`'s to hear.

    Raises:
        Failed / ToolError: it could not be started (the codes of :func:`_spawn_error`); what
            the call opened is closed, and nothing of it runs.

    Cancellation: a program whose start is cancelled is killed and reaped before it raises.
    """
    reaper = ctx.reaper
    # A program run as another user works in its own private folder: the call's work
    # folder is the daemon's alone.
    cwd = scratch.helper.workdir if program.user is not None else ctx.work_dir
    # Made by the launcher: the work folder as the daemon's user, or the run-as folder's call
    # folder as the program's account (an endpoint's; a server without a daemon made its own).
    make_cwd = not ctx.work_dir.exists() if program.user is None else isinstance(scratch.helper, CallAskpass)
    launcher = launch.for_reaper(reaper)
    try:
        for attempt in (1, 2):
            cgroup = launcher.cgroup()
            try:
                started = await launcher.spawn(
                    list(program.argv), child_env(ctx, program, credentials, scratch.helper.env),
                    str(program.cwd or cwd), limits.effective(program.limits), scratch.helper.pass_fds,
                    _user_ids(program.user), cgroup, make_cwd=program.cwd is None and make_cwd,
                    label=ctx.call_id, terminal=scratch.terminal.slave if scratch.terminal is not None else None,
                    stdio_on_terminal=program.screen is not None,
                    output_fd=program.screen.output_fd if program.screen is not None else None)
            except BaseException as exc:
                if cgroup is None:
                    raise
                # A spare cgroup removed under us (another daemon's start-up sweep): once more
                # with a new one. Any other failure: it holds nothing, unless a launcher died
                # mid-start; it goes.
                vanished = isinstance(exc, OSError) and not cgroup.path.exists()
                cgroup.kill()
                with trio.CancelScope(shield=True):
                    await cgroup.remove_when_empty()
                if attempt == 1 and vanished:
                    launcher.drop_vanished()  # a sweep takes every idle spare at once
                    continue
                raise
            break
        child = started.child
        # Registered before anything awaits: an orphan the program makes is claimed at once.
        tracker = proctree.Tracker(ctx.call_id, child.pid, cgroup=cgroup, subreaper=reaper is not None,
                                   start=child.start)
        proctree.RUNNING[ctx.call_id] = tracker
        # Its askpass questions are this call's from now on, even before the watch listens.
        scratch.helper.claim(tracker.root)
    except OSError as exc:
        scratch.close()
        raise _spawn_error(ctx, program, exc) from None
    finally:
        scratch.helper.release_secrets()  # the child holds its own copies now
    return started, tracker


async def _running(ctx: CallContext, program: Program, started: launch.Started, tracker: proctree.Tracker,
                   scratch: _Scratch) -> None:
    """Hear whether the program's ``exec`` worked, waiting for it. Awaited once the call has
    made ready what watches the program, so that the exec runs meanwhile.

    Raises:
        Failed / ToolError: it could not be started (:func:`_spawn_error`); the process made
            for it is killed and reaped, and what the call opened is closed.

    Cancellation: the process is killed and reaped, and what the call opened is closed,
    before it raises.
    """
    try:
        await started.exec_result()
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await _abandon(ctx, started.child, tracker)
        scratch.close()
        if not isinstance(exc, OSError):
            raise
        raise _spawn_error(ctx, program, exc) from None


def _forget(ctx: CallContext, pid: int) -> None:
    proctree.RUNNING.pop(ctx.call_id, None)
    if ctx.reaper is not None:
        ctx.reaper.owned.discard(pid)


async def _abandon(ctx: CallContext, child: launch.Child, tracker: proctree.Tracker) -> None:
    """Kill and reap a child whose start failed or was cancelled; remove its cgroup."""
    await proctree.kill_tree(tracker, grace_s=0, pgid=child.pid)
    with trio.move_on_after(2):
        await child.wait()
    child.close()
    child.close_pipes()
    if tracker.cgroup is not None:
        await tracker.cgroup.remove_when_empty()
    _forget(ctx, child.pid)


def _no_folders(exc: OSError) -> Failed:
    return Failed(f"rungd cannot prepare the call's folders: {exc.strerror}; nothing was run",
                  hint="retry later; the operator must free space in rungd's state folder",
                  retry="yes", next_action="retry_later", outcome="not_started")


def _spawn_error(ctx: CallContext, program: Program, exc: OSError) -> RungdError:
    """The honest error for a program that could not be started, by what the kernel said
    (:func:`_for_call`). A lost start was killed at once, but may have run its first
    instructions: a write's is marked spawned, so the boundary decides its outcome."""
    if isinstance(exc, launch.LostStart) and program.commits:
        ctx.mark_spawned()
    return _for_call(ctx, _start_failure(program, exc))


def _for_call(ctx: CallContext, error: RungdError) -> RungdError:
    """``error`` of a program that did not start, as the call must tell it: ``not_started``
    only while nothing of the call may have acted. After a write's act (its read-back
    failing to start, say) the outcome is left to the boundary, which makes it ``unknown``."""
    if ctx.may_have_acted():
        error.outcome_declared = False
    return error


def _start_failure(program: Program, exc: OSError) -> RungdError:
    """:func:`_spawn_error`'s error, as if nothing of the call had run before."""
    name = program.argv[0]
    if exc.filename == "workdir" and exc.errno not in (errno.EMFILE, errno.ENFILE):
        return _no_folders(exc)
    if isinstance(exc, launch.LostStart):
        return Failed(f"rungd lost hold of {name} as it started ({exc.strerror}); it was killed at once",
                      hint="retry later; if it persists the operator must find what holds rungd's descriptors")
    if exc.errno == errno.EAGAIN and exc.strerror != os.strerror(errno.EAGAIN):
        # rungd's own reason (a process that never ran its first line, a launcher that did not
        # answer, no pseudo-terminal free): said as it is, not as the kernel's generic EAGAIN.
        return ToolError(
            "RESOURCE_EXHAUSTED", f"rungd could not start {name}: {exc.strerror}; nothing was run",
            hint="retry later; if it persists the operator must look at what holds rungd's programs back "
            "(the host's load, a frozen cgroup, the daemon's journal)",
            outcome="not_started", retry="yes", next_action="retry_later")
    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM):
        return ToolError(
            "RESOURCE_EXHAUSTED",
            f"rungd could not start {name}: {exc.strerror} (the daemon or the host is out of "
            "descriptors, processes or memory right now); nothing was run",
            hint="retry later; if it persists the operator must raise rungd's limits or find what "
            "holds the descriptors (too many connections or calls at once)",
            outcome="not_started", retry="yes", next_action="retry_later")
    if exc.errno == errno.E2BIG:
        return ToolError(
            "ARGS_TOO_LONG",
            f"{name} was not started: its arguments and environment are longer than the kernel "
            "lets a program take (E2BIG; one argument at most 128 KiB); nothing was run",
            hint="pass a shorter input; for long data the tool's author must pass it on stdin or in a file",
            outcome="not_started", retry="no", next_action="repair")
    step = _STEPS.get(exc.filename or "exec")
    if step is not None:  # not the program itself: the folder it starts in, its cgroup, its user...
        return Failed(f"could not start {name}: {step}: {exc.strerror}",
                      hint="nothing was run; the operator must fix what the step names (the tool's cwd or "
                      "user, rungd's cgroup or state folder)", outcome="not_started")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ENOEXEC):
        return Failed(
            f"could not start {name}: {exc.strerror}",
            hint="the operator must install the program or fix the tool's argv",
            outcome="not_started")
    return Failed(f"could not start {name}: {exc.strerror}",
                  hint="nothing was run; the daemon's journal may say more", outcome="not_started")


def _with_argv_files(program: Program, secrets: Mapping[int, str], secret_file: Callable[[str, str], str]) -> Program:
    """``program`` with each declared credential marker in its argv replaced by the path of a
    sealed in-memory file holding that credential (``Program.argv_file_credentials``)."""
    argv = list(program.argv)
    for at, secret in secrets.items():
        name = program.argv_file_credentials[at]
        argv[at] = argv[at].replace(credential_file_marker(name), secret_file(f"argv-{name}", secret), 1)
    return dataclasses.replace(program, argv=tuple(argv))


def _check_trusted(ctx: CallContext, program: Program) -> None:
    """Refuse to start a program that someone other than root or rungd's user could have
    replaced since the tool was loaded (:mod:`rungd.system.trust`), before any credential is read.

    Raises:
        Failed: naming the path, its owner and mode, and the fix; this program was not run
            (the call's outcome is the boundary's when an act before it may have begun).
    """
    search = program.env.get("PATH") or os.environ.get("PATH") or DEFAULT_PATH
    try:
        _TRUSTED.program(program.argv[0], search)
        if program.fixed_paths:
            account = _owner(program.user)
            uid = os.geteuid() if account is None else account[0]
            fixed = _TRUSTED_FOR.setdefault(uid, trust.Trust(trust.daemon_owners() | {uid}))
            for path in program.fixed_paths:
                fixed.operand(path, "path in the tool's argv")
    except trust.Untrusted as exc:
        raise Failed(f"{exc}; this program was not run", hint="the operator must fix the ownership or modes "
                     "the message names (rungd check-config lists every such problem)",
                     outcome=None if ctx.may_have_acted() else "not_started") from None
    except OSError:
        pass  # missing or unreadable: the start fails as the kernel says, with _spawn_error's words


# What the launcher was doing when a start failed, when it was not the exec itself.
_STEPS = {"chdir": "entering its working folder", "cgroup": "joining the call's cgroup",
          "user": "switching to the tool's user", "capabilities": "dropping the daemon's capabilities",
          "limits": "applying the tool's limits", "start": "making its process"}


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
        Failed: the program could not be started (not found, not executable), or it is a
            read (a read tool's, or a write's read before or after its act) that declares a
            confirmation: answering one lets a program act, so nothing starts.

    Cancellation: on cancellation (the call's deadline, or daemon shutdown) the whole tree
    is killed inside a shielded scope before the cancellation propagates; ``ctx.committed``
    tells the caller whether the effect may have begun.
    """
    if program.confirmations and (ctx.tool.side_effect == "read" or not program.commits):
        # A read runs ungated, with no request_id and no read-back: an answer that lets its
        # program act would be a write nothing stands behind.
        what = f"{ctx.tool.name} is a read" if ctx.tool.side_effect == "read" else "a read before or after the act"
        # This read ran nothing; the call did, if this is a read-back after its act: then the
        # boundary decides the outcome (unknown), as for any failure after the commit point.
        raise Failed(f"{what}, but its program declares a confirmation to answer; this program was not run",
                     hint="this is a bug in the plugin: a read answers no confirmation; a tool whose program "
                     "acts on an answer is a write (side_effect other than read) with a read-back",
                     outcome=None if ctx.may_have_acted() else "not_started")
    if ctx.stand_in is not None:  # rungctl check, eval's dry run: the program is never the real one
        program = ctx.stand_in.program(ctx, program)
    _check_trusted(ctx, program)
    # Every credential the program gets from the start is looked up before anything starts:
    # a program run without one may take its absence as an answer.
    credentials = {var: credential(ctx, name) for var, name in program.env_credentials.items()}
    secret_files = {var: credential(ctx, name) for var, name in program.file_credentials.items()}
    argv_files = {at: credential(ctx, name) for at, name in program.argv_file_credentials.items()}
    # A screen's secret fields too, and its keys: a step that cannot be typed starts nothing.
    fields = {step.credential: credential(ctx, step.credential)
              for step in (program.screen.steps if program.screen is not None else ()) if step.credential}
    if program.screen is not None:
        _check_screen(program.screen)
    # And those its declared questions are answered with (read again when asked): a program
    # started without one would be stopped at its question, after it may have acted.
    for name in dict.fromkeys(prompt.credential for prompt in (*program.credential_prompts, *program.askpass)):
        credential(ctx, name)
    # What the call must not show (its sensitive inputs, credentials it already obtained)
    # and this program's own credentials: redacted from its output and evidence.
    secrets = [*ctx.secrets, *credentials.values(), *secret_files.values(), *argv_files.values(),
               *fields.values()]
    scratch = _Scratch.open(ctx, program, _owner(program.user))
    try:
        for var, secret in secret_files.items():
            scratch.helper.env[var] = scratch.helper.secret_file(var, secret)
        if argv_files:
            program = _with_argv_files(program, argv_files, scratch.helper.secret_file)
        started, tracker = await _start(ctx, program, credentials, scratch)
    except BaseException:
        # Cancelled while starting (the deadline, a stop) or a secret file failed: the
        # askpass socket and folder go now, not when the garbage collector finds them.
        scratch.close()
        raise
    proc = started.child
    if program.screen is not None:
        await _running(ctx, program, started, tracker, scratch)
        _spawned(ctx, program)
        return await _drive_screen(ctx, program, proc, tracker, scratch, secrets, fields)
    # Where the daemon may make cgroups (root, or systemd's Delegate=yes), the program was born
    # in the call's own, so the kill reaches every process of it however it detached.
    stdout = Stream("stdout", program.keep_bytes, scratch.evidence_file("stdout"), program.evidence_bytes,
                    Redactor(secrets))
    stderr = Stream("stderr", program.keep_bytes, scratch.evidence_file("stderr"), program.evidence_bytes,
                    Redactor(secrets))
    # What the program writes on its terminal: its questions, and whatever else it says there.
    terminal = None
    if scratch.terminal is not None:
        terminal = scratch.terminal, Stream("terminal", program.keep_bytes, scratch.evidence_file("terminal"),
                                            program.evidence_bytes, Redactor(secrets))
    try:
        outputs = Outputs(scratch.poller, proc, (stdout, stderr), terminal)
    except OSError as exc:  # the kernel would not watch one more descriptor (ENOMEM, ENOSPC)
        started.close()
        with trio.CancelScope(shield=True):
            await _abandon(ctx, proc, tracker)
        scratch.close()
        # Its exec may have worked, and it may have run its first instructions: a lost start.
        raise _spawn_error(ctx, program, launch.LostStart(exc.errno, exc.strerror)) from None
    # A write's program may act from its first instruction: its exec is heard of before it is
    # watched. A read's is heard of as the watch wakes (a failed exec ends at once, with its
    # errno in the pipe): one wait on the loop fewer for the common call.
    acts = _acts(ctx, program)
    watch = Watch(ctx, program, proc, tracker, outputs, (stdout, stderr), Redactor(secrets), terminal,
                  started=None if acts else started)
    if acts:
        await _running(ctx, program, started, tracker, scratch)
        _spawned(ctx, program)
    not_run: OSError | None = None
    try:
        question = await _supervise(watch, scratch.helper)
    finally:
        if not acts:
            verdict = watch.start_verdict()
            if verdict is True:
                _spawned(ctx, program)
            elif isinstance(verdict, OSError):
                not_run = verdict
        started.close()
        await _end(ctx, program, proc, tracker, watch.every_stream, scratch)
    if not_run is not None:
        raise _spawn_error(ctx, program, not_run)
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
        stdout_cut=stdout.truncated,
        stderr_cut=stderr.truncated,
        evidence_cut=stdout.evidence_cut or stderr.evidence_cut,
        stdout_bytes=stdout.total,
        stderr_bytes=stderr.total,
        answered=watch.answered,
        evidence=scratch.evidence,
        terminal=terminal[1].text() if terminal is not None else "",
    )
    check_terminal(completed, program, watch.tty)
    check_limits(completed, limits.effective(program.limits))
    return completed


def _acts(ctx: CallContext, program: Program) -> bool:
    """Whether the program may act: a write's, unless it is a read the write makes. (A read's
    start is noted when its end is heard: what it says then depends on no mark before.)"""
    return program.commits and ctx.tool.side_effect != "read"


def _spawned(ctx: CallContext, program: Program) -> None:
    """Note that a write's program runs: it may act from its first instruction, whatever the
    declared commit point."""
    if program.commits:
        ctx.mark_spawned()
        if ctx.tool.timing.commit_point == "spawn":
            ctx.mark_committed()


def _check_screen(screen: Screen) -> None:
    """Raises Failed (nothing was run) for a screen no call can run (Screen.check)."""
    try:
        screen.check()
    except ValueError as exc:
        raise Failed(f"{exc}; nothing was run", outcome="not_started",
                     hint="the tool's author must fix the screen's steps (rungctl lint checks a tool file's)") from None


async def _drive_screen(ctx: CallContext, program: Program, proc: launch.Child, tracker: proctree.Tracker,
                        scratch: _Scratch, secrets: list[str], fields: dict[str, str]) -> Completed:
    """Drive a screen program through its steps (:mod:`rungd.runner.screen`), then end it as
    every call ends: the tree killed and reaped, everything closed."""
    assert program.screen is not None and scratch.terminal is not None
    terminal = scratch.terminal
    cast = None
    try:
        evidence_id, path = ctx.evidence_path("cast")
        cast = Cast(path, program.screen, ctx.tool.name, Redactor(secrets))
        scratch.evidence.append(evidence_id)
    except OSError as exc:  # the state folder cannot hold it: the call goes on without
        log.warning("%s: the session's cast cannot be kept: %s", ctx.call_id, exc.strerror or exc)
    seen = (terminal.path, terminal.device)
    last_snapshot = [0.0]

    def waiting() -> tuple[bool, bool]:
        """Whether a process of the call reads the terminal, and whether one is hidden from rungd."""
        cgroup = tracker.cgroup
        if cgroup is None and time.monotonic() - last_snapshot[0] >= 0.2:
            tracker.snapshot()  # the kill finds an orphan only if a snapshot saw it
            last_snapshot[0] = time.monotonic()
        members = cgroup.pids() if cgroup is not None else [pid for pid, _ in tracker.members()]
        # The first few: a look costs the call's processes, never more (a program that forks
        # a thousand must not stall the loop; the one reading its screen is among the first).
        pids = [proc.pid, *(pid for pid in members if pid != proc.pid)][:_LOOK_AT]
        reading = procwatch.waiting_for_input(pids, None, seen) is not None
        return reading, not reading and any(procwatch.hidden(pid) for pid in pids)

    session = Session(ctx, program.screen, terminal, Redactor(secrets), cast, fields, waiting,
                      lambda: proc.returncode)
    # What it writes on its answer descriptor, kept as a stdout is.
    output = Stream("output", program.keep_bytes, scratch.evidence_file("output"), program.evidence_bytes,
                    Redactor(secrets))
    try:
        session.outputs = Outputs(scratch.poller, proc, (output,) if program.screen.output_fd else (),
                                  (terminal, session))
    except OSError as exc:  # the kernel would not watch one more descriptor (ENOMEM, ENOSPC)
        with trio.CancelScope(shield=True):
            await _abandon(ctx, proc, tracker)
        session.close()
        scratch.close()
        raise _spawn_error(ctx, program, exc) from None
    try:
        drawn = await session.drive()
    finally:
        ctx.answered.extend(session.answered)
        try:
            _keep_screen(ctx, scratch, session)
        finally:  # whatever the screen's state, the tree dies and everything closes
            await _end(ctx, program, proc, tracker, (session, output), scratch)
    completed = Completed(
        exit_status=proc.returncode if proc.returncode is not None else -signal.SIGKILL,
        stdout=output.text(), stdout_cut=output.truncated, stdout_bytes=output.total, stderr="", stderr_bytes=0,
        answered=session.answered, evidence=scratch.evidence, screen=drawn.screen, fields=drawn.fields,
        stopped=drawn.stopped, shots=drawn.shots, evidence_cut=(cast is not None and cast.lost > 0)
        or output.evidence_cut)
    check_limits(completed, limits.effective(program.limits))
    return completed


# How many of a screen call's processes a look at who reads its terminal reads /proc for.
_LOOK_AT = 16


def _keep_screen(ctx: CallContext, scratch: _Scratch, session: Session) -> None:
    """Keep the screen the session ended on as a text evidence file (redacted)."""
    try:
        evidence_id, path = ctx.evidence_path("screen")
        path.write_text(session.text(limit=1 << 20) + "\n")
    except OSError:
        return  # a full disk: the cast, if kept, still holds it
    scratch.evidence.append(evidence_id)


async def _supervise(watch: Watch, helper: AskpassServer | CallAskpass) -> RungdError | None:
    """Watch the program (its output, its exit, its questions) until it exits or asks; feed
    its stdin and serve its askpass questions beside, where it needs that.

    One task does most calls' whole watch: a task more is started only for declared stdin
    data and for a private askpass endpoint.

    Returns:
        The error its question calls for, or None when it exited by itself.

    Cancellation: every task stops at once; the caller kills the tree.
    """
    beside: list[Callable[[], Awaitable[None]]] = []
    if (serve := helper.listen(watch.tracker.root, watch.askpass_answer)) is not None:
        beside.append(serve)
    # Declared stdin is fed beside the watch: a program that asks before it reads all of it
    # must still be noticed.
    if watch.program.stdin != "none" or watch.program.stdin_eof:
        beside.append(watch.feed_stdin)
    try:
        if not beside:
            return await _watch(watch, helper)
        async with trio.open_nursery() as nursery:
            for task in beside:
                nursery.start_soon(task)
            question = await _watch(watch, helper)
            nursery.cancel_scope.cancel()
        return question
    finally:
        helper.quiet()  # also when cancelled (the deadline): quiet before the kill's grace period


async def _watch(watch: Watch, helper: AskpassServer | CallAskpass) -> RungdError | None:
    try:
        await watch.until_exit()
    except RungdError as exc:
        return exc
    finally:
        # Whatever ended the watch (the exit, a question nobody answers), nothing is answered
        # any more, at once: not while output is drained, nor in the kill's grace period,
        # when a program that traps SIGTERM may ask again.
        helper.quiet()
    # The program is gone; a descendant may still hold the pipes open. Take output a moment
    # longer, then stop waiting: the sweep kills whoever holds them.
    await watch.outputs.drain(0.2)
    return None


async def _end(ctx: CallContext, program: Program, proc: launch.Child, tracker: proctree.Tracker,
               streams: Iterable[Stream | Session], scratch: _Scratch) -> None:
    """Kill what is left of the call, reap it, and close everything the call opened.

    Cancellation: none; each wait in it is shielded and bounded (a call that ended by itself
    and left nothing waits on nothing here).
    """
    cgroup, reaper = tracker.cgroup, ctx.reaper
    # A program that exited and left its cgroup empty left nothing: nothing forks its way out
    # of a cgroup (one that moved itself out is an orphan of the daemon, which the reaper
    # kills: on its next pass, or below when the call is not settled). Otherwise the kill
    # looks only at the call's own processes with a cgroup or a subreaper; without either it
    # scans the host, and is skipped when provably idle.
    events = None  # read once: the cgroup kept for the next call is judged by them too
    if cgroup is not None and proc.returncode is not None:
        with contextlib.suppress(OSError):  # unreadable now: as if something were left
            events = cgroup.events()
    settled = cgroup is not None and events is not None and not cgroup.populated(events)
    if not settled and (cgroup is not None or reaper is not None or not _nothing_left(proc, cgroup, reaper)):
        with trio.CancelScope(shield=True):
            await proctree.kill_tree(tracker, grace_s=program.grace_s, pgid=proc.pid)
    if proc.returncode is None:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 2):
            await proc.wait()
    proc.close()
    if cgroup is not None:
        if reaper is not None:
            # An empty one is the next call's; removing one takes the kernel milliseconds,
            # so a populated one (a process still dying) is removed off the call's path.
            launch.for_reaper(reaper).give_back(cgroup, events if settled else None)
        else:
            with trio.CancelScope(shield=True):
                await cgroup.remove_when_empty()
    proctree.RUNNING.pop(ctx.call_id, None)
    if reaper:
        reaper.owned.discard(proc.pid)
        if not settled:
            # What left the call's cgroup, session and tag is now a stray: the reaper kills
            # it. (A settled call left nothing; the reaper's own passes reap its zombies.)
            reaper.reap()
            reaper.poke()
    for stream in streams:
        stream.close()
    # All three pipes, now: left to the garbage collector they outlive the call (the streams,
    # the watch and the child hold each other).
    proc.close_pipes()
    scratch.close()
    # The reaper, poked above, makes the next call's cgroup once this call is answered.


def _nothing_left(proc: launch.Child, cgroup: proctree.CallCgroup | None, reaper: Any) -> bool:
    """Whether a call that ended by itself provably left no process behind, so the kill
    (which scans every process on the host for the call's tag) can be skipped.

    True only when the program has exited, its cgroup is empty, and the daemon, a child
    subreaper, has no child it did not spawn: an orphan of this call would be one of those.
    """
    if proc.returncode is None or cgroup is None or reaper is None or cgroup.pids():
        return False
    return not (proctree.own_children() - reaper.owned)
