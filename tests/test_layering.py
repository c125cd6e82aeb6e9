"""The layering the project keeps, kept by a test (issues 10 and 28):

    rungd_plugins -> rungd.sdk -> rungd -> rungd_ledgers

* a plugin (``plugins/``, and the test plugins in ``tests/plugin_fixtures/``) imports nothing
  from ``rungd`` but ``rungd.sdk``;
* ``rungd_ledgers`` imports neither Trio nor ``rungd`` nor ``rungd_plugins``;
* the core (``daemon/rungd``) never imports ``rungd_plugins``;
* inside ``rungd``, each package and top-level module imports only those below it in
  ``LAYERS`` (``rungd.core`` nothing but itself), type-checking imports included: no
  cycle, and no room reaching up.

Imports are read with ``ast``: every ``import``/``from ... import`` anywhere in a file (inside
functions too) and ``importlib.import_module("literal")``. A name built at run time is not
seen; nothing in the tree does that with a literal package name.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = [ROOT / "plugins", ROOT / "tests" / "plugin_fixtures"]
LEDGERS = ROOT / "ledgers" / "rungd_ledgers"
CORE = ROOT / "daemon" / "rungd"
# Files another change is moving to rungd.sdk; each must still break the rule (so the entry
# is removed the moment it is fixed) and nothing else may.
PENDING: set[str] = set()


def imported_modules(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import in ``source``; ``from a import b`` yields
    ``a.b`` as well as ``a``, so ``from rungd import runner`` is seen as ``rungd.runner``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def _top(module: str) -> str:
    return module.split(".")[0]


def plugin_rule(module: str) -> bool:
    """A plugin may import rungd only as rungd.sdk. (``from rungd import sdk`` also yields the
    bare ``rungd``, which is allowed; ``from rungd import runner`` yields ``rungd.runner``.)"""
    if _top(module) != "rungd":
        return True
    return module in ("rungd", "rungd.sdk") or module.startswith("rungd.sdk.")


def ledger_rule(module: str) -> bool:
    return _top(module) not in ("trio", "rungd", "rungd_plugins")


def core_rule(module: str) -> bool:
    return _top(module) != "rungd_plugins"


def violations(source: str, rule: Callable[[str], bool]) -> list[str]:
    """``line: module`` for every import in ``source`` the rule refuses."""
    return [f"{line}: {module}" for line, module in imported_modules(source) if not rule(module)]


def files_under(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


# rungd's packages and top-level modules, from the bottom up: each may import those before it.
LAYERS = ("core", "redact", "system", "config", "protocol", "exchange", "runner", "ssh_host", "client", "aclient",
          "service", "sdk", "testing", "authoring", "mcp_bridge", "ctl", "main")


def layer_of(module: str) -> str | None:
    """The entry of ``LAYERS`` a ``rungd.`` module belongs to (None for ``rungd`` itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "rungd" and len(parts) > 1 else None


def layer_rule(importer: str) -> Callable[[str], bool]:
    """The rule for code of the layer ``importer``: a rungd module of its own layer or below."""
    below = set(LAYERS[:LAYERS.index(importer) + 1])
    return lambda module: layer_of(module) in below | {None} if module.split(".")[0] == "rungd" else True


def broken(folders: list[Path], rule: Callable[[str], bool]) -> dict[str, list[str]]:
    found = {}
    for path in files_under(*folders):
        bad = violations(path.read_text(encoding="utf-8"), rule)
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_plugins_import_rungd_only_through_the_sdk() -> None:
    found = broken(PLUGINS, plugin_rule)
    assert {k: v for k, v in found.items() if k not in PENDING} == {}, (
        "a plugin imports rungd only via rungd.sdk; add what it needs there")


def test_pending_files_still_need_their_move() -> None:
    found = broken(PLUGINS, plugin_rule)
    fixed = sorted(PENDING - set(found))
    assert fixed == [], f"{fixed} now import only rungd.sdk: remove them from PENDING"


def test_the_ledger_package_knows_neither_trio_nor_rungd() -> None:
    assert broken([LEDGERS], ledger_rule) == {}


def test_the_core_never_imports_a_plugin() -> None:
    assert broken([CORE], core_rule) == {}


def test_each_part_of_rungd_imports_only_the_parts_below_it() -> None:
    found = {}
    for path in files_under(CORE):
        importer = path.relative_to(CORE).parts[0].removesuffix(".py")
        if importer == "__init__":
            continue
        assert importer in LAYERS, f"{importer} is in no layer: add it to LAYERS where it belongs"
        bad = violations(path.read_text(encoding="utf-8"), layer_rule(importer))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert found == {}, "a part of rungd imports one above it (LAYERS): move the name down, or the importer up"


@pytest.mark.parametrize(("rule", "source", "expected"), [
    (plugin_rule, "from rungd.core.contract import Tool\n", ["1: rungd.core.contract", "1: rungd.core.contract.Tool"]),
    (plugin_rule, "from rungd import runner\n", ["1: rungd.runner"]),
    (plugin_rule, "def f():\n    import rungd.service.server\n", ["2: rungd.service.server"]),
    (plugin_rule, "import importlib\nimportlib.import_module('rungd.service.audit')\n", ["2: rungd.service.audit"]),
    (plugin_rule, "from rungd.sdk import Tool, hookimpl\nfrom rungd import sdk\nimport trio\n", []),
    (ledger_rule, "import trio\n", ["1: trio"]),
    (ledger_rule, "from rungd.core.errors import ConfigError\n", ["1: rungd.core.errors", "1: rungd.core.errors.ConfigError"]),
    (ledger_rule, "import msgspec\nfrom rungd_ledgers.records import Record\n", []),
    (core_rule, "from rungd_plugins.demo import tools\n", ["1: rungd_plugins.demo", "1: rungd_plugins.demo.tools"]),
    (core_rule, "from rungd.sdk import Tool\n", []),
    (layer_rule("core"), "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rungd.config import Config\n",
     ["3: rungd.config", "3: rungd.config.Config"]),
    (layer_rule("runner"), "from rungd.service import audit\n", ["1: rungd.service", "1: rungd.service.audit"]),
    (layer_rule("service"), "from rungd.runner import run\nfrom rungd import protocol\n", []),
])
def test_a_violation_is_caught(rule: Callable[[str], bool], source: str, expected: list[str]) -> None:
    assert violations(source, rule) == expected
