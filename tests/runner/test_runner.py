"""Rung 2 against the real daemon: every fake legacy program gets the right, honest result.

No test waits for a deadline it does not mean to hit: a question is reported long before
the 15 s deadline of ``fake_run``, which is how the tests tell detection from timeout.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec
import pytest

from tests.conftest import TEST_PLUGINS

SECRET = "s3cret-Zq9-never-leaks"


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'fake_tools.py'}"]
"""


@pytest.fixture(autouse=True)
def seeded_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNGD_CRED_FAKE_PASSWORD", SECRET)


async def run(daemon, program: str, *args: str, tool: str = "fake_run", **options):
    inputs = {"program": program, "args": list(args), **options}
    request_id = "r-" + os.urandom(4).hex() if tool.startswith("fake_write") else None
    return await daemon.call(tool, inputs, request_id=request_id)


def quick(env) -> None:
    """The call ended well before fake_run's 15 s deadline: detection, not a timeout."""
    assert env.elapsed_ms < 8000, env


@pytest.mark.parametrize("where", [[], ["--stderr"]])
async def test_declared_confirmation_is_answered_once(rungd_daemon, where) -> None:
    # A write: a read answers no confirmation (test_read_tools_answer_nothing.py).
    env = await run(rungd_daemon, "confirm", *where, tool="fake_write_slow", confirm=True)
    assert env.status == "ok", env.error
    assert "deleted 3" in env.fields["stdout"]
    assert len(env.fields["answered"]) == 1


@pytest.mark.parametrize("ending", ["space", "bare"])
async def test_a_confirmation_declared_as_a_person_sees_it_is_answered(rungd_daemon, ending) -> None:
    # cp asks "/usr/bin/cp: overwrite '.../b'? " (its full path, a space after the mark); the
    # tool declares "cp: overwrite '...'? " with or without that space. Once, neither matched.
    env = await rungd_daemon.call("fake_copy_over", {"ending": ending}, request_id=f"cp-{ending}")
    assert env.status == "ok", env.error
    assert (env.fields["target"], len(env.fields["answered"])) == ("new\n", 1)


@pytest.mark.parametrize("where", [[], ["--stderr"]])
async def test_undeclared_confirmation_is_prompt_unexpected_quoting_it(rungd_daemon, where) -> None:
    env = await run(rungd_daemon, "confirm", *where)
    assert (env.error.code, env.error.retry, env.next_action) == ("PROMPT_UNEXPECTED", "no", "stop")
    assert "Proceed with deletion of 3 records? [y/N]" in env.error.message
    # The whole question: what the program printed since it started (no answer yet), the
    # records it names included, its prompt last.
    assert env.fields["question"].endswith("Proceed with deletion of 3 records? [y/N]")
    assert where or "1042 Globex" in env.fields["question"]
    quick(env)


@pytest.mark.parametrize(
    ("program", "quoted"),
    [
        ("undeclared", "Overwrite existing config? (yes/no)"),
        ("silent_read", "nothing printed"),
        ("buffered_prompt", "nothing printed"),
        ("eof_yes", "Really? [Y/n]"),
    ],
)
async def test_any_other_question_is_prompt_unexpected(rungd_daemon, program, quoted) -> None:
    env = await run(rungd_daemon, program)
    assert env.error.code == "PROMPT_UNEXPECTED"
    assert quoted in env.error.message
    quick(env)


async def test_eof_is_given_only_when_declared(rungd_daemon) -> None:
    env = await run(rungd_daemon, "eof_yes", stdin="eof")
    assert env.status == "ok"
    assert "done anyway" in env.fields["stdout"]


async def test_password_question_without_credential_is_auth_required(rungd_daemon) -> None:
    env = await run(rungd_daemon, "password")
    assert (env.error.code, env.next_action) == ("AUTH_REQUIRED", "request_authority")
    assert "Password:" in env.error.message
    quick(env)


async def test_without_a_terminal_a_terminal_required_failure_is_auth_required(rungd_daemon) -> None:
    env = await run(rungd_daemon, "password", "--tty", terminal="none")
    assert env.error.code == "AUTH_REQUIRED"
    assert "terminal is required" in env.error.hint


async def test_a_password_asked_on_the_terminal_with_echo_off_is_auth_required(rungd_daemon) -> None:
    env = await run(rungd_daemon, "password", "--tty")
    assert (env.error.code, env.next_action) == ("AUTH_REQUIRED", "request_authority"), env
    assert "echo off" in env.error.message and env.fields["question"] == "Password:"
    quick(env)


