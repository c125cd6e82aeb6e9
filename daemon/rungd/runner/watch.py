"""Watching a running program: feeding its stdin, noticing that it asks, and answering only
what the tool declared. Everything else stops the call with an error quoting the question."""

from __future__ import annotations

import functools
import os
import re
import time

import trio

from rungd.runner import procwatch
from rungd.system import proctree
from rungd.core.contract import CallContext
from rungd.core.errors import AuthRequired, PromptUnexpected, RungdError
from rungd.redact import Redactor
from rungd.runner.environment import stored
from rungd.runner.program import Confirmation, CredentialPrompt, Program
from rungd.runner.questions import is_credential_question
from rungd.runner.launch import Child, Started
from rungd.runner.streams import Outputs, Stream
from rungd.runner.terminal import Terminal


# The watch looks at the program as soon as its output pauses (_PAUSE_S), then again on a
# timer that backs off from POLL_S to POLL_MAX_S while nothing happens; any output or the
# program's exit wakes it at once. A look reads a few /proc files of the call's own processes.
POLL_S = 0.01
POLL_MAX_S = 0.1
# A program silent for IDLE_AFTER_S is looked at less often: a long silent call costs the
# daemon well under 1 % of a core, and a question it prints still wakes the watch at once.
IDLE_AFTER_S = 2.0
POLL_IDLE_MAX_S = 0.25
SNAPSHOT_S = 0.2
_PAUSE_S = 0.01
_SETTLE_S = 0.003


