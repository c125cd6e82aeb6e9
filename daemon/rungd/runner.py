"""Rung 2: run one legacy command-line program so it cannot hang, lie, or leave debris.

    program = Program(argv=("inventory", "show", item), confirmations=(...,))
    done = await run(ctx, program)          # Completed: exit status, capped text, evidence
    check_exit(done, exit_table)            # map the exit status to the tool's codes

What ``run`` guarantees:

* No shell and no terminal: argv is passed as is; the child leads a new session, so
  opening ``/dev/tty`` fails with ENXIO instead of waiting for a person.
* stdin is a pipe the runner owns and never closes on its own (end-of-file is an answer
  for many programs): it stays open and silent, carries declared data, or is closed right
  away only when the tool declares ``stdin="eof"``.
* A question is recognised by evidence: when output goes quiet, the runner asks the kernel
  whether a process of the call is blocked reading its stdin (``rungd.procwatch``). A
  declared confirmation is answered only when the call passed its gate; a credential
  question is answered only with a credential the tool declared; anything else kills the
  tree and raises PromptUnexpected or AuthRequired, quoting what the program last printed.
* Output is drained as it comes; head and tail within the cap are kept, and the full
  redacted streams go to evidence files (themselves capped, and saying so).
* On the deadline or any cancellation the whole tree dies, descendants that left the
  process group included (``rungd.proctree``). Every wait after the kill is bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Literal

import trio

from rungd import askpass, procwatch, proctree
from rungd.contract import CallContext, ErrorRule
from rungd.errors import AuthRequired, Failed, PromptUnexpected, RungdError, ToolError
from rungd.redact import Redactor

# Environment every child gets. Nothing is inherited from the daemon except the names in
# PASS_THROUGH: a daemon's environment is not a program's business.
QUIET_ENV: Mapping[str, str] = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "cat",
    "SYSTEMD_COLORS": "0",
    "LESS": "-FRX",
    # An editor that fails at once: a program that wants a person to edit text gets an
    # error instead of a hang.
    "EDITOR": "false",
    "VISUAL": "false",
    "GIT_EDITOR": "false",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
}
PASS_THROUGH = ("PATH", "HOME", "USER", "LOGNAME", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

# Failures of programs that wanted a terminal for a password: the call needs a credential.
TERMINAL_REQUIRED = re.compile(
    r"terminal is required|no tty present|could not read (username|password)|terminal prompts disabled",
    re.IGNORECASE,
)
# A quiet program blocked on stdin after printing this is asking for a secret.
CREDENTIAL_QUESTION = re.compile(r"(password|passphrase|passcode|token|pin|secret|username)\b[^\n]*[:?]\s*$",
                                 re.IGNORECASE)

POLL_S = 0.05
SNAPSHOT_S = 0.2


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """A question the tool knows, and the answer the runner gives once the gate passed."""

    pattern: re.Pattern[str]
    answer: str
    times: int = 1


@dataclasses.dataclass(frozen=True)
class CredentialPrompt:
    """A credential question the tool declares, answered with the named credential."""

    pattern: re.Pattern[str]
    credential: str


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits for the child (setrlimit), applied before exec. None = unlimited."""

    cpu_s: int | None = None
    address_space_bytes: int | None = None
    open_files: int | None = None
    processes: int | None = None
    file_size_bytes: int | None = None
    no_new_privs: bool = True


