"""``{name}`` templates in tool files: argv words, file names, read-back inputs."""

from __future__ import annotations

import functools
import re
import string
from typing import Any

from rungd.sdk import BadInput, credential_file_marker

_FORMATTER = string.Formatter()
# ``{credential_file:NAME}`` in an argv word: where the runner puts the path of a sealed file
# holding the credential NAME (rungd.sdk.credential_file_marker). No input fills it.
CREDENTIAL_FILE = "credential_file"
_CREDENTIAL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class _Kept:
    """Formats a ``{credential_file:NAME}`` placeholder back as itself: the runner fills it."""

    def __format__(self, spec: str) -> str:
        return credential_file_marker(spec)


@functools.lru_cache(maxsize=4096)
def _parsed(template: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """A template's literal text, its input names and the credentials it names as files,
    parsed once: every call of a tool looks at each argv word several times."""
    parts = list(_FORMATTER.parse(template))
    return ("".join(text for text, _, _, _ in parts),
            tuple(name for _, name, _, _ in parts if name and name != CREDENTIAL_FILE),
            tuple(spec or "" for _, name, spec, _ in parts if name == CREDENTIAL_FILE))


def placeholders(template: str) -> tuple[str, ...]:
    """The input names a template refers to as ``{name}``."""
    return _parsed(template)[1]


def credential_files(template: Any) -> tuple[str, ...]:
    """The credentials a template names as files, ``{credential_file:NAME}``."""
    return _parsed(template)[2] if isinstance(template, str) else ()


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
    return template.format_map({**{k: "" if v is None else v for k, v in values.items()}, CREDENTIAL_FILE: _Kept()})


def inside_path(template: str, values: dict[str, Any], slashed: frozenset[str] = frozenset()) -> None:
    """Refuse an input that would walk out of the folder a path template names.

    In a word such as ``/srv/files/{name}`` or ``{name}.tar`` next to a ``/``, the input is one
    name in that folder: a ``/`` in it, or an empty, ``.`` or ``..`` part, would reach the folder
    itself or any file (``../../etc/shadow``). An input in ``slashed`` (``allow_slash``) may
    name a subfolder (``group/project``), never with such a part. A URL (``://``) is no path
    here; an input meant to be a whole path is declared as a whole argument.

    Raises:
        BadInput: naming the input and the template; nothing ran.
    """
    literal = literal_text(template)
    if "/" not in literal or "://" in literal:
        return
    for name in placeholders(template):
        value = values.get(name)
        text = "" if value is None else str(value)
        parts = text.split("/") if name in slashed else []
        if "/" in text and name not in slashed or any(part in ("", ".", "..") for part in parts):
            raise BadInput(f"{name}: {text!r} would leave the folder {template!r} names",
                           hint=f"give {name} as one name in that folder: not empty, no '/', not '.' or '..'"
                           + (" (it may name a subfolder: a/b)" if name in slashed else ""))
    # What is judged is each part of the path as filled in: "{name}{ext}" with ext = "" is the
    # name, a part of its own, while "{name}" or "{a}{b}" filled with nothing is the folder.
    for segment in template.split("/"):
        names = placeholders(segment)
        filled = substitute(segment, values) if names else None
        if names and ("" if filled is None else str(filled)) in ("", ".", ".."):
            given = ", ".join(f"{name}={values.get(name)!r}" for name in names)
            raise BadInput(f"{', '.join(names)}: {given} would leave the folder {template!r} names",
                           hint=f"give {' and '.join(names)} so that together they make one name in that folder: "
                           "not empty, not '.' or '..'")


def literal_text(template: str) -> str:
    """What a template says besides its placeholders."""
    return _parsed(template)[0]


def names_no_file(name: str, value: Any, *, constrained: bool, allow_path: bool) -> None:
    """Refuse an input that would name a file where the tool file did not say it may.

    For an input that is a whole argument (``{file}``) or sits in a word with no ``/``
    (``--config={file}``): a value with a ``/`` would reach any file through the program
    (``man /etc/shadow``, ``curl file:///etc/shadow``, ``ssh -F /root/x``), unless the input
    is held to an enum or a pattern (then the pattern decides) or says ``allow_path``; a ``..``
    part would climb out of any folder a pattern allows (``/srv/data/../../etc/shadow``), and
    ``.`` or ``..`` alone name a folder, unless it says ``allow_path``.

    Raises:
        BadInput: naming the input; nothing ran.
    """
    if allow_path or value is None or isinstance(value, (bool, int, float)):
        return
    text = str(value)
    parts = text.split("/")
    if ".." in parts or text == ".":
        raise BadInput(f"{name}: {text!r} names a folder by '.' or '..', which this tool does not take",
                       hint=f"give {name} without '.' or '..' parts")
    if "/" in text and not constrained:
        raise BadInput(f"{name}: {text!r} has a '/': this tool takes it as a name, not a path",
                       hint=f"give {name} without '/'; a tool file that takes a path says allow_path = true "
                       f"or holds {name} to a pattern")


def template_problem(template: str) -> str | None:
    """Why ``template`` cannot be filled at call time, or None when it can.

    Only ``{name}`` (a declared input, checked by the caller) and ``{{``/``}}`` (a literal
    brace) are allowed: ``{}`` or ``{0}`` would fail with a format error at call time, and
    ``{name.attr}``, ``{name[0]}``, ``{name!r}`` or ``{name:>9}`` would reach into a value
    or reshape it, which no tool file needs.
    """
    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as exc:
        return (f"{template!r} is not a template ({exc}); write {{{{ and }}}} for a literal brace, "
                "e.g. \"{{}}\" for find's -exec")
    files = [spec for _, name, spec, _ in parts if name == CREDENTIAL_FILE]
    if files and (len(files) > 1 or any(name not in (None, CREDENTIAL_FILE) for _, name, _, _ in parts)):
        return (f"{template!r}: a word that names a credential file holds nothing else to fill in (no "
                "input, no second credential): split it into two arguments")
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name == CREDENTIAL_FILE:
            if conversion or not _CREDENTIAL_NAME.match(spec or ""):
                return (f"{template!r}: write {{credential_file:NAME}} with the name of a credential in rungd's "
                        "store, e.g. --password-file={credential_file:db_password}")
            continue
        if name == "" or name.isdigit():
            return (f"{template!r} has a placeholder with no input name; write {{{{}}}} for a literal "
                    "\"{}\" (find -exec ... {{}} +), or {name} for an input")
        if not name.isidentifier() or spec or conversion:
            return (f"{template!r}: {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                    "is not a plain {input}; write {name} (a whole input) or {{ }} for literal braces")
    return None
