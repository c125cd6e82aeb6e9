"""Registers a tool name the echo plugin already uses: start-up must fail naming both."""

from typing import Any

from rungd.sdk import Description, NoInputs, Result, Tool, hookimpl


async def nothing(ctx: Any, inputs: NoInputs) -> Result:
    return Result()


@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="test_text_echo", description=Description("x", "x", "x", "x", "x", "x"),
                  inputs=NoInputs, outputs={}, handler=nothing))
