"""The declarative plugin: each TOML file in the config's ``plugins.tool_dirs`` wraps one
legacy program in tools, with no Python to write.

It uses only the public hook, the way an outside plugin would. The file format is in
``schema.py``; commented examples are in ``configs/tools/`` and the guide in
``plugins/README.md``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pydantic
from rungd.config import Config
from rungd.errors import ConfigError
from rungd.hookspecs import hookimpl

from rungd_plugins.declarative.build import Loaded, load_tool_file
from rungd_plugins.declarative.schema import ToolFile


def read_tool_file(path: Path) -> Loaded:
    """Read, validate and build one tool file.

    Raises:
        ConfigError: naming the file, the key and the problem.
    """
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        file = ToolFile.model_validate(raw)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors()[:5]:
            key = ".".join(str(p) for p in err["loc"])
            what = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"  key {key}: {what}")
        raise ConfigError(f"{path}: {exc.error_count()} problem(s)\n" + "\n".join(problems)
                          + "\n  hint: configs/tools/ has a commented example of every key") from None
    return load_tool_file(path, file)


def tool_files(config: Config) -> list[Path]:
    files = []
    for folder in config.plugins.tool_dirs:
        if not folder.is_dir():
            raise ConfigError(f"plugins.tool_dirs: {folder} is not a folder")
        files.extend(sorted(folder.glob("*.toml")))
    return files


@hookimpl
def rungd_register_tools(register: Any, config: Config) -> None:
    for path in tool_files(config):
        for tool in read_tool_file(path).tools:
            register(tool)
