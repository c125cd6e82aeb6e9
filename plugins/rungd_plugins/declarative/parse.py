"""Turning a program's stdout into typed fields, or saying exactly why it no longer can.

Nothing an operator writes in a tool file and nothing a program prints may hold the event
loop or outlive the call: a regular expression that can backtrack catastrophically is
refused when the tool file loads (``check_patterns``, with the file and key) and again
before it is used (``parse_output``), and ``parse_off_loop`` bounds the rest in time. A
regular expression runs in a short-lived child process killed at the bound: Python's
``re`` holds the GIL while it backtracks (measured: a polynomial pattern on 6,000
characters froze every other thread, the event loop included), so a worker thread would
not keep the loop free. The other parsers are linear and run in a worker thread.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
from rungd.sdk import PATTERN_HINT as HINT
from rungd.sdk import Completed, ConfigError, Failed, SurfaceChanged
from rungd.sdk import catastrophic_pattern as catastrophic
from rungd.sdk import polynomial_pattern
from rungd.sdk import refused_pattern as refused

from rungd_plugins.declarative.schema import FieldType, ParseSpec, ToolSpec

PARSE_S = 5.0  # a parse of capped output takes milliseconds; this is for a pattern gone wrong
PARSE_THREADS = 4
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("rungd.declarative.parse")


def check_pattern(path: Path, key: str, pattern: str, *, in_loop: bool = False) -> None:
    """Refuse a tool file's regular expression that is invalid or can backtrack catastrophically.

    Args:
        path: the tool file, for the message.
        key: where the pattern sits, e.g. ``tools.disk_usage_show.parse.pattern``.
        in_loop: it is matched in the event loop, on every redraw (a screen's waits and
            reads): a pattern whose time grows as a power of a row's length is refused too.

    Raises:
        ConfigError: ``<file>: key <key>: <why>; hint: <how to rewrite it>``.
    """
    try:
        slow = polynomial_pattern(pattern) if in_loop else None
        if slow:
            raise ConfigError(f"{path}: key {key}: {pattern!r} is too slow for a screen, matched against every row "
                              f"on every redraw ({slow}); hint: {HINT}")
        reason = catastrophic(pattern)
    except re.error as exc:
        raise ConfigError(f"{path}: key {key}: not a valid regular expression: {exc}") from None
    if reason:
        raise ConfigError(f"{path}: key {key}: {pattern!r} can backtrack catastrophically ({reason}), "
                          f"so output a program prints could hold the daemon for minutes; hint: {HINT}")


def check_patterns(path: Path, key: str, spec: ToolSpec) -> None:
    """``check_pattern`` on every regular expression one tool of a tool file declares.

    Args:
        key: the tool's key, e.g. ``tools.disk_usage_show``.

    Raises:
        ConfigError: naming the file and the full key of the first pattern refused.
    """
    found = [("parse.pattern", spec.parse.pattern)]
    found += [(f"confirm[{i}].pattern", c.pattern) for i, c in enumerate(spec.confirm)]
    found += [(f"credential_prompt[{i}].pattern", c.pattern) for i, c in enumerate(spec.credential_prompt)]
    found += [(f"askpass[{i}].pattern", c.pattern) for i, c in enumerate(spec.askpass)]
    if spec.export is not None:
        found.append(("export.as_of_pattern", spec.export.as_of_pattern))
    if spec.import_ is not None:
        found.append(("import.name_pattern", spec.import_.name_pattern))
    screen: list[tuple[str, str | None]] = []
    for i, step in enumerate(spec.screen.steps if spec.screen is not None else ()):
        if step.wait is not None:
            screen.append((f"screen.steps[{i}].wait.pattern", step.wait.pattern))
        screen += [(f"screen.steps[{i}].read.{name}.pattern", read.pattern) for name, read in step.read.items()]
    for where, pattern in found:
        if pattern:
            check_pattern(path, f"{key}.{where}", pattern)
    for where, pattern in screen:
        if pattern:
            check_pattern(path, f"{key}.{where}", pattern, in_loop=True)


# The child that runs one regular expression search: fixed code, no shell, its input on
# stdin as JSON, its answer (the named groups, or null) on stdout.
_SEARCH = ("import json,re,sys;a=json.load(sys.stdin);m=re.search(a['p'],a['s'],re.MULTILINE);"
           "json.dump(m.groupdict() if m else None,sys.stdout)")


async def parse_off_loop(spec: ParseSpec, stdout: str, *, timeout_s: float = PARSE_S,
                         whole: bool = True) -> dict[str, Any]:
    """``parse_output``, never in the event loop and never longer than ``timeout_s``.

    A ``regex`` parse searches in a child process killed at the bound; the other kinds
    run in a worker thread of the parsers' own limiter (never Trio's default one).

    Raises:
        SurfaceChanged: as ``parse_output``, or the parse took longer than ``timeout_s``.

    Cancellation: the child is killed (and reaped) or the thread abandoned at once; an
    abandoned thread only reads ``stdout`` and holds one of ``PARSE_THREADS`` tokens
    until it ends.
    """
    with trio.move_on_after(timeout_s):
        if spec.kind == "regex":
            return _fields(spec, await _search_in_child(spec, stdout), stdout)
        try:
            limiter = _LIMITER.get()
        except LookupError:
            limiter = trio.CapacityLimiter(PARSE_THREADS)
            _LIMITER.set(limiter)
        return await trio.to_thread.run_sync(functools.partial(parse_output, spec, stdout, whole=whole),
                                             abandon_on_cancel=True, limiter=limiter)
    raise SurfaceChanged(
        f"parsing the program's output took longer than {timeout_s:.0f} s and was stopped",
        hint=f"the tool file's parse pattern backtracks on this output; {HINT}",
    )


async def _search_in_child(spec: ParseSpec, stdout: str) -> dict[str, Any] | None:
    assert spec.pattern is not None  # checked when the file was loaded
    _refuse(spec.pattern)
    done = await trio.run_process(
        [sys.executable, "-I", "-S", "-c", _SEARCH], stdin=json.dumps({"p": spec.pattern, "s": stdout}).encode(),
        capture_stdout=True, stderr=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise SurfaceChanged("the tool file's parse pattern could not be run on the program's output",
                             hint=f"a person must check the tool file's parse pattern; {HINT}")
    found = json.loads(done.stdout)
    if found is None:
        raise _changed(f"output matching {spec.pattern!r}", stdout)
    return found


def _refuse(pattern: str) -> None:
    if reason := refused(pattern):
        # Also refused here, for a tool built without the load-time check: never run it.
        raise SurfaceChanged(f"the tool file's parse pattern is refused: {reason}",
                             hint=f"a person must fix the tool file: {HINT}")

_TRUE = {"true", "yes", "on", "1", "enabled", "active"}
_FALSE = {"false", "no", "off", "0", "disabled", "inactive"}


def parse_output(spec: ParseSpec, stdout: str, *, whole: bool = True) -> dict[str, Any]:
    """Parse ``stdout`` as ``spec`` says.

    A listing (``lines``, ``columns``) keeps at most ``max_lines`` items and says how many it
    shows and how many there were (``left_out`` turns that into words).

    Args:
        whole: False when ``stdout`` is only the head and tail the runner kept of a larger
            output: then the number of lines it had is unknown (``lines_total`` is None).

    Raises:
        SurfaceChanged: the output lacks a declared field, a value has the wrong type, or the
            output is not the format it used to be; the hint shows what was expected and seen.
    """
    if spec.kind == "none":
        return {}
    if spec.kind == "lines":
        lines = [line.rstrip() for line in stdout.splitlines() if line.strip()]
        shown = lines[: spec.max_lines]
        return {"lines": shown, "lines_shown": len(shown), "lines_total": len(lines) if whole else None}
    if spec.kind == "columns":
        return _columns(spec, stdout)
    if spec.kind == "json":
        try:
            found = json.loads(stdout)
        except (ValueError, RecursionError):  # nested too deep is not a document we read either
            raise _changed("one JSON document", stdout) from None
        if not isinstance(found, dict):
            raise _changed("a JSON object", stdout)
        if not spec.fields:
            return found
        found = {name: _dig(found, name) for name in spec.fields}
    elif spec.kind == "key_value":
        found = {}
        for line in stdout.splitlines():
            key, sep, value = line.partition(spec.separator)
            if sep:
                found.setdefault(key.strip(), value.strip())
    else:
        assert spec.pattern is not None  # checked when the file was loaded
        _refuse(spec.pattern)
        match = re.search(spec.pattern, stdout, re.MULTILINE)
        if match is None:
            raise _changed(f"output matching {spec.pattern!r}", stdout)
        found = match.groupdict()
    return _fields(spec, found, stdout)


def _fields(spec: ParseSpec, found: dict[str, Any], stdout: str) -> dict[str, Any]:
    """The declared fields out of what a parser found, typed; SurfaceChanged if one is missing."""
    found = {k: v for k, v in found.items() if v is not None}
    missing = [name for name in spec.fields if found.get(name) is None]
    if missing:
        raise _changed(f"the fields {', '.join(spec.fields)} (missing: {', '.join(missing)})", stdout)
    return {name: _typed(name, found[name], kind, stdout) for name, kind in spec.fields.items()}


def _columns(spec: ParseSpec, stdout: str) -> dict[str, Any]:
    """A table with a header line, columns split on whitespace (the last takes the rest).

    Columns are matched by header name, case-insensitively, never by position, so a
    program that reorders or renames its columns is SURFACE_CHANGED, not scrambled data.
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise _changed("a header line", stdout)
    header = [word.lower() for word in lines[0].split()]
    wanted = {name.lower(): name for name in spec.fields}
    missing = [name for key, name in wanted.items() if key not in header]
    if missing:
        raise _changed(f"columns {', '.join(spec.fields)} (missing: {', '.join(missing)}; found: "
                       f"{', '.join(lines[0].split())})", stdout)
    rows = []
    for line in lines[1:]:
        cells = line.split(None, len(header) - 1)
        if len(cells) != len(header):
            raise _changed(f"{len(header)} columns on every line", line)
        row = dict(zip(header, cells))
        rows.append({name: _typed(name, row[key], spec.fields[name], line) for key, name in wanted.items()})
    shown = rows[: spec.max_lines]
    return {"rows": shown, "rows_shown": len(shown), "row_count": len(rows)}


