"""A question rungd will not answer gets no answer at all, so the program cannot act on one.

Issue 18: a failed or empty askpass answer is, for many programs, an empty secret (ssh-keygen
then writes an unencrypted key). Every refusal (an undeclared question, a declared one whose
credential rungd does not hold, a re-ask beyond the declared count) holds the program until
its tree is killed, and the call raises AUTH_REQUIRED quoting the exact question. The same for
a credential prompt on stdin: nothing is written, stdin stays open. A credential the program
needs from the start is looked up before anything starts.

These tests drive ``rungd.runner.run`` directly with real programs: the fakes in tests/fakes
and the real ssh-keygen.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from rungd import runner
from rungd.core.contract import CallContext, Caller, Description, Result, Timing, Tool, ToolInputs
from rungd.core.errors import AuthRequired, PromptUnexpected

FAKES = Path(__file__).parents[1] / "fakes"
SECRET = "Pw-9xq-never-leaks"


class NoInputs(ToolInputs):
    pass


async def _unused(ctx: Any, inputs: Any) -> Result:
    return Result()


TOOL = Tool(name="runner_probe_run", inputs=NoInputs, outputs={}, handler=_unused,
            description=Description(does="Runs a program for the runner's tests.", use_when="testing.",
                                    do_not_use_when="not testing.", returns="nothing.", on_error="codes.",
                                    if_unknown="ask."),
            timing=Timing(deadline_s=20))


def make_ctx(folder: Path, credentials: Mapping[str, str] = {}, call_id: str | None = None) -> CallContext:
    call_id = call_id or "c" + os.urandom(8).hex()  # shaped like the daemon's ids
    (folder / "evidence").mkdir(exist_ok=True)
    return CallContext(call_id=call_id, tool=TOOL, caller=Caller(0, 0, 0), request_id=None,
                       deadline=trio.current_time() + 20, work_dir=folder / "work" / call_id,
                       evidence_dir=folder / "evidence", credentials=dict(credentials).get)


async def run_quick(ctx: CallContext, program: runner.Program) -> runner.Completed:
    """Run it; a refusal must end the call long before a deadline would."""
    with trio.fail_after(10):
        return await runner.run(ctx, program)


def asker(*questions: str, act: Path, **options: Any) -> runner.Program:
    argv = [str(FAKES / "askpass_asker"), "--act", str(act)]
    for question in questions:
        argv += ["--ask", question]
    return runner.Program(argv=tuple(argv), **options)


def prompt(pattern: str, credential: str = "pw", times: int = 1) -> runner.CredentialPrompt:
    return runner.CredentialPrompt(re.compile(pattern), credential, times)


def evidence(ctx: CallContext, label: str) -> bytes:
    name = next(e for e in ctx.evidence if e.endswith(label))
    return (ctx.evidence_dir / name).read_bytes()


async def test_an_undeclared_askpass_question_gets_no_answer_and_the_program_never_acts(short_tmp) -> None:
    act = short_tmp / "key"
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp), asker("Enter passphrase (empty for no passphrase):", act=act))
    assert caught.value.fields["question"] == "Enter passphrase (empty for no passphrase):"
    assert not act.exists()


async def test_a_declared_askpass_question_whose_credential_is_missing_starts_nothing(short_tmp) -> None:
    # As a credential the program gets from the start: looked for before anything starts
    # (a trial's passwd ran, and was stopped at its question, its outcome unknown).
    act = short_tmp / "key"
    program = asker("Enter passphrase:", act=act, askpass=(prompt("^Enter passphrase"),))
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp), program)
    assert "'pw', which rungd does not hold" in caught.value.message and "nothing was run" in caught.value.hint
    assert not act.exists()


async def test_a_re_ask_beyond_the_declared_count_is_rejected_and_not_answered(short_tmp) -> None:
    act = short_tmp / "key"
    program = asker("Password:", "Password:", act=act, askpass=(prompt("^Password:"),))
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp, {"pw": SECRET}), program)
    assert "rejected" in caught.value.message
    assert caught.value.fields["question"] == "Password:"
    assert not act.exists()
    assert SECRET not in str(caught.value) + caught.value.hint


async def test_a_question_is_answered_as_often_as_declared(short_tmp) -> None:
    act = short_tmp / "key"
    program = asker("Password:", "Password:", act=act, askpass=(prompt("^Password:", times=2),))
    done = await run_quick(make_ctx(short_tmp, {"pw": SECRET}), program)
    assert done.exit_status == 0, done.stderr
    assert done.answered == ["askpass pw", "askpass pw"]
    assert act.read_text() == f"secret length {len(SECRET)}\n"


async def test_an_askpass_pattern_sees_the_raw_question_and_the_quote_is_redacted(short_tmp) -> None:
    # The user name is itself a credential (so it is redacted from everything kept), yet the
    # declared pattern names it, as a tool file for git over HTTP does.
    user = "deploy-user-x1"
    credentials = {"pw": SECRET, "user": user}
    question = f"Password for 'http://{user}@127.0.0.1':"
    declared = asker(question, act=short_tmp / "a", env_credentials={"GIT_USER": "user"},
                     askpass=(prompt(rf"^Password for 'http://{user}@"),))
    done = await run_quick(make_ctx(short_tmp, credentials), declared)
    assert done.answered == ["askpass pw"]
    undeclared = asker(question, act=short_tmp / "b", env_credentials={"GIT_USER": "user"})
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp, credentials), undeclared)
    assert caught.value.fields["question"] == "Password for 'http://[REDACTED]@127.0.0.1':"
    assert user not in caught.value.message


async def test_a_stdin_credential_prompt_without_its_credential_writes_nothing(short_tmp) -> None:
    # The credential is looked for before the start (then nothing starts); a store that
    # loses it meanwhile (removed from the store mid-call) leaves the question unanswered.
    ctx = make_ctx(short_tmp)
    held = [SECRET]
    ctx.credentials = lambda name: held.pop() if held else None
    program = runner.Program(argv=(str(FAKES / "password"),), credential_prompts=(prompt("^Password:"),))
    with pytest.raises(AuthRequired) as caught:
        await run_quick(ctx, program)
    assert caught.value.fields["question"] == "Password:"
    # The fake says "Sorry, try again." to anything it reads, end-of-file included: it read nothing.
    assert b"Sorry" not in evidence(ctx, "stderr")


async def test_a_stdin_credential_prompt_the_store_lacks_starts_nothing(short_tmp) -> None:
    # A trial's passwd ran and was stopped at its question, outcome unknown; the README says
    # a credential the store lacks fails the call before the program starts.
    ctx = make_ctx(short_tmp)
    program = runner.Program(argv=(str(FAKES / "password"),), credential_prompts=(prompt("^Password:"),))
    with pytest.raises(AuthRequired) as caught:
        await run_quick(ctx, program)
    assert "nothing was run" in caught.value.hint and not ctx.spawned and not ctx.evidence


async def test_a_stdin_credential_prompt_asked_again_is_rejected_not_resent(short_tmp) -> None:
    ctx = make_ctx(short_tmp, {"pw": SECRET})
    program = runner.Program(argv=(str(FAKES / "password"), "--expect", "other"),
                             credential_prompts=(prompt("Password:"),))
    # The fake exits after one wrong answer; two_prompts shows the re-ask case below.
    done = await run_quick(ctx, program)
    assert done.exit_status == 1 and done.answered == ["credential pw"]
    again = runner.Program(argv=(str(FAKES / "two_prompts"),), credential_prompts=(prompt(r"password:\s*$"),))
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp, {"pw": SECRET}), again)
    assert "rejected" in caught.value.message
    assert caught.value.fields["question"] == "Retype new password:"


async def test_a_credential_the_program_needs_from_the_start_is_looked_up_before_it_starts(short_tmp) -> None:
    act = short_tmp / "acted"
    for options in ({"env_credentials": {"APP_PW": "pw"}}, {"file_credentials": {"APP_PW_FILE": "pw"}}):
        with pytest.raises(AuthRequired) as caught:
            await run_quick(make_ctx(short_tmp), asker(act=act, **options))
        assert "nothing was run" in caught.value.hint
        assert not act.exists()


needs_ssh_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                      reason="ssh-keygen is not installed (.ci/run installs openssh-client)")


@needs_ssh_keygen
async def test_real_ssh_keygen_with_an_undeclared_passphrase_never_writes_a_key(short_tmp) -> None:
    started = time.monotonic()
    for i in range(50):
        key = short_tmp / f"id_{i}"
        program = runner.Program(argv=("ssh-keygen", "-q", "-t", "ed25519", "-f", str(key), "-C", "rungd-test"))
        with pytest.raises(AuthRequired) as caught:
            await run_quick(make_ctx(short_tmp), program)
        assert caught.value.fields["question"] == "Enter passphrase (empty for no passphrase):"
        assert not key.exists() and not key.with_suffix(".pub").exists(), f"run {i} wrote a key"
    print(f"50 refused ssh-keygen runs: {(time.monotonic() - started) / 50 * 1000:.0f} ms each")


@needs_ssh_keygen
async def test_real_ssh_keygen_with_a_declared_passphrase_writes_an_encrypted_key(short_tmp) -> None:
    key = short_tmp / "id_declared"
    program = runner.Program(
        argv=("ssh-keygen", "-q", "-t", "ed25519", "-f", str(key), "-C", "rungd-test"),
        askpass=(prompt(r"^Enter passphrase"), prompt(r"^Enter same passphrase again")))
    done = await run_quick(make_ctx(short_tmp, {"pw": SECRET}), program)
    assert done.exit_status == 0, done.stderr
    unlock: Callable[[str], int] = lambda phrase: subprocess.run(
        ["ssh-keygen", "-y", "-P", phrase, "-f", str(key)], capture_output=True).returncode
    assert unlock("") != 0, "the key was written without a passphrase"
    assert unlock(SECRET) == 0


async def test_a_declared_stdin_question_is_matched_on_what_followed_the_last_answer(short_tmp) -> None:
    # Issue 12.3: unechoed answers put the next prompt on the same line; anchored patterns match.
    program = runner.Program(argv=(str(FAKES / "two_prompts"),),
                             credential_prompts=(prompt("^New password:"), prompt("^Retype new password:")))
    done = await run_quick(make_ctx(short_tmp, {"pw": SECRET}), program)
    assert done.exit_status == 0, done.stderr
    assert "password updated" in done.stdout
    assert done.answered == ["credential pw", "credential pw"]
    undeclared = runner.Program(argv=(str(FAKES / "two_prompts"),), credential_prompts=(prompt("^New password:"),))
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp, {"pw": SECRET}), undeclared)
    assert caught.value.fields["question"] == "Retype new password:"


@pytest.mark.parametrize("words", ["Enter PEM pass phrase:", "Enter PIN for 'token0':", "Passcode:",
                                   "Verification code:", "OTP:", "Enter your one-time password:",
                                   "Authentication token:"])
async def test_credential_words_programs_use_are_auth_required(short_tmp, fake_program, words) -> None:
    # Issue 12.5: what OpenSSL, smart-card and one-time-code tools say is a credential question.
    asks = fake_program("asks", f"""
        import sys
        sys.stderr.write({words!r} + " ")
        sys.stderr.flush()
        sys.stdin.readline()
    """)
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(asks),)))
    assert caught.value.fields["question"] == words


@pytest.mark.parametrize(("args", "error", "question"), [
    ((), PromptUnexpected, "Continue? [y/N]"),
    (("password",), AuthRequired, "Enter password:"),
])
async def test_a_program_that_asked_on_dev_tty_never_ends_ok(short_tmp, args, error, question) -> None:
    # Issue 29: the script's read from /dev/tty blocks on the daemon's terminal: a question,
    # and a secret one exactly when it turned echo off (the same words, echo on, are a question).
    with pytest.raises(error) as caught:
        await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(FAKES / "tty_question"), *args)))
    assert caught.value.fields["question"] == question
    assert "terminal" in caught.value.message


@pytest.mark.parametrize(("args", "error", "question"), [
    ((), PromptUnexpected, "Continue? [y/N]"),
    (("password",), AuthRequired, "Enter password:"),
])
async def test_without_a_terminal_a_program_that_asked_on_dev_tty_never_ends_ok(short_tmp, args, error,
                                                                                 question) -> None:
    # Issue 12.2, for a tool that opted out of the terminal: the read from /dev/tty fails
    # (ENXIO), the script carries on and exits 0; only its words are left to tell.
    program = runner.Program(argv=(str(FAKES / "tty_question"), *args), terminal="none")
    with pytest.raises(error) as caught:
        await run_quick(make_ctx(short_tmp), program)
    assert caught.value.fields["question"] == question
    assert "/dev/tty" in caught.value.hint


async def test_output_that_merely_mentions_dev_tty_is_not_a_question(short_tmp, fake_program) -> None:
    lister = fake_program("lister", """
        print("crw-rw-rw- 1 root tty 5, 0 Jan 1 00:00 /dev/tty   (open by nobody)")
    """)
    done = await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(lister),)))
    assert done.exit_status == 0
