"""Screen programs: a full-screen terminal program driven by declared steps, at fixed positions.

A tool with ``terminal = "screen"`` gives its program the call's pseudo-terminal as stdin,
stdout and stderr, with the size and ``TERM`` the tool fixes. The daemon keeps what the program
draws with a VT emulator (pyte) and walks the tool's :class:`Step` list, each inside its own
timeout and the call's deadline:

1. wait until the screen shows a state (text at a row and column, a pattern on a row or a band
   of rows, optionally a cell's attribute: a current menu item may be marked by colour only);
2. wait until the program has drawn it and waits for keys: a process of the call blocked
   reading the terminal, as the kernel shows it (:mod:`rungd.runner.procwatch`); where rungd
   may not look into the program, until its output has been quiet a moment; and whatever
   it does, once its output has been quiet a while;
3. read fields at fixed positions;
4. type text (a filled-in input, or a credential from the store for a secret field) and keys
   (named keys resolved through terminfo for the tool's ``TERM``: :mod:`rungd.runner.keys`).

A step whose state does not appear in time ends the call SURFACE_CHANGED quoting the screen;
a program that exits first ends it FAILED, quoting the screen too. The one step marked
``commit`` is the commit point of a tool that declares ``commit_point = "confirmation"``. What a
call's outcome is after that, the read-back decides, as for every write.

Echo is no evidence here: curses programs keep it off the whole time. What a screen field is,
the tool declares (``credential`` for a secret one, filled only from the store).

The session is kept as an asciicast v2 file (:class:`Cast`): the screen as the emulator kept
it, every secret masked cell by cell, what was typed (a secret field's keys never), capped,
replayable with ``asciinema play``; the final screen is kept as text. A program is stopped
when what it draws exceeds the screen's byte cap or the emulator's time (OUTPUT_TOO_LARGE),
and nothing it draws holds the event loop long (:meth:`Session._catch_up`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pyte
import trio
from wcwidth import wcwidth

from rungd.core.contract import CallContext
from rungd.core.errors import Failed, SurfaceChanged, ToolError, ToolTimeout
from rungd.redact import Redactor
from rungd.exchange import patterns
from rungd.runner import keys as keymap
from rungd.runner.streams import not_kept_path

# The most the emulator is fed in one turn of the loop: as many bytes as a screen-wide
# sequence (3 bytes for every cell of the screen, at about 2 us a cell on a busy host) costs
# in _SLICE_S, between 4 bytes and 4 KB (Session._catch_up).
_FEED = 4096
_SLICE_S = 0.05
_CELL_S = 2e-6
# The largest screen a tool may ask for: one sequence redraws all of it.
MAX_ROWS, MAX_COLUMNS = 100, 300
# How long output must pause before a program rungd may not look into counts as waiting,
# and before any program's screen counts as drawn (it sleeps or works, reading no key).
_QUIET_S = 0.05
# What is typed reaches the program's side of the terminal a moment later (the kernel's work
# queue moves it): until then the program still looks blocked in its read with nothing unread.
_TYPED_S = 0.01
_SETTLED_S = 0.3
# The most of a screen an error quotes.
QUOTE_CHARS = 1600


@dataclasses.dataclass(frozen=True)
class Band:
    """Rows ``first`` to ``last`` of the screen (0 is the top), or all of them (None)."""

    first: int | None = None
    last: int | None = None

    def rows(self, height: int) -> range:
        first = 0 if self.first is None else self.first
        last = height - 1 if self.last is None else self.last
        return range(max(0, first), min(height - 1, last) + 1)

    def said(self) -> str:
        if self.first is None:
            return "on the screen"
        return f"on row {self.first}" if self.last == self.first else f"on rows {self.first}-{self.last}"


@dataclasses.dataclass(frozen=True)
class Wait:
    """A screen state: ``text`` (exactly at ``column`` when given) or a ``pattern`` on a row
    of ``band``; with ``attribute``, its first cell must have it; ``absent``: the state is
    that it is nowhere there (a dialog gone)."""

    text: str | None = None
    pattern: re.Pattern[str] | None = None
    band: Band = Band()
    column: int | None = None
    attribute: str | None = None
    absent: bool = False

    def said(self) -> str:
        what = repr(self.text) if self.text is not None else f"/{self.pattern.pattern if self.pattern else ''}/"
        where = self.band.said() + (f" at column {self.column}" if self.column is not None else "")
        shown = f"{what} {where}" + (f" ({self.attribute})" if self.attribute else "")
        return f"{shown} to go" if self.absent else shown


@dataclasses.dataclass(frozen=True)
class Read:
    """A field read off the screen: ``width`` characters from ``column`` of the band's first
    row, the first group (else the whole match) of ``pattern`` on the first row of the band
    it matches, or the first run of cells with ``attribute``. Spaces around it are dropped."""

    name: str
    band: Band = Band()
    column: int = 0
    width: int | None = None
    pattern: re.Pattern[str] | None = None
    attribute: str | None = None  # the first run of cells with it (a menu's current item)


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a session: wait for ``wait``, read ``read``, type ``text`` (or the
    credential named ``credential``: a secret field), then press ``keys``."""

    wait: Wait | None = None
    timeout_s: float = 5.0
    read: tuple[Read, ...] = ()
    text: str | None = None
    credential: str | None = None
    keys: tuple[str, ...] = ()
    commit: bool = False

    @property
    def types(self) -> bool:
        return self.text is not None or self.credential is not None or bool(self.keys)


