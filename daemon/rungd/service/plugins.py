"""Loading plugins, giving each its own settings, and the one class that calls their hooks.

Plugins come from three places, in this order: the ``rungd.plugins`` entry-point group
(the built-ins are declared there exactly like third-party plugins), the modules named in
``plugins.modules``, and the Python files named in ``plugins.files``. Names listed in
``plugins.disable`` are blocked before loading. A misspelled hook fails start-up.

A plugin that sets ``DEMO_ONLY = True`` (the built-in ``demo`` and ``ledgerbook`` wrap fake
programs) loads only when the config opts in by giving it a settings table,
``[plugins.settings.<name>]`` (an empty one is enough). The embedded default does; a
production config that says nothing offers no fake tools.

Every call into a plugin goes through ``Hooks`` (as tox 4's one hook caller does): it builds
each plugin's ``PluginSettings`` once, records which plugin registered which tool, and keeps
one broken observer from touching the others or the result.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from rungd.core import hookspecs
from rungd.config import Config
from rungd.core.contract import Caller, Tool
from rungd.core.errors import ConfigError, PluginError
from rungd.core.settings import PluginSettings
from rungd.system.trust import Untrusted, check as check_trusted

if TYPE_CHECKING:
    from rungd.core.envelope import Envelope

ENTRY_POINT_GROUP = "rungd.plugins"
FILE_PREFIX = "file:"
# The built-in plugin that turns every tool file in plugins.tool_dirs into tools.
DECLARATIVE = "declarative"
log = logging.getLogger("rungd.plugins")

def settings_name(plugin_name: str) -> str:
    """The settings key of a plugin registered as ``plugin_name`` (files drop ``file:``)."""
    return plugin_name.removeprefix(FILE_PREFIX)


def settings_for(plugin_name: str, config: Config) -> PluginSettings:
    """The settings ``config`` gives the plugin registered as ``plugin_name``."""
    key = settings_name(plugin_name)
    raw = config.plugins.settings.get(key)
    return PluginSettings(
        name=key,
        raw=types.MappingProxyType(dict(raw)) if raw is not None else None,
        source=config.source,
        tool_dirs=tuple(config.plugins.tool_dirs),
        state_dir=config.state_dir / key,
    )


def make_plugin_manager(config: Config, refused: list[str] | None = None) -> pluggy.PluginManager:
    """A fresh plugin manager with every enabled plugin loaded and checked.

    A module of ``plugins.modules`` or a file of ``plugins.files`` that someone other than
    root or rungd's user could write (:mod:`rungd.system.trust`) is not imported: with ``refused``
    it is told there and the other plugins load; without, it raises.

    Raises:
        ConfigError: ``plugins.disable`` or ``plugins.settings`` names a plugin that does not
            exist (usually a misspelling, which would otherwise be ignored in silence).
        PluginError: a module or file cannot be imported, or a plugin implements a hook
            that does not exist (usually a misspelling).
        Untrusted: without ``refused``, a plugin module or file is not owned right.
    """

    def trusted(path: str | Path, what: str) -> bool:
        try:
            check_trusted(path, what)
        except Untrusted as exc:
            if refused is None:
                raise
            refused.append(f"{exc}; that plugin is not loaded")
            return False
        return True

    _check_plugin_names(config)
    pm = pluggy.PluginManager("rungd")
    pm.add_hookspecs(hookspecs)
    for name in config.plugins.disable:
        pm.set_blocked(name)
    try:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"entry point {exc.plugin!r}: {_explain(exc)}") from None
    for module_name in config.plugins.modules:
        if pm.is_blocked(module_name):
            continue
        origin = _origin(module_name)
        if origin is not None and not trusted(origin, f"plugins.modules {module_name!r}"):
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
        name = f"{FILE_PREFIX}{path.stem}"
        if pm.is_blocked(name) or pm.is_blocked(path.stem):
            continue
        if path.exists() and not trusted(path, "plugins.files"):
            continue
        _register(pm, _import_file(path), name)
    _drop_demo_only(pm, config)
    _check_hooks(pm)
    return pm


def _origin(module_name: str) -> str | None:
    """The file ``module_name`` would be imported from (its package's folder for a package),
    or None when it is not found or not a file (the import then says why)."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        return None
    return os.path.dirname(spec.origin) if spec.submodule_search_locations else spec.origin


def plugin_names(config: Config) -> set[str]:
    """Every name a plugin can have under ``config``: the ``rungd.plugins`` entry points
    installed (disabled ones included), ``plugins.modules``, and ``plugins.files`` by stem.

    Known only here, where plugins are found, not when the config file is parsed: an entry
    point comes from what is installed.
    """
    names = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    names |= set(config.plugins.modules)
    names |= {path.stem for path in config.plugins.files}
    return names


def _check_plugin_names(config: Config) -> None:
    """Refuse a plugin name in ``plugins.disable`` or ``plugins.settings`` that is no plugin's.

    A misspelled ``disable`` would leave the plugin running, and a misspelled settings table
    would leave it unconfigured, both in silence.

    Raises:
        ConfigError: naming the key, the closest names and the plugins that exist.
    """
    known = plugin_names(config)
    named = [("plugins.disable", settings_name(name)) for name in config.plugins.disable]
    named += [(f"plugins.settings.{name}", name) for name in config.plugins.settings]
    for key, name in named:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        guess = f"did you mean {' or '.join(close)}? " if close else ""
        raise ConfigError(
            f"{config.source}: key {key}: no plugin named {name!r}; hint: {guess}the plugins here are "
            f"{', '.join(sorted(known))} (installed entry points, plugins.modules, plugins.files by file name)"
        )


def _drop_demo_only(pm: pluggy.PluginManager, config: Config) -> None:
    # Whether a plugin is demo-only is known only once it is imported, so it is loaded with
    # the rest and unregistered here, before any of its hooks can be called.
    for name, plugin in list(pm.list_name_plugin()):
        if plugin is None or not getattr(plugin, "DEMO_ONLY", False):
            continue
        if settings_name(name) not in config.plugins.settings:
            pm.unregister(plugin)
            pm.set_blocked(name)
            log.debug("plugin %s is demo-only and not enabled by [plugins.settings.%s]", name, name)


def _register(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r}: {_explain(exc)}") from None
    except ValueError as exc:
        raise PluginError(f"plugin {name!r} is registered twice: {exc}") from None


def _explain(exc: pluggy.PluginValidationError) -> str:
    if "config" in str(exc) and "rungd_register_tools" in str(exc):
        return (f"{exc}; hint: rungd_register_tools(register, settings) gets the plugin's own "
                "PluginSettings (rungd.sdk), not the whole config")
    return str(exc)


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
    """A tool, the name of the plugin that registered it, and the digest of what it was
    (:func:`definition_digest`), which the ledger's ``received`` records name."""

    tool: Tool
    plugin: str
    digest: str = ""


DIGEST_CHARS = 16  # of a definition's sha256, in hex: the ledger names a tool's version by it


def definition_digest(tool: Tool, plugin: str) -> str:
    """What a tool was when it acted, as a digest an auditor can compare across the ledger:
    its contract (description, inputs, side effect, gate, timing, errors, precondition,
    credentials) and what it runs (``Tool.provenance``, else the source of the handler's
    module), and the plugin that registered it."""
    try:
        schema = tool.input_schema()
    except Exception:  # noqa: BLE001 - a schema that does not build is still a definition
        schema = {"unbuildable": tool.inputs.__qualname__}
    contract = {
        "name": tool.name, "plugin": plugin, "side_effect": tool.side_effect, "gate": tool.gate,
        "description": dataclasses.asdict(tool.description), "inputs": schema, "outputs": dict(tool.outputs),
        "errors": [repr(rule) for rule in tool.errors], "timing": repr(tool.timing), "cap_bytes": tool.cap_bytes,
        "concurrency": tool.concurrency, "log_fields": list(tool.log_fields), "precondition": repr(tool.precondition),
        "credentials": list(tool.credentials), "runs": tool.provenance or _handler_source(tool.handler),
    }
    text = json.dumps(contract, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def _handler_source(handler: Any) -> str:
    """The digest of the file the handler's code lives in, or its qualified name when it has
    none to read (a builtin, a lambda made at run time)."""
    function = getattr(handler, "func", handler)  # functools.partial
    function = getattr(function, "__func__", function)  # a bound method
    try:
        path = inspect.getsourcefile(function)
        if path is not None:
            info = os.stat(path)
            return _file_digest(path, info.st_size, info.st_mtime_ns)
    except (TypeError, OSError):
        pass
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """A source file's digest, read once per version of it: a plugin's tools share its module."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class Hooks:
    """The one place that calls plugin hooks, through pluggy.

    Built once from a loaded plugin manager (``Hooks.load(config)`` does both). The per-plugin
    callers are made here, once, so a call's cost does not grow with how often it is made.

    Args:
        pm: a plugin manager from ``make_plugin_manager``.
    """

    def __init__(self, pm: pluggy.PluginManager, refused: list[str] | None = None) -> None:
        self.pm = pm
        # What was left out because its owner or modes are wrong (rungd.system.trust): plugin files
        # and modules at load, tool files and programs at collect_tools.
        self._refused_at_load = list(refused or ())
        self.refused: list[str] = list(self._refused_at_load)
        self._registrars = self._per_plugin("rungd_register_tools")
        self._observers = self._per_plugin("rungd_observe_result")

    @classmethod
    def load(cls, config: Config) -> Hooks:
        """Load every enabled plugin for ``config`` (see ``make_plugin_manager``); a plugin file
        or module not owned right is left out and named in ``refused``.

        Raises:
            PluginError: as ``make_plugin_manager`` does.
        """
        refused: list[str] = []
        return cls(make_plugin_manager(config, refused), refused)

    def _per_plugin(self, hook: str) -> list[tuple[str, Callable[..., Any]]]:
        # In pluggy's calling order (the last registered first), one caller per plugin that
        # implements the hook: each plugin is then called on its own, with its own arguments.
        impls = list(reversed(getattr(self.pm.hook, hook).get_hookimpls()))
        everyone = [impl.plugin for impl in impls]
        return [
            (impl.plugin_name,
             self.pm.subset_hook_caller(hook, remove_plugins=[p for p in everyone if p is not impl.plugin]))
            for impl in impls
        ]

    def collect_tools(self, config: Config) -> dict[str, RegisteredTool]:
        """Ask every plugin for its tools, each with its own ``PluginSettings``.

        Args:
            config: the daemon's config; each plugin sees only its own part of it.

        Returns:
            Tool name -> the tool and the plugin that registered it, in the order the
            plugins were called. What a plugin left out because its owner or modes are
            wrong is added to ``refused`` (a plugin that raises ``Untrusted`` loses its tools).

        Raises:
            PluginError: two plugins registered one name (the message names both), or a
                plugin registered something that is not a ``Tool``.
            ConfigError: a plugin's settings do not validate (raised by the plugin).
        """
        tools: dict[str, RegisteredTool] = {}
        self.refused = list(self._refused_at_load)
        for plugin_name, call in self._registrars:

            def register(tool: Tool, _plugin: str = plugin_name) -> None:
                if not isinstance(tool, Tool):
                    raise PluginError(f"plugin {_plugin!r} registered {tool!r}, which is not a rungd.sdk.Tool")
                if tool.name in tools:
                    first = tools[tool.name].plugin
                    if first == _plugin:
                        raise PluginError(f"plugin {_plugin!r} registered the tool {tool.name!r} twice; "
                                          "hint: a tool's name is unique: fix the plugin")
                    hint = "rename the tool in one of them, or list the one that should not offer it in plugins.disable"
                    if DECLARATIVE in (first, _plugin):
                        hint = (f"rename [tools.{tool.name}] in its tool file (disabling {DECLARATIVE!r} would drop "
                                f"every tool file), or disable the other plugin (plugins.disable)")
                    raise PluginError(
                        f"tool {tool.name!r} is registered by two plugins: {first!r} and {_plugin!r}; hint: {hint}"
                    )
                tools[tool.name] = RegisteredTool(tool, _plugin, definition_digest(tool, _plugin))

            settings = settings_for(plugin_name, config)
            before = set(tools)
            try:
                call(register=register, settings=settings, config=config)
            except Untrusted as exc:  # a file this plugin reads decides what runs: its tools go
                for name in set(tools) - before:
                    del tools[name]
                settings.refuse(f"{exc}; the tools of plugin {plugin_name!r} are not loaded")
            except (PluginError, ConfigError):
                raise
            except Exception as exc:  # a bug in the plugin's own code: say whose, never "report it to rungd"
                raise PluginError(f"plugin {plugin_name!r} failed while registering its tools: "
                                  f"{type(exc).__name__}: {exc}; hint: this is a bug in the plugin (or its "
                                  f"settings); fix it, or list {plugin_name!r} in plugins.disable") from exc
            self.refused.extend(settings.refused)
        return tools

    def credential(self, name: str, tool: str) -> str | None:
        """The first credential a plugin supplies for ``name`` in a call of ``tool``, or None.

        Raises:
            Exception: whatever a credential plugin raises; the caller decides what the
                call reports (a credential that could not be read is not a missing one).
        """
        value: str | None = self.pm.hook.rungd_credential(name=name, tool=tool)
        return value

    def observe_result(self, tool: str, envelope: Envelope, caller: Caller) -> None:
        """Show a final result to every observer.

        An observer that raises is logged with its plugin's name; the others are still
        called and the result is not changed. Never raises.
        """
        for plugin_name, call in self._observers:
            try:
                call(tool=tool, envelope=envelope, caller=caller)
            except Exception:  # an observer must never change or lose the result
                log.exception("result observer %s failed", plugin_name)


def collect_tools(pm: pluggy.PluginManager, config: Config) -> dict[str, RegisteredTool]:
    """``Hooks(pm).collect_tools(config)``, for callers that hold a plugin manager.

    Raises:
        PluginError: as ``Hooks.collect_tools`` does.
        ConfigError: as ``Hooks.collect_tools`` does.
    """
    return Hooks(pm).collect_tools(config)
