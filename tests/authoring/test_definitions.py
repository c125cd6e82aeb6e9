"""Exported tool definitions: each provider's published shape, strict mode, request_id, sizes.

The provider shapes below are written from the providers' own published definitions:

- OpenAI Chat Completions function tool: ``ChatCompletionToolParam`` / ``FunctionDefinition``
  in openai-python (name ``[a-zA-Z0-9_-]{1,64}``), and strict mode as the function-calling
  and structured-outputs guides state it (every object closed, every property required,
  a subset of keywords; root an object).
- Anthropic Messages tool: ``ToolParam`` in anthropic-sdk-python and the API reference's
  name pattern ``^[a-zA-Z0-9_-]{1,64}$``.
- MCP: ``Tool`` and ``ToolAnnotations`` from schema/2025-11-25/schema.json of
  modelcontextprotocol/modelcontextprotocol, plus the spec's tool-name guidance. The
  published schema leaves objects open; here they are closed so a misspelt key fails.

Validation with those schemas needs ``jsonschema``; without it those tests skip and the
structural tests below still run.
"""

from __future__ import annotations

import copy
import json
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field
from rungd.config import embedded_configs, load_config
from rungd.core.contract import (
    Description,
    ErrorRule,
    Result,
    SettleSpec,
    Timing,
    Tool,
    ToolInputs,
)
from rungd.authoring.definitions import (
    FORMATS,
    REQUEST_ID,
    ExportError,
    admits_null,
    compact_json,
    definition_name,
    estimate_tokens,
    export,
    size_table,
    sizes,
    split_request_id,
    strict_schema,
)
from rungd.authoring.lint import definitions_from_config
from rungd.protocol import ToolDefinition
from rungd.service.server import describe
from rungd.testing import write_config

# --- the provider shapes, as published -------------------------------------------------------

NAME_PATTERN = "^[a-zA-Z0-9_-]{1,64}$"
# Keywords strict mode does not accept, and the two rungd must never leave in (default, oneOf).
STRICT_UNSUPPORTED = [
    "patternProperties", "unevaluatedProperties", "propertyNames", "minProperties", "prefixItems",
    "maxProperties", "unevaluatedItems", "contains", "minContains", "maxContains", "uniqueItems", "default", "oneOf",
]

OPENAI_TOOL: dict[str, Any] = {
    "type": "object",
    "required": ["type", "function"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": NAME_PATTERN},
                "description": {"type": "string"},
                "parameters": {"$ref": "#/$defs/strict_object"},
                "strict": {"type": ["boolean", "null"]},
            },
        },
    },
    "$defs": {
        "strict_object": {
            "type": "object",
            "required": ["type", "properties", "required", "additionalProperties"],
            "properties": {
                "type": {"const": "object"},
                "additionalProperties": {"const": False},
                "properties": {"type": "object", "additionalProperties": {"$ref": "#/$defs/strict_node"}},
                "required": {"type": "array", "items": {"type": "string"}},
                "$defs": {"type": "object", "additionalProperties": {"$ref": "#/$defs/strict_node"}},
            },
            "not": {"anyOf": [{"required": [k]} for k in STRICT_UNSUPPORTED]},
        },
        "strict_node": {
            "type": "object",
            "not": {"anyOf": [{"required": [k]} for k in STRICT_UNSUPPORTED]},
            "properties": {
                "items": {"$ref": "#/$defs/strict_node"},
                "anyOf": {"type": "array", "items": {"$ref": "#/$defs/strict_node"}},
                "properties": {"type": "object", "additionalProperties": {"$ref": "#/$defs/strict_node"}},
            },
            "allOf": [
                {"if": {"properties": {"type": {"const": "object"}}, "required": ["type"]},
                 "then": {"$ref": "#/$defs/strict_object"}},
                # a $ref may not have siblings in strict mode
                {"if": {"required": ["$ref"]}, "then": {"maxProperties": 1}},
            ],
        },
    },
}