@dataclasses.dataclass(frozen=True)
class Program:
    """How to run the program for one call. ``argv`` is complete: no shell will see it."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    env_credentials: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # ENV_VAR -> credential name: the value goes into a 0600 file only this call's folder
    # holds, and ENV_VAR names that file (PGPASSFILE, a --password-file argument...).
    file_credentials: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stdin: Literal["none", "eof"] | bytes = "none"
    confirmations: tuple[Confirmation, ...] = ()
    credential_prompts: tuple[CredentialPrompt, ...] = ()
    askpass: tuple[CredentialPrompt, ...] = ()
    limits: Limits | None = None
    cwd: Path | None = None
    keep_bytes: int = 64 * 1024
    evidence_bytes: int = 16 * 1024 * 1024
    quiet_s: float = 0.25
    grace_s: float = 1.0
    # False for a read a write makes before or after its act: starting it is no commit point.
    commits: bool = True


@dataclasses.dataclass
class Completed:
    """What a finished program left behind, already redacted."""

    exit_status: int
    stdout: str
    stderr: str
    truncated: bool
    stdout_bytes: int
    stderr_bytes: int
    answered: list[str]
    evidence: list[str]

    def stderr_tail(self, chars: int = 400) -> str:
        return self.stderr[-chars:].strip()


class _Stream:
    """One output stream: kept head and tail, evidence file, and when it last spoke."""

    def __init__(self, name: str, keep: int, evidence: BinaryIO, evidence_cap: int, redactor: Redactor) -> None:
        self.name = name
        self._keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.last_output = time.monotonic()
        self.recent = bytearray()  # the last bytes printed, to quote a question
        self.drained = trio.Event()  # set at end-of-file
        self.evidence_error: str | None = None
        self._evidence = evidence
        self._evidence_cap = evidence_cap
        self._evidence_written = 0
        self.clean_total = 0  # bytes after redaction: what head, tail and evidence hold
        self.redactor = redactor  # this stream's own: it holds back bytes between chunks

    def take(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.last_output = time.monotonic()
        self.recent += chunk  # raw, to quote a prompt at once; redacted when read
        del self.recent[: max(0, len(self.recent) - 512)]
        # Everything kept is redacted first: a secret cut at the head/tail boundary must not
        # leave its first half behind.
        self._keep_clean(self.redactor.feed(chunk))

    def _keep_clean(self, clean: bytes) -> None:
        self.clean_total += len(clean)
        half = self._keep // 2
        room = max(0, half - len(self.head))
        self.head += clean[:room]
        if clean[room:]:
            self.tail += clean[room:]
            del self.tail[: max(0, len(self.tail) - half)]
        self._write_evidence(clean)

    def _write_evidence(self, data: bytes) -> None:
        # Plain blocking writes: they land in the page cache and cost microseconds; the cap
        # bounds the total, so a flood cannot fill the disk. Evidence is for operators: a
        # full disk loses the rest of it (and says so), never the call.
        room = self._evidence_cap - self._evidence_written
        if room > 0 and data and self.evidence_error is None:
            try:
                self._evidence.write(data[:room])
            except OSError as exc:
                self.evidence_error = exc.strerror or str(exc)
                return
            self._evidence_written += min(room, len(data))

    def close(self) -> None:
        self._keep_clean(self.redactor.flush())
        with contextlib.suppress(OSError):
            if self.clean_total > self._evidence_written:
                why = f": {self.evidence_error}" if self.evidence_error else ""
                note = f"\n[rungd: {self.clean_total - self._evidence_written} more bytes were not kept{why}]\n"
                self._evidence.write(note.encode())
        with contextlib.suppress(OSError):
            self._evidence.close()

    @property
    def truncated(self) -> bool:
        return self.clean_total > len(self.head) + len(self.tail)

    def text(self) -> str:
        kept = bytes(self.head)
        if self.truncated:
            cut = self.clean_total - len(self.head) - len(self.tail)
            kept += f"\n[... {cut} bytes cut; full output in evidence ...]\n".encode()
        kept += bytes(self.tail)
        return self.redactor.text(kept.decode("utf-8", "replace"))

    @property
    def mid_line(self) -> bool:
        return bool(self.recent) and not self.recent.endswith(b"\n")

    def question(self) -> str:
        """The last line the program printed, as a person would have read it."""
        text = self.redactor.text(bytes(self.recent).decode("utf-8", "replace"))
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-1].strip()[-200:] if lines else ""


def child_env(
    ctx: CallContext, program: Program, credentials: Mapping[str, str], askpass: Mapping[str, str] = {}
) -> dict[str, str]:
    """The child's whole environment: the quiet defaults, a few names passed through, the
    askpass helper, the tool's own values, its credentials, and the call tag."""
    env = {name: os.environ[name] for name in PASS_THROUGH if name in os.environ}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(QUIET_ENV)
    env.update(askpass)
    env.update(program.env)
    env.update(credentials)
    env[proctree.TAG_ENV] = ctx.call_id
    return env


def _preexec(limits: Limits) -> Callable[[], None]:
    def apply() -> None:
        pairs = (
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_AS, limits.address_space_bytes),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_NPROC, limits.processes),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        )
        for which, value in pairs:
            if value is not None:
                resource.setrlimit(which, (value, value))
        if limits.no_new_privs:
            ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS

    return apply


