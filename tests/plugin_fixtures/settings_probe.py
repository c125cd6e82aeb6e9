"""A plugin that registers one tool built from its own settings, for the register hook's test.

It records the ``PluginSettings`` it was given, so the test can check that a plugin sees its
own table and nothing else of the config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from rungd.sdk import Description, NoInputs, PluginSettings, Result, Tool, hookimpl

SEEN: list[PluginSettings] = []


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    greeting: str


@hookimpl
def rungd_register_tools(register: Callable[[Tool], None], settings: PluginSettings) -> None:
    SEEN.append(settings)
    parsed = settings.parse(Settings, 'greeting = "hello"')
    if parsed is None:
        return

    async def greet(ctx: Any, inputs: NoInputs) -> Result:
        return Result(fields={"greeting": parsed.greeting})

    register(Tool(
        name="probe_greeting_show",
        description=Description("Returns the configured greeting.", "testing rungd.", "not testing.",
                                "greeting.", "none expected.", "ask the test author."),
        inputs=NoInputs, outputs={"greeting": "the configured greeting"}, handler=greet,
    ))