ANTHROPIC_TOOL: dict[str, Any] = {
    "type": "object",
    "required": ["name", "input_schema"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "description": {"type": "string"},
        "input_schema": {
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"const": "object"},
                "properties": {"type": ["object", "null"]},
                "required": {"type": ["array", "null"], "items": {"type": "string"}},
            },
        },
        "cache_control": {"type": ["object", "null"]},
        "type": {"enum": ["custom", None]},
    },
}

MCP_TOOL: dict[str, Any] = {
    "type": "object",
    "required": ["inputSchema", "name"],
    "additionalProperties": False,
    "properties": {
        "_meta": {"type": "object"},
        "annotations": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "destructiveHint": {"type": "boolean"},
                "idempotentHint": {"type": "boolean"},
                "openWorldHint": {"type": "boolean"},
                "readOnlyHint": {"type": "boolean"},
                "title": {"type": "string"},
            },
        },
        "description": {"type": "string"},
        "execution": {"type": "object"},
        "icons": {"type": "array"},
        "inputSchema": {
            "type": "object",
            "required": ["type"],
            "properties": {
                "$schema": {"type": "string"},
                "properties": {"type": "object", "additionalProperties": {"type": "object"}},
                "required": {"type": "array", "items": {"type": "string"}},
                "type": {"const": "object"},
            },
        },
        # The 2025-11-25 spec: 1-128 characters of A-Z a-z 0-9 _ - . (SHOULD).
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$"},
        "outputSchema": {"type": "object"},
        "title": {"type": "string"},
    },
}

JSONSCHEMA_DOC: dict[str, Any] = {
    "type": "object",
    "required": ["$schema", "title", "description", "type", "properties", "required", "additionalProperties"],
    "properties": {
        "$schema": {"const": "https://json-schema.org/draft/2020-12/schema"},
        "title": {"type": "string", "pattern": NAME_PATTERN},
        "type": {"const": "object"},
        "additionalProperties": {"const": False},
    },
}

# The Responses API's FunctionToolParam (openai-python types/responses/function_tool_param.py):
# the Chat Completions function's fields, flat beside "type".
OPENAI_RESPONSES_TOOL: dict[str, Any] = {
    "type": "object",
    "required": ["type", "name", "parameters", "strict"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        **OPENAI_TOOL["properties"]["function"]["properties"],
    },
    "$defs": OPENAI_TOOL["$defs"],
}

SHAPES = {"openai": OPENAI_TOOL, "openai-responses": OPENAI_RESPONSES_TOOL, "anthropic": ANTHROPIC_TOOL,
          "mcp": MCP_TOOL, "jsonschema": JSONSCHEMA_DOC}


def input_schema_of(exported: dict[str, Any], fmt: str) -> dict[str, Any]:
    return {
        "openai": lambda e: e["function"]["parameters"],
        "openai-responses": lambda e: e["parameters"],
        "anthropic": lambda e: e["input_schema"],
        "mcp": lambda e: e["inputSchema"],
        "jsonschema": lambda e: e,
    }[fmt](exported)


# --- tools to export -------------------------------------------------------------------------


class Filter(ToolInputs):
    key: Annotated[str, Field(max_length=20, description="The key to match, exactly.", examples=["owner"])]
    level: Annotated[int, Field(ge=0, le=9, description="Minimum level, 0-9.", examples=[2])] = 0
    note: Annotated[str | None, Field(max_length=40, description="A note, or null.", examples=["x"])] = None


class RichInputs(ToolInputs):
    item: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,31}$", max_length=32,
                               description="The item's name, lower case.", examples=["widget"])]
    mode: Annotated[Literal["fast", "slow"], Field(description="How hard to look.", examples=["fast"])] = "fast"
    limit: Annotated[int, Field(ge=1, le=100, description="At most this many rows.", examples=[10])] = 10
    tags: Annotated[list[str], Field(description="Tags to match, any of.", examples=[["red"]])] = []
    since: Annotated[int | None, Field(ge=0, description="Days back; null for all time.", examples=[7])] = 7
    filter: Annotated[Filter | None, Field(description="An optional filter.")] = None


