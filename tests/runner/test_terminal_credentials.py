"""Real gpg (Debian packages gpg and gpg-agent), in a home folder of the test's own, on the
daemon's terminal: a passphrase asked there is AUTH_REQUIRED because gpg turned echo off,
answered there when the tool declares it; a failure whose words say it wanted a terminal
(its agent's, outside the call) is AUTH_REQUIRED too."""

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


async def test_gpg_asking_its_passphrase_on_the_terminal_is_auth_required_by_its_echo(
        short_tmp, nursery, gnupg) -> None:
    # Issue 29: gpg opens /dev/tty (the daemon's terminal), turns echo off and asks. No word
    # of its decides: the terminal's echo does.
    env = await call_gpg(short_tmp, nursery, "--homedir", str(gnupg), "--pinentry-mode", "loopback",
                         "--decrypt", str(short_tmp / "sealed.gpg"))
    assert env.error is not None and env.error.code == "AUTH_REQUIRED", env
    assert "echo off" in env.error.message and env.fields["question"] == "Enter passphrase:"
    assert env.next_action == "request_authority" and env.elapsed_ms < 8000


async def test_gpg_given_its_passphrase_on_the_terminal_decrypts(short_tmp, nursery, gnupg, monkeypatch) -> None:
    monkeypatch.setenv("RUNGD_CRED_GPG_PASSPHRASE", "pw")
    text = TOOL.format(gpg=shutil.which("gpg"), argv=", ".join(f'"{a}"' for a in (
        "--homedir", str(gnupg), "--pinentry-mode", "loopback", "--decrypt", str(short_tmp / "sealed.gpg"))))
    text += """
[[tools.keys_secret_read.credential_prompt]]
pattern = "^Enter passphrase:"
credential = "gpg_passphrase"
[tools.keys_secret_read.parse]
kind = "lines"
"""
    daemon = await serve_tool_file(nursery, short_tmp, text)
    env = await daemon.call("keys_secret_read", {})
    daemon.daemon.stop()
    assert env.status == "ok", env
    assert "secret words" in str(env.fields) and "pw" not in str(env.fields).replace("pwd", "")


async def test_gpg_whose_agent_finds_no_terminal_for_the_passphrase_is_auth_required(
        short_tmp, nursery, gnupg) -> None:
    # The agent is outside the call's session: its pinentry finds no terminal, and gpg fails
    # saying so. A failure its words name (they can only name a failure, never make one ok).
    env = await call_gpg(short_tmp, nursery, "--homedir", str(gnupg), "--decrypt", str(short_tmp / "sealed.gpg"))
    assert env.error is not None and env.error.code == "AUTH_REQUIRED", env
    assert "Inappropriate ioctl for device" in env.error.hint


async def test_gpg_asking_over_several_lines_is_quoted_whole(short_tmp, nursery, gnupg) -> None:
    # quick-gen-key says why it wants entropy over four lines, then asks for the new key's
    # passphrase: the question is all it wrote on the terminal since it started.
    env = await call_gpg(short_tmp, nursery, "--homedir", str(gnupg), "--status-fd", "2", "--pinentry-mode",
                         "loopback", "--quick-gen-key", "someone@example.com")
    assert env.error is not None and env.error.code == "AUTH_REQUIRED", env
    question = env.fields["question"]
    assert question.endswith("Enter passphrase:") and question.count("\n") >= 2, question


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