@dataclasses.dataclass(frozen=True)
class Screen:
    """A screen tool's terminal and steps. ``end``: after the last step, wait for the program
    to exit by itself (its exit status is judged), or stop it (a read that took its fields)."""

    steps: tuple[Step, ...]
    rows: int = 24
    columns: int = 80
    term: str = "xterm-256color"
    end: Literal["exit", "kill"] = "exit"
    # The most bytes the emulator draws in one call: a program that redraws forever is stopped.
    screen_bytes: int = 4 * 1024 * 1024
    cast_bytes: int = 2 * 1024 * 1024
    # Keep the screen as each step found it, and as it ended (rungctl probe --screen).
    snapshots: bool = False
    # A descriptor the program writes its answer to (dialog's --output-fd 3): a pipe rungd
    # reads, whose text is the Completed's stdout.
    output_fd: int | None = None
    # The most CPU time the emulator may spend on what one call draws.
    emulator_s: float = 5.0

    def check(self) -> None:
        """Raises ValueError (keymap.UnknownKey for a key) for what no call of it can run:
        a key the terminal type does not have on this host, a screen larger than rungd draws
        (one sequence redraws all of it), a place past the screen (always empty: a wait for
        something to go would pass at once), or a wait's or a read's pattern too slow to
        match in the event loop on every redraw (rungd.exchange.patterns). Each judgement is
        remembered, so a call pays a few lookups."""
        for step in self.steps:
            for name in step.keys:
                keymap.key(self.term, name)
        if not (10 <= self.rows <= MAX_ROWS and 20 <= self.columns <= MAX_COLUMNS):
            raise ValueError(f"a {self.rows}x{self.columns} screen: rungd draws from 10x20 to {MAX_ROWS}x{MAX_COLUMNS}")
        for number, step in enumerate(self.steps, 1):
            places = [(step.wait.band, step.wait.column or 0)] if step.wait is not None else []
            places += [(read.band, read.column) for read in step.read]
            for band, column in places:
                if (band.last or 0) >= self.rows or (band.first or 0) >= self.rows or column >= self.columns:
                    raise ValueError(f"step {number} looks past the screen ({self.rows} rows, {self.columns} "
                                     "columns, counted from 0)")
            found = [step.wait.pattern] if step.wait is not None and step.wait.pattern is not None else []
            found += [read.pattern for read in step.read if read.pattern is not None]
            for pattern in found:
                if reason := patterns.refused_in_loop(pattern.pattern):
                    raise ValueError(f"step {number}'s pattern {pattern.pattern!r} is too slow to match on every "
                                     f"redraw ({reason}); hint: {patterns.HINT}")


