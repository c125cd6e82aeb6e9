"""Capturing a program's output: drained as it comes, redacted, kept within a cap, and
written in full (up to its own cap) to an evidence file for operators."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import BinaryIO

import trio

from rungd.redact import Redactor
from rungd.runner.questions import tty_failure

# A /dev/tty complaint cut between two chunks is still seen: the last bytes of one chunk are
# searched again with the next.
_CARRY = 256


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
        self.drained = trio.Event()  # set at end-of-file
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

    def take(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.last_output = time.monotonic()
        if self.on_output is not None:
            self.on_output()
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

    def answered(self) -> None:
        """Forget what was printed before an answer: the next question is what comes after.

        A program that does not echo the answer prints its next prompt on the same line
        ("New password: Retype new password: "); only the part after the answer is asked.
        """
        self.recent.clear()

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
            kept += (f"\n[... {cut} bytes cut; read them with `rungctl evidence ID --bytes {len(self.head)}:{cut}`, "
                     f"ID being this call's {self.name} evidence id in the envelope ...]\n").encode()
        kept += bytes(self.tail)
        return self.redactor.text(kept.decode("utf-8", "replace"))

    @property
    def mid_line(self) -> bool:
        return bool(self.recent) and not self.recent.endswith(b"\n")

    def question(self, *, raw: bool = False) -> str:
        """The last line the program printed since the last answer, as a person would read it.

        Args:
            raw: as printed, for matching a declared pattern; by default redacted, for quoting.
        """
        text = bytes(self.recent).decode("utf-8", "replace")
        if not raw:
            text = self.redactor.text(text)
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-1].strip()[-200:] if lines else ""


async def drain(stream: trio.abc.ReceiveStream | None, sink: Stream) -> None:
    """Read ``stream`` to its end into ``sink``; ``sink.drained`` is set however it ends.

    Cancellation: stops reading at once; what was read is kept.
    """
    try:
        if stream is not None:
            while chunk := await stream.receive_some(1 << 16):
                sink.take(chunk)
    finally:
        sink.drained.set()