def left_out(spec: ParseSpec, fields: dict[str, Any]) -> str | None:
    """What a listing parse kept out of ``fields`` (past ``max_lines``), in words; None when
    it shows everything the program printed (or the parse is not a listing)."""
    if spec.kind == "lines" and fields["lines_total"] is not None and fields["lines_total"] > fields["lines_shown"]:
        shown, total, what = fields["lines_shown"], fields["lines_total"], "lines"
    elif spec.kind == "columns" and fields["row_count"] > fields["rows_shown"]:
        shown, total, what = fields["rows_shown"], fields["row_count"], "rows"
    else:
        return None
    return f"the first {shown} of {total} {what} are shown (the tool file keeps max_lines = {spec.max_lines})"


def failed_quietly(spec: ParseSpec, done: Completed) -> None:
    """Refuse a result whose program printed nothing to parse and said why on stderr.

    Some programs report a failure on stderr and still exit 0 (``bc`` on ``1/0``: "Runtime
    error: Divide by zero"). Empty stdout then is no answer and no new release either: it
    is the program's failure, quoted. Not for a tool that parses nothing (a write says
    warnings on stderr and is judged by its read-back), nor one that parses stderr, nor an
    exit status the tool file lists in ``ok_exit`` besides 0 (the file says that status, with
    what it prints, is an answer: "1: no such file"), nor a ``lines`` parse that says an
    empty listing is an answer whatever stderr warns (``empty = "answer"``).

    Raises:
        Failed: quoting the stderr tail, redacted as all output is; outcome left to the
            boundary (a write that ran is ``unknown``).
    """
    if (spec.kind == "none" or spec.stream != "stdout" or done.exit_status != 0 or done.stdout.strip()
            or not done.stderr.strip() or (spec.kind == "lines" and spec.empty == "answer")):
        return
    raise Failed(
        "the program exited 0 but printed no result, only words on stderr",
        hint=f"it said: {done.stderr_tail(300)!r}. If those words name a mistake in the call, fix the inputs; "
        "if an empty result with such words is normal for this tool, its tool file must say "
        "parse.empty = \"answer\"",
    )


def _dig(data: dict[str, Any], path: str) -> Any:
    value: Any = data
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _typed(name: str, value: Any, kind: FieldType, stdout: str) -> Any:
    try:
        if kind == "string":
            return value if isinstance(value, str) else json.dumps(value)
        if kind == "integer":
            if isinstance(value, bool):
                raise ValueError
            return int(value) if not isinstance(value, float) or value.is_integer() else _fail()
        if kind == "number":
            return float(value)
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError
    except (TypeError, ValueError):
        raise _changed(f"{name} as {kind}, not {value!r}", stdout) from None


def _fail() -> int:
    raise ValueError


def _changed(expected: str, stdout: str) -> SurfaceChanged:
    seen = stdout.strip()[:200] or "(no output)"
    return SurfaceChanged(
        "the program's output is no longer what the tool was written for",
        hint=f"expected {expected}; saw {seen!r}. The tool file needs updating for this release of the program.",
    )
