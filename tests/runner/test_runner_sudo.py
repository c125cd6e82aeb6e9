"""The real ``sudo -A``: its askpass question is answered only as declared, and never with
nothing (issues 18 and 12.12).

sudo asks only a user other than root, and runs SUDO_ASKPASS as that user. The test makes a
user with a password and a sudoers rule (root only; .ci/run installs sudo), and runs
``setpriv --reuid USER sudo -A -k touch FILE`` through the runner; the file is the effect.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rungd import runner
from rungd.core.errors import AuthRequired
from tests.runner.test_runner_refusals import make_ctx, run_quick

USER = "rungd-sudo-test"
PASSWORD = "Sudo-pw-4Qz-test-only"
SUDOERS = Path("/etc/sudoers.d/rungd-sudo-test")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="making a sudo user needs root (CI runs as root)"),
    pytest.mark.skipif(not all(shutil.which(p) for p in ("sudo", "setpriv", "useradd", "chpasswd")),
                       reason="sudo is not installed (.ci/run installs the Debian package sudo)"),
]


@pytest.fixture(scope="module")
def sudo_user() -> Iterator[str]:
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
    subprocess.run(["chpasswd"], input=f"{USER}:{PASSWORD}\n", text=True, check=True)
    SUDOERS.write_text(f"{USER} ALL=(root) /usr/bin/touch\n")
    SUDOERS.chmod(0o440)
    try:
        yield USER
    finally:
        SUDOERS.unlink(missing_ok=True)


@pytest.fixture
def state(short_tmp: Path) -> Path:
    short_tmp.chmod(0o711)  # the user sudo runs the helper as must reach it (no listing)
    for sub in ("work", "evidence"):
        (short_tmp / sub).mkdir(mode=0o711, exist_ok=True)
    return short_tmp


def sudo_touch(target: Path, *askpass: runner.CredentialPrompt) -> runner.Program:
    return runner.Program(
        argv=("setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups",
              "sudo", "-A", "-k", "/usr/bin/touch", str(target)),
        askpass=askpass)


QUESTION = f"[sudo] password for {USER}:"
DECLARED = runner.CredentialPrompt(re.compile(r"^\[sudo\] password for "), "sudo_pw")


async def test_sudo_askpass_undeclared_is_auth_required_and_nothing_runs(sudo_user, state) -> None:
    target = state / "touched"
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(state), sudo_touch(target))
    assert caught.value.fields["question"] == QUESTION
    assert not target.exists()


async def test_sudo_askpass_declared_without_its_credential_runs_nothing(sudo_user, state) -> None:
    target = state / "touched"
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(state), sudo_touch(target, DECLARED))
    assert "does not hold" in caught.value.message
    assert not target.exists()


async def test_sudo_askpass_declared_is_answered_and_sudo_acts(sudo_user, state) -> None:
    target = state / "touched"
    done = await run_quick(make_ctx(state, {"sudo_pw": PASSWORD}), sudo_touch(target, DECLARED))
    assert done.exit_status == 0, done.stderr
    assert done.answered == ["askpass sudo_pw"]
    assert target.exists()


async def test_a_wrong_sudo_password_is_sent_once_then_rejected(sudo_user, state) -> None:
    target = state / "touched"
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(state, {"sudo_pw": "not-the-password"}), sudo_touch(target, DECLARED))
    assert "rejected" in caught.value.message
    assert caught.value.fields["question"] == QUESTION
    assert not target.exists()


async def test_sudo_askpass_of_a_tool_run_as_that_user_is_answered(sudo_user, state) -> None:
    # `user = ...` on the tool, not setpriv in its argv: sudo runs SUDO_ASKPASS as that user,
    # who must reach and run the helper of the call's private folder (rungd's, 0711) and could
    # replace none of it.
    target = state / "touched"
    program = runner.Program(argv=("sudo", "-A", "-k", "/usr/bin/touch", str(target)), user=USER,
                             askpass=(DECLARED,))
    done = await run_quick(make_ctx(state, {"sudo_pw": PASSWORD}), program)
    assert done.exit_status == 0, done.stderr
    assert done.answered == ["askpass sudo_pw"]
    assert target.exists()
