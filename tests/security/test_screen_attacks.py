"""Hostile screen programs (terminal = "screen") and hostile inputs against rungd.

Each test runs a small hostile program, written at test time, through ``rungd.runner.run``
(or a daemon serving a tool file) and checks one promise: the event loop keeps turning and
the deadline holds whatever the program draws; no credential leaves the call in a screen
quote, an evidence file or a field; every process of the call dies with it; what rungd
says it typed reached the program; what a program does to the emulator ends the call as a
typed error, not as a crash.

Tests marked ``# Was a defect (fixed):`` found one when they were written (issue 30); the
others are attacks rungd withstood from the start.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pyte
import pytest
import trio

from rungd import runner
from rungd.core.errors import Failed, RungdError, SurfaceChanged
from rungd.runner.screen import Band, Read, Screen, Session, Step, Wait, _Emulator
from rungd.sdk import ConfigError
from rungd.system import proctree
from rungd.testing import STUB_DESCRIPTION, serve_tool_file
from rungd_plugins.declarative import read_tool_file
from tests.conftest import record_loop_gaps
from tests.runner.test_runner_refusals import make_ctx

SECRET = "Zq-81-otter-hid"
# The longest a heartbeat task may wait for its turn while a hostile program runs. A healthy
# call keeps it near its 10 ms period.
MAX_STALL_S = 0.3


def screen(path: Path, steps: tuple[Step, ...], *args: str, **options: Any) -> runner.Program:
    return runner.Program(argv=(str(path), *args), terminal="screen",
                          screen=Screen(steps=steps, **options))  # type: ignore[arg-type]


async def timed(ctx: Any, program: runner.Program, limit_s: float = 30) -> tuple[Any, float, float]:
    """Run ``program`` beside a 10 ms heartbeat, cancelled after ``limit_s`` (a deadline).

    Returns (the Completed or the exception raised, the longest stall of the loop in seconds,
    seconds it took)."""
    gaps: list[float] = []
    outcome: Any = None
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(record_loop_gaps, gaps, 0.01)
        with trio.move_on_after(limit_s):
            try:
                outcome = await runner.run(ctx, program)
            except Exception as exc:  # noqa: BLE001 - the test judges it
                outcome = exc
        nursery.cancel_scope.cancel()
    return outcome, max(gaps, default=0.0), time.monotonic() - start


async def run_bounded(ctx: Any, program: runner.Program) -> runner.Completed:
    with trio.fail_after(20):
        return await runner.run(ctx, program)


def kept(ctx: Any) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in ctx.evidence_dir.iterdir()}


def replayed(cast: bytes, columns: int = 80, rows: int = 24) -> str:
    """What ``asciinema play`` shows at the end of a cast: its output events drawn on a VT."""
    shown = pyte.Screen(columns, rows)
    stream = pyte.Stream(shown)
    for line in cast.decode().splitlines()[1:]:
        _, kind, text = json.loads(line)
        if kind == "o":
            stream.feed(text)
    return "\n".join(shown.display)


# ---------------------------------------------------------------------------------------
# The event loop and the deadline against what a program draws
# ---------------------------------------------------------------------------------------

FLOOD = r'''
import os, sys, time
columns, rows, kind, count = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if kind == "decaln":                      # ESC # 8: fill the screen with E, 3 bytes each
    os.write(1, b"\x1b#8" * count)
elif kind == "erase":                     # ESC [ 2 J on a full screen, 4 bytes each
    os.write(1, b"\x1b[H" + b"x" * (columns * rows) + b"\x1b[2J" * count)
time.sleep(60)
'''


# Was a defect (fixed): Session._catch_up feeds pyte 16 KB per turn; ESC#8 costs rows*columns cell writes per 3 bytes (7 s a slice at 80x24, 380 s at 500x200), ESC[2J per 4 bytes.
@pytest.mark.parametrize(("columns", "rows", "kind", "count"), [(80, 24, "decaln", 2000), (500, 200, "erase", 1000)])
async def test_a_costly_escape_flood_neither_stalls_the_loop_nor_outlives_the_deadline(
        short_tmp, fake_program, columns, rows, kind, count) -> None:
    program = fake_program("flood", FLOOD)
    steps = (Step(wait=Wait(text="never drawn"), timeout_s=60),)
    _, stall, took = await timed(make_ctx(short_tmp), screen(program, steps, str(columns), str(rows), kind,
                                                                    str(count), columns=columns, rows=rows),
                                       limit_s=1.0)
    assert stall < MAX_STALL_S, f"the event loop stood still {stall * 1000:.0f} ms"
    assert took < 3.0, f"a 1 s deadline ended the call after {took:.1f} s"


CHEAP = r'''
import os, time
out = [b"\x1b[H"]
out.append(b"B" * (1 << 20))                              # a 1 MB line
out.append(b"\x1b[99999999;99999999H\x1b[99999999@" * 2000)  # giant moves, insert-chars storm
out.append(b"\x1b[1;999r\x1b[999L\x1b[999M" * 2000)        # margins, insert/delete-lines storm
out.append(b"\x1b[" + b"1;" * 20000 + b"m")                # an SGR with 20000 parameters
out.append(b"\xff\xfe\xc3(\xed\xa0\x80\xe2\x82" * 2000)     # invalid UTF-8
out.append("\u754c\u0301\u0301".encode() * 2000)           # wide and combining characters
out.append(b"\x1b]0;" + b"t" * 200000 + b"\x07")            # a 200 KB title
out.append(b"\x1b[2J\x1b[Hdrawn")
os.write(1, b"".join(out))
time.sleep(60)
'''


async def test_cheap_floods_keep_the_loop_turning(short_tmp, fake_program) -> None:
    program = fake_program("cheap", CHEAP)
    steps = (Step(wait=Wait(text="drawn", band=Band(0, 0)), timeout_s=20, read=(Read("top", Band(0, 0)),)),)
    done, stall, _ = await timed(make_ctx(short_tmp), screen(program, steps, end="kill"), limit_s=30)
    assert not isinstance(done, Exception), done
    assert done.fields == {"top": "drawn"} and done.stopped
    assert stall < MAX_STALL_S, f"the event loop stood still {stall * 1000:.0f} ms"


# A pattern catastrophic() lets through, polynomial in the row's length (O(n^4)): 0.3 s on an
# 80-column blank row, 24 s on a 200-column one. Screen rows are blank until drawn.
POLYNOMIAL = r"\s*\s*\s*\s*\S"


def screen_tool_file(wait: str) -> str:
    return f"""
