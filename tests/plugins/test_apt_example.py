"""configs/examples/apt.toml against the real apt of this Debian host: a real [Y/n] prompt.

Needs root and network access to the Debian mirror (CI has both); the test installs the tiny
package `sl` itself with apt-get, then lets the tool remove it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rungd.config import embedded_configs

pytestmark = pytest.mark.skipif(os.getuid() != 0 or shutil.which("apt") is None, reason="needs root and apt")

EXAMPLE = embedded_configs() / "examples" / "apt.toml"


def install_sl() -> None:
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "sl"], capture_output=True, timeout=300,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if done.returncode != 0:
        pytest.skip(f"cannot install sl here: {done.stderr.decode(errors='replace')[-200:]}")


def installed() -> bool:
    done = subprocess.run(["dpkg-query", "-W", "--showformat=${Status}", "sl"], capture_output=True)
    return done.stdout.endswith(b" installed")


@pytest.fixture
def rungd_config_toml(short_tmp: Path) -> str:
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "apt.toml").write_text(EXAMPLE.read_text())
    return f'[gates]\nvisible = "log"\n\n[plugins]\ntool_dirs = ["{folder}"]\n'


async def test_remove_answers_apts_prompt_and_reads_the_state_back(rungd_daemon) -> None:
    install_sl()
    shown = await rungd_daemon.call("apt_package_show", {"package": "sl"})
    assert shown.status == "ok", shown.error
    assert shown.fields["installed"] != "(none)"
    removed = await rungd_daemon.call("apt_package_remove", {"package": "sl"}, request_id="apt-1")
    assert (removed.status, removed.effect) == ("ok", "changed"), removed.error
    assert removed.fields["after"]["installed"] == "(none)"
    assert not installed()
    again = await rungd_daemon.call("apt_package_remove", {"package": "sl"}, request_id="apt-2")
    assert (again.status, again.effect) == ("ok", "no_change")


async def test_without_the_declared_confirmation_apts_question_stops_the_call(nursery, short_tmp) -> None:
    from rungd.config import load_config
    from rungd.testing import start_daemon, write_config

    install_sl()
    text = EXAMPLE.read_text()
    undeclared = text.replace('commit_point = "confirmation"', 'commit_point = "spawn"').replace(
        "[[tools.apt_package_remove.confirm]]\npattern = 'Do you want to continue\\? \\[Y/n\\]$'\nanswer = \"Y\"\n", "")
    assert "confirm]]" not in undeclared
    folder = short_tmp / "undeclared"
    folder.mkdir()
    (folder / "apt.toml").write_text(undeclared)
    config = load_config(write_config(short_tmp, f'[gates]\nvisible = "log"\n\n[plugins]\ntool_dirs = ["{folder}"]\n'))
    daemon = await start_daemon(nursery, config)
    env = await daemon.call("apt_package_remove", {"package": "sl"}, request_id="apt-3")
    assert (env.error.code, env.next_action) == ("PROMPT_UNEXPECTED", "stop")
    assert "Do you want to continue? [Y/n]" in env.error.message
    assert installed()  # nobody answered, so apt changed nothing
    daemon.daemon.stop()