async def test_a_declared_credential_prompt_is_typed_on_the_terminal_and_never_shown(rungd_daemon) -> None:
    env = await run(rungd_daemon, "password", "--tty", "--expect", SECRET, credential=True)
    assert env.status == "ok", env.error
    assert "authenticated" in env.fields["stdout"] and env.fields["answered"] == ["credential fake_password"]
    assert env.fields["terminal"] == "Password: "  # echo was off: the answer never came back on it
    assert SECRET not in json.dumps(msgspec.to_builtins(env))


async def test_declared_credential_prompt_is_answered_and_never_returned(rungd_daemon) -> None:
    env = await run(rungd_daemon, "password", "--expect", SECRET, credential=True)
    assert env.status == "ok", env.error
    assert "authenticated" in env.fields["stdout"]
    assert SECRET not in str(env)


async def test_pager_is_turned_off_and_does_not_hang(rungd_daemon) -> None:
    env = await run(rungd_daemon, "pager")
    assert env.status == "ok", env.error
    quick(env)


@pytest.mark.parametrize("mode", ["sleep", "compute", "socket", "progress", "select"])
async def test_busy_quiet_programs_are_not_called_prompts(rungd_daemon, mode) -> None:
    env = await run(rungd_daemon, "busy", "--mode", mode, "--seconds", "1.5")
    assert env.status == "ok", env.error
    assert "done" in env.fields["stdout"]


async def test_deadline_kills_a_sigterm_ignoring_child(rungd_daemon) -> None:
    env = await run(rungd_daemon, "stubborn", tool="fake_run_short")
    # A read has no effect to be unsure about: no settle read, safe to try again. It ran: done.
    assert (env.error.code, env.outcome, env.error.retry, env.next_action) == (
        "TIMEOUT", "done", "yes", "retry_later")
    assert env.settle is None
    # no_survivors (conftest) asserts the tree is gone


async def test_a_read_whose_plugin_fails_after_its_program_ran_is_done_never_unknown(rungd_daemon) -> None:
    # A read has no effect to be unsure about: "unknown" sent an agent to reconcile nothing.
    env = await rungd_daemon.call("fake_run_then_crash", {"program": "exit_with"})
    assert (env.error.code, env.outcome, env.settle) == ("FAILED", "done", None), env
    assert env.next_action != "reconcile" and env.error.retry != "after_check", env


async def test_timeout_before_the_commit_point_is_not_started(rungd_daemon) -> None:
    env = await run(rungd_daemon, "busy", "--mode", "sleep", "--seconds", "30", tool="fake_write_short")
    assert (env.error.code, env.outcome, env.error.retry) == ("TIMEOUT", "not_started", "yes")
    assert env.settle is None
    # Decided by the settle read: the hint says what it showed, not "may or may not have happened".
    assert "shows nothing moved and the effect absent" in env.error.hint and "may or may not" not in env.error.hint


async def test_double_forked_grandchild_holding_stdout_is_killed(rungd_daemon) -> None:
    env = await run(rungd_daemon, "doublefork")
    assert env.status == "ok", env.error
    quick(env)


async def test_grandchild_of_a_timed_out_call_dies_too(rungd_daemon) -> None:
    env = await run(rungd_daemon, "doublefork", "--wait", "--stubborn-middle", tool="fake_run_short")
    assert env.error.code == "TIMEOUT"


async def test_flood_is_drained_capped_and_marked_truncated(rungd_daemon) -> None:
    size = 50 * 1024 * 1024
    env = await run(rungd_daemon, "flood", "--bytes", str(size))
    assert env.status == "ok", env.error
    assert env.fields["stdout_bytes"] == size
    assert env.truncated is True
    evidence = Path(rungd_daemon.config.state_dir / "evidence" / env.evidence[0])
    kept = evidence.stat().st_size
    assert kept < 2 * 1024 * 1024  # evidence is capped too, and says so
    # The file holds the program's bytes only; rungd says what it did not keep beside it, where
    # a program's own "[rungd: ...]" line cannot pass for it.
    assert b"rungd" not in evidence.read_bytes()[-200:]
    part = await rungd_daemon.run(lambda c: c.evidence(env.evidence[0], offset=kept - 10))
    assert (part.size, part.not_kept) == (kept, size - kept)
    assert "evidence cap" in part.not_kept_why
    note = evidence.with_name(f".{evidence.name}.not-kept")
    assert note.exists()
    old = time.time() - 30 * 86400
    os.utime(evidence, (old, old))
    await rungd_daemon.daemon.evidence.prune()
    assert not evidence.exists() and not note.exists()  # the note goes with its file


