"""Test helpers for rungd and for plugin authors: a real daemon on a real socket.

Use it as a pytest plugin (``pytest_plugins = ["rungd.testing"]``) with pytest-trio in
``trio_mode`` (both come with rungd's ``test`` extra):

    async def test_my_tool(rungd_daemon):
        envelope = await rungd_daemon.call("my_tool", {"name": "x"})
        assert envelope.status == "ok"

``rungd_daemon`` serves the configuration returned by the ``rungd_config_toml`` fixture
(override it in your conftest to load your plugin). ``fake_program`` writes a small
executable Python script, the kind of fake legacy program a test needs.

Importing this module does not import pytest: ``write_config``, ``start_daemon`` and
``RunningDaemon`` work without it, and the fixtures are built the first time pytest asks
for them (PEP 562 module ``__getattr__``), since only the ``test`` extra installs pytest.
"""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import trio

from rungd.client import Client
from rungd.config import Config, load_config
from rungd.service.daemon import Daemon
from rungd.core.envelope import Envelope


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


async def start_daemon(nursery: trio.Nursery, config: Config) -> RunningDaemon:
    """Start a daemon for ``config`` in ``nursery``; returns once its socket listens."""
    daemon = Daemon(config)
    await nursery.start(daemon.serve)
    return RunningDaemon(daemon)


async def serve_tool_file(nursery: trio.Nursery, folder: Path, text: str, *, name: str = "tools.toml",
                          config: str = "") -> RunningDaemon:
    """Start a daemon serving one tool file: ``text`` written as ``folder/tools/name``, the
    config (with ``config`` TOML added) and the socket in ``folder``."""
    tools = folder / "tools"
    tools.mkdir(exist_ok=True)
    (tools / name).write_text(text)
    body = f'[plugins]\ntool_dirs = ["{tools}"]\n{config}'
    return await start_daemon(nursery, load_config(write_config(folder, body)))


# The six description slots a tool file needs, for a test's tool that says nothing more.
STUB_DESCRIPTION = "\n".join(f'{slot} = "t."' for slot in
                              ("does", "use_when", "do_not_use_when", "returns", "on_error", "if_unknown")) + "\n"


def _short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path: a Unix socket path must fit in 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="rungd-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rungd_config_toml() -> str:
    """Extra TOML for the test daemon's config. Override to load your plugin or tools."""
    return ""


def _rungd_config(short_tmp: Path, rungd_config_toml: str) -> Config:
    return load_config(write_config(short_tmp, rungd_config_toml))


async def _rungd_daemon(nursery: trio.Nursery, rungd_config: Config) -> AsyncIterator[RunningDaemon]:
    running = await start_daemon(nursery, rungd_config)
    yield running
    running.daemon.stop()


def _fake_program(short_tmp: Path) -> Any:
    """Build a fake legacy program: ``fake_program("name", source)`` returns its path.

    The source is a Python script body; it gets a shebang and the executable bit, so a
    person can run it by hand the same way the daemon does.
    """

    def build(name: str, source: str) -> Path:
        folder = short_tmp / "fakes"
        folder.mkdir(exist_ok=True)
        path = folder / name
        path.write_text("#!/usr/bin/env python3\n" + textwrap.dedent(source), encoding="utf-8")
        path.chmod(0o755)
        return path

    return build


# name -> the function behind the fixture of that name; pytest finds them through the
# module's __dir__ and __getattr__, so pytest is imported only when pytest itself asks.
_FIXTURES: dict[str, Any] = {
    "short_tmp": _short_tmp,
    "rungd_config_toml": _rungd_config_toml,
    "rungd_config": _rungd_config,
    "rungd_daemon": _rungd_daemon,
    "fake_program": _fake_program,
}
_built: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name not in _FIXTURES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        import pytest  # only the test extra installs it; nothing else here needs it

        _built[name] = pytest.fixture(_FIXTURES[name], name=name)
    return _built[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_FIXTURES})
