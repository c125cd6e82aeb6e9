"""Issue 29: the terminal the daemon owns. Each call's program has a pseudo-terminal as its
controlling terminal (its stdio stay pipes); what it asks there is judged by what the terminal
and the kernel show, never by its words: the fakes below are worded unlike each other and
unlike every program the tests wrap elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time

import pytest

from rungd import runner
from rungd.core.errors import AuthRequired, PromptUnexpected
from tests.runner.test_runner_refusals import make_ctx, run_quick

SECRET = "Tq-44-zebra-never-leaks"

# Opens its terminal, turns echo off, writes two lines there and waits for a line.
ECHO_OFF = """
    import os, sys, termios
    tty = os.open("/dev/tty", os.O_RDWR)
    attrs = termios.tcgetattr(tty)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(tty, termios.TCSANOW, attrs)
    os.write(tty, b"Vault 7 is sealed.\\nUnsealing phrase for vault 7 > ")
    line = os.read(tty, 200).decode().strip()
    print("unsealed" if line == sys.argv[1] else "wrong phrase")
"""


async def test_a_secret_asked_on_the_terminal_is_known_by_its_echo_and_quoted_whole(short_tmp, fake_program) -> None:
    program = runner.Program(argv=(str(fake_program("vault", ECHO_OFF)), SECRET))
    with pytest.raises(AuthRequired) as caught:
        await run_quick(make_ctx(short_tmp), program)
    assert caught.value.fields["question"] == "Vault 7 is sealed.\nUnsealing phrase for vault 7 >"
    assert "echo off" in caught.value.message


async def test_a_declared_secret_is_typed_on_the_terminal_never_shown(short_tmp, fake_program) -> None:
    program = runner.Program(argv=(str(fake_program("vault", ECHO_OFF)), SECRET),
                             credential_prompts=(runner.CredentialPrompt(re.compile(r"phrase for vault \d+ >$"),
                                                                         "vault"),))
    done = await run_quick(make_ctx(short_tmp, {"vault": SECRET}), program)
    assert done.stdout == "unsealed\n" and done.answered == ["credential vault"]
    assert done.terminal == "Vault 7 is sealed.\nUnsealing phrase for vault 7 > "
    evidence = b"".join(p.read_bytes() for p in (short_tmp / "evidence").iterdir())
    assert SECRET.encode() not in evidence


# The same words as a secret would use, but echo stays on: a question, whatever it says.
ECHO_ON = """
    import os
    tty = os.open("/dev/tty", os.O_RDWR)
    os.write(tty, b"Password policy: rotate the passphrase of realm EXAMPLE now? ")
    answer = os.read(tty, 200).decode().strip()
    print("rotated" if answer == "sure" else "left alone")
