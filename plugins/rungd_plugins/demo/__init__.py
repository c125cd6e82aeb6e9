"""The demo plugin: two task-shaped tools around ``inventory``, a small legacy program.

``inventory`` (in this folder) prints ``key: value`` lines, asks ``[y/N]`` before a change
and signals errors by exit status, like many programs on ops hosts. The tools show the
whole contract: a read parsed into typed fields, and a write that is answered only after
its gate, read back before it reports ``changed``, and settled by the read after a timeout.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from rungd.sdk import (
    CallContext,
    Confirmation,
    Description,
    ErrorRule,
    Heading,
    PluginSettings,
    Precondition,
    Program,
    Result,
    RuledOut,
    Session,
    SettleSpec,
    StepDown,
    SurfaceChanged,
    Timing,
    Tool,
    ToolInputs,
    UnexpectedState,
    check_exit,
    hookimpl,
    run,
)

# A fake program: offered only when a config opts in with [plugins.settings.demo]
# (the embedded default does), never by default on a production host.
DEMO_ONLY = True
PROGRAM = Path(__file__).with_name("inventory.py")
ITEM = Annotated[
    str,
    Field(
        pattern=r"^[a-z][a-z0-9-]{0,31}$",
        description="The item's name exactly as the inventory knows it, lower case.",
        examples=["widget"],
    ),
]
NOT_FOUND = ErrorRule("NOT_FOUND", "no", "repair", "check the item name; the demo stock has widget, gadget, sprocket",
                      "the inventory has no item of that name")


class ShowInputs(ToolInputs):
    item: ITEM


class SetCountInputs(ToolInputs):
    item: ITEM
    count: Annotated[int, Field(ge=0, le=1_000_000, description="The new stock count.", examples=[15])]
    expected_count: Annotated[int | None, Field(
        ge=0, le=1_000_000, examples=[12],
        description="The count you read before deciding. If the item's count is no longer this, the call "
        "answers CONFLICT with the current count and changes nothing; leave it out to set the count whatever it is.",
    )] = None


def _argv(db: Path, *args: str) -> tuple[str, ...]:
    return (sys.executable, str(PROGRAM), *args, "--db", str(db))


_LINE = re.compile(r"^(item|count|location): (.*)$")


def parse_show(stdout: str) -> dict[str, Any]:
    """Parse ``show`` output into fields, or raise SurfaceChanged saying what differed."""
    found = dict(m.groups() for line in stdout.splitlines() if (m := _LINE.match(line)))
    missing = {"item", "count", "location"} - found.keys()
    if missing or not found.get("count", "").isdigit():
        raise SurfaceChanged(
            "inventory's output no longer has the expected 'item:', 'count:', 'location:' lines",
            hint=f"expected those three lines with a numeric count; missing {sorted(missing)}; "
            f"saw {stdout[:160]!r}. The plugin needs updating for this release.",
            outcome="done",
        )
    return {"item": found["item"], "count": int(found["count"]), "location": found["location"]}


class Inventory:
    """The demo tools, bound to one inventory file under the daemon's state folder."""

    def __init__(self, db: Path) -> None:
        self.db = db

    async def read(self, ctx: CallContext, item: str) -> dict[str, Any]:
        self.db.parent.mkdir(parents=True, exist_ok=True)  # the program keeps its file there
        # The example is what rungctl check's and eval's stand-ins print in its place.
        done = await run(ctx, Program(argv=_argv(self.db, "show", item), commits=False,
                                      example_output=f"item: {item}\ncount: 12\nlocation: A-01\n"))
        check_exit(done, {3: NOT_FOUND})
        return parse_show(done.stdout)

    async def show(self, ctx: CallContext, inputs: ShowInputs) -> Result:
        fields = await self.read(ctx, inputs.item)
        return Result(fields=fields, verified_by="parsed inventory show output (rung 2)")

    async def set_count(self, ctx: CallContext, inputs: SetCountInputs) -> Result:
        before = await self.read(ctx, inputs.item)
        # The settle read (inventory_item_show) judges an unknown outcome against this read.
        ctx.note_read_before("inventory_item_show", {"item": inputs.item}, before)
        program = Program(
            argv=_argv(self.db, "set", inputs.item, str(inputs.count)),
            confirmations=(Confirmation(re.compile(r"^Set \S+ count from \d+ to \d+\? \[y/N\]$"), "y"),),
        )
        done = await run(ctx, program)
        check_exit(done, {3: NOT_FOUND})
        after = await self.read(ctx, inputs.item)
        fields = {"item": inputs.item, "count_before": before["count"], "count_after": after["count"]}
        verified = "inventory show after the change (rung 2)"
        if after["count"] == inputs.count:
            effect = "no_change" if before["count"] == inputs.count else "changed"
            return Result(fields=fields, effect=effect, verified_by=verified)
        raise UnexpectedState(
            f"after the change the count is {after['count']}, not {inputs.count}",
            hint="someone else may be changing this item; read it again before deciding",
            outcome="unknown",
            fields=fields,
        )


