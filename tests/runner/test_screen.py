"""Issue 30: screen programs. A full-screen curses program (tests/fakes/screen_config) on the
daemon's terminal, driven through declared steps: waits on what the emulator shows, keys from
terminfo, fields read at fixed positions; truthful when the screen is not what the steps
expect, when the program dies or floods, at the deadline; and a replayable, redacted cast."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import termios
from pathlib import Path

import pytest
import trio

from rungd import runner
from rungd.core.errors import AuthRequired, Failed, SurfaceChanged, ToolError, ToolTimeout
from rungd.runner.screen import Band, Read, Screen, Step, Wait
from tests.runner.test_runner_refusals import make_ctx, run_quick

FAKE = str(Path(__file__).parents[1] / "fakes" / "screen_config")
SECRET = "Zq-81-otter-hid"  # the fake's field takes 20 characters

MENU_TO_FORM = (
    Step(wait=Wait(text="Set hostname", band=Band(3, 5), attribute="reverse", absent=True), keys=("Down",)),
    Step(wait=Wait(text="Set hostname", band=Band(3, 5), attribute="reverse"), keys=("Enter",)),
)


def settings_read(end: str = "exit") -> tuple[Step, ...]:
    steps = [Step(wait=Wait(text="Show settings", band=Band(3, 5), attribute="reverse"), keys=("Enter",)),
             Step(wait=Wait(text="Hostname:", band=Band(3, 3), column=2),
                  read=(Read("hostname", Band(3, 3), column=12, width=30),
                        Read("owner", Band(4, 4), pattern=re.compile(r"Owner:\s+(\S+)"))),
                  keys=() if end == "kill" else ("Space",))]
    if end == "exit":
        steps += [Step(wait=Wait(text="Quit", attribute="reverse", absent=True), keys=("Up",)),
                  Step(wait=Wait(text="Quit", attribute="reverse"), keys=("Enter",))]
    return tuple(steps)


def set_hostname(name: str, *, password: bool = False) -> tuple[Step, ...]:
    steps = [*MENU_TO_FORM, Step(wait=Wait(text="New hostname:"), text=name, keys=("Enter",))]
    if password:
        steps.append(Step(wait=Wait(text="Admin password:"), credential="admin", keys=("Enter",)))
    steps += [Step(wait=Wait(pattern=re.compile(rf"Save hostname '{name}'\? \(y/n\)")), text="y", commit=True),
              Step(wait=Wait(text="Saved."), keys=("Enter",)),
              Step(wait=Wait(text="Quit", attribute="reverse", absent=True), keys=("Down",)),
              Step(wait=Wait(text="Quit", attribute="reverse"), keys=("Enter",))]
    return tuple(steps)


def program(state: Path, steps: tuple[Step, ...], *args: str, **screen: object) -> runner.Program:
    return runner.Program(argv=(FAKE, "--state", str(state), *args), terminal="screen",
                          screen=Screen(steps=steps, **screen))  # type: ignore[arg-type]


def cast_of(ctx) -> list:
    name = next(e for e in ctx.evidence if e.endswith(".cast"))
    return [json.loads(line) for line in (ctx.evidence_dir / name).read_text().splitlines()]


async def test_a_screen_write_navigates_fills_a_field_and_commits(short_tmp) -> None:
    state = short_tmp / "state"
    state.write_text("alpha\n")
    ctx = make_ctx(short_tmp)
    done = await run_quick(ctx, program(state, set_hostname("beta")))
    assert state.read_text() == "beta\n" and done.exit_status == 0
    assert done.answered == ["screen commit at step 4"]
    assert "Host configuration" in done.screen and "─" in done.screen  # line drawing as drawn, not ACS letters
    header, *events = cast_of(ctx)
    assert header["version"] == 2 and (header["width"], header["height"]) == (80, 24)
    assert [e[2] for e in events if e[1] == "i"][:3] == ["\x1bOB", "\r", "beta"]  # keypad mode: Down is ESC O B


async def test_fields_are_read_at_fixed_positions(short_tmp) -> None:
    state = short_tmp / "state"
    state.write_text("gamma.example\n")
    done = await run_quick(make_ctx(short_tmp), program(state, settings_read()))
    assert done.fields == {"hostname": "gamma.example", "owner": os.environ.get("USER", "root")}
    assert done.exit_status == 0 and not done.stopped


async def test_a_read_may_stop_the_program_once_it_has_its_fields(short_tmp) -> None:
    state = short_tmp / "state"
    done = await run_quick(make_ctx(short_tmp), program(state, settings_read("kill"), end="kill"))
    assert done.fields["hostname"] == "localhost" and done.stopped


async def test_the_same_steps_drive_a_vt100(short_tmp) -> None:
    # The keys come from the host's terminfo for the tool's TERM, never spelled out by rungd.
    state = short_tmp / "state"
    await run_quick(make_ctx(short_tmp), program(state, set_hostname("delta"), term="vt100"))
    assert state.read_text() == "delta\n"


async def test_an_unexpected_dialog_is_surface_changed_quoting_the_screen(short_tmp) -> None:
    state = short_tmp / "state"
    steps = tuple(Step(wait=s.wait, timeout_s=0.5, keys=s.keys) for s in settings_read())
    with pytest.raises(SurfaceChanged) as caught:
        await run_quick(make_ctx(short_tmp), program(state, steps, "--license"))
    assert "step 1 waited for 'Show settings' on rows 3-5 (reverse)" in caught.value.message
    assert "You must accept the license to go on." in caught.value.fields["screen"]
    assert caught.value.fields["step"] == 1 and not state.exists()


async def test_a_program_that_dies_mid_session_fails_quoting_its_last_screen(short_tmp) -> None:
    state = short_tmp / "state"
    with pytest.raises(Failed) as caught:
        await run_quick(make_ctx(short_tmp), program(state, set_hostname("beta"), "--die-at", "form"))
    assert "exited (status 3) at step 3" in caught.value.message
    assert "Host configuration" in caught.value.fields["screen"] and not state.exists()


async def test_a_program_that_floods_its_screen_is_stopped(short_tmp) -> None:
    steps = (Step(wait=Wait(text="never drawn"), timeout_s=30),)
    with pytest.raises(ToolError) as caught:
        await run_quick(make_ctx(short_tmp), program(short_tmp / "state", steps, "--flood", screen_bytes=256 * 1024))
    assert caught.value.code == "OUTPUT_TOO_LARGE" and "refreshing" in caught.value.fields["screen"]


async def test_the_deadline_kills_the_whole_session(short_tmp) -> None:
    ctx = make_ctx(short_tmp)
    steps = (Step(wait=Wait(text="never drawn"), timeout_s=60),)
    with trio.move_on_after(1.5):
        await runner.run(ctx, program(short_tmp / "state", steps))
    left = subprocess.run(["pgrep", "-f", f"{FAKE} --state {short_tmp}"], capture_output=True, text=True)
    assert left.stdout == "", "a process of the session outlived its deadline"


async def test_a_secret_field_is_typed_from_the_store_and_never_recorded(short_tmp) -> None:
    state = short_tmp / "state"
    ctx = make_ctx(short_tmp, {"admin": SECRET})
    done = await run_quick(ctx, program(state, set_hostname("epsilon", password=True), "--password",
                                       "--expect", SECRET))
    assert state.read_text() == "epsilon\n"
    assert "screen credential admin at step 4" in done.answered
    kept = b"".join(p.read_bytes() for p in ctx.evidence_dir.iterdir())
    assert SECRET.encode() not in kept and b"epsilon" in kept


async def test_a_secret_field_without_its_credential_starts_nothing(short_tmp) -> None:
    state = short_tmp / "state"
    with pytest.raises(AuthRequired):
        await run_quick(make_ctx(short_tmp), program(state, set_hostname("zeta", password=True), "--password"))
    assert not state.exists()


async def test_a_key_the_terminal_type_lacks_starts_nothing(short_tmp) -> None:
    steps = (Step(wait=Wait(text="Host"), keys=("Delete",)),)  # vt100 has no Delete key
    with pytest.raises(Failed) as caught:
        await run_quick(make_ctx(short_tmp), program(short_tmp / "state", steps, term="vt100"))
    assert "no Delete key" in caught.value.message and caught.value.outcome == "not_started"


@pytest.mark.skipif(shutil.which("asciinema") is None, reason="needs asciinema (Debian package asciinema)")
async def test_the_cast_replays_with_asciinema(short_tmp) -> None:
    state = short_tmp / "state"
    ctx = make_ctx(short_tmp)
    await run_quick(ctx, program(state, set_hostname("theta")))
    name = next(e for e in ctx.evidence if e.endswith(".cast"))
    # asciinema opens /dev/tty: it gets a terminal of its own, as an auditor's shell has.
    master, slave = os.openpty()
    try:
        replay = await trio.to_thread.run_sync(lambda: subprocess.run(
            ["asciinema", "cat", str(ctx.evidence_dir / name)], stdin=slave, capture_output=True, timeout=60,
            start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0)))
    finally:
        os.close(master)
        os.close(slave)
    assert replay.returncode == 0, replay.stderr
    assert b"Save hostname 'theta'? (y/n)" in replay.stdout


@pytest.mark.skipif(shutil.which("dialog") is None, reason="needs dialog (Debian package dialog)")
async def test_a_screen_programs_answer_comes_on_the_descriptor_the_tool_names(short_tmp) -> None:
    # dialog draws on its terminal and writes the answer to --output-fd: a pipe rungd reads.
    program = runner.Program(
        argv=(shutil.which("dialog"), "--output-fd", "3", "--inputbox", "New hostname for web", "8", "40"),
        terminal="screen", screen=Screen(steps=(Step(wait=Wait(text="New hostname for web"), text="web01",
                                                     keys=("Enter",)),), output_fd=3))
    ctx = make_ctx(short_tmp)
    done = await run_quick(ctx, program)
    assert (done.exit_status, done.stdout) == (0, "web01")
    assert any(e.endswith(".output") for e in ctx.evidence)


async def test_steps_that_leave_the_program_running_say_so_at_the_deadline(short_tmp) -> None:
    # A read that forgot end = "kill": every step done, the program still on its menu.
    ctx = make_ctx(short_tmp)
    ctx.deadline = trio.current_time() + 2
    steps = (Step(wait=Wait(text="Show settings")),)
    with pytest.raises(ToolTimeout) as caught:
        await run_quick(ctx, program(short_tmp / "state", steps))
    assert "every step was done, but the program did not exit" in caught.value.message
    assert 'end = "kill"' in caught.value.hint and "Host configuration" in caught.value.fields["screen"]


async def test_a_deadline_before_a_steps_timeout_is_timeout_quoting_the_screen(short_tmp) -> None:
    ctx = make_ctx(short_tmp)
    ctx.deadline = trio.current_time() + 1.5
    steps = (Step(wait=Wait(text="never drawn"), timeout_s=30),)
    with pytest.raises(ToolTimeout) as caught:
        await run_quick(ctx, program(short_tmp / "state", steps))
    assert "deadline came while step 1 waited for 'never drawn'" in caught.value.message
    assert "Host configuration" in caught.value.fields["screen"]


async def test_a_menus_current_item_is_read_by_its_attribute(short_tmp) -> None:
    steps = (Step(wait=Wait(text="Show settings", attribute="reverse"), keys=("Down",)),
             Step(wait=Wait(text="Set hostname", attribute="reverse"),
                  read=(Read("current", Band(3, 5), attribute="reverse"),)))
    done = await run_quick(make_ctx(short_tmp), program(short_tmp / "state", steps, end="kill"))
    assert done.fields == {"current": "Set hostname"}


def test_alt_keys_are_escape_then_the_key() -> None:
    from rungd.runner.keys import key

    assert key("xterm-256color", "Alt-r").sent(True) == b"\x1br"


async def test_a_screen_program_is_not_told_to_ask_nothing(short_tmp, fake_program) -> None:
    # DEBIAN_FRONTEND=noninteractive would make debconf's screens skip every question.
    shows_env = fake_program("envshow", """
        import os, sys, termios, tty
        print(f"frontend={os.environ.get('DEBIAN_FRONTEND', 'unset')} term={os.environ['TERM']}")
        sys.stdin.read(1)
    """)
    steps = (Step(wait=Wait(pattern=re.compile(r"frontend=(\S+)")), read=(Read("env", pattern=re.compile(r"(frontend=.*)")),)),)
    done = await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(shows_env),), terminal="screen",
                                                                screen=Screen(steps=steps, end="kill")))
    assert done.fields["env"] == "frontend=unset term=xterm-256color"


async def test_a_quoted_screen_that_was_cut_says_so(short_tmp, fake_program) -> None:
    full = fake_program("full", """
        import os, time
        os.write(1, b"\\x1b[2J\\x1b[H" + b"\\r\\n".join(b"%02d " % n + b"x" * 76 for n in range(24)))
        time.sleep(60)
    """)
    steps = (Step(wait=Wait(text="never drawn"), timeout_s=0.5),)
    with pytest.raises(SurfaceChanged) as caught:
        await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(full),), terminal="screen",
                                                             screen=Screen(steps=steps)))
    quoted = caught.value.fields["screen"]
    assert quoted.startswith("00 xxx") and quoted.endswith("the whole screen is the call's .screen evidence]")


async def test_sequences_a_terminal_ignores_do_not_end_the_call(short_tmp, fake_program) -> None:
    # mc restores xterm's private modes as it quits (CSI ? Pm r, not a scroll region); other
    # programs send a parameter too many (CSI 0 ; C) or a mode nobody knows (CSI 11 K). A
    # terminal ignores what it does not know; pyte raised, and the call was SURFACE_CHANGED.
    draws = fake_program("draws", """
        import os, sys
        os.write(1, b"\\x1b[2J\\x1b[Hhello\\x1b[?1001r\\x1b[?1049l\\x1b[0;2Cthere\\x1b[11K\\x1b[1;2;3r\\x1b[?6n"
                    b"\\x1b[Hfirst row\\r\\n")
        sys.stdin.read(1)
    """)
    steps = (Step(wait=Wait(text="first row"), read=(Read("first", Band(0, 0)), Read("second", Band(1, 1)))),)
    done = await run_quick(make_ctx(short_tmp), runner.Program(argv=(str(draws),), terminal="screen",
                                                                screen=Screen(steps=steps, end="kill")))
    # CSI 0 ; 2 C moved one column (its first parameter, 0 read as 1), DECSTBM (CSI 1 ; 2 r,
    # its third parameter ignored) took the cursor home, and "first row" overwrote "hello there".
    assert done.fields == {"first": "first rowre", "second": ""}
