"""Tools for the daemon's own tests: an echo read, a slow read, and a big-output read."""

from __future__ import annotations

from typing import Annotated, Any

import trio
from pydantic import Field

from rungd.sdk import Description, Result, Timing, Tool, ToolInputs, hookimpl


def describe(does: str) -> Description:
    return Description(does=does, use_when="testing rungd.", do_not_use_when="not testing; there is no other tool.",
                       returns="what it was given.", on_error="BAD_INPUT for bad inputs.",
                       if_unknown="ask the test author.")


class EchoInputs(ToolInputs):
    text: Annotated[str, Field(max_length=100, description="Text to echo back.", examples=["hello"])]
    times: Annotated[int, Field(ge=1, le=10, description="How many times.", examples=[2])] = 1


class SleepInputs(ToolInputs):
    seconds: Annotated[float, Field(ge=0, le=60, description="How long to sleep.", examples=[0.5])]


class BigInputs(ToolInputs):
    size: Annotated[int, Field(ge=0, le=1_000_000, description="Characters to return.", examples=[10000])]


async def echo(ctx: Any, inputs: EchoInputs) -> Result:
    return Result(fields={"text": inputs.text * inputs.times}, verified_by="echo")


async def sleep(ctx: Any, inputs: SleepInputs) -> Result:
    await trio.sleep(inputs.seconds)
    return Result(fields={"slept": inputs.seconds})


async def big(ctx: Any, inputs: BigInputs) -> Result:
    return Result(fields={"blob": "x" * inputs.size, "rows": list(range(inputs.size // 10))})


@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="test_text_echo", description=describe("Echoes text."), inputs=EchoInputs,
                  outputs={"text": "the text"}, handler=echo))
    register(Tool(name="test_clock_sleep", description=describe("Sleeps."), inputs=SleepInputs,
                  outputs={"slept": "seconds slept"}, handler=sleep, timing=Timing(deadline_s=5)))
    register(Tool(name="test_blob_get", description=describe("Returns a big blob."), inputs=BigInputs,
                  outputs={"blob": "the blob", "rows": "numbers"}, handler=big, cap_bytes=2048))