class Watch:
    """Watches a running program: feeds stdin, notices questions, answers or stops it."""

    def __init__(self, ctx: CallContext, program: Program, proc: Child, tracker: proctree.Tracker,
                 outputs: Outputs, streams: tuple[Stream, Stream], redactor: Redactor,
                 terminal: tuple[Terminal, Stream] | None = None, *, started: Started | None = None) -> None:
        """``started``: the program's start, when whether its exec worked is to be heard as
        the watch wakes (:attr:`verdict`), not before it."""
        self.ctx = ctx
        self.program = program
        self.proc = proc
        self.tracker = tracker
        self.outputs = outputs
        self.streams = streams  # stdout and stderr, where a question on stdin is printed
        self.terminal = terminal  # the call's terminal, and what the program wrote on it
        self.every_stream = (*streams, terminal[1]) if terminal is not None else streams
        self.redactor = redactor
        self.answered: list[str] = []
        self._left = {id(c): c.times for c in (*program.confirmations, *program.credential_prompts, *program.askpass)}
        self._checked_at = 0.0
        self._stdin_closed = False
        self._feeding = False
        for stream in self.every_stream:
            stream.on_output = self.wake
        self.refused: RungdError | None = None
        self.started = started
        # What the program's start said once it said (Started.verdict_now): heard at the first
        # wake that finds it, so the pipe is not held open the whole run.
        self.verdict: bool | OSError = False
        self.decided = False  # the watch ended: no question is answered any more
        self._tty_words: str | None = None  # what the program said about /dev/tty
        self._tty_question = ""
        if terminal is None:
            # No terminal (the tool opted out): opening /dev/tty fails, and only the program's
            # own complaint, on stderr, says it tried.
            streams[1].on_tty = self.tty_tried

    async def feed_stdin(self) -> None:
        """Send the declared stdin data, then close stdin only if the tool said ``eof`` (or
        ``stdin_eof``: data, then the end).

        Cancellation: stops sending at once; stdin stays open.
        """
        stdin = self.proc.stdin
        try:
            if isinstance(self.program.stdin, bytes):
                # While declared data is still going in, a read that waits for more of it
                # is not a question: the watch does not judge until all of it is sent.
                self._feeding = True
                try:
                    await stdin.send_all(self.program.stdin)
                finally:
                    self._feeding = False
        except trio.BrokenResourceError:
            return  # it exited without reading: its exit status will tell
        if self.program.stdin == "eof" or self.program.stdin_eof:
            stdin.close()
            self._stdin_closed = True  # a reader now gets end-of-file: it cannot be waiting for us

    def _protect(self, secret: str) -> None:
        """Redact a credential given mid-call from everything kept from now on."""
        self.redactor.add(secret)
        for stream in self.every_stream:
            stream.redactor.add(secret)

    def _secret_for(self, prompt: CredentialPrompt, question: str, how: str) -> str | RungdError:
        """The secret to answer ``prompt`` with once more, or the error that refuses it (also
        when the credential store fails: a plugin's exception ends this call, never the daemon).

        Args:
            question: what the program asked, already redacted, to quote.
            how: "through askpass", "on stdin" or "on its terminal", for the message.
        """
        asked_on = how.rpartition(" ")[2]  # "askpass", "stdin" or "terminal"
        if self._left[id(prompt)] <= 0:
            times = "once" if prompt.times == 1 else f"{prompt.times} times"
            return _auth_required(
                f"the program asked again {how}: {question!r}; rungd answered it {times}, so the "
                f"credential {prompt.credential!r} was rejected",
                hint=f"the operator must check the credential {prompt.credential!r} in rungd's store; it is "
                "not sent again in the same call", question=question, asked_on=asked_on)
        try:
            secret = stored(self.ctx, prompt.credential, f"the program's question {how} was not answered")
        except RungdError as failure:
            return failure
        if secret is None:
            return _auth_required(
                f"the program asked {how}: {question!r}, declared with the credential "
                f"{prompt.credential!r}, which rungd does not hold",
                hint=f"the operator must add {prompt.credential!r} to rungd's credential store", question=question,
                asked_on=asked_on)
        self._left[id(prompt)] -= 1
        self._protect(secret)
        return secret

    def askpass_answer(self, raw: str) -> str | None:
        """The credential to give an askpass question of this call, or None to refuse it.

        The declared patterns see the question as the program asked it (it may name a user
        that is itself a credential); only what is quoted back is redacted. A refusal is kept
        in :attr:`refused`; the watch then stops the call.
        """
        raw = raw.strip()
        question = self.redactor.text(raw)
        if self.decided or self.refused is not None:
            return None  # the call is being stopped: held like any refused question
        prompt = next((p for p in self.program.askpass if p.pattern.search(raw)), None)
        if prompt is None:
            result: str | RungdError = _auth_required(
                f"the program asked for a credential through askpass: {question!r}",
                hint="rungd holds no credential declared for this question, and askpass does not say whether "
                "a question wants a secret or a yes/no (ssh asks there whether to trust a new host key): for a "
                "secret, the operator must add it to the tool's askpass answers and the credential store; for "
                "a question, the tool must settle it beforehand (for ssh: the host's key in a known_hosts file "
                "the tool names)", question=question)
        else:
            result = self._secret_for(prompt, question, "through askpass")
        if isinstance(result, RungdError):
            if self.refused is None:
                self.refused = result
                self.wake()  # the watch stops the call now, not at its next look
            return None
        self.answered.append(f"askpass {prompt.credential}")  # type: ignore[union-attr]
        return result

    def tty_tried(self, stream: Stream) -> None:
        """Note that the program said (on ``stream``) it could not use /dev/tty."""
        if self._tty_words is None:
            self._tty_words = stream.tty_failure or ""
            self._tty_question = self._tty_prompt()

    @property
    def tty(self) -> tuple[str, str] | None:
        """The program's words about /dev/tty and the question it had printed, if it tried.

        The question is looked for when the complaint arrives and, if nothing was printed
        yet, again now: stdout and stderr are separate pipes, read one after the other, so
        a prompt printed just before the complaint may be read just after it.
        """
        if self._tty_words is None:
            return None
        return self._tty_words, self._tty_question or self._tty_prompt()

    def _tty_prompt(self) -> str:
        for stream in self.streams:
            text = self.redactor.text(bytes(stream.recent).decode("utf-8", "replace"))
            if (question := prompt_in(text, skip=stream.tty_failure)):
                return question
        return ""

    @functools.cached_property
    def _stdin_ino(self) -> int | None:
        """The inode of the program's stdin pipe, looked up the first time a question is
        looked for (most calls end before); None once the daemon's end is closed."""
        try:
            return procwatch.pipe_inode(self.proc.stdin.fileno())
        except OSError:
            return None

    def wake(self) -> None:
        """Look at the program now: it printed something, or a question was refused."""
        self.outputs.wake()

    def start_verdict(self) -> bool | OSError:
        """Once the watch is over: what the program's start said (:meth:`Started.verdict_now`),
        heard now if no wake heard it. Only for a watch given ``started``."""
        if self.verdict is False and self.started is not None:
            self.verdict = self.started.verdict_now(exited=self.proc.returncode is not None)
        return self.verdict

    async def until_exit(self) -> None:
        """Return when the program exits; answer or raise when it asks.

        Raises:
            AuthRequired: it asked for a credential nobody may give it.
            PromptUnexpected: it waits for an answer nobody declared.

        Cancellation: returns at once; the caller kills the tree.
        """
        try:
            await self._until_exit()
        finally:
            self.decided = True  # exited, asked, or cancelled: no question is answered any more

    async def _until_exit(self) -> None:
        last_snapshot = 0.0
        interval = POLL_S
        while True:
            # Output or the exit wakes the watch at once (:meth:`wake`); otherwise it looks
            # on a timer that backs off while nothing changes.
            woken = await self.outputs.wait(interval)
            now = time.monotonic()
            quiet_since = max(s.last_output for s in self.every_stream)
            if woken:
                interval = POLL_S
            else:
                idle = now - quiet_since >= IDLE_AFTER_S
                interval = min(interval * 2, POLL_IDLE_MAX_S if idle else POLL_MAX_S)
            if self.proc.returncode is not None:
                return
            if self.started is not None and self.verdict is False:
                self.verdict = self.started.verdict_now()
            if self.refused is not None:
                raise self.refused
            # Without a cgroup the kill finds an orphan only if a snapshot saw it (or its tag);
            # a cgroup holds every process of the call, so there is nothing to keep up.
            if self.tracker.cgroup is None and now - last_snapshot >= SNAPSHOT_S:
                self.tracker.snapshot()
                last_snapshot = now
            if now - quiet_since < _PAUSE_S:
                interval = POLL_S  # output is pausing: look again as soon as it has
            elif quiet_since > self._checked_at:
                # The kernel says whether it waits on stdin: no need to wait out quiet_s first.
                await self._check_for_question(quiet_since)

    async def _check_for_question(self, quiet_since: float) -> None:
        stdin_open = not (self.program.stdin == "eof" or self._stdin_closed or self._feeding)
        if not stdin_open and self.terminal is None:
            return
        cgroup = self.tracker.cgroup
        members = cgroup.pids() if cgroup is not None else [pid for pid, _ in self.tracker.members()]
        pids = [self.proc.pid, *(pid for pid in members if pid != self.proc.pid)]
        # (The terminal's name is looked up here, the first time it is needed: most calls end before.)
        terminal_id = (self.terminal[0].path, self.terminal[0].device) if self.terminal is not None else None
        waiting = procwatch.waiting_for_input(pids, self._stdin_ino if stdin_open else None, terminal_id)
        where = waiting[1] if waiting is not None else None
        if where is None and self._typing_unseen(pids):
            where = "terminal"
        if where is None:
            return  # busy, sleeping or waiting on something else: not our business
        # A prompt may sit in a pipe not read yet (on a loaded host the program can print and
        # block within one tick of ours), or come from another of its processes a moment
        # later: read the pipes once more a moment later, and start over if anything arrived.
        await trio.sleep(_SETTLE_S)
        self.outputs.take()
        if max(s.last_output for s in self.every_stream) > quiet_since:
            return
        self._checked_at = quiet_since
        if where == "terminal":
            await self._terminal_question()
        else:
            await self._stdin_question()

    def _typing_unseen(self, pids: list[int]) -> bool:
        """Whether a secret is being asked on the terminal by a process rungd may not look at
        (a setuid program such as sudo, when the daemon is not root): the program printed
        something there since the last answer and turned echo off for a line, and is quiet."""
        if self.terminal is None or not self.terminal[1].recent:
            return False
        echo, canonical = self.terminal[0].echo()
        return not echo and canonical and any(procwatch.hidden(pid) for pid in pids)

    def _declared(self, raw: str, how: str) -> tuple[str, str, object] | None:
        """The declared question ``raw`` (as printed, since the last answer) matches, and the
        answer it still has left: (answer, label, the declaration), or None.

        A declared pattern matches a line of the question (text after the prompt allowed:
        patterns search), each line in the forms a person would type it (:func:`_as_read`).
        Patterns see the question as printed (it may contain a credential given earlier, such
        as a user name); what is quoted back is redacted.

        Raises:
            AuthRequired / Failed: a credential question whose credential is spent, missing,
                or unreadable (nothing is written: the program waits until the kill).
        """
        forms = tuple(form for line in raw.splitlines() for form in _as_read(line, self.program.argv[0]))
        question = self.redactor.text(raw.strip())
        for prompt in self.program.credential_prompts:
            if any(prompt.pattern.search(form) for form in forms):
                secret = self._secret_for(prompt, question, how)
                if isinstance(secret, RungdError):
                    raise secret
                return secret, f"credential {prompt.credential}", prompt
        for confirmation in self.program.confirmations:
            # Only a call that passed its gate runs at all (a held call starts nothing), so a
            # confirmation reached here is one the gate allowed.
            if any(confirmation.pattern.search(form) for form in forms) and self._left[id(confirmation)] > 0:
                self._left[id(confirmation)] -= 1
                return confirmation.answer, f"confirmation {confirmation.pattern.pattern}", confirmation
        return None

    async def _stdin_question(self) -> None:
        """A process of the call waits on stdin: answer what the tool declared, or stop."""
        question = self._question()
        declared = self._declared(self._question(raw=True), "on stdin")
        if declared is not None:
            await self._answer(*declared, on_terminal=False)
            return
        if is_credential_question(question):
            raise _auth_required(
                f"the program asked for a credential: {question!r}",
                hint="rungd holds no credential declared for this question; the operator must add one",
                question=question, asked_on="stdin")
        shown = question or "(nothing printed: it is reading stdin silently, or its prompt is still buffered)"
        raise PromptUnexpected(
            f"the program is waiting for an answer nobody declared: {shown!r}",
            hint="nothing answered it and the program was stopped; the tool's author must declare "
            "this question or pass its answer as an argument",
            fields={"question": question, "asked_on": "stdin"},
        )

    async def _terminal_question(self) -> None:
        """A process of the call waits on its terminal: answer what the tool declared, or stop.
        What kind of question it is, the terminal says (its echo), never the words."""
        assert self.terminal is not None
        terminal, stream = self.terminal
        echo, canonical = terminal.echo()
        # What it wrote on the terminal since the last answer; a script that printed its
        # question on stdout and reads the answer from /dev/tty asked there.
        on_it = bool(stream.recent)
        question = stream.question() if on_it else self._question()
        declared = self._declared(stream.question(raw=True) if on_it else self._question(raw=True), "on its terminal")
        if declared is not None:
            await self._answer(*declared, on_terminal=True)
            return
        shown = question or "(nothing written on it)"
        if not canonical:
            raise PromptUnexpected(
                f"the program reads keys one at a time on its terminal (a screen program): {shown!r}",
                hint="nothing answered it and the program was stopped; the tool's author must pass what it asks as "
                "arguments, or use a batch mode of the program that needs no screen",
                fields={"question": question, "asked_on": "terminal", "echo": "keys"})
        if not echo:
            raise _auth_required(
                f"the program asked for a secret on its terminal (it turned echo off): {shown!r}",
                hint="rungd holds no credential declared for this question; the operator must add one to the tool's "
                "credential prompts and the credential store", question=question, asked_on="terminal", echo="off")
        raise PromptUnexpected(
            f"the program asked on its terminal and waits for an answer nobody declared: {shown!r}",
            hint="nothing answered it and the program was stopped; the tool's author must declare this question "
            "or pass its answer as an argument",
            fields={"question": question, "asked_on": "terminal", "echo": "on"})

    def _question(self, *, raw: bool = False) -> str:
        # A prompt rarely ends its line: prefer the stream that stopped mid-line. The two
        # streams are read by separate tasks, so their timestamps only break ties.
        ordered = sorted(self.streams, key=lambda s: (s.mid_line, s.last_output), reverse=True)
        return next((q for s in ordered if (q := s.question(raw=raw))), "")

    async def _answer(self, answer: str, label: str, declared: object, *, on_terminal: bool) -> None:
        """Type ``answer`` where the program waits for it: on its terminal, or its stdin."""
        line = answer.encode() + b"\n"
        echoed = b""
        if on_terminal:
            assert self.terminal is not None
            echoed = line if self.terminal[0].echo()[0] else b""
            if not self.terminal[0].type(line):
                return  # its terminal takes nothing more: what the program does next will tell
        else:
            try:
                await self.proc.stdin.send_all(line)
            except trio.BrokenResourceError:
                return  # it exited between asking and our answer: its exit status will tell
        self.answered.append(label)
        if isinstance(declared, Confirmation) and self.ctx.tool.timing.commit_point == "confirmation":
            self.ctx.mark_committed()
        for stream in self.every_stream:
            stream.last_output = time.monotonic()  # the reply resets the quiet clock
            stream.answered(echoed if self.terminal is not None and stream is self.terminal[1] else b"")


