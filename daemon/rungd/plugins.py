"""Loading plugins and collecting their tools.

Plugins come from three places, in this order: the ``rungd.plugins`` entry-point group
(the built-ins are declared there exactly like third-party plugins), the modules named in
``plugins.modules``, and the Python files named in ``plugins.files``. Names listed in
``plugins.disable`` are blocked before loading. A misspelled hook fails start-up.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

import pluggy

from rungd import hookspecs
from rungd.config import Config
from rungd.contract import Tool
from rungd.errors import PluginError

ENTRY_POINT_GROUP = "rungd.plugins"


def make_plugin_manager(config: Config) -> pluggy.PluginManager:
    """A fresh plugin manager with every enabled plugin loaded and checked.

    Raises:
        PluginError: a module or file cannot be imported, or a plugin implements a hook
            that does not exist (usually a misspelling).
    """
    pm = pluggy.PluginManager("rungd")
    pm.add_hookspecs(hookspecs)
    for name in config.plugins.disable:
        pm.set_blocked(name)
    try:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"entry point {exc.plugin!r}: {exc}") from None
    for module_name in config.plugins.modules:
        if pm.is_blocked(module_name):
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PluginError(
                f"plugins.modules: cannot import {module_name!r}: {exc}; "
                "hint: install the package that provides it into rungd's environment"
            ) from None
        if not pm.is_registered(module):  # also installed as an entry point: load it once
            _register(pm, module, module_name)
    for path in config.plugins.files:
        name = f"file:{path.stem}"
        if pm.is_blocked(name) or pm.is_blocked(path.stem):
            continue
        _register(pm, _import_file(path), name)
    _check_hooks(pm)
    return pm


def _register(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r}: {exc}") from None
    except ValueError as exc:
        raise PluginError(f"plugin {name!r} is registered twice: {exc}") from None


def _import_file(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(f"rungd_plugin_file_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise PluginError(f"plugins.files: {path} is not a readable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a plugin file may raise anything while importing
        raise PluginError(f"plugins.files: {path} failed to import: {exc!r}") from None
    return module


def _check_hooks(pm: pluggy.PluginManager) -> None:
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        known = ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("rungd_")))
        raise PluginError(f"plugin {pm.get_name(exc.plugin)!r}: {exc}; the hooks are: {known}") from None


@dataclasses.dataclass(frozen=True)
class RegisteredTool:
    tool: Tool
    plugin: str


def collect_tools(pm: pluggy.PluginManager, config: Config) -> dict[str, RegisteredTool]:
    """Ask every plugin for its tools, recording which plugin registered each.

    Raises:
        PluginError: two plugins registered one name (the message names both), or a plugin
            registered something that is not a ``Tool``.
    """
    tools: dict[str, RegisteredTool] = {}
    for impl in reversed(pm.hook.rungd_register_tools.get_hookimpls()):
        plugin_name = impl.plugin_name

        def register(tool: Tool, _plugin: str = plugin_name) -> None:
            if not isinstance(tool, Tool):
                raise PluginError(f"plugin {_plugin!r} registered {tool!r}, which is not a rungd.contract.Tool")
            if tool.name in tools:
                first = tools[tool.name].plugin
                raise PluginError(
                    f"tool {tool.name!r} is registered by two plugins: {first!r} and {_plugin!r}; "
                    "hint: disable one of them (plugins.disable) or rename the tool"
                )
            tools[tool.name] = RegisteredTool(tool, _plugin)

        kwargs = {"register": register, "config": config}
        impl.function(*[kwargs[arg] for arg in impl.argnames])
    return tools
