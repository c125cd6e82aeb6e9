"""Watching a running program: feeding its stdin, noticing that it asks, and answering only
what the tool declared. Everything else stops the call with an error quoting the question."""

from __future__ import annotations

import time

import trio

from rungd import procwatch, proctree
from rungd.contract import CallContext
from rungd.errors import AuthRequired, PromptUnexpected
from rungd.redact import Redactor
from rungd.runner.environment import credential
from rungd.runner.program import Program
from rungd.runner.questions import CREDENTIAL_QUESTION
from rungd.runner.streams import Stream

POLL_S = 0.05
SNAPSHOT_S = 0.2


class Watch:
    """Watches a running program: feeds stdin, notices questions, answers or stops it."""

    def __init__(self, ctx: CallContext, program: Program, proc: trio.Process, tracker: proctree.Tracker,
                 streams: tuple[Stream, Stream], redactor: Redactor) -> None:
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
        """Send the declared stdin data, then close stdin only if the tool said ``eof``.

        Cancellation: stops sending at once; stdin stays open.
        """
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
        """Return when the program exits; answer or raise when it asks.

        Raises:
            AuthRequired: it asked for a credential nobody may give it.
            PromptUnexpected: it waits for an answer nobody declared.

        Cancellation: returns at once; the caller kills the tree.
        """
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
                secret = credential(self.ctx, prompt.credential)
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