"""


async def test_echo_on_is_a_question_whatever_its_words(short_tmp, fake_program) -> None:
    program = runner.Program(argv=(str(fake_program("rotate", ECHO_ON)),))
    with pytest.raises(PromptUnexpected) as caught:
        await run_quick(make_ctx(short_tmp), program)
    assert caught.value.fields["question"] == "Password policy: rotate the passphrase of realm EXAMPLE now?"


async def test_a_declared_confirmation_is_answered_on_the_terminal(short_tmp, fake_program) -> None:
    program = runner.Program(argv=(str(fake_program("rotate", ECHO_ON)),),
                             confirmations=(runner.Confirmation(re.compile(r"realm \w+ now\?"), "sure"),))
    ctx = make_ctx(short_tmp)
    ctx.tool = dataclasses.replace(ctx.tool, side_effect="reversible")  # a write answers confirmations
    done = await run_quick(ctx, program)
    assert done.stdout == "rotated\n" and len(done.answered) == 1


async def test_a_background_group_reading_the_terminal_is_stopped_and_seen(short_tmp, fake_program) -> None:
    # The reader is in a group of its own, not the terminal's foreground one: the kernel stops
    # it (SIGTTIN) instead of letting it read. A stop, not a wait to the deadline.
    program = runner.Program(argv=(str(fake_program("bg", """
        import os, sys
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            sys.stdout.write("indexing done; keep the old index (k) or drop it (d)? ")
            sys.stdout.flush()
            with open("/dev/tty") as tty:
                tty.readline()
            os._exit(0)
        os.waitpid(pid, 0)
    """)),))
    started = time.monotonic()
    with pytest.raises(PromptUnexpected) as caught:
        await run_quick(make_ctx(short_tmp), program)
    assert time.monotonic() - started < 5
    assert caught.value.fields["question"] == "indexing done; keep the old index (k) or drop it (d)?"


async def test_a_program_reading_keys_one_at_a_time_is_a_screen_program(short_tmp, fake_program) -> None:
    program = runner.Program(argv=(str(fake_program("keys", """
        import os, termios
        tty = os.open("/dev/tty", os.O_RDWR)
        attrs = termios.tcgetattr(tty)
        attrs[3] &= ~(termios.ICANON | termios.ECHO)
        termios.tcsetattr(tty, termios.TCSANOW, attrs)
        os.write(tty, b"[ Menu ]  1 Start  2 Stop  3 Quit ")
        os.read(tty, 1)
    """)),))
    with pytest.raises(PromptUnexpected) as caught:
        await run_quick(make_ctx(short_tmp), program)
    assert "one at a time" in caught.value.message
    assert caught.value.fields["question"] == "[ Menu ]  1 Start  2 Stop  3 Quit"


async def test_what_a_program_only_writes_on_its_terminal_is_kept_not_asked(short_tmp, fake_program) -> None:
    program = runner.Program(argv=(str(fake_program("warns", """
        import os
        tty = os.open("/dev/tty", os.O_WRONLY)
        os.write(tty, b"warning: clock skew of 3s detected\\n")
        print("42 rows")
    """)),))
    done = await run_quick(make_ctx(short_tmp), program)
    assert done.exit_status == 0 and done.stdout == "42 rows\n"
    assert done.terminal == "warning: clock skew of 3s detected\n"
    assert any(e.endswith(".terminal") for e in done.evidence)


async def test_a_question_on_the_terminal_is_seen_though_stdin_was_closed(short_tmp, fake_program) -> None:
    # stdin = "eof" says end-of-file is a safe answer on stdin; the terminal is another place.
    program = runner.Program(argv=(str(fake_program("later", """
        import os, sys
        sys.stdin.read()
        tty = os.open("/dev/tty", os.O_RDWR)
        os.write(tty, b"Apply 3 staged changes to /srv/app [apply/skip]: ")
        os.read(tty, 100)
    """)),), stdin="eof")
    with pytest.raises(PromptUnexpected) as caught:
        await run_quick(make_ctx(short_tmp), program)
    assert caught.value.fields["question"] == "Apply 3 staged changes to /srv/app [apply/skip]:"


async def test_the_deadline_kills_a_terminal_reader_and_closes_the_terminal(short_tmp, fake_program) -> None:
    # Killed first, then the terminal closed: the program never sees the hang-up, and nothing
    # of the call's terminal is left open in the daemon.
    import os
    import trio

    before = set(os.listdir("/proc/self/fd"))
    program = runner.Program(argv=(str(fake_program("spins", """
        import os, signal, time
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        tty = os.open("/dev/tty", os.O_RDWR)
        os.write(tty, b"working")
        while True:
            time.sleep(0.05)
    """)),))
    with trio.move_on_after(1.0):
        await runner.run(make_ctx(short_tmp), program)
    ptys = [fd for fd in set(os.listdir("/proc/self/fd")) - before
            if os.readlink(f"/proc/self/fd/{fd}").startswith(("/dev/pts", "/dev/ptmx"))]
    assert ptys == []


# Opens /dev/tty and says whether it got a terminal, or the error it got.
OPENS_TTY = """
    import errno, os
    try:
        os.open("/dev/tty", os.O_RDWR)
        print("a terminal")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""


async def test_a_tool_may_opt_out_of_the_terminal(short_tmp, fake_program) -> None:
    program = runner.Program(argv=(str(fake_program("opens", OPENS_TTY)),), terminal="none")
    done = await run_quick(make_ctx(short_tmp), program)
    assert done.stdout == "ENXIO\n" and done.terminal == ""


async def test_a_host_with_no_pseudo_terminals_runs_programs_without_one(short_tmp, fake_program, monkeypatch,
                                                                         caplog) -> None:
    # A sandbox without /dev/ptmx must not stop every call: programs get no terminal (ENXIO),
    # as with terminal = "none", and the daemon says so once.
    import errno
    import os

    from rungd.runner import execute

    def no_ptmx() -> tuple[int, int]:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/dev/ptmx")

    monkeypatch.setattr(os, "openpty", no_ptmx)
    monkeypatch.setattr(execute, "_SAID_NO_TERMINALS", [])
    program = runner.Program(argv=(str(fake_program("opens", OPENS_TTY)),))
    for _ in range(2):
        done = await run_quick(make_ctx(short_tmp), program)
        assert done.stdout == "ENXIO\n"
    said = [r.getMessage() for r in caplog.records if "no pseudo-terminal" in r.getMessage()]
    assert len(said) == 1 and "PrivateDevices" in said[0]


def test_a_terminals_name_is_what_proc_shows_for_it_and_never_fails() -> None:
    # The prompt watch compares it with the links in /proc/PID/fd of the call's processes; it
    # is read when first needed (after the program started), so it must not raise then.
    from rungd.runner.terminal import Terminal

    terminal = Terminal()
    try:
        assert terminal.path == os.ttyname(terminal.slave) == os.readlink(f"/proc/self/fd/{terminal.slave}")
    finally:
        terminal.close()
    closed = Terminal()
    closed.close()
    assert closed.path == ""  # the device number alone identifies it then