[program]
name = "x"
command = "/bin/true"
[tools.x_show]
terminal = "screen"
[tools.x_show.description]
{STUB_DESCRIPTION}
[tools.x_show.screen]
end = "kill"
[[tools.x_show.screen.steps]]
wait = {wait}
read.hostname = {{ row = 3, column = 12, width = 30 }}
"""


# Was a defect (fixed): check_patterns only refuses nested repeats (exchange/patterns.catastrophic); adjacent overlapping repeats load and run on the loop.
def test_a_polynomial_screen_pattern_is_refused_at_load(short_tmp) -> None:
    (short_tmp / "t.toml").write_text(screen_tool_file(f"{{ pattern = '{POLYNOMIAL}', row = 0 }}"))
    with pytest.raises(ConfigError):
        read_tool_file(short_tmp / "t.toml")


def test_a_nested_repeat_in_a_screen_pattern_is_refused_at_load(short_tmp) -> None:
    (short_tmp / "t.toml").write_text(screen_tool_file("{ pattern = '(\\w+\\s?)+:$', row = 0 }"))
    with pytest.raises(ConfigError, match="backtrack catastrophically"):
        read_tool_file(short_tmp / "t.toml")


IDLE = r'''
import os, time
os.write(1, b"\x1b[2J\x1b[H")
time.sleep(60)
'''


# Was a defect (fixed): Session._find runs wait patterns in the event loop (parse patterns run off it, bounded: parse_off_loop); one search of a blank row stalls it.
async def test_a_slow_wait_pattern_does_not_stall_the_loop(short_tmp, fake_program) -> None:
    program = fake_program("idle", IDLE)
    steps = (Step(wait=Wait(pattern=re.compile(POLYNOMIAL), band=Band(0, 0)), timeout_s=1),)
    outcome, stall, _ = await timed(make_ctx(short_tmp), screen(program, steps, columns=120), limit_s=10)
    assert isinstance(outcome, RungdError), outcome  # the steps ran: the call ended in a typed error
    assert stall < MAX_STALL_S, f"the event loop stood still {stall * 1000:.0f} ms"


MANY = r'''
import os, sys, time
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
os.write(1, b"\x1b[Hready")
time.sleep(60)
'''


# Was a defect (fixed): Session._ready calls waiting() every 5-10 ms, and it reads /proc for every process of the call twice (waiting_for_input, hidden) in the loop; 2000 processes stall it.
async def test_a_program_with_many_processes_does_not_stall_the_loop_while_a_step_waits(
        short_tmp, fake_program, monkeypatch) -> None:
    program = fake_program("many", MANY)
    steps = (Step(wait=Wait(text="ready"), timeout_s=30), Step(timeout_s=3, keys=("Enter",)))
    spans: list[tuple[float, float]] = []
    ready = Session._ready

    async def timed_ready(self: Session, until: float) -> None:
        start = trio.current_time()
        try:
            await ready(self, until)
        finally:
            spans.append((start, trio.current_time()))

    monkeypatch.setattr(Session, "_ready", timed_ready)
    beats: list[float] = []

    async def beat() -> None:
        while True:
            await trio.sleep(0.01)
            beats.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat)
        with trio.move_on_after(40):
            await runner.run(make_ctx(short_tmp), screen(program, steps, "2000", end="kill"))
        nursery.cancel_scope.cancel()
    [(start, end)] = spans
    inside = [b for b in beats if start < b <= end]
    # A 10 ms heartbeat beats about 100 times a second while the loop is free.
    assert len(inside) > 0.5 * (end - start) / 0.01, \
        f"the heartbeat beat {len(inside)} times in the step's {end - start:.1f} s: the loop was busy scanning /proc"


# ---------------------------------------------------------------------------------------
# What the emulator may throw: a typed error, and the tree killed all the same
# ---------------------------------------------------------------------------------------

WIDE = r'''
import os, time
os.write(1, "\x1b[2J\x1b[HReady \u754c\x1b[1;7Hx".encode())   # a wide character, then its first cell overwritten
time.sleep(60)
'''


# Was a defect (fixed): pyte's Screen.display raises IndexError on a wide char's orphaned stub; _drive_screen's finally called _keep_screen (session.text) before _end, so the tree was never killed.
async def test_a_wide_character_overwritten_is_no_crash_and_the_tree_dies_with_the_call(
        short_tmp, fake_program) -> None:
    program = fake_program("wide", WIDE)
    ctx = make_ctx(short_tmp)
    steps = (Step(wait=Wait(text="Ready"), timeout_s=2, read=(Read("top", Band(0, 0)),)),)
    try:
        outcome, _, _ = await timed(ctx, screen(program, steps, end="kill"), limit_s=10)
        left = proctree.RUNNING.get(ctx.call_id)
        alive = sorted(pid for pid, _ in left.members()) if left is not None else []
    finally:
        # Were it back, the call's tree and cgroup would be left: cleared for the suite's checks.
        tracker = proctree.RUNNING.pop(ctx.call_id, None)
        if tracker is not None:
            await proctree.kill_tree(tracker, grace_s=0, pgid=None)
            if tracker.cgroup is not None:
                await tracker.cgroup.remove_when_empty()
    assert not alive, f"the call's processes outlived it: {alive}"
    assert isinstance(outcome, runner.Completed), f"the call crashed: {outcome!r}"
    assert outcome.fields["top"].startswith("Ready") and outcome.stopped


PYTE_CHOKES = r'''
import os, sys, time
os.write(1, b"\x1b[2J\x1b[HReady")
time.sleep(0.3)
os.write(1, {"erase": b"\x1b[5K", "digits": b"\x1b[" + b"9" * 5000 + b"m", "private_dsr": b"\x1b[?6n",
             "two_param_da": b"\x1b[1;2c"}[sys.argv[1]])
time.sleep(60)
'''


# Was a defect (fixed): Session._catch_up lets pyte's own exceptions out (UnboundLocalError: ESC[5K; ValueError: a >4300-digit parameter; TypeError: ESC[?6n, ESC[1;2c); a daemon then blames the plugin ("the tool's handler failed").
@pytest.mark.parametrize("kind", ["erase", "digits", "private_dsr", "two_param_da"])
async def test_sequences_the_emulator_chokes_on_end_the_call_as_a_typed_error(
        short_tmp, fake_program, kind) -> None:
    program = fake_program("chokes", PYTE_CHOKES)
    steps = (Step(wait=Wait(text="Ready"), timeout_s=2, keys=("Enter",)),
             Step(wait=Wait(text="never drawn"), timeout_s=2))
    outcome, _, _ = await timed(make_ctx(short_tmp), screen(program, steps, kind), limit_s=10)
    assert isinstance(outcome, RungdError), f"the call crashed: {outcome!r}"


# ---------------------------------------------------------------------------------------
# Credentials: typed into a secret field, drawn back by the program
# ---------------------------------------------------------------------------------------

ECHOER = r'''
import os, sys, time, tty
tty.setraw(0)
os.write(1, b"\x1b[2J\x1b[HPassword: ")
got = b""
while not got.endswith(b"\r"):
    got += os.read(0, 100)
s = got[:-1]
mode = sys.argv[1]
if mode == "whole":                       # in one piece, in two writes a moment apart
    os.write(1, b"\x1b[3;5H" + s[:6])
    time.sleep(0.3)
    os.write(1, s[6:])
elif mode == "wrap":                      # at column 70: the emulator wraps it onto row 1
    os.write(1, b"\x1b[1;71H" + s)
elif mode == "pieces":                    # split by an attribute, and drawn backwards
    os.write(1, b"\x1b[5;1H" + s[:5] + b"\x1b[1m" + s[5:] + b"\x1b[0m")
    os.write(1, b"".join(b"\x1b[8;%dH" % (i + 1) + s[i:i + 1] for i in reversed(range(len(s)))))
os.write(1, b"\x1b[12;1Hdone")
time.sleep(60)
'''


def echo_steps(reads: tuple[Read, ...] = ()) -> tuple[Step, ...]:
    return (Step(wait=Wait(text="Password:"), credential="admin", keys=("Enter",)),
            Step(wait=Wait(text="done"), read=reads),
            Step(wait=Wait(text="never drawn"), timeout_s=0.5))


async def test_a_credential_drawn_whole_is_redacted_everywhere(short_tmp, fake_program) -> None:
    program = fake_program("echoer", ECHOER)
    reads = (Read("field", Band(2, 2), column=4, width=20), Read("match", Band(2, 2), pattern=re.compile(r"(\S+)")))
    ctx = make_ctx(short_tmp, {"admin": SECRET})
    done = await run_bounded(ctx, screen(program, echo_steps(reads)[:2], "whole", end="kill"))
    assert set(done.fields) == {"field", "match"} and SECRET not in done.screen
    assert all(value and SECRET[:6] not in value and SECRET[6:] not in value for value in done.fields.values())
    assert "screen credential admin at step 1" in done.answered
    failing = make_ctx(short_tmp, {"admin": SECRET})
    with pytest.raises(SurfaceChanged) as caught:
        await run_bounded(failing, screen(program, echo_steps(), "whole"))
    quoted = caught.value.fields["screen"]
    assert "Password:" in quoted and SECRET[:6] not in quoted and SECRET[6:] not in quoted
    evidence = kept(ctx) | kept(failing)
    assert sum(name.endswith(".cast") for name in evidence) == 2 and any(name.endswith(".screen") for name in evidence)
    for name, data in evidence.items():
        assert SECRET.encode() not in data, name
        if name.endswith(".cast"):
            assert SECRET not in replayed(data)


# Was a defect (fixed): Session.text joins the emulator's rows with "\n" before redacting, so a secret wrapped at the right margin is kept whole but split (fields["screen"], the .screen file).
async def test_a_credential_wrapped_at_the_margin_is_redacted(short_tmp, fake_program) -> None:
    program = fake_program("echoer", ECHOER)
    ctx = make_ctx(short_tmp, {"admin": SECRET})
    with pytest.raises(SurfaceChanged) as caught:
        await run_bounded(ctx, screen(program, echo_steps(), "wrap"))
    quoted = caught.value.fields["screen"]
    assert SECRET not in quoted.replace("\n", ""), quoted
    for name, data in kept(ctx).items():
        assert SECRET.encode() not in data.replace(b"\n", b""), name


# Was a defect (fixed): Cast.output redacts the byte stream, but a program that draws a secret in pieces (an SGR between, or cell by cell) has it whole on the screen the cast replays.
async def test_a_credential_drawn_in_pieces_does_not_replay_from_the_cast(short_tmp, fake_program) -> None:
    program = fake_program("echoer", ECHOER)
    ctx = make_ctx(short_tmp, {"admin": SECRET})
    with pytest.raises(SurfaceChanged) as caught:
        await run_bounded(ctx, screen(program, echo_steps(), "pieces"))
    assert SECRET not in caught.value.fields["screen"]  # the screen itself is redacted
    cast = next(data for name, data in kept(ctx).items() if name.endswith(".cast"))
    assert SECRET.encode() not in cast
    assert SECRET not in replayed(cast), "asciinema play shows the credential"


SHOW_TOOLS = """
[program]
name = "echoer"
command = "{fake}"

