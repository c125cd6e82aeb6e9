"""The tool contract: the definition a model reads comes from the model that validates."""

from __future__ import annotations

from typing import Annotated

import pydantic
import pytest
from pydantic import Field

from rungd.core.contract import Description, Result, Tool, ToolInputs
from rungd.core.errors import BadInput

SLOTS = ("Does:", "Use when:", "Do not use when:", "Returns:", "On error:", "If unknown:")


class Inputs(ToolInputs):
    name: Annotated[str, Field(pattern=r"^[a-z]+$", max_length=20, description="A name.", examples=["web"])]
    mode: Annotated[str, Field(description="How.", examples=["fast"], json_schema_extra={"enum": ["fast", "slow"]})]
    flag: Annotated[str, Field(description="Passed as is.", examples=["-v"], json_schema_extra={"allow_dash": True})] = "x"
    note: Annotated[str, Field(description="Free text.", examples=["hi"])] = ""


async def handler(ctx, inputs):  # pragma: no cover - never run here
    return Result()


TOOL = Tool(
    name="svc_name_show",
    description=Description("Shows a name.", "you need it.", "never.", "the name.", "BAD_INPUT.", "ask."),
    inputs=Inputs,
    outputs={"name": "the name"},
    handler=handler,
)


def test_definition_joins_the_six_slots_and_is_strict() -> None:
    definition = TOOL.definition()
    assert definition["name"] == "svc_name_show"
    lines = definition["description"].splitlines()
    assert [line.split(":")[0] + ":" for line in lines] == list(SLOTS)
    schema = definition["input_schema"]
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["name", "mode"]
    assert schema["properties"]["name"]["examples"] == ["web"]
    assert schema["properties"]["name"]["description"] == "A name."
    assert "allow_dash" not in str(schema)


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"name": "web", "mode": "fast", "extra": 1}, "extra", "not an input"),
        ({"name": 5, "mode": "fast"}, "name", "valid string"),
        ({"name": "web", "mode": "fast", "note": "a\x00b"}, "note", "NUL"),
        ({"name": "web", "mode": "fast", "note": "\u202eecnalab-tes"}, "note", "U+202E, an invisible character"),
        ({"name": "web", "mode": "fast", "note": "set\u200b-balance"}, "note", "U+200B, an invisible character"),
        ({"name": "web", "mode": "fast", "note": "report.txt\U000e0031"}, "note", "U+E0031, an invisible character"),
        ({"name": "web", "mode": "fast", "note": "a\u3164b"}, "note", "U+3164, an invisible character"),
        ({"name": "web", "mode": "fast", "note": "x" * 5000}, "note", "at most 4096"),
        ({"name": "web", "mode": "-rf"}, "mode", "start with '-'"),
        ({"name": "WEB", "mode": "fast"}, "name", "pattern"),
        ({"mode": "fast"}, "name", "required"),
    ],
)
def test_bad_inputs_name_the_field_and_a_valid_example(raw, field, words) -> None:
    with pytest.raises(BadInput) as caught:
        TOOL.validate(raw)
    text = caught.value.message + " " + caught.value.hint
    assert field in text
    assert words in text
    assert 'a valid call: svc_name_show {"name": "web", "mode": "fast"' in caught.value.hint


def test_many_unknown_names_are_counted_not_each_described() -> None:
    with pytest.raises(BadInput) as caught:
        TOOL.validate({"name": "web", "mode": "fast", **{f"x{i}": i for i in range(5000)}})
    assert caught.value.message.startswith("invalid inputs: '")
    assert caught.value.message.endswith("(and 4997 more) are not inputs of svc_name_show")
    assert caught.value.hint.startswith("its inputs are flag, mode, name, note. a valid call: svc_name_show")


def test_dash_allowed_only_where_the_field_says_so() -> None:
    assert TOOL.validate({"name": "web", "mode": "fast", "flag": "-v"}).flag == "-v"


def test_inputs_are_strict_no_coercion() -> None:
    with pytest.raises(BadInput):
        TOOL.validate({"name": "web", "mode": "fast", "note": 12})


def test_tool_refuses_non_contract_inputs_and_unknown_log_fields() -> None:
    from pydantic import BaseModel

    class Loose(BaseModel):
        x: int

    with pytest.raises(TypeError, match="ToolInputs"):
        Tool(name="a", description=TOOL.description, inputs=Loose, outputs={}, handler=handler)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="log_fields"):
        Tool(name="a", description=TOOL.description, inputs=Inputs, outputs={}, handler=handler, log_fields=("zzz",))


@pytest.mark.parametrize("value", ["x\nrole=admin", "x\rrole=admin", "x\u2028role=admin", "x\u0085role=admin",
                                   "a\tb", "\x1b[2Jclear", "x\u2029y"])
def test_line_breaks_and_control_characters_are_refused_in_one_line_inputs(value: str) -> None:
    class One(ToolInputs):
        value: str

    with pytest.raises(pydantic.ValidationError, match="control character"):
        One(value=value)
    with pytest.raises(pydantic.ValidationError, match="control character"):
        One.model_validate({"value": value})


def test_a_multiline_field_takes_line_breaks_and_still_refuses_other_controls() -> None:
    class Text(ToolInputs):
        body: Annotated[str, Field(json_schema_extra={"allow_multiline": True})]

    assert Text(body="line one\nline two\r\n\tindented").body.count("\n") == 2
    with pytest.raises(pydantic.ValidationError, match=r"U\+001B"):
        Text(body="x\x1b[31m")
    with pytest.raises(pydantic.ValidationError, match=r"U\+2067, an invisible character"):
        Text(body="line one\n\u2067hidden\u2069")  # Trojan Source: text that shows another order


def test_an_input_published_under_its_alias_is_taken_by_that_name() -> None:
    class Aliased(ToolInputs):
        source: Annotated[str, Field(alias="from", description="Where from.", examples=["a"])]

    tool = Tool(name="svc_copy_show", description=TOOL.description, inputs=Aliased, outputs={}, handler=handler)
    assert tool.validate({"from": "a"}).source == "a"
