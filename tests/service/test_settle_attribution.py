"""A write's settle read credits the call with a change only when the read before the act
showed something else: a state that was already there is no change, and a write stopped
before its commit point with nothing moved never started."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from rungd.testing import STUB_DESCRIPTION, serve_tool_file


def cp_tool_file(root: Path, confirm_pattern: str) -> str:
    """cp -i installing a template over a file, read back by sha256sum of the copy."""
    wanted = hashlib.sha256((root / "template.txt").read_bytes()).hexdigest()
    return f"""
[programs.cp]
command = "{shutil.which('cp')}"
[programs.sha256sum]
command = "{shutil.which('sha256sum')}"

[tools.files_copy_show]
program = "sha256sum"
argv = ["{root}/installed.txt"]
[tools.files_copy_show.description]
{STUB_DESCRIPTION}
[tools.files_copy_show.parse]
kind = "regex"
pattern = '^(?P<sum>[0-9a-f]{{64}}) '
fields = {{ sum = "string" }}

[tools.files_template_install]
program = "cp"
side_effect = "reversible"
commit_point = "confirmation"
argv = ["-i", "{root}/template.txt", "{root}/installed.txt"]
[[tools.files_template_install.confirm]]
pattern = '{confirm_pattern}'
answer = "y"
[tools.files_template_install.description]
{STUB_DESCRIPTION}
[tools.files_template_install.verify]
tool = "files_copy_show"
expect = {{ sum = "{wanted}" }}
wait_s = 0
"""


@pytest.mark.skipif(not shutil.which("cp") or not shutil.which("sha256sum"),
                    reason="needs cp and sha256sum (coreutils)")
async def test_a_copy_stopped_at_its_unanswered_question_over_an_equal_file_changed_nothing(short_tmp, nursery) -> None:
    root = short_tmp / "files"
    root.mkdir()
    (root / "template.txt").write_text("template v2\n")
    (root / "installed.txt").write_text("template v2\n")  # already what the copy would make
    before = (root / "installed.txt").stat().st_mtime_ns
    # The pattern does not match cp's "cp: overwrite '...'? ": nobody answers, cp never acts.
    daemon = await serve_tool_file(nursery, short_tmp, cp_tool_file(root, "^replace .*\\\\?"), name="files.toml")
    env = await daemon.call("files_template_install", {}, request_id="cp-1")
    assert env.error is not None and env.error.code == "PROMPT_UNEXPECTED", env
    assert (root / "installed.txt").stat().st_mtime_ns == before  # cp did not act
    # cp ran (to its question): what it did before asking, only the reads can say, and they
    # show the state as asked, before and after. Never "changed".
    assert (env.outcome, env.effect) == ("done", "no_change"), env
    assert "already as asked before the act, unchanged" in env.error.hint
    daemon.daemon.stop()


@pytest.mark.skipif(not shutil.which("cp") or not shutil.which("sha256sum"),
                    reason="needs cp and sha256sum (coreutils)")
async def test_a_copy_answered_over_a_different_file_is_changed(short_tmp, nursery) -> None:
    root = short_tmp / "files"
    root.mkdir()
    (root / "template.txt").write_text("template v2\n")
    (root / "installed.txt").write_text("template v1\n")
    daemon = await serve_tool_file(nursery, short_tmp, cp_tool_file(root, "overwrite"), name="files.toml")
    env = await daemon.call("files_template_install", {}, request_id="cp-2")
    assert (env.status, env.outcome, env.effect) == ("ok", "done", "changed"), env
    assert (root / "installed.txt").read_text() == "template v2\n"
    daemon.daemon.stop()


# Like gpg importing a key it already holds, then failing (exit 2) for another reason: the
# state the read-back expects was there before the call.
# A key-value program: `show DB` prints the value; `set VALUE ... DB` does what follows.
KV_SHOW = '''
    import sys, time
    from pathlib import Path
    db = Path(sys.argv[-1])
    if sys.argv[1] == "show":
        print(f"value: {db.read_text().strip() if db.exists() else 'none'}")
        sys.exit(0)
'''
FAILS_AFTER = KV_SHOW + '''
    if "--act" in sys.argv:
        db.write_text(sys.argv[2])
    sys.stderr.write("gpg: keyserver receive failed: No data\\n")
    sys.exit(2)
'''


def kv_tool_file(program: Path, db: Path, act: bool) -> str:
    return f"""