@dataclasses.dataclass(frozen=True)
class Shot:
    """The screen at one moment: its rows (redacted, trailing spaces dropped) and the runs of
    reverse video on it (row, column, text): where a menu's current item often is."""

    rows: tuple[str, ...]
    reverse: tuple[tuple[int, int, str], ...]


@dataclasses.dataclass
class Drawn:
    """What a session left: the fields read, the final screen (redacted), whether rungd
    stopped the program after its last step (``end = "kill"``), and the snapshots."""

    fields: dict[str, str]
    screen: str
    stopped: bool = False
    shots: list[Shot] = dataclasses.field(default_factory=list)


class _Emulator(pyte.Screen):  # type: ignore[misc]
    """pyte's screen, answering the terminal's own reports (cursor position, device
    attributes) on the terminal as a real one would."""

    def __init__(self, columns: int, rows: int, reply: Callable[[bytes], None]) -> None:
        super().__init__(columns, rows)
        self._reply = reply

    def write_process_input(self, data: str) -> None:
        self._reply(data.encode())


# Which values of its first parameter a handler knows; pyte fails on any other (CSI 11 K).
_KNOWN_MODES = {"erase_in_line": range(3), "erase_in_display": range(4)}


def _as_a_terminal(name: str) -> Callable[..., None]:
    """pyte's CSI handler ``name``, taking what a terminal takes: a sequence with more
    parameters than it has (``CSI 0 ; C``), a private variant it does not implement (``CSI ?
    Pm r``, xterm's restore of private modes, which mc sends as it quits: not DECSTBM) or a
    mode it does not know (``CSI 11 K``) is ignored in what it does not know, as a terminal
    ignores it, instead of raising in the middle of the program's output."""
    handler = getattr(pyte.Screen, name)
    takes = [p for p in inspect.signature(handler).parameters.values() if p.name != "self"]
    keyword = any(p.name == "private" or p.kind is p.VAR_KEYWORD for p in takes)
    many = any(p.kind is p.VAR_POSITIONAL for p in takes)
    count = sum(p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "private" for p in takes)
    known = _KNOWN_MODES.get(name)

    def dispatched(self: _Emulator, *params: int, private: bool = False) -> None:
        if private and not keyword:
            return
        if known is not None and params and params[0] not in known:
            return
        params = params if many else params[:count]
        if private:
            handler(self, *params, private=True)
        else:
            handler(self, *params)

    return dispatched


for _name in set(pyte.Stream.csi.values()):
    setattr(_Emulator, _name, _as_a_terminal(_name))