async def handler(ctx: Any, inputs: Any) -> Result:  # pragma: no cover - never run here
    return Result()


DESCRIPTION = Description("Changes one item's tags in the test store; a repeat with the same request_id does "
                          "nothing more.", "testing.", "reading; use test_item_show.", "item, tags.",
                          "TIMEOUT (settle first).", "ask.")
RICH_WRITE = Tool(name="test_item_tag", description=DESCRIPTION, inputs=RichInputs, outputs={"item": "the item"},
                  handler=handler, side_effect="reversible",
                  errors=(ErrorRule.core("TIMEOUT"),),
                  timing=Timing(settle=SettleSpec("test_item_show", {"item": "$item"})))
RICH_READ = Tool(name="test_item_show", description=DESCRIPTION, inputs=RichInputs, outputs={"item": "the item"},
                 handler=handler)


@pytest.fixture
def builtin_definitions(short_tmp) -> list[ToolDefinition]:
    """The built-in tools (demo plugin and the shipped tool files), as a daemon serves them."""
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{embedded_configs() / "tools"}"]\n'))
    return definitions_from_config(config)


@pytest.fixture
def definitions(builtin_definitions) -> list[ToolDefinition]:
    return [*builtin_definitions, describe(RICH_WRITE, "test"), describe(RICH_READ, "test")]


# --- shapes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_exports_validate_against_the_providers_published_shape(definitions, fmt) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    shape = jsonschema.Draft202012Validator(SHAPES[fmt])
    for exported in export(definitions, fmt):
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in shape.iter_errors(exported)]
        assert not errors, (definition_name(exported), errors)
        # ... and what the model reads is itself a valid JSON Schema (2020-12).
        jsonschema.Draft202012Validator.check_schema(input_schema_of(exported, fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_exported_schema_accepts_a_valid_call_and_refuses_an_extra_key(definitions, fmt) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    by_name = {definition_name(e): e for e in export(definitions, fmt)}
    schema = input_schema_of(by_name["inventory_count_set"], fmt)
    call = {"item": "widget", "count": 15, REQUEST_ID: "r-1"}
    if fmt.startswith("openai"):  # strict mode: a model sends every property, null for an optional one
        call = {**{name: None for name in schema["properties"]}, **call}
    jsonschema.validate(call, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**call, "force": True}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in call.items() if k != REQUEST_ID}, schema)  # a write without its request_id


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_carries_name_description_and_a_closed_object_schema(definitions, fmt) -> None:
    for d, exported in zip(definitions, export(definitions, fmt), strict=True):
        assert definition_name(exported) == d.name
        text = exported["function"]["description"] if fmt == "openai" else exported["description"]
        assert text == d.description
        schema = input_schema_of(exported, fmt)
        assert schema["type"] == "object" and schema["additionalProperties"] is False
    if fmt == "openai":
        assert all(e["type"] == "function" and e["function"]["strict"] is True for e in export(definitions, fmt))
        assert set(export(definitions, fmt)[0]["function"]) == {"name", "description", "parameters", "strict"}
    elif fmt == "openai-responses":
        assert all(set(e) == {"type", "name", "description", "parameters", "strict"} and e["strict"] is True
                   for e in export(definitions, fmt))
        chat = export(definitions, "openai")
        assert [{"type": "function", **c["function"]} for c in chat] == export(definitions, fmt)
    elif fmt == "anthropic":
        assert all(set(e) == {"name", "description", "input_schema"} for e in export(definitions, fmt))
    elif fmt == "mcp":
        assert all(set(e) == {"name", "title", "description", "inputSchema", "outputSchema", "annotations"}
                   for e in export(definitions, fmt))


