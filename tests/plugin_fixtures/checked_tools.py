"""Tools of a Python plugin for ``rungctl check``'s plugin fixtures: a write whose act comes
first (so hang_after, acts_dies and noop reach it), one whose read before its act has no
example output (so they cannot), a read that swallows its program's absence, and one that
crashes on output it did not expect.

Their program does not exist: only the check's stand-in can run in its place.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field

from rungd.sdk import (
    CallContext,
    Confirmation,
    Description,
    Failed,
    Program,
    Result,
    SurfaceChanged,
    Timing,
    Tool,
    ToolInputs,
    check_exit,
    hookimpl,
    run,
)

REAL = "/nonexistent/rungd-check-real-program"


class NoteInputs(ToolInputs):
    note: Annotated[str, Field(pattern=r"^[a-z]{1,20}$", description="The note.", examples=["hello"])]


async def note_add(ctx: CallContext, inputs: NoteInputs) -> Result:
    act = Program(argv=(REAL, "add", inputs.note),
                  confirmations=(Confirmation(re.compile(r"^Add note \S+\? \[y/N\]$"), "y"),))
    check_exit(await run(ctx, act), {})
    after = await run(ctx, Program(argv=(REAL, "count"), commits=False))
    found = re.search(r"^notes: (\d+)$", after.stdout, re.MULTILINE)
    if found is None:
        raise SurfaceChanged("the count after the change is not there", hint=f"saw {after.stdout[:80]!r}",
                             outcome="unknown")
    return Result(fields={"notes": int(found[1])}, effect="changed", verified_by="notes count after")


async def note_replace(ctx: CallContext, inputs: NoteInputs) -> Result:
    # Reads before it acts, and gives that read no example_output: the act is out of reach.
    before = await run(ctx, Program(argv=(REAL, "show"), commits=False))
    if not before.stdout.startswith("note: "):
        raise SurfaceChanged("the note is not where it was", hint=f"saw {before.stdout[:80]!r}", outcome="not_started")
    check_exit(await run(ctx, Program(argv=(REAL, "replace", inputs.note))), {})
    return Result(fields={}, effect="changed", verified_by="nothing: never reached by the check")


async def swallowing_show(ctx: CallContext, inputs: NoteInputs) -> Result:
    try:
        done = await run(ctx, Program(argv=(REAL, "show", inputs.note)))
    except Failed:
        return Result(fields={"note": None})  # the defect the check must find: no program, yet ok
    return Result(fields={"note": done.stdout.strip()[:20]})


async def crashing_show(ctx: CallContext, inputs: NoteInputs) -> Result:
    done = await run(ctx, Program(argv=(REAL, "show", inputs.note), example_output="note: hello\n"))
    return Result(fields={"count": int(done.stdout.split()[-1])})  # ValueError on what it did not expect


def _describe(does: str) -> Description:
    return Description(does=does, use_when="testing the check.", do_not_use_when="not testing.",
                       returns="a field.", on_error="codes.", if_unknown="ask.")


@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="ck_note_add", description=_describe("Adds a note. A write."), inputs=NoteInputs,
                  outputs={"notes": "count"}, handler=note_add, side_effect="reversible",
                  timing=Timing(deadline_s=20, commit_point="confirmation")))
    register(Tool(name="ck_note_replace", description=_describe("Replaces the note. A write."), inputs=NoteInputs,
                  outputs={}, handler=note_replace, side_effect="reversible", timing=Timing(deadline_s=20)))
    register(Tool(name="ck_note_crash", description=_describe("Shows a note, badly. Changes nothing."),
                  inputs=NoteInputs, outputs={"count": "number"}, handler=crashing_show,
                  timing=Timing(deadline_s=20)))
    register(Tool(name="ck_note_show", description=_describe("Shows a note. Changes nothing."), inputs=NoteInputs,
                  outputs={"note": "text"}, handler=swallowing_show, timing=Timing(deadline_s=20)))