class Cast:
    """The session as an asciicast v2 file: a header line, then ``[seconds, "o"|"i", text]``
    events, capped at ``cast_bytes`` (a note beside the file says how much was not kept).

    What it records is the screen as the emulator kept it, not the program's bytes: each
    event redraws the rows that changed (and the reverse video of a current item), with
    every secret masked cell by cell. A program can draw a secret in pieces (cell by cell,
    out of order, wrapped at the margin); a byte stream would replay it whole however it was
    redacted, a masked screen cannot. What was typed is recorded as typed (redacted), a
    secret field's keys never.

    Raises (at construction):
        OSError: the state folder cannot hold it; the caller goes on without one.
    """

    def __init__(self, path: Path, screen: Screen, title: str, redactor: Redactor) -> None:
        self.path = path
        self._file: BinaryIO = open(path, "wb")
        self._start = time.monotonic()
        self._redactor = redactor
        self._cap = screen.cast_bytes
        self._shown: list[str] = [""] * screen.rows
        self.written = 0
        self.lost = 0
        header = {"version": 2, "width": screen.columns, "height": screen.rows, "timestamp": int(time.time()),
                  "env": {"TERM": screen.term}, "title": title}
        self._write(json.dumps(header).encode() + b"\n")

    def drawn(self, rows: dict[int, str], cursor: tuple[int, int]) -> None:
        """Record the screen now: the rows given (already masked, with their SGR) that changed."""
        changed = [f"\x1b[{y + 1};1H{row}\x1b[m\x1b[K" for y, row in sorted(rows.items()) if row != self._shown[y]]
        if changed:
            for y, row in rows.items():
                self._shown[y] = row
            self._event("o", "".join(changed) + f"\x1b[{cursor[0] + 1};{cursor[1] + 1}H")

    def typed(self, data: bytes) -> None:
        self._event("i", self._redactor.text(data.decode("utf-8", "replace")))

    def _event(self, kind: str, text: str) -> None:
        if text:
            line = json.dumps([round(time.monotonic() - self._start, 6), kind, text]).encode() + b"\n"
            self._write(line)

    def _write(self, line: bytes) -> None:
        if self._file.closed:
            return
        if self.written + len(line) > self._cap:
            self.lost += len(line)
            return
        try:
            self._file.write(line)
        except OSError:
            self.lost += len(line)
            return
        self.written += len(line)

    def close(self) -> None:
        if self._file.closed:
            return
        with contextlib.suppress(OSError):
            self._file.close()
        if self.lost:
            with contextlib.suppress(OSError):
                not_kept_path(self.path).write_text(json.dumps(
                    {"bytes": self.lost, "why": "the cast cap (the screen's cast_bytes), or a full disk"}))