async def _spawn(
    ctx: CallContext, program: Program, credentials: Mapping[str, str], askpass: Mapping[str, str]
) -> trio.Process:
    return await trio.lowlevel.open_process(
        list(program.argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=child_env(ctx, program, credentials, askpass),
        cwd=str(program.cwd or ctx.work_dir),
        preexec_fn=_preexec(program.limits) if program.limits else None,
    )


async def run(ctx: CallContext, program: Program) -> Completed:
    """Run ``program`` for the call ``ctx`` until it exits, asks, or the call is cancelled.

    Returns:
        Completed, with the exit status (negative for a signal) and redacted output.

    Raises:
        PromptUnexpected: the program waited on stdin for an answer nobody declared (or the
            call did not pass its gate for a declared confirmation). The tree is dead.
        AuthRequired: it asked for a credential the daemon does not hold for this tool.
        Failed: the program could not be started (not found, not executable).

    Cancellation: on cancellation (the call's deadline, or daemon shutdown) the whole tree
    is killed inside a shielded scope before the cancellation propagates; ``ctx.committed``
    tells the caller whether the effect may have begun.
    """
    credentials = {var: _credential(ctx, name) for var, name in program.env_credentials.items()}
    secret_files = {var: _credential(ctx, name) for var, name in program.file_credentials.items()}
    redactor = Redactor([*credentials.values(), *secret_files.values()])
    out_id, out_path = ctx.evidence_path("stdout")
    err_id, err_path = ctx.evidence_path("stderr")
    opened: list[Any] = []
    try:
        ctx.work_dir.mkdir(parents=True, exist_ok=True)
        helper = _Askpass(ctx.work_dir)
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
    reaper = ctx.reaper
    for var, secret in secret_files.items():
        helper.env[var] = str(helper.secret_file(var, secret))
    try:
        with reaper.spawning() if reaper else contextlib.nullcontext():
            proc = await _spawn(ctx, program, credentials, helper.env)
            if reaper:
                reaper.owned.add(proc.pid)
    except OSError as exc:
        helper.close()
        out_file.close()
        err_file.close()
        raise Failed(
            f"could not start {program.argv[0]}: {exc.strerror}",
            hint="the operator must install the program or fix the tool's argv",
        ) from None
    if ctx.tool.timing.commit_point == "spawn" and program.commits:
        ctx.mark_committed()
    # Where the daemon may make cgroups (root, or systemd's Delegate=yes), the call gets its
    # own, so the kill reaches every process of it, however it detached (cgroup.kill).
    cgroup = proctree.CallCgroup.create(ctx.call_id)
    if cgroup is not None:
        cgroup.add(proc.pid)
    tracker = proctree.Tracker(ctx.call_id, proc.pid, cgroup=cgroup)
    secrets = [*credentials.values(), *secret_files.values()]
    stdout = _Stream("stdout", program.keep_bytes, out_file, program.evidence_bytes, Redactor(secrets))
    stderr = _Stream("stderr", program.keep_bytes, err_file, program.evidence_bytes, Redactor(secrets))
    watch = _Watch(ctx, program, proc, tracker, (stdout, stderr), redactor)
    question: RungdError | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, proc.stdout, stdout)
            nursery.start_soon(_drain, proc.stderr, stderr)
            nursery.start_soon(helper.serve, watch)
            # Declared stdin is fed beside the watch: a program that asks before it reads
            # all of it must still be noticed.
            nursery.start_soon(watch.feed_stdin)
            try:
                await watch.until_exit()
            except RungdError as exc:
                # Raised outside the nursery below, so callers see the error itself and
                # not an exception group.
                question = exc
            else:
                # The program is gone; a descendant may still hold the pipes open. Give
                # the readers a moment to reach end-of-file, then stop waiting: the sweep
                # below kills whoever holds them.
                with trio.move_on_after(0.2):
                    for stream in (stdout, stderr):
                        await stream.drained.wait()
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if not _nothing_left(proc, cgroup, reaper):
                await proctree.kill_tree(tracker, grace_s=program.grace_s, pgid=proc.pid)
            if cgroup is not None:
                cgroup.remove()
            with trio.move_on_after(2):
                await proc.wait()
            if reaper:
                reaper.owned.discard(proc.pid)
                reaper.poke()  # the kill may have left adopted orphans to reap
            for stream in (stdout, stderr):
                stream.close()
            if proc.stdin is not None:
                await proc.stdin.aclose()
            helper.close()
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
        evidence=[out_id, err_id],
    )
    last_words = [line for line in completed.stderr.splitlines() if line.strip()][-3:]
    if completed.exit_status != 0 and TERMINAL_REQUIRED.search("\n".join(last_words)):
        raise AuthRequired(
            f"{program.argv[0]} wanted a terminal to ask for a credential",
            hint=f"it said: {completed.stderr_tail(200)!r}; the operator must provide the credential "
            "to rungd for this tool",
            fields={"question": completed.stderr_tail(200)},
        )
    return completed