[program]
name = "kv"
command = "{program}"
[tools.kv_value_show]
argv = ["show", "{db}"]
[tools.kv_value_show.description]
{STUB_DESCRIPTION}
[tools.kv_value_show.parse]
kind = "key_value"
fields = {{ value = "string" }}
[tools.kv_value_set]
side_effect = "reversible"
argv = ["set", "{{value}}", {'"--act", ' if act else ''}"{db}"]
[tools.kv_value_set.description]
{STUB_DESCRIPTION}
[tools.kv_value_set.inputs.value]
description = "The value."
example = "one"
pattern = "^[a-z]+$"
[tools.kv_value_set.verify]
tool = "kv_value_show"
expect = {{ value = "{{value}}" }}
wait_s = 0
"""


async def test_a_failed_write_whose_state_was_already_there_reports_no_change(short_tmp, nursery, fake_program) -> None:
    db = short_tmp / "kv.db"
    db.write_text("two")
    program = fake_program("kv", FAILS_AFTER)
    daemon = await serve_tool_file(nursery, short_tmp, kv_tool_file(program, db, act=False), name="kv.toml")
    env = await daemon.call("kv_value_set", {"value": "two"}, request_id="kv-1")
    assert env.error is not None and env.error.code == "FAILED", env
    assert (env.outcome, env.effect) == ("done", "no_change"), env
    assert env.verified_by is not None and env.verified_by.startswith("settle read kv_value_show")
    daemon.daemon.stop()


async def test_a_failed_write_that_moved_the_state_reports_changed(short_tmp, nursery, fake_program) -> None:
    db = short_tmp / "kv.db"
    db.write_text("one")
    program = fake_program("kv", FAILS_AFTER)
    daemon = await serve_tool_file(nursery, short_tmp, kv_tool_file(program, db, act=True), name="kv.toml")
    env = await daemon.call("kv_value_set", {"value": "two"}, request_id="kv-2")
    assert env.error is not None and env.error.code == "FAILED", env
    assert db.read_text() == "two"
    assert (env.outcome, env.effect) == ("done", "changed"), env
    daemon.daemon.stop()


# The same program with its failing status named in the tool's exit table: what the status
# is called proves nothing about the write either (issue 29: writes decided by a read).
MAPPED = """
[tools.kv_value_set.exit.2]
code = "UPSTREAM_DOWN"
retry = "no"
next_action = "stop"
hint = "the key server did not answer"
"""


@pytest.mark.parametrize(("act", "decided"), [
    (False, ("not_started", "none")),  # nothing moved: it was "done" by the table's name alone
    (True, ("done", "changed")),  # it did it all, then exited with the failing status
])
async def test_a_mapped_exit_status_of_a_write_is_decided_by_its_read(
        short_tmp, nursery, fake_program, act: bool, decided: tuple[str, str]) -> None:
    db = short_tmp / "kv.db"
    db.write_text("one")
    program = fake_program("kv", FAILS_AFTER)
    daemon = await serve_tool_file(nursery, short_tmp, kv_tool_file(program, db, act=act) + MAPPED, name="kv.toml")
    env = await daemon.call("kv_value_set", {"value": "two"}, request_id=f"kv-mapped-{act}")
    assert env.error is not None and env.error.code == "UPSTREAM_DOWN", env
    assert db.read_text() == ("two" if act else "one")
    assert (env.outcome, env.effect) == decided, env
    assert env.verified_by is not None and env.verified_by.startswith("settle read kv_value_show"), env
    # What the read showed, then the table's own advice: the read decided, the fix still holds.
    assert env.error.hint.startswith("the settle read kv_value_show shows") and \
        "the key server did not answer" in env.error.hint, env.error.hint
    daemon.daemon.stop()


# A Python plugin's write: reads the value file, runs exit_with (a real child) that fails,
# and may write the file first ("acts"), to a value ("moves") other than the one asked for.
PLUGIN = '''
from pathlib import Path
from typing import Annotated, Any
from pydantic import Field
from rungd.sdk import (Description, Program, Result, SettleSpec, Timing, Tool, ToolInputs, check_exit,
                       hookimpl, run)

FAKES = Path(@FAKES@)
DB = Path(@DB@)

def describe(does):
    return Description(does=does, use_when="t.", do_not_use_when="t.", returns="t.", on_error="t.",
                       if_unknown="t.")

class Value(ToolInputs):
    value: Annotated[str, Field(max_length=20, pattern="^[a-z]+$", description="A value.", examples=["one"])]
    note: Annotated[bool, Field(description="Note the read before.", examples=[True])] = True
    moves: Annotated[bool, Field(description="Write another value first.", examples=[False])] = False

class Nothing(ToolInputs):
    pass

async def show(ctx: Any, inputs: Nothing) -> Result:
    return Result(fields={"value": DB.read_text()})

async def set_value(ctx: Any, inputs: Value) -> Result:
    if inputs.note:
        ctx.note_read_before("probe_value_show", {}, {"value": DB.read_text()})
    if inputs.moves:
        DB.write_text("elsewhere")
    check_exit(await run(ctx, Program(argv=(str(FAKES / "exit_with"), "2", "--stderr", "failed"))), {})
    raise AssertionError("exit_with 2 fails")

@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="probe_value_show", description=describe("Shows the value."), inputs=Nothing,
                  outputs={"value": "the value"}, handler=show))
    register(Tool(name="probe_value_set", description=describe("Sets the value."), inputs=Value,
                  outputs={}, handler=set_value, side_effect="reversible",
                  timing=Timing(deadline_s=10, settle=SettleSpec("probe_value_show", {}, {"value": "$value"}))))
'''


@pytest.fixture
def value_db(short_tmp: Path) -> Path:
    return short_tmp / "value.db"


@pytest.fixture
def rungd_config_toml(short_tmp: Path, value_db: Path) -> str:
    plugin = short_tmp / "probe_values.py"
    fakes = Path(__file__).parents[1] / "fakes"
    plugin.write_text(PLUGIN.replace("@FAKES@", repr(str(fakes))).replace("@DB@", repr(str(value_db))))
    return f'[plugins]\nfiles = ["{plugin}"]\n'


@pytest.mark.parametrize(("start", "inputs", "expected"), [
    # The read before showed it already: the failed call cannot be credited with it.
    ("two", {"note": True}, ("done", "no_change")),
    # No read before: the value is there, whether this call put it there nothing says.
    ("two", {"note": False}, ("done", "existing")),
    # The read moved, but not to what was asked: nobody can say what happened.
    ("one", {"note": True, "moves": True}, ("unknown", "none")),
    # Nothing moved and it is not there: the write did not happen.
    ("one", {"note": True}, ("not_started", "none")),
])
async def test_a_python_plugins_settle_read_is_judged_against_its_noted_read_before(
        rungd_daemon, value_db, start, inputs, expected) -> None:
    value_db.write_text(start)
    env = await rungd_daemon.call("probe_value_set", {"value": "two", **inputs}, request_id=f"v-{start}-{len(inputs)}")
    assert env.error is not None and env.error.code == "FAILED", env
    assert (env.outcome, env.effect) == expected, env


# Like dd filling a file it is killed in the middle of: a part of the effect is done, and the
# read-back (the value) cannot see it.
HALF_DONE = KV_SHOW + '''
    db.with_suffix(".part").write_text(sys.argv[2][:1])
    time.sleep(60)
'''


async def test_a_write_killed_past_its_commit_point_stays_unknown_when_its_read_sees_nothing(
        short_tmp, nursery, fake_program) -> None:
    # The settle read shows the value as before, but the program was killed mid-act: "it did
    # not happen; the request_id is free again" would be a guess (a real-program trial: dd).
    db = short_tmp / "kv.db"
    db.write_text("one")
    program = fake_program("kv", HALF_DONE)
    tool_file = kv_tool_file(program, db, act=False).replace(
        "[tools.kv_value_set.description]", "deadline_s = 2\n[tools.kv_value_set.description]")
    daemon = await serve_tool_file(nursery, short_tmp, tool_file, name="kv.toml")
    env = await daemon.call("kv_value_set", {"value": "two"}, request_id="kv-half")
    assert (short_tmp / "kv.part").read_text() == "t"  # half done
    assert env.error is not None and env.error.code == "TIMEOUT", env
    assert (env.outcome, env.error.retry, env.next_action) == ("unknown", "after_check", "reconcile"), env
    assert env.settle is not None and env.verified_by.startswith("settle read kv_value_show"), env
    assert "killed past its commit point" in env.error.hint
    daemon.daemon.stop()


# Like tar -xw stopped at its third question: two files out, the read-back's third missing.
PART_THEN_ASKS = KV_SHOW + '''
    db.write_text(sys.argv[2][:1])
    print("extract the rest? ", end="", flush=True)
    sys.stdin.readline()
'''


async def test_a_reconcile_that_finds_the_state_moved_elsewhere_leaves_it_unknown(
        short_tmp, nursery, fake_program) -> None:
    # A real-program trial: reconcile ran the settle read, found the effect absent, and
    # said not_started, freeing the request_id, though the read before the act had shown
    # another state (tar had extracted two files of three).
    db = short_tmp / "kv.db"
    db.write_text("one")
    daemon = await serve_tool_file(nursery, short_tmp, kv_tool_file(fake_program("kv", PART_THEN_ASKS), db, act=False),
                                   name="kv.toml")
    env = await daemon.call("kv_value_set", {"value": "two"}, request_id="kv-part")
    assert env.error is not None and env.error.code == "PROMPT_UNEXPECTED", env
    assert db.read_text() == "t" and env.outcome == "unknown", env
    assert env.settle is not None and env.settle.before is not None
    settled = await daemon.run(lambda c: c.reconcile("kv_value_set", "kv-part"))
    assert settled.outcome == "unknown", settled
    assert "moved" in settled.error.message and settled.fields == {"value": "t"}, settled
    again = await daemon.call("kv_value_set", {"value": "two"}, request_id="kv-part")
    assert again.error is not None and again.error.code == "RECONCILE_REQUIRED", again  # not run twice
    daemon.daemon.stop()
