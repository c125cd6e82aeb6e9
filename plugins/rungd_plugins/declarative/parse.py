"""Turning a program's stdout into typed fields, or saying exactly why it no longer can.

Nothing an operator writes in a tool file and nothing a program prints may hold the event
loop or outlive the call: a regular expression that can backtrack catastrophically is
refused when the tool file loads (``check_patterns``, with the file and key) and again
before it is used (``parse_output``), and ``parse_off_loop`` runs parsing in a worker
thread of its own limiter, bounded in time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import trio
from rungd.errors import ConfigError, SurfaceChanged
from rungd.exchange.patterns import HINT, catastrophic, refused

from rungd_plugins.declarative.schema import FieldType, ParseSpec, ToolSpec

PARSE_S = 5.0  # a parse of capped output takes milliseconds; this is for a pattern gone wrong
PARSE_THREADS = 4
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("rungd.declarative.parse")


def check_pattern(path: Path, key: str, pattern: str) -> None:
    """Refuse a tool file's regular expression that is invalid or can backtrack catastrophically.

    Args:
        path: the tool file, for the message.
        key: where the pattern sits, e.g. ``tools.disk_usage_show.parse.pattern``.

    Raises:
        ConfigError: ``<file>: key <key>: <why>; hint: <how to rewrite it>``.
    """
    try:
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
    for where, pattern in found:
        if pattern:
            check_pattern(path, f"{key}.{where}", pattern)


async def parse_off_loop(spec: ParseSpec, stdout: str, *, timeout_s: float = PARSE_S) -> dict[str, Any]:
    """``parse_output`` in a worker thread of the parsers' own limiter, bounded in time.

    Raises:
        SurfaceChanged: as ``parse_output``, or the parse took longer than ``timeout_s``.

    Cancellation: the thread is abandoned at once (it only reads ``stdout``); it holds one
    of ``PARSE_THREADS`` tokens until it ends, so a runaway parse can slow other parses,
    never the loop, the ledger or file exchange.
    """
    try:
        limiter = _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(PARSE_THREADS)
        _LIMITER.set(limiter)
    with trio.move_on_after(timeout_s):
        return await trio.to_thread.run_sync(parse_output, spec, stdout, abandon_on_cancel=True, limiter=limiter)
    raise SurfaceChanged(
        f"parsing the program's output took longer than {timeout_s:.0f} s and was abandoned",
        hint=f"the tool file's parse pattern backtracks on this output; {HINT}",
    )

_TRUE = {"true", "yes", "on", "1", "enabled", "active"}
_FALSE = {"false", "no", "off", "0", "disabled", "inactive"}


def parse_output(spec: ParseSpec, stdout: str) -> dict[str, Any]:
    """Parse ``stdout`` as ``spec`` says.

    Raises:
        SurfaceChanged: the output lacks a declared field, a value has the wrong type, or the
            output is not the format it used to be; the hint shows what was expected and seen.
    """
    if spec.kind == "none":
        return {}
    if spec.kind == "lines":
        lines = [line.rstrip() for line in stdout.splitlines() if line.strip()]
        return {"lines": lines[: spec.max_lines], "lines_shown": min(len(lines), spec.max_lines)}
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
        if reason := refused(spec.pattern):
            # Also refused here, for a tool built without the load-time check: never run it.
            raise SurfaceChanged(f"the tool file's parse pattern is refused: {reason}",
                                 hint=f"a person must fix the tool file: {HINT}")
        match = re.search(spec.pattern, stdout, re.MULTILINE)
        if match is None:
            raise _changed(f"output matching {spec.pattern!r}", stdout)
        found = {k: v for k, v in match.groupdict().items() if v is not None}
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
    return {"rows": rows[: spec.max_lines], "row_count": len(rows)}


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