[tools.echo_show]
terminal = "screen"
argv = ["wrap"]
credentials = {{ ADMIN_UNUSED = "admin" }}
[tools.echo_show.description]
""" + STUB_DESCRIPTION + """
[tools.echo_show.screen]
[[tools.echo_show.screen.steps]]
wait = {{ text = "Password:" }}
credential = "admin"
keys = ["Enter"]
[[tools.echo_show.screen.steps]]
wait = {{ text = "never drawn" }}
timeout_s = 1
"""


# Was a defect (fixed): the same wrap (Session.text) reaches a daemon's caller in the error's screen field and the .screen evidence file.
async def test_a_wrapped_credential_reaches_no_caller_through_a_daemon(nursery, short_tmp, fake_program) -> None:
    fake = fake_program("echoer", ECHOER)
    creds = short_tmp / "creds.toml"
    creds.write_text(f'admin = "{SECRET}"\n')
    creds.chmod(0o600)
    daemon = await serve_tool_file(nursery, short_tmp, SHOW_TOOLS.format(fake=fake),
                                   config=f'[credentials]\nfile = "{creds}"\n')
    env = await daemon.call("echo_show", {})
    daemon.daemon.stop()
    assert env.error is not None and env.error.code == "SURFACE_CHANGED"
    assert SECRET not in str(env.fields).replace("\\n", "").replace("\n", ""), env.fields
    for path in (short_tmp / "state").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes().replace(b"\\n", b"").replace(b"\n", b""), path


# ---------------------------------------------------------------------------------------
# Keys: what rungd types, and what a program can make it type
# ---------------------------------------------------------------------------------------

def test_the_emulator_answers_only_fixed_reports() -> None:
    # A program cannot make rungd type text of its choosing: of every CSI, OSC and DCS query
    # a terminal knows, pyte answers three, each numbers only.
    answers: list[bytes] = []
    emulator = _Emulator(80, 24, lambda data: answers.append(data) or True)
    stream = pyte.ByteStream(emulator)
    for marker in ("", "?", ">", "=", "!", " "):
        for params in ("", "0", "1", "5", "6", "14", "18", "21", "6;6", "999"):
            for final in range(0x40, 0x7F):
                try:
                    stream.feed(f"\x1b[{marker}{params}{chr(final)}".encode())
                except Exception:  # noqa: BLE001 - pyte's own faults are another test's
                    pass
    for query in ("\x1bZ", "\x1b]10;?\x07", "\x1b]4;1;?\x07", "\x1bP$qm\x1b\\", "\x1b[>0q", "\x1b[?u"):
        stream.feed(query.encode())
    assert answers and {re.sub(rb"\d+", b"N", a) for a in answers} <= {b"\x1b[?Nc", b"\x1b[N;NR", b"\x1b[Nn"}


QUERIES = r'''
import os, time, tty
tty.setraw(0)
os.write(1, b"\x1b[2J\x1b[HAsking")
end = time.monotonic() + 2
while time.monotonic() < end:             # queries, never reading their answers meanwhile
    os.write(1, b"\x1b[6n\x1b[c\x1b[5n" * 200)
os.write(1, b"\x1b[2;1Hflooded")
while True:
    os.read(0, 65536)                      # then reads keys, as a screen program does
'''


async def test_terminal_queries_in_a_loop_hang_nothing_and_the_caps_hold(short_tmp, fake_program) -> None:
    program = fake_program("queries", QUERIES)
    ctx = make_ctx(short_tmp)
    steps = (Step(wait=Wait(text="flooded"), timeout_s=15, text="hello", keys=("Enter",)),
             Step(wait=Wait(text="never drawn"), timeout_s=0.5))
    outcome, stall, took = await timed(ctx, screen(program, steps, cast_bytes=256 * 1024), limit_s=20)
    # Its queries are answered, or (where rungd reads them faster than it draws them, on a busy
    # host) it floods past the screen's byte cap: stopped either way, with a typed error.
    assert isinstance(outcome, SurfaceChanged) or getattr(outcome, "code", None) == "OUTPUT_TOO_LARGE", outcome
    assert stall < MAX_STALL_S and took < 10, (stall, took)
    evidence = kept(ctx)
    cast = next(data for name, data in evidence.items() if name.endswith(".cast"))
    assert len(cast) <= 256 * 1024
    for name, data in evidence.items():  # what the cap kept out is noted beside the cast
        if name.endswith(".not-kept"):
            assert json.loads(data)["bytes"] > 0


DEAF = r'''
import os, re, time, tty, select
tty.setraw(0)
os.write(1, b"\x1b[2J\x1b[H" + b"\x1b[6n" * 8000)   # its own input queue fills with the answers
os.write(1, b"\x1b[2;1HSave? (y/n)")
time.sleep(2.5)                                       # deaf a while: rungd types ahead
got = b""
while select.select([0], [], [], 0.3)[0]:
    got += os.read(0, 65536)
rest = re.sub(rb"\x1b\[\d+;\d+R", b"", got)
os.write(1, b"\x1b[3;1Hgot " + (b"y" if rest == b"y" else b"%r" % rest[:20]))
time.sleep(60)
'''


# Was a defect (fixed): Session._type ignores Terminal.type's False (a full input queue: the key is lost or cut), records "screen commit" and goes on; _Emulator's answers may be cut mid-sequence too.
async def test_keys_the_terminal_did_not_take_are_not_claimed_typed(short_tmp, fake_program) -> None:
    program = fake_program("deaf", DEAF)
    steps = (Step(wait=Wait(text="Save? (y/n)"), timeout_s=1, text="y", commit=True),
             Step(wait=Wait(pattern=re.compile("got ")), timeout_s=10, read=(Read("got", Band(2, 2), column=4),)))
    outcome, _, _ = await timed(make_ctx(short_tmp), screen(program, steps, end="kill"), limit_s=20)
    if not isinstance(outcome, RungdError):  # rungd may say it could not type; it may not claim it did
        assert not isinstance(outcome, Exception), outcome
        assert outcome.fields["got"] == "y", (outcome.fields, outcome.answered)


INPUT_TOOLS = """
[program]
name = "namer"
command = "{fake}"