def _as_read(line: str, argv0: str) -> tuple[str, ...]:
    """The forms of a line of a question a declared pattern is matched against: as printed,
    without the spaces around it (a pattern may end in "? " or in "?"), cut after each mark a
    prompt ends with (a prompt the program printed more after on its line, a warning, still
    matches a pattern anchored at its end), and naming the program as a person typed it ("cp:
    overwrite", where exec's full path made it "/usr/bin/cp: ...")."""
    forms = [line, line.strip()]
    forms += [line[:end.end()] for end in _PROMPT_END.finditer(line)]
    if "/" in argv0 and forms[1].startswith(argv0 + ":"):
        name = os.path.basename(argv0)
        forms += [form.replace(argv0, name, 1) for form in forms]
    return tuple(dict.fromkeys(forms))


_PROMPT_END = re.compile(r"[?:\]>)]\s")


def prompt_in(text: str, *, skip: str | None = None) -> str:
    """The last prompt-shaped text in ``text``: a line with a question mark, colon or closing
    bracket, cut after the last one (a prompt answered by nobody is often followed on its line
    by what the program printed next). Empty when no line looks like a question.

    Args:
        skip: a line to pass over (the program's own complaint about /dev/tty).
    """
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line or line == skip:
            continue
        ends = list(_PROMPT_END.finditer(line + " "))
        if ends:
            return line[: ends[-1].start() + 1][-200:]
    return ""


def _auth_required(message: str, *, hint: str, question: str, asked_on: str = "askpass",
                   echo: str | None = None) -> AuthRequired:
    """AUTH_REQUIRED quoting the question, where it was asked (stdin, terminal, askpass) and,
    on the terminal, its echo."""
    fields = {"question": question, "asked_on": asked_on}
    if echo is not None:
        fields["echo"] = echo
    return AuthRequired(message, hint=hint, fields=fields)
