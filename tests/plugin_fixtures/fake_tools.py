"""Tools around the fake legacy programs in tests/fakes, for the runner's tests.

``fake_run`` runs one fake with arguments and options the test chooses; the runner does the
rest exactly as it would for a real plugin.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from rungd.sdk import (
    Confirmation,
    CredentialPrompt,
    Description,
    ErrorRule,
    Limits,
    Program,
    Result,
    SettleSpec,
    SurfaceChanged,
    Timing,
    Tool,
    ToolInputs,
    check_exit,
    hookimpl,
    run,
)

FAKES = Path(__file__).resolve().parent.parent / "fakes"
Fake = Literal["confirm", "password", "undeclared", "silent_read", "buffered_prompt", "eof_yes", "pager",
               "busy", "stubborn", "doublefork", "flood", "exit_with", "broken_output", "fork_bomb_limited",
               "argv_echo", "escapee", "traceme", "hog"]
NOT_FOUND = ErrorRule("NOT_FOUND", "no", "repair", "check the name", "no such thing")


class RunInputs(ToolInputs):
    program: Annotated[Fake, Field(description="Which fake.", examples=["confirm"])]
    args: Annotated[list[str], Field(description="Arguments.", examples=[["--stderr"]],
                                     json_schema_extra={"allow_dash": True, "allow_multiline": True})] = []
    confirm: Annotated[bool, Field(description="Declare the confirmation.", examples=[True])] = False
    credential: Annotated[bool, Field(description="Declare the password prompt.", examples=[True])] = False
    env_secret: Annotated[bool, Field(description="Pass the secret in the env.", examples=[True])] = False
    stdin: Annotated[Literal["none", "eof"], Field(description="stdin policy.", examples=["none"])] = "none"
    parse_json: Annotated[bool, Field(description="Parse stdout as JSON.", examples=[False])] = False
    max_processes: Annotated[int, Field(ge=0, description="RLIMIT_NPROC, 0 = none.", examples=[0])] = 0
    terminal: Annotated[Literal["line", "none"], Field(description="The program's terminal.", examples=["line"])] = "line"


async def run_fake(ctx: Any, inputs: RunInputs) -> Result:
    program = Program(
        argv=(str(FAKES / inputs.program), *inputs.args),
        stdin=inputs.stdin,
        confirmations=(Confirmation(re.compile(r"Proceed with deletion of \d+ records\? \[y/N\]"), "y"),)
        if inputs.confirm else (),
        credential_prompts=(CredentialPrompt(re.compile(r"^Password:"), "fake_password"),)
        if inputs.credential else (),
        env_credentials={"FAKE_SECRET": "fake_password"} if inputs.env_secret else {},
        limits=Limits(processes=inputs.max_processes) if inputs.max_processes else None,
        keep_bytes=4096,
        evidence_bytes=1 << 20,
        terminal=inputs.terminal,
    )
    done = await run(ctx, program)
    check_exit(done, {3: NOT_FOUND})
    fields: dict[str, Any] = {
        "exit_status": done.exit_status,
        "stdout_bytes": done.stdout_bytes,
        "stdout": done.stdout[-300:],
        "stderr": done.stderr[-300:],
        "answered": done.answered,
        "terminal": done.terminal[-300:],
    }
    if inputs.parse_json:
        try:
            fields["parsed"] = json.loads(done.stdout)
        except ValueError:
            raise SurfaceChanged("the output is not the JSON object it used to be",
                                 hint=f"expected one JSON object; saw {done.stdout[:120]!r}", outcome="done") from None
    if ctx.tool.side_effect != "read":
        # A test plugin: the fakes' own report of what they did is the read-back here.
        return Result(fields=fields, effect="changed", verified_by="the fake program's own report (tests only)",
                      truncated=done.truncated, narrow="full output in evidence" if done.truncated else None)
    return Result(fields=fields, truncated=done.truncated,
                  narrow="full output in evidence" if done.truncated else None)


class CopyInputs(ToolInputs):
    ending: Annotated[Literal["space", "bare"], Field(description="How the pattern ends.", examples=["space"])]


async def copy_over(ctx: Any, inputs: CopyInputs) -> Result:
    """Real `cp -i` over an existing file, its question declared as a person sees it on a
    terminal ("cp: overwrite 'b'? ", its trailing space written or not), although exec gives
    cp its full path and so it asks "/usr/bin/cp: overwrite ...". """
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    source, target = ctx.work_dir / "a", ctx.work_dir / "b"
    source.write_text("new\n")
    target.write_text("old\n")
    ending = r"\? $" if inputs.ending == "space" else r"\?$"
    program = Program(argv=(shutil.which("cp") or "/bin/cp", "-i", str(source), str(target)),
                      confirmations=(Confirmation(re.compile(rf"^cp: overwrite '[^']*'{ending}"), "y"),))
    done = await run(ctx, program)
    return Result(fields={"answered": done.answered, "target": target.read_text()}, effect="changed",
                  verified_by="the target read back")


def describe(does: str) -> Description:
    return Description(does=does, use_when="testing.", do_not_use_when="not testing.", returns="exit status.",
                       on_error="codes.", if_unknown="ask.")


async def run_then_crash(ctx: Any, inputs: RunInputs) -> Result:
    """A plugin bug after its program ran."""
    await run(ctx, Program(argv=(str(FAKES / inputs.program), *inputs.args)))
    raise RuntimeError("a bug in the plugin, after its program ran")


@hookimpl
def rungd_register_tools(register: Any) -> None:
    common = dict(inputs=RunInputs, outputs={"exit_status": "status"}, handler=run_fake,
                  errors=(NOT_FOUND,), cap_bytes=8192)
    register(Tool(name="fake_run", description=describe("Runs a fake."), timing=Timing(deadline_s=15), **common))
    register(Tool(name="fake_run_then_crash", description=describe("Runs a fake, then fails as a bug."),
                  timing=Timing(deadline_s=15), **{**common, "handler": run_then_crash}))
    register(Tool(name="fake_run_single", description=describe("Runs a fake, one call at a time."),
                  timing=Timing(deadline_s=15), concurrency=1, **common))
    register(Tool(name="fake_run_short", description=describe("Runs a fake, 2 s deadline."),
                  timing=Timing(deadline_s=2, settle=SettleSpec("fake_run", {"program": "exit_with"})), **common))
    register(Tool(name="fake_write_spawn", description=describe("A write whose effect begins at spawn."),
                  side_effect="reversible",
                  timing=Timing(deadline_s=2, settle=SettleSpec("fake_run", {"program": "exit_with"})), **common))
    register(Tool(name="fake_write_slow", description=describe("A slow write whose effect begins at spawn."),
                  side_effect="reversible",
                  timing=Timing(deadline_s=60, settle=SettleSpec("fake_run", {"program": "exit_with"})), **common))
    register(Tool(name="fake_records_delete", description=describe("A visible write behind the review gate."),
                  side_effect="visible",
                  timing=Timing(deadline_s=15, commit_point="confirmation",
                                settle=SettleSpec("fake_run", {"program": "exit_with"})), **common))
    register(Tool(name="fake_copy_over", description=describe("Copies over a file with cp -i."),
                  side_effect="reversible", inputs=CopyInputs, outputs={"target": "the target's text"},
                  handler=copy_over, timing=Timing(deadline_s=15, commit_point="confirmation")))
    # Its settle read looks and finds nothing moved (argv_echo never prints "changed"), so a
    # timeout before the confirmation is decided not_started by a read, not by the declaration.
    register(Tool(name="fake_write_short", description=describe("A write whose effect begins at the answer."),
                  side_effect="reversible",
                  timing=Timing(deadline_s=2, commit_point="confirmation",
                                settle=SettleSpec("fake_run", {"program": "argv_echo", "args": ["look"]},
                                                  {"stdout": "changed"})), **common))
