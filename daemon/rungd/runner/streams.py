"""Capturing a program's output: drained as it comes, redacted, kept within a cap, and
written in full (up to its own cap) to an evidence file for operators; and :class:`Outputs`,
which reads a program's pipes and notes its exit for the call's one watching task."""

from __future__ import annotations

import contextlib
import json
import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

import trio

from rungd.redact import Redactor
from rungd.runner.launch import Child, Pipe
from rungd.runner.questions import tty_failure
from rungd.runner.terminal import Terminal

# A /dev/tty complaint cut between two chunks is still seen: the last bytes of one chunk are
# searched again with the next.
_CARRY = 256
# The most of a question quoted back or matched: what a program printed since the last
# answer, from its prompt back (the rest is in evidence).
QUESTION_CHARS = 400
# What one wake takes from a pipe at most: a flood of output still lets the loop go round.
_CHUNK = 1 << 16
_CHUNKS_PER_WAKE = 4


def not_kept_path(evidence: Path) -> Path:
    """Where rungd says how much of an evidence file it did not keep, and why: beside it,
    under a name no evidence id can take (a leading dot). The evidence holds the program's
    bytes only, so nothing a program prints can forge the note or hide it."""
    return evidence.with_name(f".{evidence.name}.not-kept")


class Stream:
    """One output stream: kept head and tail, evidence file, and when it last spoke."""

    def __init__(self, name: str, keep: int, evidence: BinaryIO | Callable[[], BinaryIO], evidence_cap: int,
                 redactor: Redactor) -> None:
        self.name = name
        self._keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.last_output = time.monotonic()
        self.recent = bytearray()  # the last bytes printed, to quote a question
        self.evidence_error: str | None = None
        # Every call keeps its output as evidence, small or not: a result may hold only the
        # fields parsed from it, and operators (and ``rungctl evidence``) read what the program
        # actually printed. A callable opens the file at the stream's first byte (a stream
        # that prints nothing has nothing to keep, and costs no file); if the state folder
        # cannot hold it, the stream says so in its evidence note and the call goes on.
        self._evidence: BinaryIO | None = None
        self._open_evidence: Callable[[], BinaryIO] | None = None
        if callable(evidence):
            self._open_evidence = evidence
        else:
            self._evidence = evidence
        self._evidence_cap = evidence_cap
        self._evidence_written = 0
        self.clean_total = 0  # bytes after redaction: what head, tail and evidence hold
        self.redactor = redactor  # this stream's own: it holds back bytes between chunks
        self.tty_failure: str | None = None  # the program's own words: it tried /dev/tty
        # Set for stderr only: a program complains there, while stdout may carry data that
        # merely mentions /dev/tty.
        self.on_tty: Callable[[Stream], None] | None = None
        self.on_output: Callable[[], None] | None = None  # the watch looks when output pauses
        self._carry = b""
        self._echo = b""

    def take(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.last_output = time.monotonic()
        if self.on_output is not None:
            self.on_output()
        if self._echo:  # the terminal repeating what rungd typed: no part of the next question
            same = len(os.path.commonprefix([self._echo, chunk]))
            self._echo = self._echo[same:] if same else b""
            self.recent += chunk[same:]
        else:
            self.recent += chunk  # raw, to quote a prompt at once; redacted when read
        del self.recent[: max(0, len(self.recent) - 512)]
        self._look_for_tty(chunk)
        # Everything kept is redacted first: a secret cut at the head/tail boundary must not
        # leave its first half behind.
        self._keep_clean(self.redactor.feed(chunk))

    def _look_for_tty(self, chunk: bytes) -> None:
        window, self._carry = self._carry + chunk, (self._carry + chunk)[-_CARRY:]
        # Cheap byte search first: a flood of output costs a memchr per chunk, not a regex.
        if self.on_tty is None or self.tty_failure is not None or b"/dev/tty" not in window:
            return
        words = tty_failure(window.decode("utf-8", "replace"))
        if words is not None:
            self.tty_failure = self.redactor.text(words)
            self.on_tty(self)

    def answered(self, echo: bytes = b"") -> None:
        """Forget what was printed before an answer: the next question is what comes after.

        A program that does not echo the answer prints its next prompt on the same line
        ("New password: Retype new password: "); only the part after the answer is asked.

        Args:
            echo: what the terminal will repeat of the answer (echo on): left out of the
                next question, kept in the evidence.
        """
        self.recent.clear()
        self._echo = echo

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
                if self._evidence is None:
                    if self._open_evidence is None:
                        return  # it could not be opened: close() says so
                    opener, self._open_evidence = self._open_evidence, None
                    self._evidence = opener()
                self._evidence.write(data[:room])
            except OSError as exc:
                self.evidence_error = exc.strerror or str(exc)
                return
            self._evidence_written += min(room, len(data))

    def close(self) -> None:
        self._keep_clean(self.redactor.flush())
        if self._evidence is None:
            return
        with contextlib.suppress(OSError):
            self._evidence.close()
        name = getattr(self._evidence, "name", None)
        if self.evidence_cut and isinstance(name, str):
            note = {"bytes": self.clean_total - self._evidence_written,
                    "why": self.evidence_error or "the evidence cap (the tool's evidence_bytes)"}
            with contextlib.suppress(OSError):  # a full disk: the envelope still says evidence_cut
                fd = os.open(not_kept_path(Path(name)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "w") as file:
                    json.dump(note, file)

    @property
    def evidence_cut(self) -> bool:
        """Whether the evidence file holds less than the stream said (its cap, a full disk)."""
        return self.clean_total > self._evidence_written

    @property
    def truncated(self) -> bool:
        return self.clean_total > len(self.head) + len(self.tail)

    def text(self) -> str:
        """What the program printed, as kept. Cut, it is the whole lines of the head and of
        the tail, one after the other: no line is made of two halves, and no words of rungd's
        mark the gap (the program could print the same words); ``truncated`` and the
        envelope say it was cut, and where the rest is."""
        if not self.truncated:
            kept = bytes(self.head)
        else:
            head, tail = bytes(self.head), bytes(self.tail)
            head = head[:head.rfind(b"\n") + 1]
            tail = tail[tail.find(b"\n") + 1:]
            kept = head + tail
        return self.redactor.text(kept.decode("utf-8", "replace"))

    @property
    def mid_line(self) -> bool:
        return bool(self.recent) and not self.recent.endswith(b"\n")

    def question(self, *, raw: bool = False) -> str:
        """What the program printed since the last answer, as a person would read it: the
        whole question, not its last line (a sentence, then a short ``[default]:`` line; an
        overwrite question and the file it names), its last ``QUESTION_CHARS`` at most.

        Args:
            raw: as printed (the spaces around each line kept), for matching a declared
                pattern against its lines; by default redacted and stripped, for quoting.
        """
        text = bytes(self.recent).decode("utf-8", "replace")
        if not raw:
            text = self.redactor.text(text)
        lines = [line if raw else line.strip() for line in text.splitlines() if line.strip()]
        kept: list[str] = []
        for line in reversed(lines):  # from the prompt back, whole lines while they fit
            if kept and sum(len(k) + 1 for k in kept) + len(line) > QUESTION_CHARS:
                break
            kept.insert(0, line[-QUESTION_CHARS:])
        return "\n".join(kept)


class Sink(Protocol):
    """Where output read from a pipe or the terminal goes: a :class:`Stream`, or a screen
    program's emulator (rungd.runner.screen.Session)."""

    def take(self, chunk: bytes) -> None: ...


class Outputs:
    """A program's stdout, stderr, terminal and exit, watched by its call's one task through an epoll of
    the call's own: one turn of the loop takes whatever of them is ready (a task per pipe and
    one for the exit cost a call a turn and a task switch each).

    Args:
        poller: the call's epoll, made before the program started (a daemon out of
            descriptors then starts nothing); the caller closes it.
        streams: where stdout's and stderr's output go.
        terminal: the call's terminal and where what the program writes on it goes.
    """

    def __init__(self, poller: select.epoll, child: Child, streams: tuple[Stream, ...],
                 terminal: tuple[Terminal, Sink] | None = None) -> None:
        self._poller = poller
        self._child = child
        # stdout's and stderr's streams; a screen program's stdio is its terminal, and its one
        # stream, if any, is its answer descriptor's.
        pipes = (child.stdout, child.stderr) if child.stdout.fileno() >= 0 else (child.output,)
        self._pipes: dict[int, tuple[Pipe | Terminal, Sink]] = {
            pipe.fileno(): (pipe, stream) for pipe, stream in zip(pipes, streams)}
        self._terminal = -1
        if terminal is not None:  # what the program writes on its terminal, read from the master
            self._terminal = terminal[0].fileno()
            self._pipes[self._terminal] = terminal
        self._pidfd = child.pidfd()
        for fd in (*self._pipes, self._pidfd):
            poller.register(fd, select.EPOLLIN)
        self._scope: trio.CancelScope | None = None
        self._woken = False

    def wake(self) -> None:
        """End the :meth:`wait` under way (or the next one) at once."""
        self._woken = True
        if self._scope is not None:
            self._scope.cancel()

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for output, the exit or :meth:`wake`, then take the
        output there is.

        Returns:
            Whether anything happened: output, the exit, or a wake.

        Cancellation: stops waiting at once; what was read is kept.
        """
        if self._woken:
            await trio.lowlevel.checkpoint()
        else:
            with trio.CancelScope(deadline=trio.current_time() + timeout) as self._scope:
                await trio.lowlevel.wait_readable(self._poller.fileno())
            self._scope = None
        self.take()
        woken, self._woken = self._woken, False
        return woken

    async def drain(self, timeout: float) -> None:
        """Once the program has exited: take output until both pipes end, ``timeout`` seconds
        at most (a descendant may hold them open; the kill that follows ends it). The
        terminal never ends while the daemon holds it: what is on it now is taken."""
        deadline = trio.current_time() + timeout
        while self._pipes.keys() - {self._terminal} and (left := deadline - trio.current_time()) > 0:
            await self.wait(left)

    def take(self) -> None:
        """Take what the pipes hold now (a few chunks each at most), and note an exit."""
        for fd, _ in self._poller.poll(0):
            if fd == self._pidfd:
                self._exited()
                continue
            entry = self._pipes.get(fd)
            if entry is None:
                continue
            pipe, stream = entry
            for _ in range(_CHUNKS_PER_WAKE):
                chunk = pipe.read(_CHUNK)
                if chunk is None:
                    break
                if not chunk:  # end of file: every process holding the pipe closed it
                    # Taken out of the poller, not closed here: a close takes it out only when
                    # no other process holds a copy of it (pidfd_getfd, a fork in a worker
                    # thread), and one left in could not be taken out: it would wake every wait.
                    self._forget(fd)
                    break
                stream.take(chunk)  # wakes the watch (Stream.on_output)

    def _exited(self) -> None:
        # Reaped now, or (a tracer has not collected it yet) looked at again on the watch's
        # timer: the pidfd stays readable, and would wake the loop on every turn.
        self._forget(self._pidfd)
        self._pidfd = -1
        self._child.exited()  # reaps it when it can be reaped
        self.wake()

    def _forget(self, fd: int) -> None:
        self._pipes.pop(fd, None)
        with contextlib.suppress(OSError, ValueError):
            self._poller.unregister(fd)