def _nothing_left(proc: trio.Process, cgroup: proctree.CallCgroup | None, reaper: Any) -> bool:
    """Whether a call that ended by itself provably left no process behind, so the kill
    (which scans every process on the host for the call's tag) can be skipped.

    True only when the program has exited, its cgroup is empty, and the daemon, a child
    subreaper, has no child it did not spawn: an orphan of this call would be one of those.
    """
    if proc.returncode is None or cgroup is None or reaper is None or cgroup.pids():
        return False
    return not (proctree.own_children() - reaper.owned)


async def _drain(stream: trio.abc.ReceiveStream | None, sink: _Stream) -> None:
    try:
        if stream is not None:
            while chunk := await stream.receive_some(1 << 16):
                sink.take(chunk)
    finally:
        sink.drained.set()


def _credential(ctx: CallContext, name: str) -> str:
    value = ctx.credentials(name)
    if value is None:
        raise AuthRequired(
            f"{ctx.tool.name} needs the credential {name!r}, which rungd does not hold",
            hint=f"the operator must add {name!r} to rungd's credential store; nothing was run",
        )
    return value


class _Askpass:
    """The call's private folder: the askpass socket, the script GIT_ASKPASS, SSH_ASKPASS and
    SUDO_ASKPASS point at, and credential files. Removed when the call ends."""

    def __init__(self, work_dir: Path) -> None:
        # Inside the call's work folder, which the daemon removes (and recovery sweeps
        # after a crash), so credential files never outlive it; in /tmp only when that
        # path is too long for a Unix socket (107 bytes).
        if len(os.fsencode(work_dir)) < 80:
            self.folder = Path(tempfile.mkdtemp(prefix=".rungd-", dir=work_dir))  # 0700, unique per run
        else:
            self.folder = Path(tempfile.mkdtemp(prefix="rungd-askpass-"))
        self.socket_path = self.folder / "s"
        self.script = self.folder / "askpass"
        self.script.write_text(f"#!{sys.executable}\nimport sys\nfrom rungd.askpass import main\nsys.exit(main())\n")
        self.script.chmod(0o700)
        self._sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock._sock.bind(str(self.socket_path))  # local path: binding does not block
        self._sock.listen(8)
        self.env = {
            "GIT_ASKPASS": str(self.script),
            "SSH_ASKPASS": str(self.script),
            "SSH_ASKPASS_REQUIRE": "force",
            "SUDO_ASKPASS": str(self.script),
            askpass.SOCKET_ENV: str(self.socket_path),
        }

    def secret_file(self, label: str, secret: str) -> Path:
        """Write a credential into a 0600 file in this call's private folder (removed at the end)."""
        path = self.folder / f"secret-{label}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secret)
        return path

    async def serve(self, watch: _Watch) -> None:
        """Answer askpass questions until the call ends.

        Cancellation: stops at once; a helper left waiting gets no answer and fails.
        """
        while True:
            conn, _ = await self._sock.accept()
            with conn:
                question = b""
                while len(question) < askpass.MAX_QUESTION and (chunk := await conn.recv(4096)):
                    question += chunk
                answer = watch.askpass_answer(question.decode("utf-8", "replace"))
                reply = b"NO\n" if answer is None else b"OK\n" + answer.encode()
                with contextlib.suppress(OSError):  # the helper may have died meanwhile
                    while reply:
                        reply = reply[await conn.send(reply):]

    def close(self) -> None:
        self._sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class _Watch:
    """Watches a running program: feeds stdin, notices questions, answers or stops it."""

    def __init__(self, ctx: CallContext, program: Program, proc: trio.Process, tracker: proctree.Tracker,
                 streams: tuple[_Stream, _Stream], redactor: Redactor) -> None:
        self.ctx = ctx
        self.program = program
        self.proc = proc
        self.tracker = tracker
        self.streams = streams
        self.redactor = redactor
        self.answered: list[str] = []
        self._left = {id(c): c.times for c in program.confirmations}
        self._stdin_ino = procwatch.pipe_inode(proc.stdin.fileno())  # type: ignore[union-attr]
        self._checked_at = 0.0
        self.refused: AuthRequired | None = None

    async def feed_stdin(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            if isinstance(self.program.stdin, bytes):
                await stdin.send_all(self.program.stdin)
        except trio.BrokenResourceError:
            return  # it exited without reading: its exit status will tell
        if self.program.stdin == "eof":
            await stdin.aclose()

    def _protect(self, secret: str) -> None:
        """Redact a credential given mid-call from everything kept from now on."""
        self.redactor.add(secret)
        for stream in self.streams:
            stream.redactor.add(secret)

    def askpass_answer(self, question: str) -> str | None:
        """The credential to give an askpass question, or None (and the call will stop)."""
        question = self.redactor.text(question).strip()
        for prompt in self.program.askpass:
            if prompt.pattern.search(question):
                secret = self.ctx.credentials(prompt.credential)
                if secret is not None:
                    self._protect(secret)
                    self.answered.append(f"askpass {prompt.credential}")
                    return secret
        self.refused = AuthRequired(
            f"the program asked for a credential through askpass: {question!r}",
            hint="rungd holds no credential declared for this question; the operator must add one to the "
            "tool's askpass answers and the credential store",
            fields={"question": question},
        )
        return None

    async def until_exit(self) -> None:
        last_snapshot = 0.0
        while True:
            # Wake the moment the program exits, and at least every POLL_S to look at it.
            with trio.move_on_after(POLL_S):
                await self.proc.wait()
            if self.proc.returncode is not None:
                return
            if self.refused is not None:
                raise self.refused
            now = time.monotonic()
            if now - last_snapshot >= SNAPSHOT_S:
                self.tracker.snapshot()
                last_snapshot = now
            quiet_since = max(s.last_output for s in self.streams)
            if now - quiet_since >= self.program.quiet_s and quiet_since > self._checked_at:
                await self._check_for_question(quiet_since)

    async def _check_for_question(self, quiet_since: float) -> None:
        if self.proc.stdin is None or self.program.stdin == "eof":
            return
        pids = [self.proc.pid, *(pid for pid, _ in self.tracker.members())]
        if procwatch.waiting_for_input(pids, self._stdin_ino) is None:
            return  # busy, sleeping or waiting on something else: not our business
        self._checked_at = quiet_since
        question = self._question()
        for prompt in self.program.credential_prompts:
            if prompt.pattern.search(question):
                secret = _credential(self.ctx, prompt.credential)
                self._protect(secret)
                await self._answer(secret, label=f"credential {prompt.credential}")
                return
        for confirmation in self.program.confirmations:
            # Only a call that passed its gate runs at all (a held call starts nothing), so a
            # confirmation reached here is one the gate allowed.
            if confirmation.pattern.search(question) and self._left[id(confirmation)] > 0:
                self._left[id(confirmation)] -= 1
                await self._answer(confirmation.answer, label=f"confirmation {confirmation.pattern.pattern}")
                if self.ctx.tool.timing.commit_point == "confirmation":
                    self.ctx.mark_committed()
                return
        if CREDENTIAL_QUESTION.search(question):
            raise AuthRequired(
                f"the program asked for a credential: {question!r}",
                hint="rungd holds no credential declared for this question; the operator must add one",
                fields={"question": question},
            )
        shown = question or "(nothing printed: it is reading stdin silently, or its prompt is still buffered)"
        raise PromptUnexpected(
            f"the program is waiting for an answer nobody declared: {shown!r}",
            hint="nothing answered it and the program was stopped; the tool's author must declare "
            "this question or pass its answer as an argument",
            fields={"question": question},
        )

    def _question(self) -> str:
        # A prompt rarely ends its line: prefer the stream that stopped mid-line. The two
        # streams are read by separate tasks, so their timestamps only break ties.
        ordered = sorted(self.streams, key=lambda s: (s.mid_line, s.last_output), reverse=True)
        return next((q for s in ordered if (q := s.question())), "")

    async def _answer(self, answer: str, *, label: str) -> None:
        assert self.proc.stdin is not None
        try:
            await self.proc.stdin.send_all(answer.encode() + b"\n")
        except trio.BrokenResourceError:
            return  # it exited between asking and our answer: its exit status will tell
        self.answered.append(label)
        for stream in self.streams:
            stream.last_output = time.monotonic()  # the reply resets the quiet clock


def check_exit(done: Completed, table: Mapping[int, ErrorRule], *, ok: tuple[int, ...] = (0,)) -> None:
    """Map a non-zero exit status through the tool's table.

    Raises:
        ToolError: the status is in the table; its rule gives code, retry and hint.
        Failed: the status is in no table; the hint is the redacted stderr tail.
    """
    if done.exit_status in ok:
        return
    rule = table.get(done.exit_status)
    detail = done.stderr_tail(300) or done.stdout[-300:].strip()
    if rule is not None:
        raise ToolError(rule.code, rule.meaning or f"the program exited with status {done.exit_status}",
                        hint=f"{rule.hint} (it said: {detail!r})" if detail else rule.hint,
                        outcome="done", retry=rule.retry, next_action=rule.next_action)
    status = f"signal {-done.exit_status}" if done.exit_status < 0 else f"status {done.exit_status}"
    raise Failed(f"the program exited with {status}, which the tool does not name",
                 hint=detail or "it printed nothing on stderr")