[tools.name_set]
side_effect = "reversible"
terminal = "screen"
commit_point = "confirmation"
[tools.name_set.inputs.name]
description = "A name, free text."
example = "web01"
[tools.name_set.description]
""" + STUB_DESCRIPTION + """
[tools.name_set.verify]
tool = "name_show"
expect = {{ name = "{{name}}" }}
[tools.name_set.screen]
[[tools.name_set.screen.steps]]
wait = {{ text = "Name:" }}
type = "{{name}}"
keys = ["Enter"]
commit = true

[tools.name_show]
terminal = "screen"
[tools.name_show.description]
""" + STUB_DESCRIPTION + """
[tools.name_show.screen]
end = "kill"
[[tools.name_show.screen.steps]]
wait = {{ text = "Name:" }}
read.name = {{ row = 1 }}
"""

NAMER = r'''
import os, sys, time, tty
open(sys.argv[0] + ".ran", "a").write("ran\n")
tty.setraw(0)
os.write(1, b"\x1b[2J\x1b[HName:")
time.sleep(5)
'''


@pytest.mark.parametrize("name", ["web\x1b[B", "web\ry", "web\x03", "web\x9b2J", "web\u2028x", "\x1b"])
async def test_control_characters_in_an_input_never_reach_the_screen(nursery, short_tmp, fake_program, name) -> None:
    fake = fake_program("namer", NAMER)
    daemon = await serve_tool_file(nursery, short_tmp, INPUT_TOOLS.format(fake=fake))
    env = await daemon.call("name_set", {"name": name}, request_id="r1")
    daemon.daemon.stop()
    assert env.error is not None and env.error.code == "BAD_INPUT" and env.outcome == "not_started", env
    assert not Path(str(fake) + ".ran").exists()


# Was a defect (fixed): _check_screen checks no wait's or read's row and column against the screen's rows and columns: a read off the screen is "" and an absent wait passes at once.
def test_a_read_outside_the_declared_screen_is_refused_at_load(short_tmp) -> None:
    text = screen_tool_file("{ text = 'Gone', row = 150, absent = true }").replace("row = 3, column = 12",
                                                                                 "row = 100, column = 400")
    (short_tmp / "t.toml").write_text(text)
    with pytest.raises(ConfigError):
        read_tool_file(short_tmp / "t.toml")


# ---------------------------------------------------------------------------------------
# The process tree, and programs that stop, close, exit or garble
# ---------------------------------------------------------------------------------------

ESCAPER = r'''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()                            # its own session, then a grandchild: a daemon
    if os.fork() == 0:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        for fd in (0, 1, 2):
            os.close(fd)
        open(sys.argv[1], "w").write(str(os.getpid()))
        while True:
            time.sleep(0.1)
    os._exit(0)
os.write(1, b"\x1b[Hready")
while True:
    os.read(0, 100)                        # waits for keys, as a screen program does
'''


def alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return False
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return status not in ("Z", "X")


@pytest.mark.parametrize("how", ["end_kill", "deadline", "step_timeout"])
async def test_a_daemon_child_that_left_the_session_dies_with_the_call(short_tmp, fake_program, how) -> None:
    program = fake_program("escaper", ESCAPER)
    pid_file = short_tmp / "escapee.pid"
    if how == "end_kill":
        steps: tuple[Step, ...] = (Step(wait=Wait(text="ready"), timeout_s=5, read=(Read("r", Band(0, 0)),)),)
    elif how == "deadline":
        steps = (Step(wait=Wait(text="never drawn"), timeout_s=60),)
    else:
        steps = (Step(wait=Wait(text="never drawn"), timeout_s=1),)
    outcome, _, _ = await timed(make_ctx(short_tmp), screen(program, steps, str(pid_file),
                                                            end="kill" if how == "end_kill" else "exit"), limit_s=2.5)
    await trio.sleep(0.3)
    assert pid_file.exists() and not alive(pid_file), "the escaped grandchild outlived the call"
    if how == "end_kill":
        assert not isinstance(outcome, Exception) and outcome.stopped and outcome.fields == {"r": "ready"}


ODD = {
    "stops": "os.write(1, b'\\x1b[Hready'); os.kill(os.getpid(), signal.SIGSTOP); time.sleep(60)",
    "closes": "os.write(1, b'\\x1b[Hready'); [os.close(fd) for fd in (0, 1, 2)]; time.sleep(60)",
    "exits": "os._exit(0)",
    "garbles": ("os.write(1, b'\\x1b[?1049h\\x1b[?3h\\xff\\xfe\\xc3(\\xed\\xa0\\x80\\x1b[Hready \\xe2\\x82'); "
                "fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack('HHHH', 5, 10, 0, 0)); time.sleep(60)"),
    "ignores_term": "signal.signal(signal.SIGTERM, signal.SIG_IGN); os.write(1, b'\\x1b[Hready'); time.sleep(60)",
}


@pytest.mark.parametrize("kind", sorted(ODD))
async def test_odd_programs_end_in_a_typed_error_within_the_step_time(short_tmp, fake_program, kind) -> None:
    program = fake_program("odd", "import fcntl, os, signal, struct, termios, time\n" + ODD[kind] + "\n")
    steps = (Step(wait=Wait(text="ready"), timeout_s=2, keys=("Enter",)), Step(wait=Wait(text="never"), timeout_s=1))
    outcome, stall, took = await timed(make_ctx(short_tmp), screen(program, steps), limit_s=15)
    expected: type[RungdError] = Failed if kind == "exits" else SurfaceChanged
    assert isinstance(outcome, expected), outcome
    assert took < 6 and stall < MAX_STALL_S