async def test_mapped_exit_status_becomes_its_code(rungd_daemon) -> None:
    env = await run(rungd_daemon, "exit_with", "3", "--stderr", "no such thing: x")
    assert (env.error.code, env.error.retry, env.next_action) == ("NOT_FOUND", "no", "repair")
    assert "no such thing: x" in env.error.hint


async def test_unmapped_exit_status_is_failed_with_stderr_tail(rungd_daemon) -> None:
    env = await run(rungd_daemon, "exit_with", "9", "--stderr", "disk on fire")
    assert (env.error.code, env.next_action) == ("FAILED", "stop")
    assert "disk on fire" in env.error.hint
    assert "9" in env.error.message


async def test_output_that_no_longer_parses_is_surface_changed(rungd_daemon) -> None:
    env = await run(rungd_daemon, "broken_output", parse_json=True)
    assert (env.error.code, env.next_action) == ("SURFACE_CHANGED", "stop")
    assert "expected one JSON object" in env.error.hint


async def test_process_limit_contains_a_fork_storm(rungd_daemon) -> None:
    env = await run(rungd_daemon, "fork_bomb_limited", "--n", "10000", tool="fake_run_short", max_processes=50)
    assert env.error.code == "TIMEOUT"  # it waits forever after its forks fail; the tree is killed


@pytest.mark.parametrize("terminal", ["line", "none"])
async def test_child_has_pipes_for_stdio_only_the_daemons_terminal_and_a_quiet_environment(
        rungd_daemon, fake_program, terminal) -> None:
    # The fake writes what it sees where the test can read it: stdio are pipes (batch
    # behaviour), /dev/tty is the daemon's 80x24 terminal, or nothing with terminal = "none".
    probe = fake_program("probe", """
        import json, os, sys
        try:
            fd = os.open("/dev/tty", os.O_RDWR)
            tty = "opened"
            size = tuple(os.get_terminal_size(fd))
        except OSError as exc:
            tty, size = exc.errno, None
        print(json.dumps({"tty": tty, "size": size, "isatty": [os.isatty(fd) for fd in (0, 1, 2)],
                          "env": dict(os.environ), "sid": os.getsid(0) == os.getpid()}))
    """)
    from rungd import runner
    from rungd.service.engine import new_call_id
    import errno
    import trio
    from rungd.core.contract import CallContext, Caller

    tool = rungd_daemon.daemon.tools["fake_run"].tool
    state = rungd_daemon.config.state_dir
    ctx = CallContext(call_id=new_call_id(), tool=tool, caller=Caller(0, 0, 0), request_id=None,
                      deadline=trio.current_time() + 10, work_dir=state / "work" / "probe",
                      evidence_dir=state / "evidence")
    done = await runner.run(ctx, runner.Program(argv=(str(probe),), terminal=terminal))
    import json
    seen = json.loads(done.stdout)
    assert seen["isatty"] == [False, False, False]
    assert (seen["tty"], seen["size"]) == (("opened", [80, 24]) if terminal == "line" else (errno.ENXIO, None))
    assert seen["sid"] is True
    env = seen["env"]
    for key, value in {"PAGER": "cat", "GIT_PAGER": "cat", "TERM": "dumb", "NO_COLOR": "1",
                       "GIT_TERMINAL_PROMPT": "0", "DEBIAN_FRONTEND": "noninteractive", "EDITOR": "false"}.items():
        assert env[key] == value
    assert "RUNGD_CRED_FAKE_PASSWORD" not in env  # nothing of the daemon's env leaks in


async def test_daemon_memory_stays_flat_while_a_1_gib_flood_drains(rungd_daemon) -> None:
    import psutil

    me = psutil.Process()  # the daemon runs in this process
    before = me.memory_info().rss
    size = 1 << 30
    env = await run(rungd_daemon, "flood", "--bytes", str(size))
    grown = me.memory_info().rss - before
    assert env.status == "ok", env.error
    assert env.fields["stdout_bytes"] == size and env.truncated
    assert grown < 64 * 1024 * 1024, f"the daemon grew by {grown / 2**20:.0f} MiB draining 1 GiB"


