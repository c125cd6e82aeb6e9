"""The hooks a rungd plugin may implement. Project name ``rungd``; every hook is ``rungd_*``.

Hooks are synchronous and cheap: they run on the daemon's event loop. Slow work belongs in
a tool's handler, never in a hook.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("rungd")
hookimpl = pluggy.HookimplMarker("rungd")


@hookspec
def rungd_register_tools(register: Any, config: Any) -> None:
    """Register this plugin's tools. Called once at start-up, for every plugin.

    Args:
        register: call ``register(tool)`` with a ``rungd.contract.Tool`` for each tool.
            The daemon records which plugin registered it; a name registered by two plugins
            stops start-up with an error naming both.
        config: the daemon's validated ``rungd.config.Config`` (read-only).
    """


@hookspec(firstresult=True)
def rungd_credential(name: str, tool: str) -> str | None:
    """Supply the credential called ``name`` for a call of ``tool``.

    Called when a tool declares that it needs a credential and the daemon's own store
    (file, environment, systemd ``$CREDENTIALS_DIRECTORY``) does not hold it. The first
    plugin that returns a value wins; return None to pass. The value is redacted from
    everything the call returns or records.
    """


@hookspec
def rungd_observe_result(tool: str, envelope: Any, caller: Any) -> None:
    """Observe the result of every call, after it is final and before the caller hears it.

    Args:
        tool: the tool's name.
        envelope: the ``rungd.envelope.Envelope`` (read-only; credentials already redacted).
        caller: the ``rungd.contract.Caller`` of the call.

    Every plugin's implementation is called; return values are ignored. An observer that
    raises is logged and does not change the result.
    """
