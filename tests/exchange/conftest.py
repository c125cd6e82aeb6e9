"""Fixtures for the file-exchange tests: a daemon with the xfer tools, its folders, and the
fake legacy programs of tests/fakes run as real processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import FAKES

XFER_TOOLS = Path(__file__).with_name("xfer_tools.py")


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{XFER_TOOLS}"]
"""


@pytest.fixture
def xfer(rungd_daemon: Any) -> Path:
    """The xfer tools' folder under the daemon's state folder."""
    return rungd_daemon.config.state_dir / "xfer"


async def fake(name: str, *args: Any) -> str:
    """Run a fake legacy program to its end; return what it printed."""
    done = await trio.run_process([sys.executable, str(FAKES / name), *map(str, args)], capture_stdout=True,
                                  capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


class Background:
    """Fake programs started in the background; killed when the test ends."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.processes: list[trio.Process] = []

    async def start(self, name: str, *args: Any, ready: str | None = None) -> trio.Process:
        """Start ``name``; with ``ready``, wait until it prints that word."""
        process = await trio.lowlevel.open_process([sys.executable, str(FAKES / name), *map(str, args)],
                                                   stdout=subprocess.PIPE if ready else subprocess.DEVNULL)
        self.processes.append(process)
        if ready:
            assert process.stdout is not None
            seen = b""
            with trio.fail_after(10):
                while ready.encode() not in seen:
                    chunk = await process.stdout.receive_some()
                    assert chunk, f"{name} ended before it printed {ready!r}"
                    seen += chunk
        return process

    async def stop(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                process.terminate()
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            if process.stdout is not None:
                await process.stdout.aclose()


@pytest.fixture
async def background(nursery: trio.Nursery) -> AsyncIterator[Background]:
    programs = Background(nursery)
    yield programs
    await programs.stop()
