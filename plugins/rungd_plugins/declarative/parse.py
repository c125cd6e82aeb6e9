"""Turning a program's stdout into typed fields, or saying exactly why it no longer can."""

from __future__ import annotations

import json
import re
from typing import Any

from rungd.errors import SurfaceChanged

from rungd_plugins.declarative.schema import FieldType, ParseSpec

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
        except ValueError:
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
