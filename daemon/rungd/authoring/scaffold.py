"""``rungctl new-plugin``: a starting point for wrapping one more legacy program.

A TOML tool file (every contract slot present and commented) for the common case, or a
Python plugin package (a read and a write to copy, a fake program, and tests that pass as
generated). The tool file's FILL IN placeholders stop ``check-config`` and ``lint`` until
each is replaced, so an unfinished scaffold never reaches a model.
"""

from __future__ import annotations

import re
import string
from importlib import resources
from pathlib import Path

NAME = re.compile(r"^[a-z][a-z0-9]{1,20}$")


def new_plugin(name: str, folder: Path, *, python: bool = False) -> list[Path]:
    """Write the scaffold for ``name`` into ``folder``; returns the files written.

    Raises:
        ValueError: the name is not one lower-case word, or a file would be overwritten.
    """
    if not NAME.match(name):
        raise ValueError(f"{name!r}: a plugin is named after its program: one lower-case word, e.g. 'erp'")
    templates = resources.files("rungd.authoring") / "templates"
    if not python:
        target = folder / f"{name}.toml"
        _refuse_overwrite([target])
        target.write_text((templates / "tool_file.toml").read_text().format(system=name))
        return [target]
    root = folder / f"rungd-{name}"
    files = {
        root / "pyproject.toml": "pyproject.toml.tmpl",
        root / f"rungd_{name}" / "__init__.py": "plugin.py.tmpl",
        root / "tests" / f"test_{name}.py": "test.py.tmpl",
        root / "tests" / f"fake_{name}": "fake.tmpl",
    }
    _refuse_overwrite(list(files))
    for path, template in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = (templates / "python" / template).read_text()
        path.write_text(string.Template(text).substitute(name=name, Name=name.capitalize()))
    (root / "tests" / f"fake_{name}").chmod(0o755)
    return list(files)


def _refuse_overwrite(paths: list[Path]) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise ValueError(f"refusing to overwrite {', '.join(existing)}")
