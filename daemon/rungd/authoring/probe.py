"""``rungctl probe``: the evidence about a program, offered to its author before a tool file exists.

A plugin author's first step used to be a guess from a man page: does it ask, where, for what,
and does it act before it asks? :func:`probe` runs the program once as a call would (the
daemon's terminal as its controlling terminal, stdin owned and silent, a deadline and a kill of
its whole tree) with nothing answered but what the author passes with ``answers``, and reports
what the runner saw: the question with its exact text, where it was asked (stdout or stderr
for a question on stdin, the terminal, askpass) and the terminal's echo; the exit status; the
shape of the output; and, with a ``read`` command run before and after, whether the program
changed something before its first question. :meth:`Probe.draft` turns that into a tool file
with the question declared, its FILL IN placeholders left for the author.

The program runs for real, as the user running ``rungctl``: probe a write against something
that may change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from rungd import runner
from rungd.core.contract import CallContext, Caller, Description, Result, Timing, Tool, ToolInputs
from rungd.core.errors import RungdError

_NAME = re.compile(r"[^a-z0-9]+")


class _NoInputs(ToolInputs):
    pass


async def _nothing(ctx: Any, inputs: Any) -> Result:  # pragma: no cover - never called: probe runs no tool
    return Result()


@dataclasses.dataclass
class Probe:
    """What one run of a program showed."""

    argv: list[str]
    ended: str  # "exited", "asked", "deadline", "failed" (it could not be started or was refused)
    elapsed_ms: int
    exit_status: int | None = None
    question: str = ""
    asked_on: str = ""  # "stdin", "terminal" or "askpass"
    echo: str = ""  # on the terminal: "off" (a secret), "on" (a question), "keys" (one key at a time)
    code: str = ""  # the error code a call would return
    message: str = ""
    stdout: str = ""
    stderr: str = ""
    terminal: str = ""
    answered: list[str] = dataclasses.field(default_factory=list)
    read_before: str | None = None
    read_after: str | None = None
    user: str | None = None  # the account it ran as (--user), else the caller's
    # A screen program (--screen): what was sent, one step each, and the screen before each
    # and at the end: {"rows": [...], "reverse": [[row, column, text], ...]}.
    screen: ScreenProbe | None = None
    sends: list[str] = dataclasses.field(default_factory=list)
    screens: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def acted_before_asking(self) -> bool | None:
        """Whether the read changed over the run (None without a read)."""
        if self.read_before is None or self.read_after is None:
            return None
        return self.read_before != self.read_after

    def as_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["acted_before_asking"] = self.acted_before_asking
        found["output_shape"] = output_shape(self.stdout)
        return found

    def report(self) -> list[str]:
        """What it saw, for a person: one fact a line."""
        lines = [f"ran:      {' '.join(self.argv)}  ({self.elapsed_ms} ms)",
                 "in:       a new folder of its own, as a call's program is: a relative path in its argv "
                 "reaches nothing there (name files by their full path)"]
        if self.screen is not None:
            return lines + self._screen_report()
        if self.ended == "asked":
            where = {"stdin": "on stdin (printed on stdout or stderr)", "terminal": "on its terminal (/dev/tty)",
                     "askpass": "through askpass"}.get(self.asked_on, self.asked_on)
            lines.append(f"asked:    {where}; a call would end {self.code}")
            if self.echo:
                lines.append(f"echo:     {self.echo}" + {"off": " (a secret: declare a credential_prompt)",
                                                         "on": " (a question: declare a confirm, or avoid it by an "
                                                               "argument)",
                                                         "keys": " (it reads keys one at a time: a screen program)"
                                                         }.get(self.echo, ""))
            lines += ["question:", *(f"  | {line}" for line in self.question.splitlines())]
        elif self.ended == "exited":
            lines.append(f"exited:   status {self.exit_status}, "
                         + ("asking nothing more" if self.answered else "asking nothing"))
        elif self.ended == "deadline":
            lines.append("deadline: it neither asked nor exited in time (busy, waiting on something other than its "
                         "stdin or terminal, or asking in a process rungd may not look into: a setuid program probed "
                         "by a user other than root; probe as root to see it ask); its whole tree was killed")
        else:
            lines.append(f"failed:   {self.code}: {self.message}")
        for pattern, times in _answered(self.answered).items():
            lines.append(f"answered: {pattern} (by --answer{f', {times} times' if times > 1 else ''})")
        if self.acted_before_asking is not None:
            if self.ended == "asked":
                lines.append("read:     " + ("CHANGED before the question: the program acts before it asks (a write; "
                                             "its settle read decides an interrupted call)" if self.acted_before_asking
                                             else "unchanged up to the question"))
            else:
                lines.append("read:     " + ("changed" if self.acted_before_asking else "unchanged"))
        for name in ("stdout", "stderr", "terminal"):
            text = getattr(self, name)
            if text:
                shown = text.splitlines()
                lines.append(f"{name + ':':<9} {len(shown)} line(s)" + (f", {output_shape(text)}" if name == "stdout"
                                                                         else ""))
                lines += [f"  | {line}" for line in shown[:8]]
                if len(shown) > 8:
                    lines.append(f"  | ... {len(shown) - 8} more")
        return lines

    def _screen_report(self) -> list[str]:
        assert self.screen is not None
        lines = [f"screen:   {self.screen.rows}x{self.screen.columns}, TERM={self.screen.term}"]
        if self.ended == "failed":
            lines.append(f"failed:   {self.code}: {self.message}")
        ruler = "".join(str(c // 10 % 10) if c % 10 == 0 else " " for c in range(self.screen.columns))
        for number, shot in enumerate(self.screens):
            sent = (f"before --send {self.sends[number]}" if number < len(self.sends)
                    else "at the end" if self.sends else "as drawn")
            lines += ["", f"screen {number + 1} ({sent}):", f"     {ruler.rstrip()}"]
            # Rows holding nothing but the frame drawn around a window are left out.
            lines += [f"  {row:>2} {text}" for row, text in enumerate(shot["rows"]) if _FRAME.sub("", text).strip()
                      or row in (0, len(shot["rows"]) - 1) and text.strip()]
            for row, column, text in shot["reverse"]:
                lines.append(f"  reverse video: row {row}, column {column}: {text!r}")
        if self.ended == "exited":
            lines += ["", f"exited:   status {self.exit_status} before the last screen"]
        if self.screen.output_fd is not None:
            shown = self.stdout.splitlines()
            lines += ["", f"fd {self.screen.output_fd}:     {len(shown)} line(s)", *(f"  | {line}" for line in shown[:8])]
        return lines

    def _system(self) -> str:
        system = _NAME.sub("", os.path.basename(self.argv[0]).lower())[:20] or "program"
        return system if system[0].isalpha() else "p" + system[:19]

    def _screen_draft(self) -> str:
        """A screen tool drafted from the screens seen: a wait on what each screen showed
        first that the one before did not, the send that followed, and a read to fill in."""
        assert self.screen is not None
        system = self._system()
        write = any(send.startswith("text:") for send in self.sends)
        name = f"{system}_item_{'change' if write else 'show'}"
        tool = f"tools.{name}"
        out = [f"# Drafted by `rungctl probe --screen` from one run of: {' '.join(self.argv)}",
               "# Each step waits for what its screen showed that the one before did not; check each wait",
               "# (prefer text a later screen will not also show), replace each FILL IN, rename the tool as",
               "# <system>_<object>_<verb>; then `rungctl lint` and `rungctl check`.",
               "", "[program]", f"name = {_toml(system)}", f"command = {_toml(self.argv[0])}", "",
               f"[{tool}]", f"side_effect = {_toml('reversible' if write else 'read')}", 'terminal = "screen"',
               f"argv = [{', '.join(_toml(a) for a in self.argv[1:])}]"]
        if write:
            out.append('commit_point = "confirmation"')
        out += ["", f"[{tool}.description]", *(f'{slot} = "FILL IN"' for slot in
                                                 ("does", "use_when", "do_not_use_when", "returns", "on_error",
                                                  "if_unknown"))]
        out += ["", f"[{tool}.screen]"]
        if (self.screen.rows, self.screen.columns) != (24, 80):
            out += [f"rows = {self.screen.rows}", f"columns = {self.screen.columns}"]
        if self.screen.term != "xterm-256color":
            out.append(f"term = {_toml(self.screen.term)}")
        if not write:
            out.append('end = "kill"  # a read stops the program once it has its fields')
        if self.screen.output_fd is not None:
            out.append(f"output_fd = {self.screen.output_fd}  # its answer, parsed by [{tool}.parse]")
        previous: list[str] = []
        marked_before: list[Any] = []
        for number, shot in enumerate(self.screens):
            rows = list(shot["rows"])
            out += ["", f"[[{tool}.screen.steps]]"]
            found = _distinctive(rows, previous)
            marked = [r for r in shot["reverse"] if r not in marked_before]
            if marked and (found is None or rows == previous):
                # Only the current item moved: wait for it where it now is.
                row, column, text = marked[0]
                out.append(f"wait = {{ text = {_toml(text)}, row = {row}, attribute = \"reverse\" }}  "
                           "# the current item, marked by reverse video")
            elif found is not None:
                row, column, text = found
                out.append(f"wait = {{ text = {_toml(text)}, row = {row}, column = {column} }}")
                for row, column, text in marked[:1]:
                    out.append(f"# row {row} shows {text!r} in reverse video (a current item?): "
                               f"wait = {{ text = {_toml(text)}, row = {row}, attribute = \"reverse\" }}")
            else:
                out.append("# FILL IN: a wait; this screen showed nothing the one before did not")
            marked_before = list(shot["reverse"])
            if number < len(self.sends):
                send = self.sends[number]
                if send.startswith("text:"):
                    out.append('type = "FILL IN: a literal, or {input}"  # the probe typed ' + _toml(send[5:]))
                else:
                    out.append(f"keys = [{_toml(send)}]")
                if write and number == len(self.sends) - 1:
                    out.append("commit = true  # FILL IN: mark the one step whose keys commit the change")
            else:
                out.append('read.FILL_IN = { row = 0, column = 0, width = 10 }  # a field this screen shows')
            previous = rows
        if self.screen.output_fd is not None:
            out += ["", f"[{tool}.parse]", f"kind = {_toml(_parse_kind(self.stdout))}"]
        if write:
            out += ["", "# A write needs a read-back: a read tool of this file and what it shows after the change.",
                    f"[{tool}.verify]", 'tool = "FILL IN: a read tool of this file"']
        return "\n".join(out) + "\n"

    def draft(self) -> str:
        """A tool file for the program with what this run saw declared; FILL IN where only the
        author can say (check-config and lint refuse the file until each is replaced)."""
        if self.screen is not None:
            return self._screen_draft()
        system = self._system()
        # A question it asks, answered, lets it act: a read may answer none (the file would not load).
        write = bool(self.acted_before_asking) or bool(self.answered) or (
            self.ended == "asked" and self.echo != "off" and self.code == "PROMPT_UNEXPECTED")
        name = f"{system}_item_{'change' if write else 'show'}"
        tool = f"tools.{name}"
        out = [f"# Drafted by `rungctl probe` from one run of: {' '.join(self.argv)}",
               f"# It {self._summary()}.",
               "# Check every line; replace each FILL IN (the file does not load until you do); rename the tool",
               "# as <system>_<object>_<verb>; then `rungctl lint` and `rungctl check`.",
               "", "[program]", f"name = {_toml(system)}", f"command = {_toml(self.argv[0])}", "",
               f"[{tool}]", f"side_effect = {_toml('reversible' if write else 'read')}",
               *([f"user = {_toml(self.user)}"] if self.user else []),
               f"argv = [{', '.join(_toml(a) for a in self.argv[1:])}]"]
        for pattern, times in _answered(self.answered).items():  # what --answer typed: questions it asks
            out += ["", "# Answered during the probe by --answer. If it asked for a secret (echo off), declare it as",
                    "# a credential_prompt instead, answered from rungd's store.",
                    f"[[{tool}.confirm]]", f"pattern = {_toml(pattern)}", 'answer = "FILL IN"']
            if times > 1:
                out.append(f"times = {times}")
        if self.ended == "asked" and self.question:
            prompt = self.question.splitlines()[-1].strip()
            pattern = "^" + re.escape(prompt).replace("\\ ", " ")  # a space needs no escape
            if self.echo == "off" or self.code == "AUTH_REQUIRED":
                table = "askpass" if self.asked_on == "askpass" else "credential_prompt"
                out += ["", f"# Asked {_WHERE.get(self.asked_on, 'on stdin')}" + (", echo off" if self.echo == "off" else "")
                        + ": answered with a credential from rungd's store.",
                        f"[[{tool}.{table}]]", f"pattern = {_toml(pattern)}",
                        f"credential = {_toml(system + '_secret')}"]
            elif self.echo == "keys":
                out += ["", "# It reads keys one at a time on its terminal (a screen program): find a batch mode,",
                        "# or an argument that skips the question."]
            else:
                out += ["", f"# Asked {_WHERE.get(self.asked_on, 'on stdin')}: answered only for a call that passed its "
                        "gate.",
                        "# Better: an argument that skips the question, if the program has one.",
                        f"[[{tool}.confirm]]", f"pattern = {_toml(pattern)}", 'answer = "FILL IN"']
        out += ["", f"[{tool}.description]", *(f'{slot} = "FILL IN"' for slot in
                                               ("does", "use_when", "do_not_use_when", "returns", "on_error",
                                                "if_unknown"))]
        kind = _parse_kind(self.stdout)
        out += ["", f"[{tool}.parse]", f"kind = {_toml(kind)}"]
        if kind == "regex":
            out.append('pattern = "FILL IN: a named group per field"')
        if write:
            out += ["", "# A write needs a read-back: a read tool of this file and what it shows after the change.",
                    f"[{tool}.verify]", 'tool = "FILL IN: a read tool of this file"']
        return "\n".join(out) + "\n"

    def _summary(self) -> str:
        if self.answered:
            return f"asked {len(self.answered)} question(s) answered by --answer, then {self._end()}"
        return self._end()

    def _end(self) -> str:
        if self.ended == "asked":
            echo = f", echo {self.echo}" if self.echo else ""
            return f"asked {_WHERE.get(self.asked_on, self.asked_on)}{echo} after {self.elapsed_ms} ms"
        if self.ended == "exited":
            return f"exited {self.exit_status} without asking"
        if self.ended == "deadline":
            return "neither asked nor exited before the deadline"
        return f"could not be run ({self.code})"


_WHERE = {"stdin": "on stdin", "terminal": "on its terminal", "askpass": "through askpass"}


@dataclasses.dataclass(frozen=True)
class ScreenProbe:
    """A probe of a screen program: its terminal, and what to send, one step each (a key
    name, or ``text:WORDS`` to type)."""

    sends: tuple[str, ...] = ()
    rows: int = 24
    columns: int = 80
    term: str = "xterm-256color"
    output_fd: int | None = None  # a descriptor it writes its answer to (dialog --output-fd)

    def steps(self) -> tuple[runner.Step, ...]:
        return tuple(runner.Step(text=send[5:]) if send.startswith("text:") else runner.Step(keys=(send,))
                     for send in self.sends)


_FRAME = re.compile(r"[\u2500-\u257f|+\-=_]{2,}|[\u2500-\u257f]")


def _distinctive(rows: list[str], previous: list[str]) -> tuple[int, int, str] | None:
    """The first text a screen shows that the one before did not, as (row, column, text):
    a row's words without the frame drawn around them."""
    for row, line in enumerate(rows):
        before = previous[row] if row < len(previous) else ""
        if line == before or not line.strip():
            continue
        for part in _FRAME.split(line):
            text = part.strip()
            if len(text) >= 3 and text not in before:
                return row, line.index(text), text
    return None