def assert_strict(node: Any, path: str = "parameters") -> None:
    """OpenAI's strict-mode rules, checked by walking the schema (JSON Schema cannot say
    "every property is required")."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            assert_strict(item, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    assert not set(node) & set(STRICT_UNSUPPORTED), (path, set(node) & set(STRICT_UNSUPPORTED))
    if "$ref" in node:
        assert set(node) == {"$ref"}, f"{path}: $ref with siblings"
    if node.get("type") == "object" or "properties" in node:
        assert node["additionalProperties"] is False, path
        assert sorted(node["required"]) == sorted(node["properties"]), path
    for key, value in node.items():
        if key in ("properties", "$defs"):
            for name, sub in value.items():
                assert_strict(sub, f"{path}.{name}")
        elif key in ("items", "anyOf", "allOf", "prefixItems"):
            assert_strict(value, f"{path}.{key}")


def test_openai_export_is_strict_at_every_level(definitions) -> None:
    for exported in export(definitions, "openai"):
        parameters = exported["function"]["parameters"]
        assert parameters["type"] == "object" and "anyOf" not in parameters  # the root must be an object
        assert_strict(parameters)


def test_strict_mode_makes_optional_inputs_nullable_and_says_what_null_means() -> None:
    params = export([describe(RICH_WRITE, "test")], "openai")[0]["function"]["parameters"]
    props = params["properties"]
    assert params["required"] == ["item", "mode", "limit", "tags", "since", "filter", REQUEST_ID]
    assert props["mode"]["type"] == ["string", "null"] and props["mode"]["enum"] == ["fast", "slow", None]
    assert props["limit"]["type"] == ["integer", "null"]
    assert 'Null means the default ("fast")' in props["mode"]["description"]
    assert "Null means the default (10)" in props["limit"]["description"]
    assert props["tags"]["type"] == ["array", "null"]
    # Already nullable in the tool's own schema: null is a real value there, so it stays as declared.
    assert {"type": "null"} in props["since"]["anyOf"] and "Null means" not in props["since"]["description"]
    # A nested model is closed and strict too, its optional fields nullable.
    nested = params["$defs"]["Filter"]
    assert nested["additionalProperties"] is False and nested["required"] == ["key", "level", "note"]
    assert nested["properties"]["level"]["type"] == ["integer", "null"]
    # Keywords strict mode supports stay where the model honours them (definitions.py cites
    # the rules); none is repeated in the description.
    assert props["item"]["maxLength"] == 32 and "maxLength" not in props["item"]["description"]
    assert props["item"]["pattern"] == r"^[a-z][a-z0-9-]{0,31}$"
    assert nested["properties"]["level"]["minimum"] == 0 and nested["properties"]["level"]["maximum"] == 9


def test_split_request_id_undoes_strict_nulls_so_the_daemon_applies_its_defaults() -> None:
    definition = describe(RICH_WRITE, "test")
    arguments = {"item": "widget", "mode": None, "limit": None, "tags": None, "since": None,
                 "filter": {"key": "owner", "level": None, "note": None}, REQUEST_ID: "r-42"}
    jsonschema = _maybe_jsonschema()
    if jsonschema:  # what a strict model sends is valid under the exported schema
        jsonschema.validate(arguments, export([definition], "openai")[0]["function"]["parameters"])
    inputs, request_id = split_request_id(arguments, definition)
    assert request_id == "r-42"
    assert inputs == {"item": "widget", "since": None, "filter": {"key": "owner", "note": None}}
    validated = RICH_WRITE.validate(inputs)
    assert (validated.mode, validated.limit, validated.tags, validated.since) == ("fast", 10, [], None)
    assert validated.filter is not None and validated.filter.level == 0


def test_split_request_id_without_a_definition_only_takes_the_key_out() -> None:
    assert split_request_id({"item": "w", "limit": None, REQUEST_ID: "k"}) == ({"item": "w", "limit": None}, "k")
    assert split_request_id({"item": "w"}) == ({"item": "w"}, None)
    # Not a string: no key is guessed; the daemon answers BAD_INPUT for a write without one.
    assert split_request_id({"item": "w", REQUEST_ID: 7}) == ({"item": "w"}, None)


def test_writes_get_a_required_described_request_id_and_reads_do_not(definitions) -> None:
    for fmt in FORMATS:
        for d, exported in zip(definitions, export(definitions, fmt), strict=True):
            schema = input_schema_of(exported, fmt)
            if d.requires_request_id:
                assert REQUEST_ID in schema["required"], (fmt, d.name)
                prop = schema["properties"][REQUEST_ID]
                assert prop["type"] == "string" and "unique per intended change" in prop["description"].lower()
                assert "reuse only to retry the same change" in prop["description"]
            else:
                assert REQUEST_ID not in schema["properties"], (fmt, d.name)
            assert REQUEST_ID not in d.input_schema["properties"]  # the definition itself is untouched


def test_an_input_called_request_id_on_a_write_is_refused() -> None:
    class Clash(ToolInputs):
        request_id: Annotated[str, Field(description="Mine.", examples=["x"])]

    tool = Tool(name="test_clash_set", description=DESCRIPTION, inputs=Clash, outputs={}, handler=handler,
                side_effect="reversible")
    with pytest.raises(ExportError, match="request_id"):
        export([describe(tool, "t")], "anthropic")


@pytest.mark.parametrize("name", ["do stuff", "x" * 65, "inventory.item.show", ""])
def test_a_name_the_providers_refuse_is_refused(name) -> None:
    d = describe(RICH_READ, "t")
    bad = ToolDefinition(**{f: getattr(d, f) for f in d.__struct_fields__ if f != "name"}, name=name)
    for fmt in FORMATS:
        with pytest.raises(ExportError, match="not accepted"):
            export([bad], fmt)


def test_unknown_format_is_refused_naming_the_formats() -> None:
    with pytest.raises(ExportError, match="openai, openai-responses, anthropic, mcp, jsonschema"):
        export([], "gemini")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("side_effect", "read_only", "destructive"),
    [("read", True, False), ("reversible", False, False), ("visible", False, True), ("irreversible", False, True)],
)
def test_mcp_annotations_follow_the_side_effect_class(side_effect, read_only, destructive) -> None:
    tool = Tool(name="test_item_tag", description=DESCRIPTION, inputs=RichInputs, outputs={}, handler=handler,
                side_effect=side_effect)
    annotations = export([describe(tool, "t")], "mcp")[0]["annotations"]
    assert annotations == {"readOnlyHint": read_only, "destructiveHint": destructive,
                           "idempotentHint": True, "openWorldHint": False}


def test_export_leaves_the_definition_unchanged(definitions) -> None:
    before = copy.deepcopy([d.input_schema for d in definitions])
    for fmt in FORMATS:
        export(definitions, fmt)
    assert [d.input_schema for d in definitions] == before


def test_jsonschema_document_keeps_the_name_and_its_refs_resolve(definitions) -> None:
    doc = next(e for e in export(definitions, "jsonschema") if e["title"] == "test_item_tag")
    assert doc["description"] == DESCRIPTION.text()
    assert doc["properties"]["filter"]["anyOf"][0]["$ref"] == "#/$defs/Filter" and "Filter" in doc["$defs"]
    jsonschema = _maybe_jsonschema()
    if jsonschema:
        jsonschema.validate({"item": "w", "filter": {"key": "k"}, REQUEST_ID: "r"}, doc)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"item": "w", "filter": {"key": "k", "extra": 1}, REQUEST_ID: "r"}, doc)


def test_admits_null_reads_types_enums_unions_and_refs() -> None:
    root = {"$defs": {"N": {"type": "null"}, "S": {"type": "string"}}}
    assert admits_null({"type": ["string", "null"]})
    assert admits_null({"anyOf": [{"type": "string"}, {"type": "null"}]})
    assert admits_null({"enum": ["a", None]}) and not admits_null({"enum": ["a"]})
    assert admits_null({"$ref": "#/$defs/N"}, root) and not admits_null({"$ref": "#/$defs/S"}, root)
    assert admits_null({}) and not admits_null({"type": "integer"})


def test_strict_schema_rewrites_oneof_refs_with_siblings_and_unsupported_formats() -> None:
    schema = {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date-time", "description": "When."},
            "host": {"type": "string", "format": "idn-hostname", "description": "Host."},
            "word": {"type": "string", "pattern": "^(?!rm)[a-z]+$", "description": "Word."},
            "pick": {"oneOf": [{"type": "string"}, {"type": "integer"}], "description": "Pick."},
            "sub": {"$ref": "#/$defs/Sub", "description": "Sub."},
        },
        "required": ["when", "host", "word", "pick", "sub"],
        "$defs": {"Sub": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}},
    }
    out = strict_schema(schema)
    props = out["properties"]
    assert props["when"]["format"] == "date-time"  # a supported format stays
    assert "format" not in props["host"] and "(format idn-hostname)" in props["host"]["description"]
    assert "pattern" not in props["word"] and "pattern ^(?!rm)" in props["word"]["description"]
    assert "oneOf" not in props["pick"] and len(props["pick"]["anyOf"]) == 2
    assert props["sub"]["anyOf"] == [{"$ref": "#/$defs/Sub"}] and props["sub"]["description"] == "Sub."
    assert out["$defs"]["Sub"]["additionalProperties"] is False
    assert_strict(out)
    assert schema["properties"]["host"]["format"] == "idn-hostname"  # the input is not changed


# --- sizes -----------------------------------------------------------------------------------


def test_sizes_are_compact_json_bytes_with_a_token_estimate(definitions) -> None:
    for fmt in FORMATS:
        exported = export(definitions, fmt)
        rows = sizes(exported)
        assert [r.name for r in rows] == [d.name for d in definitions]
        for row, item in zip(rows, exported, strict=True):
            assert row.bytes == len(json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode())
            assert row.bytes / 6 < row.tokens < row.bytes / 2.5
    table = size_table(sizes(export(definitions, "anthropic"))).splitlines()
    assert table[0].split() == ["tool", "bytes", "~tokens"]
    assert table[-1].startswith("total") and len({len(line) for line in table}) == 1  # aligned


# Token counts of seed 002's two definitions (minified) under o200k_base, measured once with
# the bpe-openai tokenizer, which rungd does not depend on.
SEED_CREATE_REFUND = {
    "name": "create_refund", "description": "Create a refund.",
    "parameters": {"type": "object", "properties": {
        "charge": {"type": "string"}, "amount": {"type": "number"}, "reason": {"type": "string"}}},
}
SEED_REFUND_PAYMENT_TEXT = (
    "Refunds one charge to the customer's original payment method. Permanent: a refund cannot be undone. "
    "Use when the customer has asked for money back on a specific charge and you hold its charge_ref from "
    "find_refundable_charges. Do not use to look charges up or to cancel an order; call "
    "find_refundable_charges first. Returns the refund reference, the amount refunded in cents and the "
    "amount still refundable on the charge. Safe to retry: repeating this call within the same run returns "
    "the existing refund, flagged as pre-existing, and moves no more money. On error returns a code, a "
    "message, whether a retry can help, and a hint. Example: already_refunded, not retryable, nothing is "
    "left to refund on this charge. If you do not know the charge_ref, do not guess. Ask the user which "
    "charge they mean."
)


@pytest.mark.parametrize(("text", "o200k"), [(compact_json(SEED_CREATE_REFUND), 42),
                                              (SEED_REFUND_PAYMENT_TEXT, 171)])
def test_token_estimate_is_close_to_a_real_tokenizer(text, o200k) -> None:
    assert abs(estimate_tokens(text) - o200k) <= 0.12 * o200k


def _maybe_jsonschema() -> Any:
    try:
        import jsonschema
    except ImportError:
        return None
    return jsonschema
