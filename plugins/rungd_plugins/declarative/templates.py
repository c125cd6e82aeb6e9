"""``{name}`` templates in tool files: argv words, file names, read-back inputs."""

from __future__ import annotations

import string
from typing import Any

_FORMATTER = string.Formatter()


def placeholders(template: str) -> list[str]:
    """The input names a template refers to as ``{name}``."""
    return [name for _, name, _, _ in _FORMATTER.parse(template) if name]


def whole(template: Any) -> str | None:
    """The input a template is, when it is exactly one ``{name}`` and nothing else."""
    if not isinstance(template, str):
        return None
    names = placeholders(template)
    return names[0] if len(names) == 1 and template == "{" + names[0] + "}" else None


def substitute(template: Any, values: dict[str, Any]) -> Any:
    """Fill ``{name}`` placeholders; a template that is one whole placeholder keeps its type."""
    if not isinstance(template, str):
        return template
    name = whole(template)
    if name is not None:
        return values.get(name)
    return template.format_map({k: "" if v is None else v for k, v in values.items()})
