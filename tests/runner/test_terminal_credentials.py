"""A program that wanted a terminal for a credential is AUTH_REQUIRED, by its own words;
one that did not say what it wanted the terminal for stays PROMPT_UNEXPECTED. Real gpg
(Debian packages gpg and gpg-agent), in a home folder of the test's own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rungd.testing import STUB_DESCRIPTION, serve_tool_file

pytestmark = pytest.mark.skipif(not shutil.which("gpg") or not shutil.which("gpg-agent"),
                                reason="needs gpg and gpg-agent (Debian packages gpg, gpg-agent)")

TOOL = """
[program]
name = "gpg"
command = "{gpg}"
[tools.keys_secret_read]
argv = [{argv}]
[tools.keys_secret_read.description]
""" + STUB_DESCRIPTION


@pytest.fixture
def gnupg(short_tmp: Path):
    """A gpg home folder with a file encrypted to a passphrase; its agent stopped after."""
    home = short_tmp / "g"
    home.mkdir(mode=0o700)
    (short_tmp / "plain.txt").write_text("secret words\n")
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", "pw",
                    "-o", str(short_tmp / "sealed.gpg"), "--symmetric", str(short_tmp / "plain.txt")],
                   check=True, capture_output=True, timeout=60)
    # The passphrase must not be cached: each call's gpg must ask for it again.
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, timeout=30)
    yield home
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, timeout=30)


async def call_gpg(short_tmp: Path, nursery, *args: str):
    argv = ", ".join(f'"{a}"' for a in args)
    daemon = await serve_tool_file(nursery, short_tmp, TOOL.format(gpg=shutil.which("gpg"), argv=argv))
    env = await daemon.call("keys_secret_read", {})
    daemon.daemon.stop()
    return env


async def test_gpg_saying_it_needs_a_passphrase_before_it_fails_on_dev_tty_is_auth_required(
        short_tmp, nursery, gnupg) -> None:
    env = await call_gpg(short_tmp, nursery, "--homedir", str(gnupg), "--status-fd", "2", "--pinentry-mode",
                         "loopback", "--decrypt", str(short_tmp / "sealed.gpg"))
    assert env.error is not None and env.error.code == "AUTH_REQUIRED", env
    assert "/dev/tty" in env.error.hint and env.next_action == "request_authority"


async def test_gpg_whose_agent_finds_no_terminal_for_the_passphrase_is_auth_required(
        short_tmp, nursery, gnupg) -> None:
    env = await call_gpg(short_tmp, nursery, "--homedir", str(gnupg), "--decrypt", str(short_tmp / "sealed.gpg"))
    assert env.error is not None and env.error.code == "AUTH_REQUIRED", env
    assert "Inappropriate ioctl for device" in env.error.hint


async def test_gpg_reaching_for_dev_tty_without_saying_why_stays_prompt_unexpected(short_tmp, nursery, gnupg) -> None:
    # quick-gen-key asks "Continue? (Y/n)" on /dev/tty, in the same words as for a
    # passphrase: nothing says a credential, so it is not called one.
    env = await call_gpg(short_tmp, nursery, "--homedir", str(gnupg), "--status-fd", "2", "--pinentry-mode",
                         "loopback", "--quick-gen-key", "someone@example.com")
    assert env.error is not None and env.error.code == "PROMPT_UNEXPECTED", env
    assert "not what it wanted to ask" in env.error.hint and "credential" in env.error.hint


def test_ordinary_output_about_passwords_is_no_statement_that_a_credential_is_needed() -> None:
    # A listing that mentions a password reset, then a question on /dev/tty: a question,
    # not AUTH_REQUIRED (only stderr and status lines state what the program needs).
    from rungd.core.errors import PromptUnexpected
    from rungd.runner.exits import check_terminal
    from rungd.runner.program import Completed, Program

    done = Completed(exit_status=1, stdout="alice needs a password reset\n", stderr="", stdout_bytes=29,
                     stderr_bytes=0, answered=[], evidence=[])
    with pytest.raises(PromptUnexpected):
        check_terminal(done, Program(argv=("/usr/bin/tool",)), ("cannot open '/dev/tty'", "Continue? (Y/n)"))
