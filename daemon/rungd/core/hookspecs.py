"""The hooks a rungd plugin may implement. Project name ``rungd``; every hook is ``rungd_*``.

Hooks are synchronous and cheap: they run on the daemon's event loop. Slow work belongs in
a tool's handler, never in a hook. ``rungd.service.plugins.Hooks`` makes every call; a plugin
imports ``hookimpl`` and the argument types from ``rungd.sdk``.

    hook                    called                          result
    rungd_register_tools    once per plugin, at start-up    ignored (tools go to register)
    rungd_credential        when a credential is missing    the first non-None wins
    rungd_observe_result    once per call, when it is final ignored; every observer runs
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:  # only for the annotations: the core modules import this one
    from rungd.core.contract import Caller, Tool
    from rungd.core.envelope import Envelope
    from rungd.core.settings import PluginSettings

hookspec = pluggy.HookspecMarker("rungd")
hookimpl = pluggy.HookimplMarker("rungd")


@hookspec(warn_on_impl_args={
    "config": DeprecationWarning(
        "rungd_register_tools(config) is deprecated and goes in rungd 0.2: take `settings` (this "
        "plugin's own rungd.sdk.PluginSettings) instead of the whole config"),
})
def rungd_register_tools(register: Callable[[Tool], None], settings: PluginSettings, config: Any) -> None:
    """Register this plugin's tools.

    Called once at start-up (and by ``rungctl lint``), for every loaded plugin, each on its
    own, in pluggy's order (the last registered first).

    Args:
        register: call ``register(tool)`` with a ``rungd.sdk.Tool`` for each tool. The
            daemon records which plugin registered it; a name registered by two plugins
            stops start-up with an error naming both.
        settings: this plugin's own ``rungd.sdk.PluginSettings``: its
            ``[plugins.settings.<name>]`` table, ``parse(model, example)`` to validate it,
            the config file's label, ``tool_dirs`` and its own ``state_dir``.
        config: deprecated, for plugins written before ``settings``: the whole validated
            config (``rungd.config.Config``, typed loosely: the contract sits below the
            config). Asking for it warns; it goes in rungd 0.2.

    Returns:
        Nothing; the result is ignored. Raise ``rungd.sdk.ConfigError`` (from
        ``settings.parse``) when the settings are wrong: start-up stops and says why.
    """


@hookspec(firstresult=True)
def rungd_credential(name: str, tool: str) -> str | None:
    """Supply the credential called ``name`` for a call of ``tool``.

    Called during a call, when its tool declares that it needs a credential and the daemon's
    own store (file, environment, systemd ``$CREDENTIALS_DIRECTORY``) does not hold it.

    Args:
        name: the credential's name as the tool declares it.
        tool: the name of the tool being called.

    Returns:
        The value, or None to pass. The first plugin that returns a value wins and the
        rest are not asked. The value is redacted from everything the call returns or records.
    """


@hookspec
def rungd_observe_result(tool: str, envelope: Envelope, caller: Caller) -> None:
    """Observe the result of every call, after it is final and before the caller hears it.

    Called once per call, by every plugin that implements it, whatever the result.

    Args:
        tool: the tool's name.
        envelope: the ``rungd.core.envelope.Envelope`` (read-only; credentials already redacted).
        caller: the ``rungd.sdk.Caller`` of the call.

    Returns:
        Nothing; return values are ignored. An observer that raises is logged and does not
        stop the other observers or change the result.
    """
