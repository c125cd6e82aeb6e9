"""The declarative plugin: each TOML file in the config's ``plugins.tool_dirs`` wraps one
legacy program in tools, with no Python to write.

It uses only the public hook and ``rungd.sdk``, the way an outside plugin would. The file
format is in ``schema.py``; every key, commented, is in the file ``rungctl new-plugin`` writes, and the guide in
``plugins/README.md``.
"""

from __future__ import annotations

import difflib
import tomllib
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel
from rungd.sdk import ConfigError, PluginSettings, Tool, Untrusted, check_trusted, hookimpl

from rungd_plugins.declarative.build import Loaded, load_tool_file
from rungd_plugins.declarative.schema import ToolFile

# What `rungctl new-plugin` writes where only the author knows the answer. A file that still
# holds one would otherwise load and hand a model a description that says "FILL IN".
PLACEHOLDERS = ("FILL IN", "FILL-IN")


def read_tool_file(path: Path) -> Loaded:
    """Read, validate and build one tool file.

    Raises:
        ConfigError: naming the file, the key and the problem: unreadable, not UTF-8, not
            TOML, an unknown key with the closest valid ones, or a scaffold placeholder.
    """
    try:
        data = path.read_bytes()
        raw = tomllib.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}; "
                          "hint: the user rungd runs as must be able to read every tool file") from None
    except UnicodeDecodeError as exc:
        # TOML is UTF-8; a file saved in another encoding is named, never loaded mangled.
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: not valid UTF-8 (line {line}, byte 0x{data[exc.start]:02x}); "
                          "hint: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unfilled = [key for key, _ in _placeholders(raw)]
    if unfilled:
        shown = "\n".join(f"  key {key}: still the scaffold's FILL IN placeholder" for key in unfilled[:5])
        more = f"\n  (and {len(unfilled) - 5} more)" if len(unfilled) > 5 else ""
        raise ConfigError(f"{path}: {len(unfilled)} placeholder(s) left\n{shown}{more}"
                          "\n  hint: replace every FILL IN with what the program really does")
    try:
        file = ToolFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        problems = [f"  key {_key(err['loc'])}: {_problem(err)}" for err in exc.errors()[:5]]
        raise ConfigError(f"{path}: {exc.error_count()} problem(s)\n" + "\n".join(problems)
                          + "\n  hint: every key, its type and default are in plugins/README.md (appendix), and "
                          "`rungctl new-plugin NAME` writes a tool file with every key commented") from None
    return load_tool_file(path, file)


def _placeholders(value: Any, where: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """Every (dotted key, text) in a parsed tool file whose text is a scaffold placeholder."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _placeholders(inner, (*where, str(key)))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _placeholders(inner, (*where, str(index)))
    elif isinstance(value, str) and any(mark in value for mark in PLACEHOLDERS):
        yield ".".join(where), value


def _key(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _problem(err: Any) -> str:
    if err["type"] != "extra_forbidden":
        return str(err["msg"])
    valid = _keys_at(ToolFile, tuple(err["loc"][:-1]))
    close = difflib.get_close_matches(str(err["loc"][-1]), valid, n=3, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {' or '.join(close)}?"
    return f"unknown key; valid keys here: {', '.join(valid)}" if valid else "unknown key"


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the schema allows at ``loc`` (a pydantic error location), or [] if unknown."""
    current: Any = model
    parts = list(loc)
    while parts:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(parts.pop(0)))
            if field is None:
                return []
            current = field.annotation
            continue
        current = _unwrap(current)
        origin = typing.get_origin(current)
        if origin is dict or origin is list:
            parts.pop(0)  # a table's own key, or an array's index
            current = typing.get_args(current)[-1]
        elif not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    # `X | None` reaches here as a union; the table inside is X.
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def tool_files(tool_dirs: tuple[Path, ...], refuse: Callable[[str], None]) -> list[Path]:
    """Every ``*.toml`` in ``tool_dirs``, each folder sorted by name; hidden ones left out (an
    editor's lock file, ``.#host.toml``, is no tool file, and must not fail a reload).

    Args:
        refuse: told of each folder or file left out because someone other than root or
            rungd's user could write it (rungd.system.trust); the others are still returned.

    Raises:
        ConfigError: a folder in ``plugins.tool_dirs`` does not exist.
    """

    def trusted(path: Path, what: str, left_out: str) -> bool:
        try:
            check_trusted(path, what)
        except Untrusted as exc:
            refuse(f"{exc}; {left_out}")
            return False
        return True

    files = []
    for folder in tool_dirs:
        if not folder.is_dir():
            raise ConfigError(f"plugins.tool_dirs: {folder} is not a folder")
        if trusted(folder, "tool folder", "no tool file in it is loaded"):
            files.extend(path for path in sorted(folder.glob("*.toml"))
                         if not path.name.startswith(".") and trusted(path, "tool file", "its tools are not loaded"))
    return files


@hookimpl
def rungd_register_tools(register: Callable[[Tool], None], settings: PluginSettings) -> None:
    # Every tool file registers through this one plugin, so only here are two files told
    # apart: the host would see "declarative" twice.
    defined_in: dict[str, Path] = {}
    for path in tool_files(settings.tool_dirs, settings.refuse):
        try:
            loaded = read_tool_file(path)
        except Untrusted as exc:  # a program it names: this file's tools go, the others stay
            settings.refuse(f"{exc}; the tools of {path} are not loaded")
            continue
        for tool in loaded.tools:
            if tool.name in defined_in:
                raise ConfigError(
                    f"tool {tool.name!r} is defined by two tool files: {defined_in[tool.name]} and {path}; "
                    f"hint: rename [tools.{tool.name}] in one of them, or remove one file from the tool folder"
                )
            defined_in[tool.name] = path
            register(tool)
