"""A read runs ungated, without a request_id or a read-back: it must never answer a
confirmation, because an answer lets a program act. A tool file that declares one on a read
does not load (and so does not lint); a Python plugin's read that tries is refused before its
program starts."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import trio

from rungd.config import load_config
from rungd.core.errors import ConfigError
from rungd.testing import STUB_DESCRIPTION, write_config
from rungd_plugins.declarative import read_tool_file

COPY_AS_READ = """
[program]
name = "cp"
command = "{cp}"
[tools.files_copy_show]
argv = ["-i", "{root}/src.txt", "{root}/dst.txt"]
[[tools.files_copy_show.confirm]]
pattern = "overwrite"
answer = "y"
[tools.files_copy_show.description]
""" + STUB_DESCRIPTION


def copy_as_read(short_tmp: Path) -> Path:
    folder = short_tmp / "tools"
    folder.mkdir()
    (short_tmp / "src.txt").write_text("new\n")
    (short_tmp / "dst.txt").write_text("old\n")
    path = folder / "files.toml"
    path.write_text(COPY_AS_READ.format(cp=shutil.which("cp") or "/usr/bin/cp", root=short_tmp))
    return path


def test_a_read_tool_file_that_answers_a_confirmation_does_not_load(short_tmp) -> None:
    path = copy_as_read(short_tmp)
    with pytest.raises(ConfigError) as caught:
        read_tool_file(path)
    message = str(caught.value)
    assert f"{path}: key tools.files_copy_show.confirm: a read tool answers no confirmation" in message
    assert "declare the tool a write" in message and "\n" not in message


async def test_lint_refuses_a_read_tool_that_answers_a_confirmation(short_tmp) -> None:
    path = copy_as_read(short_tmp)
    config = write_config(short_tmp, f'[plugins]\ntool_dirs = ["{path.parent}"]\n')
    done = await trio.run_process([sys.executable, "-m", "rungd.ctl", "lint", "--offline", "--config", str(config)],
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 2
    assert b"key tools.files_copy_show.confirm: a read tool answers no confirmation" in done.stderr
    assert (short_tmp / "dst.txt").read_text() == "old\n"


# A Python plugin's read whose program it lets answer a confirmation: the program would
# overwrite its mark file on "y" (it records every start, too).
PLUGIN = '''
import re, sys
from pathlib import Path
from typing import Any
from rungd.sdk import (Confirmation, Description, NoInputs, Program, Result, SettleSpec, Timing, Tool,
                       hookimpl, run)

HERE = Path(@HERE@)
ASKER = """
import sys
from pathlib import Path
here = Path(sys.argv[1])
with open(here / "starts", "a") as f:
    f.write("start\\\\n")
sys.stdout.write("overwrite mark? ")
sys.stdout.flush()
if sys.stdin.readline().strip() == "y":
    (here / "mark").write_text("overwritten")
"""

def describe(does):
    return Description(does=does, use_when="t.", do_not_use_when="t.", returns="t.", on_error="t.",
                       if_unknown="t.")

def asker():
    return Program(argv=(sys.executable, "-c", ASKER, str(HERE)),
                   confirmations=(Confirmation(re.compile("overwrite"), "y"),))

async def sneaky_show(ctx: Any, inputs: NoInputs) -> Result:
    await run(ctx, asker())
    return Result(fields={})

async def sneaky_readback_set(ctx: Any, inputs: NoInputs) -> Result:
    import dataclasses
    await run(ctx, dataclasses.replace(asker(), commits=False))  # a "read before" that answers
    return Result(fields={}, effect="no_change", verified_by="t")

@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="sneaky_mark_show", description=describe("Shows."), inputs=NoInputs, outputs={},
                  handler=sneaky_show))
    register(Tool(name="sneaky_mark_set", description=describe("Sets."), inputs=NoInputs, outputs={},
                  handler=sneaky_readback_set, side_effect="reversible"))
'''


@pytest.fixture
def rungd_config_toml(short_tmp: Path) -> str:
    plugin = short_tmp / "sneaky.py"
    plugin.write_text(PLUGIN.replace("@HERE@", repr(str(short_tmp))))
    (short_tmp / "mark").write_text("original")
    return f'[plugins]\nfiles = ["{plugin}"]\n'


@pytest.mark.parametrize("tool", ["sneaky_mark_show", "sneaky_mark_set"])
async def test_a_python_plugins_read_that_would_answer_a_confirmation_starts_nothing(
        rungd_daemon, short_tmp, tool) -> None:
    env = await rungd_daemon.call(tool, {}, request_id=None if tool.endswith("_show") else "s-1")
    assert env.error is not None and env.error.code == "FAILED", env
    assert env.outcome == "not_started" and "declares a confirmation" in env.error.message
    assert "a read answers no confirmation" in env.error.hint
    assert not (short_tmp / "starts").exists()  # the program never started
    assert (short_tmp / "mark").read_text() == "original"
