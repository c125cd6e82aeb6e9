"""The whole question, by its shape (issue 29): what a program printed since its last answer
is the question, quoted whole; a declared pattern matches a line of it, with text after the
prompt on its line allowed; a field with a default or a yes/no choice is a question even when
it mentions a credential. Every program here is worded unlike the others in the suite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rungd import runner
from rungd.core.errors import AuthRequired, PromptUnexpected
from tests.runner.test_runner_refusals import make_ctx, run_quick

ASKS = '''
import sys
sys.stdout.write({text!r})
sys.stdout.flush()
answer = sys.stdin.readline()
open({act!r}, "w").write("got %d characters\\n" % len(answer.rstrip("\\n")))
'''


def asks(fake_program, short_tmp: Path, text: str) -> tuple[Path, Path]:
    act = short_tmp / "acted"
    return fake_program("ledgerctl", ASKS.format(text=text, act=str(act))), act


async def test_a_question_over_two_lines_is_quoted_whole(short_tmp, fake_program) -> None:
    program, act = asks(fake_program, short_tmp,
                        "Replacing the stored key of host alpha (fingerprint 3f:aa:01).\nKeep a backup copy [yes]: ")
    with pytest.raises(PromptUnexpected) as caught:
        await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(program),)))
    assert caught.value.fields["question"] == ("Replacing the stored key of host alpha (fingerprint 3f:aa:01).\n"
                                               "Keep a backup copy [yes]:")
    assert not act.exists()


@pytest.mark.parametrize("text", [
    "Vault secret file [/etc/vault.key]: ",  # a field with its default: a value, not a secret
    "Forget the saved passcode for alpha (yes/no)? ",  # a choice that mentions one
    "Rotate the service token now [y/N] ",
])
async def test_a_field_or_a_choice_that_mentions_a_credential_is_a_question(short_tmp, fake_program, text) -> None:
    program, act = asks(fake_program, short_tmp, text)
    with pytest.raises(PromptUnexpected) as caught:
        await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(program),)))
    assert caught.value.fields["question"] == text.strip()
    assert not act.exists()


async def test_a_bare_credential_prompt_is_still_one(short_tmp, fake_program) -> None:
    program, act = asks(fake_program, short_tmp, "Vault secret for alpha: ")
    with pytest.raises(AuthRequired):
        await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(program),)))
    assert not act.exists()


async def test_a_pattern_anchored_at_the_prompts_end_matches_with_a_warning_after_it(short_tmp, fake_program) -> None:
    program, act = asks(fake_program, short_tmp, "Unlock word: [caps lock is on] ")
    answered = runner.Program(argv=(str(program),), credential_prompts=(
        runner.CredentialPrompt(re.compile(r"^Unlock word: $"), "unlock", 1),))
    done = await run_quick(make_ctx(short_tmp, {"unlock": "tulip-41"}), answered)
    assert done.exit_status == 0, done.stderr
    assert act.read_text() == "got 8 characters\n"


def test_a_field_asked_on_the_terminal_is_a_question_too() -> None:
    # The same rule of shape for a program that tried /dev/tty as for one blocked on stdin.
    from rungd.runner.exits import check_terminal
    done = runner.Completed(exit_status=0, stdout="", stderr="", stdout_bytes=0, stderr_bytes=0, answered=[],
                            evidence=[])
    program = runner.Program(argv=("/usr/bin/ledgerctl",))
    with pytest.raises(PromptUnexpected):
        check_terminal(done, program, ("ledgerctl: cannot open /dev/tty", "Vault secret file [/etc/vault.key]:"))
    with pytest.raises(AuthRequired):
        check_terminal(done, program, ("ledgerctl: cannot open /dev/tty", "Vault secret for alpha:"))