def tools(db: Path) -> list[Tool]:
    inventory = Inventory(db)
    session = Session("nobody signs in: the demo inventory runs as the daemon's user")
    ruled_out = (RuledOut(1, "present", "the demo inventory has no API, only its command line"),)
    show_heading = Heading(2, ruled_out, (StepDown("SURFACE_CHANGED", count=3, to="stop: a person checks the "
                                                   "inventory program's output"),),
                           climb="the inventory gains an API", session=session)
    set_heading = Heading(
        2, ruled_out,
        (StepDown("SURFACE_CHANGED", count=3, to="stop: a person sets counts by hand until the wrapper is fixed"),
         StepDown("PROMPT_UNEXPECTED", count=2, within_s=86400, to="stop: the program asks something new"),
         StepDown("UNEXPECTED_STATE", to="stop: something else changes counts")),
        climb="the inventory gains an API -> rung 1", attempts=1, session=session)
    show = Tool(
        name="inventory_item_show",
        description=Description(
            does="Reads one item of the demo inventory: its stock count and shelf location. Changes nothing.",
            use_when="you need the current count or location of a named item.",
            do_not_use_when="you want to change a count; use inventory_count_set instead.",
            returns="item, count (integer), location (shelf code like A-01).",
            on_error="NOT_FOUND when the item does not exist (do not retry; check the name), "
            "SURFACE_CHANGED when the program's output changed (stop), TIMEOUT (retry once).",
            if_unknown="if you do not know the item's exact name, ask the user; do not guess.",
        ),
        inputs=ShowInputs,
        outputs={"item": "the item's name", "count": "units in stock", "location": "shelf code"},
        handler=inventory.show,
        errors=(NOT_FOUND, ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("TIMEOUT"),
                ErrorRule.core("AUTH_REQUIRED")),
        timing=Timing(deadline_s=10, commit_point="spawn"),
        cap_bytes=1024,
        log_fields=("item",),
        heading=show_heading,
    )
    set_count = Tool(
        name="inventory_count_set",
        description=Description(
            does="Sets the stock count of one item in the demo inventory. A write: it can be undone by "
            "setting the old count again; a repeat with the same request_id changes nothing more.",
            use_when="the user asked to correct or record the number of units of a named item.",
            do_not_use_when="you only need to read the count; use inventory_item_show instead.",
            returns="item, count_before, count_after, and effect changed or no_change after a read-back.",
            on_error="NOT_FOUND (do not retry; check the name), UNEXPECTED_STATE (stop and read again), "
            "CONFLICT when expected_count is stale (read again, then decide), "
            "TIMEOUT with outcome unknown (run the settle read inventory_item_show before any retry).",
            if_unknown="if you do not know the item or the new count, ask the user; do not guess.",
        ),
        inputs=SetCountInputs,
        outputs={"item": "the item's name", "count_before": "count read before the change",
                 "count_after": "count read back after the change"},
        handler=inventory.set_count,
        side_effect="reversible",
        errors=(NOT_FOUND, ErrorRule.core("UNEXPECTED_STATE"), ErrorRule.core("CONFLICT"), ErrorRule.core("PROMPT_UNEXPECTED"),
                ErrorRule.core("SURFACE_CHANGED"), ErrorRule.core("TIMEOUT"), ErrorRule.core("AUTH_REQUIRED")),
        timing=Timing(deadline_s=20, commit_point="confirmation",
                      settle=SettleSpec("inventory_item_show", {"item": "$item"}, {"count": "$count"})),
        precondition=Precondition("inventory_item_show", {"item": "$item"}, {"count": "$expected_count"},
                                  lock="inventory-item:{item}"),
        cap_bytes=1024,
        concurrency=1,
        log_fields=("item", "count"),
        heading=set_heading,
    )
    return [show, set_count]


@hookimpl
def rungd_register_tools(register: Callable[[Tool], None], settings: PluginSettings) -> None:
    for tool in tools(settings.state_dir / "inventory.json"):
        register(tool)
