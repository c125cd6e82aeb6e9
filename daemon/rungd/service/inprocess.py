"""A daemon in this process, on a real socket: what the test kit (``rungd.testing``) and
``rungctl check``'s throw-away daemon both start.

    write_config(folder, body)        a config with its socket and state inside ``folder``
    start_daemon(nursery, config)     a Daemon serving in ``nursery``, once its socket listens
    RunningDaemon                     that daemon, and helpers that call it from a worker thread
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import trio

from rungd.client import Client
from rungd.config import Config
from rungd.core.envelope import Envelope
from rungd.service.daemon import Daemon


# The demo-only plugins a test daemon offers unless asked not to: the fake programs every
# walkthrough and many tests call, so a test config need not repeat the opt-in.
DEMO_PLUGINS = ("demo", "ledgerbook")


def write_config(folder: Path, body: str = "", *, demo_plugins: bool = True) -> Path:
    """Write a config file into ``folder`` with the socket and state inside it.

    Args:
        folder: where the config, the socket and the state folder go.
        body: extra TOML appended as is; it must not repeat ``[server]`` or ``[state]``.
        demo_plugins: opt in to the demo-only plugins (``demo``, ``ledgerbook``) by giving
            each an empty ``[plugins.settings.<name>]`` table, unless ``body`` has its own.
            Pass False to test what a production config offers.

    Returns:
        The config file's path.
    """
    body = textwrap.dedent(body)
    if demo_plugins:
        body += "".join(f"\n[plugins.settings.{name}]\n" for name in DEMO_PLUGINS
                        if f"[plugins.settings.{name}]" not in body)
    path = folder / "rungd.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [server]
            socket = "{folder / 'rungd.sock'}"
            shutdown_grace_s = 2

            [state]
            dir = "{folder / 'state'}"
            """
        )
        + body,
        encoding="utf-8",
    )
    return path


class RunningDaemon:
    """A daemon serving in the test's nursery, and async helpers that call it."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.socket = daemon.socket_path
        self.config: Config = daemon.config

    def client(self) -> Client:
        return Client(self.socket)

    async def call(
        self, tool: str, inputs: dict[str, Any] | None = None, *, request_id: str | None = None, wait_s: float = 30
    ) -> Envelope:
        def blocking() -> Envelope:
            with self.client() as client:
                return client.call(tool, inputs, request_id=request_id, wait_s=wait_s)

        return await trio.to_thread.run_sync(blocking)

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(client, *args)`` with a fresh client in a worker thread."""

        def blocking() -> Any:
            with self.client() as client:
                return fn(client, *args)

        return await trio.to_thread.run_sync(blocking)


async def start_daemon(nursery: trio.Nursery, config: Config, *, stand_in: Any = None) -> RunningDaemon:
    """Start a daemon for ``config`` in ``nursery``; returns once its socket listens.

    ``stand_in``: the substitute for every program in ``rungctl check`` and eval's dry run
    (``Daemon``'s argument).
    """
    daemon = Daemon(config, stand_in=stand_in)
    await nursery.start(daemon.serve)
    return RunningDaemon(daemon)