class Session:
    """One call's screen: fed what the program draws (:meth:`take`, as an output stream),
    driven through the tool's steps (:meth:`drive`)."""

    def __init__(self, ctx: CallContext, screen: Screen, terminal: Any, redactor: Redactor,
                 cast: Cast | None, credentials: dict[str, str], waiting: Callable[[], tuple[bool, bool]],
                 exited: Callable[[], int | None]) -> None:
        self.ctx = ctx
        self._credentials = credentials  # a secret field's credential, by name
        self.spec = screen
        self.terminal = terminal
        self.redactor = redactor
        self.cast = cast
        self._waiting = waiting  # (a process waits reading the terminal, rungd may not see it)
        self._exited = exited
        self.outputs: Any = None  # streams.Outputs, set once the program runs
        self._out = bytearray()  # what is still to be typed: answers and keys, in order
        self.emulator = _Emulator(screen.columns, screen.rows, self._answer)
        self._stream = pyte.ByteStream(self.emulator)
        self._pending = bytearray()
        self._typed_at = -math.inf  # when (time.monotonic) something was last typed
        self.drawn = 0
        self.last_output = time.monotonic()
        self.answered: list[str] = []
        self.fields: dict[str, str] = {}
        self.spent = 0.0  # the emulator's CPU seconds so far
        self._slice = max(4, min(_FEED, int(_SLICE_S * 3 / (screen.rows * screen.columns * _CELL_S))))

    # -- fed by streams.Outputs, as a Stream is -------------------------------------------
    def take(self, chunk: bytes) -> None:
        self.drawn += len(chunk)
        self.last_output = time.monotonic()
        if self.drawn <= self.spec.screen_bytes:
            self._pending += chunk

    def close(self) -> None:
        if self.cast is not None:
            self.cast.close()

    async def _catch_up(self) -> None:
        """Draw what the program wrote, a slice per turn of the loop, then record the screen
        in the cast. pyte draws about 1 MB a second, and some sequences cost a whole screen
        of cells for 3 bytes (ESC # 8, ESC [ 2 J), so a slice is as many bytes as the worst
        of them may cost in a few tens of milliseconds on this screen's size: no turn of the
        loop is held long. (A worker thread would not help: pyte is Python, and the loop
        would wait for the interpreter lock at every system call.)

        Raises:
            ToolError: OUTPUT_TOO_LARGE once it drew more than the screen's cap, or cost the
                emulator more than its time.
            SurfaceChanged: the emulator could not follow what it drew.
        """
        fed = False
        while self._pending:
            piece = bytes(self._pending[:self._slice])
            del self._pending[:self._slice]
            started = time.thread_time()
            try:
                self._stream.feed(piece)
            except Exception as exc:  # noqa: BLE001 - pyte's own failure, whatever its kind
                raise SurfaceChanged(
                    f"rungd's terminal emulator could not follow what the program drew ({type(exc).__name__}); it "
                    "was stopped", hint="the program writes escape sequences the emulator does not know; try the "
                    "other term (vt100 or xterm-256color) in the tool's screen table") from None
            self.spent += time.thread_time() - started
            fed = True
            if self.spent > self.spec.emulator_s:
                raise ToolError("OUTPUT_TOO_LARGE", f"what the program drew cost the emulator more than "
                                f"{self.spec.emulator_s:g} s; it was stopped", fields={"screen": self.text()},
                                hint="a screen program redraws a little per key: this one floods its terminal; "
                                "the tool's author must find a quieter way to run it")
            if self._pending:
                await trio.lowlevel.checkpoint()
        if fed:
            if self.cast is not None:
                dirty = set(self.emulator.dirty)
                self.emulator.dirty.clear()
                self.cast.drawn(self._styled(dirty), (self.emulator.cursor.y, self.emulator.cursor.x))
            await self._flush(None)  # the emulator's answers to what it drew
        if self.drawn > self.spec.screen_bytes:
            raise ToolError("OUTPUT_TOO_LARGE",
                            f"the program drew more than {self.spec.screen_bytes} bytes on its screen; it was stopped",
                            hint="a screen program redraws a few KB per key: this one floods its terminal; the "
                            "tool's author must find a quieter way to run it", fields={"screen": self.text()})

    # -- what is on the screen -----------------------------------------------------------
    def _row(self, y: int) -> str:
        """Row ``y`` as a person reads it: a wide character once, never its second cell."""
        line, out, skip = self.emulator.buffer[y], [], False
        for x in range(self.spec.columns):
            if skip:
                skip = False
                continue
            data = line[x].data or " "
            out.append(data)
            skip = data[0] > "\u10ff" and wcwidth(data[0]) == 2  # nothing below U+1100 is wide
        return "".join(out)

    def _raw(self) -> list[str]:
        """The rows as drawn, secrets and all: what waits are matched against."""
        return [self._row(y) for y in range(self.spec.rows)]

    def rows(self) -> list[str]:
        """The rows with every secret masked cell by cell, also one the right margin wrapped
        onto the next row (the rows are joined as the terminal fills them, then split)."""
        rows = self._raw()
        flat = "".join(rows)
        spans = self.redactor.char_spans(flat)
        if not spans:
            return rows
        cells = list(flat)
        for start, end in spans:
            cells[start:end] = "*" * (end - start)
        masked, at = [], 0
        for row in rows:
            masked.append("".join(cells[at:at + len(row)]))
            at += len(row)
        return masked

    def _styled(self, dirty: set[int]) -> dict[int, str]:
        """The ``dirty`` rows, masked, with the reverse video a current item is marked by,
        for the cast. Without a secret to mask only they are rendered; with one, the whole
        screen (a secret may wrap from a row that did not change)."""
        masked = self.rows() if self.redactor.active else None
        styled = {}
        for y in sorted(dirty):
            if not 0 <= y < self.spec.rows:
                continue
            row = masked[y] if masked is not None else self._row(y)
            if len(row) != self.spec.columns:  # a wide character: columns and characters differ
                styled[y] = row.rstrip()
                continue
            line, out, on = self.emulator.buffer[y], [], False
            for x, char in enumerate(row.rstrip()):
                if line[x].reverse != on:
                    on = line[x].reverse
                    out.append("\x1b[7m" if on else "\x1b[27m")
                out.append(char)
            styled[y] = "".join(out)
        return styled

    def text(self, limit: int = QUOTE_CHARS) -> str:
        """The screen as a person reads it: rows without trailing spaces, blank rows at the
        top and bottom left out, secrets masked, at most ``limit`` characters (the top kept).
        Never raises: it is what every error and the evidence quote."""
        try:
            rows = [row.rstrip() for row in self.rows()]
        except Exception:  # noqa: BLE001 - an emulator in a state it cannot render
            return "(the screen could not be rendered)"
        while rows and not rows[-1]:
            rows.pop()
        while rows and not rows[0]:
            rows.pop(0)
        text = "\n".join(rows)
        if len(text) <= limit:
            return text
        return text[:limit] + f"\n[cut at {limit} characters: the whole screen is the call's .screen evidence]"

    def shot(self) -> Shot:
        masked = self.rows()
        runs = []
        for y in range(self.spec.rows):
            line, x = self.emulator.buffer[y], 0
            while x < self.spec.columns:
                if line[x].reverse:
                    start = x
                    while x < self.spec.columns and line[x].reverse:
                        x += 1
                    text = self._cells(masked[y], y, start, x).strip()
                    if text:
                        runs.append((y, start, text))
                x += 1
        return Shot(tuple(row.rstrip() for row in masked), tuple(runs))

    def _cells(self, masked: str, y: int, start: int, end: int) -> str:
        """Columns ``start`` to ``end`` of row ``y``, secrets masked (as ``masked`` has them)."""
        if len(masked) == self.spec.columns:
            return masked[start:end]
        # A wide character makes characters and columns differ: redact the cells' own text.
        return self.redactor.text("".join(self.emulator.buffer[y][x].data for x in range(start, end)))

    def shows(self, wait: Wait) -> bool:
        found = self._find(wait)
        return not found if wait.absent else found

    def _find(self, wait: Wait) -> bool:
        for row in wait.band.rows(self.spec.rows):  # only the band's rows are rendered
            line = self._row(row)
            for start in self._starts(wait, line):
                if wait.attribute is None or self._has(row, start, wait.attribute):
                    return True
        return False

    @staticmethod
    def _starts(wait: Wait, line: str) -> list[int]:
        if wait.text is not None:
            if wait.column is not None:
                return [wait.column] if line.startswith(wait.text, wait.column) else []
            return [m.start() for m in re.finditer(re.escape(wait.text), line)]
        assert wait.pattern is not None
        if wait.column is not None:
            return [wait.column] if wait.pattern.match(line, wait.column) else []
        return [m.start() for m in wait.pattern.finditer(line)]

    def _run(self, masked: str, row: int, column: int, attribute: str) -> str:
        """The text of the first run of cells with ``attribute`` on ``row`` from ``column``,
        stripped, secrets masked."""
        x = column
        while x < self.spec.columns and not self._has(row, x, attribute):
            x += 1
        start = x
        while x < self.spec.columns and self._has(row, x, attribute):
            x += 1
        return self._cells(masked, row, start, x).strip()

    def _has(self, row: int, column: int, attribute: str) -> bool:
        cell = self.emulator.buffer[row][column]
        if attribute.startswith(("fg:", "bg:")):
            return getattr(cell, attribute[:2]) == attribute[3:]
        return bool(getattr(cell, attribute, False))

    def read(self, field: Read) -> str:
        """The field's text, secrets masked.

        Raises:
            SurfaceChanged: a pattern matches no row of its band (nothing has the attribute).
        """
        display = self.rows()
        rows = field.band.rows(self.spec.rows)
        if field.attribute is not None:
            for row in rows:
                run = self._run(display[row], row, field.column, field.attribute)
                if run:
                    return run
            raise self._missing(field, f"nothing {field.band.said()} is {field.attribute}")
        if field.pattern is None:
            line = display[rows[0]] if rows else ""
            end = None if field.width is None else field.column + field.width
            return self.redactor.text(line[field.column:end].strip())
        for row in rows:
            if (match := field.pattern.search(display[row], field.column)) is not None:
                value = match.group(1) if match.re.groups else match.group(0)
                return self.redactor.text((value or "").strip())
        raise self._missing(field, f"/{field.pattern.pattern}/ matches nothing {field.band.said()}")

    def _missing(self, field: Read, why: str) -> SurfaceChanged:
        return SurfaceChanged(f"the field {field.name} is not on the screen: {why}",
                              hint="the program's screen changed; the tool's author must check the step's read "
                              "(rungctl probe --screen shows the screens)", fields={"screen": self.text()})

    # -- the steps ---------------------------------------------------------------------
    async def drive(self) -> Drawn:
        """Walk the steps; returns what they read once the last is done (and, with ``end =
        "exit"``, once the program exited).

        Raises:
            SurfaceChanged: a step's state did not appear in time, or a field was missing.
            Failed: the program exited before a step's state appeared, or did not take what a
                step typed.
            ToolError: OUTPUT_TOO_LARGE, it flooded its screen.

        Cancellation: stops at once; the caller kills the tree.
        """
        shots: list[Shot] = []
        for number, step in enumerate(self.spec.steps, 1):
            until = trio.current_time() + step.timeout_s
            if step.wait is not None:
                await self._until(step.wait, until, number)
            if step.read or step.types or self.spec.snapshots:
                await self._ready(until)
            if self.spec.snapshots:
                shots.append(self.shot())
            for field in step.read:
                self.fields[field.name] = self.read(field)
            if step.types:
                await self._type(step, number, until)
        if self.spec.end == "kill":
            if self.spec.snapshots:
                await self._ready(trio.current_time() + 5)
                shots.append(self.shot())
            if self._exited() is not None:
                await self.outputs.drain(0.2)  # it ended by itself: its answer descriptor, to its end
            await self._catch_up()
            # Stopped by rungd only if it still runs: an exit of its own is judged as any exit.
            return Drawn(self.fields, self.text(limit=1 << 20), stopped=self._exited() is None, shots=shots)
        # Until just before the call's deadline, to say why: a deadline after the last step is
        # a program the steps did not make exit.
        while self._exited() is None:
            left = self.ctx.deadline - 0.1 - trio.current_time()
            if left <= 0:
                raise ToolTimeout(
                    "every step was done, but the program did not exit before the call's deadline; the screen shows "
                    "something else than an exit (quoted in the screen field)",
                    hint="a read that has its fields ends with end = \"kill\" in [tools.NAME.screen]; a write's last "
                    "step must press what makes the program exit; the settle read tells what it did",
                    fields={"screen": self.text()})
            await self.outputs.wait(min(left, 0.25))
            await self._catch_up()
        await self.outputs.drain(0.2)  # its answer descriptor, to its end
        await self._catch_up()
        return Drawn(self.fields, self.text(limit=1 << 20))

    async def _until(self, wait: Wait, until: float, number: int) -> None:
        while True:
            await self._catch_up()
            if self.shows(wait):
                return
            status = self._exited()
            if status is not None:
                self.outputs.take()  # its last words on the screen
                await self._catch_up()
                if self.shows(wait):
                    return
                raise Failed(f"the program exited (status {status}) at step {number}, before the screen showed "
                             f"{wait.said()}", hint="the screen it left is quoted in the screen field; the "
                             "read-back or settle read tells what it did", fields={"screen": self.text(),
                                                                                     "step": number})
            now, last = trio.current_time(), self.ctx.deadline - 0.1  # the call's end, less a moment to say why
            if now >= until and until < last:
                raise SurfaceChanged(
                    f"step {number} waited for {wait.said()}, which did not appear; the screen shows something "
                    "else (quoted in the screen field)",
                    hint="the program's screen changed, or it showed a dialog the tool does not expect; the tool's "
                    "author must check the steps against it (rungctl probe --screen)",
                    fields={"screen": self.text(), "step": number})
            if now >= last:
                raise ToolTimeout(f"the call's deadline came while step {number} waited for {wait.said()}; the "
                                  "screen shows something else (quoted in the screen field)",
                                  hint="the program may be slow or its screen changed; the tool's author must give "
                                  "the tool a longer deadline_s or check the step (rungctl probe --screen)",
                                  fields={"screen": self.text(), "step": number})
            left = min(until, last) - now
            await self.outputs.wait(min(left, 0.25))

    async def _ready(self, until: float) -> None:
        """Wait until the program has drawn what it will and waits for keys: the kernel shows
        a process of the call blocked reading the terminal with nothing typed left unread
        (or, where rungd may not look, its output paused a moment), its output has been
        quiet a while, it exited, or the step's time is up (keys are typed ahead, as a
        person would)."""
        interval = 0.005
        while trio.current_time() < until and self._exited() is None:
            await self._catch_up()
            reading, hidden = self._waiting()
            if self.terminal.unread() or time.monotonic() - self._typed_at < _TYPED_S:
                # Still blocked in the read that what we typed is about to end (or will, once
                # the kernel has moved it across): not ready yet.
                reading = hidden = False
            quiet = time.monotonic() - self.last_output
            # Blocked reading its terminal; or, where rungd may not look, quiet a moment; or
            # quiet a while, whatever it does (a program that draws, then sleeps or works).
            if reading or (hidden and quiet >= _QUIET_S) or quiet >= _SETTLED_S:
                self.outputs.take()  # drawn in the same instant it blocked: seen before we type
                if not self._pending:
                    return
                continue
            if await self.outputs.wait(interval):
                interval = 0.005  # it drew: look again soon
            else:
                interval = min(interval * 2, 0.05)  # busy and quiet: look less often
        await self._catch_up()

    async def _type(self, step: Step, number: int, until: float) -> None:
        """Type the step's text, credential and keys, each whole, after what is still queued
        (the emulator's answers); a step whose keys the program does not take in time (its
        terminal's input full) fails, never counted as typed.

        Raises:
            Failed: not all of it was taken by the step's end.
        """
        if step.commit:
            # The gate passed before the program started: this is the call's one committing key.
            if self.ctx.tool.timing.commit_point == "confirmation":
                self.ctx.mark_committed()
        if step.text is not None:
            data = step.text.encode()
            if self.cast is not None:
                self.cast.typed(data)
            self._out += data
        if step.credential is not None:
            # Looked up before the program started, and redacted from everything since.
            self._out += self._credentials[step.credential].encode()  # never in the cast
        keypad = (1 << 5) in self.emulator.mode  # DECCKM, as pyte keeps a private mode
        for name in step.keys:
            data = keymap.key(self.spec.term, name).sent(keypad)
            if self.cast is not None:
                self.cast.typed(data)
            self._out += data
        if not await self._flush(max(until, trio.current_time() + 1.0)):
            raise Failed(f"the program did not take what step {number} types: its terminal's input stayed full "
                         "(it reads no keys) or it closed its terminal", fields={"screen": self.text(), "step": number},
                         hint="the read-back or settle read tells what it did; the tool's author must check the "
                         "step against the program's screens (rungctl probe --screen)")
        if step.commit:
            self.answered.append(f"screen commit at step {number}")
        if step.credential is not None:
            self.answered.append(f"screen credential {step.credential} at step {number}")

    def _answer(self, data: bytes) -> None:
        """The emulator's answer to a query of the program's (cursor position...): queued,
        and typed whole, in order with the steps' keys."""
        self._out += data

    async def _flush(self, until: float | None) -> bool:
        """Type what is queued: with ``until``, all of it, waiting while the terminal's input
        is full; without, what the terminal takes now (the rest later, never cut). False
        when it could not all be typed (the time is up, or the terminal is closed)."""
        while self._out:
            taken = self.terminal.write_some(bytes(self._out))
            if taken < 0:
                return False
            if taken:
                self._typed_at = time.monotonic()
            del self._out[:taken]
            if not self._out or until is None:
                break
            if trio.current_time() >= until:
                return False
            with trio.move_on_at(until):
                await trio.lowlevel.wait_writable(self.terminal.master)
        return not self._out or until is None

