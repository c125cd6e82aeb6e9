"""The README's TypeScript/JavaScript snippet runs as written on Node against a live daemon.

A doc test: the ```js block of "## Wire protocol" is saved as agent.mjs, exactly as the
README tells a reader to, beside a real ``npm install @msgpack/msgpack``, and run by node.
Skipped, saying why, when node or the package cannot be had (no network, no apt).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from rungd.testing import RunningDaemon

README = Path(__file__).resolve().parents[2] / "README.md"
INSTALL_TIMEOUT_S = 300


def readme_snippet() -> str:
    """The ```js block of the README's "## Wire protocol" section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Wire protocol\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```js\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the Wire protocol section should hold exactly one ```js block"
    return blocks[0]


def find_node() -> str:
    """node on PATH, else installed from Debian (bounded in time), else skip."""
    node = shutil.which("node")
    if node is None and shutil.which("apt-get") and os.geteuid() == 0:
        try:
            subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nodejs", "npm"],
                           capture_output=True, timeout=INSTALL_TIMEOUT_S, check=False,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        except subprocess.TimeoutExpired:
            pass
        node = shutil.which("node")
    if node is None:
        pytest.skip("the README's snippet needs node; it is not installed and apt-get could not install nodejs")
    return node


@pytest.fixture(scope="module")
def agent_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    node = find_node()
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"the README's snippet needs npm to install @msgpack/msgpack; node is at {node} but npm is not")
    folder = tmp_path_factory.mktemp("ts-agent")
    try:
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "@msgpack/msgpack"],
                              cwd=folder, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install @msgpack/msgpack took too long (no registry reachable?)")
    if done.returncode != 0:
        pytest.skip(f"npm install @msgpack/msgpack failed (no registry reachable?): {done.stderr.strip()[-300:]}")
    (folder / "agent.mjs").write_text(readme_snippet(), encoding="utf-8")
    yield folder


async def test_the_readme_snippet_runs_as_written_and_gets_a_result(agent_folder: Path,
                                                                   rungd_daemon: RunningDaemon) -> None:
    node = shutil.which("node")
    assert node is not None
    with trio.fail_after(60):
        done = await trio.run_process([node, "agent.mjs"], cwd=agent_folder, capture_stdout=True,
                                      capture_stderr=True, check=False,
                                      env={**os.environ, "RUNGD_SOCKET": str(rungd_daemon.socket)})
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    status, _, fields = out.strip().partition(" ")
    # The status is the tool's business (the demo program may fail); the protocol round
    # trip is what the snippet shows, and a result envelope came back.
    assert status in ("ok", "error", "pending"), out
    assert fields.startswith("{") or fields == "undefined", out


async def test_the_snippet_reports_a_protocol_error_instead_of_crashing_on_it(
        agent_folder: Path, rungd_daemon: RunningDaemon) -> None:
    """A reply that is not a result (here: no such tool is still a result, so send a bad frame
    type through the same function) is reported in one line, not as a TypeError."""
    node = shutil.which("node")
    assert node is not None
    probe = agent_folder / "probe.mjs"
    probe.write_text(readme_snippet().replace('type: "call"', 'type: "no_such_request"'), encoding="utf-8")
    with trio.fail_after(60):
        done = await trio.run_process([node, "probe.mjs"], cwd=agent_folder, capture_stdout=True,
                                      capture_stderr=True, check=False,
                                      env={**os.environ, "RUNGD_SOCKET": str(rungd_daemon.socket)})
    assert done.returncode != 0
    assert "protocol_error: INVALID_MESSAGE" in done.stderr.decode()
