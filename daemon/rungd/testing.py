"""Test helpers for rungd and for plugin authors: a real daemon on a real socket.

Use it as a pytest plugin (``pytest_plugins = ["rungd.testing"]``) with pytest-trio in
``trio_mode`` (both come with rungd's ``test`` extra):

    async def test_my_tool(rungd_daemon):
        envelope = await rungd_daemon.call("my_tool", {"name": "x"})
        assert envelope.status == "ok"

``rungd_daemon`` serves the configuration returned by the ``rungd_config_toml`` fixture
(override it in your conftest to load your plugin). ``fake_program`` writes a small
executable Python script, the kind of fake legacy program a test needs.

The daemon runs inside the test's own process, as a child subreaper that kills what its calls
leave behind: a process the test itself starts in a session of its own (``start_new_session``)
while a daemon runs is such a stray to it, and is killed. Start such a helper through
``setsid --fork --wait`` (its own child then), or before the daemon.

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

from rungd.config import Config, load_config
# A daemon in this process, for tests and for rungctl check alike; the test kit's names.
from rungd.service.inprocess import DEMO_PLUGINS, RunningDaemon, start_daemon, write_config

__all__ = ["DEMO_PLUGINS", "STUB_DESCRIPTION", "RunningDaemon", "serve_tool_file", "start_daemon", "write_config"]


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