async def test_a_tool_limited_to_one_call_answers_busy_and_starts_nothing(rungd_daemon) -> None:
    first = await rungd_daemon.call("fake_run_single", {"program": "busy", "args": ["--mode", "sleep", "--seconds", "3"]},
                                  wait_s=0.3)
    assert first.status == "pending"
    second = await rungd_daemon.call("fake_run_single", {"program": "argv_echo"})
    assert (second.error.code, second.error.retry, second.next_action, second.outcome) == (
        "BUSY", "yes", "retry_later", "not_started")
    assert second.evidence == []  # nothing was started
    done = await rungd_daemon.run(lambda c: c.wait(first.call_id, 20))
    assert done.status == "ok"


async def test_a_secret_cut_at_the_head_boundary_leaves_no_fragment_and_streams_stay_apart(
        rungd_daemon, fake_program, monkeypatch) -> None:
    import trio

    from rungd import runner
    from rungd.service.engine import new_call_id
    from rungd.core.contract import CallContext, Caller

    monkeypatch.setenv("RUNGD_CRED_SPLIT", "TOPSECRET-abcdefghijklmnop")
    leaky = fake_program("leaky", """
        import os, sys
        sys.stdout.write("A" * 40 + os.environ["LEAK"] + "B" * 300)
        sys.stderr.write("ERR-LINE\\n")
    """)
    tool = rungd_daemon.daemon.tools["fake_run"].tool
    state = rungd_daemon.config.state_dir
    store = rungd_daemon.daemon.credentials
    ctx = CallContext(call_id=new_call_id(), tool=tool, caller=Caller(0, 0, 0), request_id=None,
                      deadline=trio.current_time() + 10, work_dir=state / "work" / "leak",
                      evidence_dir=state / "evidence", credentials=lambda name: store.get(name, tool.name))
    done = await runner.run(ctx, runner.Program(argv=(str(leaky),), env_credentials={"LEAK": "split"},
                                                keep_bytes=100))
    assert "TOPSECRET" not in done.stdout and "abcdefgh" not in done.stdout
    assert done.truncated
    out, err = (state / "evidence" / e for e in done.evidence)
    assert b"TOPSECRET" not in out.read_bytes() and b"ERR-LINE" not in out.read_bytes()
    assert err.read_bytes().startswith(b"ERR-LINE")


async def test_a_calls_work_folder_and_private_files_are_gone_when_it_ends(rungd_daemon) -> None:
    env = await run(rungd_daemon, "password", "--expect", SECRET, credential=True)
    assert env.status == "ok", env.error
    work = rungd_daemon.config.state_dir / "work"
    # Nothing is left but empty folders kept for the next calls: the daemon's askpass
    # endpoint is a sealed memfd and an abstract socket, in no folder.
    assert not (work / ".askpass").exists()
    kept = list(work.iterdir())
    assert kept, "the call's empty folder is kept for the next call"
    assert all(path.is_dir() and not list(path.iterdir()) for path in kept)


def test_output_cut_to_its_head_and_tail_is_whole_lines_with_no_words_of_rungds() -> None:
    import io

    from rungd.redact import Redactor
    from rungd.runner.streams import Stream
    stream = Stream("stdout", 64, io.BytesIO(), 1 << 20, Redactor())
    for n in range(1, 1001):
        stream.take(b"%d\n" % n)
    stream.close()
    assert stream.truncated
    numbers = [int(line) for line in stream.text().splitlines()]  # a note, or half a line, fails here
    [jump] = [i for i in range(1, len(numbers)) if numbers[i] != numbers[i - 1] + 1]
    assert numbers[0] == 1 and numbers[-1] == 1000 and numbers[jump] > numbers[jump - 1] + 1


def test_what_a_program_said_last_is_quoted_from_a_line_or_word_start() -> None:
    # A question or error quoted from stderr's end must not begin inside a word ("ted\ngpg:
    # problem with the agent", as a 200-character cut of gpg's words once did).
    from rungd.runner.program import tail

    said = "gpg: signing failed: Inappropriate ioctl for device\ngpg: problem with the agent: No pinentry"
    assert tail(said, 50) == "gpg: problem with the agent: No pinentry"
    assert tail("x" * 10 + " the one long last line of it", 20) == "…last line of it"  # not "…ong"
    assert tail("y" * 30, 20) == "…" + "y" * 19
    assert tail("  short\n", 20) == "short"