def _answered(labels: list[str]) -> dict[str, int]:
    """The --answer patterns the run used, each with how often (the runner's labels)."""
    counts: dict[str, int] = {}
    for label in labels:
        pattern = label.removeprefix("confirmation ")
        counts[pattern] = counts.get(pattern, 0) + 1
    return counts


def _toml(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text, ensure_ascii=False)


def output_shape(text: str) -> str:
    """What the output looks like, in words: what ``parse.kind`` would read it."""
    kind = _parse_kind(text)
    return {"none": "nothing", "json": "one JSON object", "key_value": "KEY: VALUE lines",
            "columns": "a table under a header line", "lines": "plain lines", "regex": "free text"}[kind]


def _parse_kind(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return "none"
    try:
        if isinstance(json.loads(text), dict):
            return "json"
    except ValueError:
        pass
    if all(re.match(r"^\s*[\w .-]+:\s", line + " ") for line in lines):
        return "key_value"
    widths = {len(line.split()) for line in lines}
    if len(lines) > 1 and len(widths) == 1 and widths.pop() > 1 and lines[0].split()[0].isupper():
        return "columns"
    return "lines"


def _context(folder: Path, name: str, side_effect: str, deadline_s: float) -> CallContext:
    call_id = "c" + os.urandom(8).hex()
    tool = Tool(name=name, inputs=_NoInputs, outputs={}, handler=_nothing, side_effect=side_effect,  # type: ignore[arg-type]
                description=Description(does="Probes a program.", use_when="probing.", do_not_use_when="not.",
                                        returns="what it saw.", on_error="codes.", if_unknown="ask."),
                timing=Timing(deadline_s=deadline_s))
    (folder / "evidence").mkdir(exist_ok=True)
    return CallContext(call_id=call_id, tool=tool, caller=Caller(os.getuid(), os.getgid(), os.getpid()),
                       request_id=None, deadline=trio.current_time() + deadline_s, work_dir=folder / "work" / call_id,
                       evidence_dir=folder / "evidence")


async def _read(folder: Path, argv: list[str], deadline_s: float) -> str:
    """The read's output (and how it ended, when it did not end well): compared before and after."""
    ctx = _context(folder, "probe_read", "read", deadline_s)
    try:
        with trio.fail_after(deadline_s):
            done = await runner.run(ctx, runner.Program(argv=tuple(argv), stdin="eof", commits=False))
    except trio.TooSlowError:
        return "(the read did not finish in time)"
    except RungdError as exc:
        return f"(the read failed: {exc.code}: {exc.message})"
    return f"status {done.exit_status}\n{done.stdout}"


def probe(argv: list[str], *, deadline_s: float = 10.0, read: list[str] | None = None,
          answers: list[tuple[str, str]] = (), stdin: str = "none", terminal: str = "line",  # type: ignore[assignment]
          user: str | None = None, screen: ScreenProbe | None = None) -> Probe:
    """Run ``argv`` once as a call would and say what it showed.

    Args:
        read: a program (argv) run before and after, whose output tells whether ``argv``
            changed something before its first question.
        answers: (pattern, answer) pairs typed only for a question a pattern matches, as a
            tool's ``confirm`` would (to see what the program asks next).
        stdin: "none" (open and silent) or "eof" (closed at once).
        terminal: "line" (the daemon's terminal) or "none".
        user: the account to run it as (a tool's ``user =``); needs root, as the daemon does.
        screen: run it as a screen program, sending what it says one step each, and keep
            the screen before each step and at the end.

    Raises:
        ValueError: a key name the terminal type does not have, or a bad pattern.
    """
    if screen is not None:
        runner.Screen(steps=screen.steps(), term=screen.term, rows=screen.rows, columns=screen.columns).check()
    return trio.run(_probe, argv, deadline_s, read, list(answers), stdin, terminal, user, screen)


async def _probe(argv: list[str], deadline_s: float, read: list[str] | None, answers: list[tuple[str, str]],
                 stdin: str, terminal: str, user: str | None, screen: ScreenProbe | None = None) -> Probe:
    with tempfile.TemporaryDirectory(prefix="rungd-probe-") as scratch:
        folder = Path(scratch)
        if user is not None:
            folder.chmod(0o711)  # the account passes through to the private folder made for it
        before = await _read(folder, read, deadline_s) if read else None
        confirmations = tuple(runner.Confirmation(re.compile(pattern), answer, times=10) for pattern, answer in answers)
        if screen is not None:
            program = runner.Program(argv=tuple(argv), terminal="screen", user=user, screen=runner.Screen(
                steps=screen.steps(), rows=screen.rows, columns=screen.columns, term=screen.term, end="kill",
                snapshots=True, output_fd=screen.output_fd))
        else:
            program = runner.Program(argv=tuple(argv), stdin=stdin, confirmations=confirmations,  # type: ignore[arg-type]
                                     terminal=terminal, user=user)  # type: ignore[arg-type]
        writes = bool(answers) or (screen is not None and bool(screen.sends))
        ctx = _context(folder, "probe_program_run", "reversible" if writes else "read", deadline_s)
        started = time.monotonic()
        seen = Probe(argv=list(argv), ended="deadline", elapsed_ms=0, user=user, screen=screen,
                     sends=list(screen.sends) if screen else [])
        try:
            with trio.move_on_after(deadline_s):
                done = await runner.run(ctx, program)
                seen.ended, seen.exit_status = "exited", done.exit_status
                seen.stdout, seen.stderr, seen.terminal, seen.answered = (done.stdout, done.stderr, done.terminal,
                                                                          list(done.answered))
                seen.screens = [{"rows": list(shot.rows), "reverse": [list(r) for r in shot.reverse]}
                                for shot in done.shots]
                if done.stopped:
                    seen.ended = "stopped"  # rungd stopped it after the last screen
        except RungdError as exc:
            fields = exc.fields or {}
            asked = exc.code in ("PROMPT_UNEXPECTED", "AUTH_REQUIRED") and "question" in fields
            seen.ended = "asked" if asked else "failed"
            seen.code, seen.message = exc.code, exc.message
            seen.question = str(fields.get("question", ""))
            seen.asked_on, seen.echo = str(fields.get("asked_on", "")), str(fields.get("echo", ""))
        if seen.ended != "exited":
            seen.answered = list(ctx.answered)
            # What it printed up to its question, or the deadline, is in the call's evidence
            # (redacted, as kept).
            for label in ("stdout", "stderr", "terminal"):
                for path in sorted((folder / "evidence").glob(f"{ctx.call_id}.*.{label}")):
                    setattr(seen, label, path.read_text(encoding="utf-8", errors="replace"))
        seen.elapsed_ms = int((time.monotonic() - started) * 1000)
        if read:
            seen.read_before, seen.read_after = before, await _read(folder, read, deadline_s)
        return seen
