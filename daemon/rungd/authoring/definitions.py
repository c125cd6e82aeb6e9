"""Tool definitions in the shape each model provider expects, and what each one costs.

The daemon serves one ``ToolDefinition`` per tool (``describe``); agent code hands a model the
same three parts in a provider's own wrapping. This module does the wrapping, so agent code in
any framework, ``rungctl export-tools`` and the MCP bridge all send the same thing.

    export(defs, "openai")      Chat Completions function tools, strict mode
    export(defs, "openai-responses")  Responses API function tools (flat), strict mode
    export(defs, "anthropic")   Messages API tools: name, description, input_schema
    export(defs, "mcp")         MCP ``Tool`` objects, with annotations from the side effect
    export(defs, "jsonschema")  one plain JSON Schema document per tool
    sizes(exported)             bytes (compact JSON) and an estimate of tokens per definition
    split_request_id(args)      the model's arguments back into (inputs, request_id)

The request_id. Every tool that changes something (``requires_request_id``) needs an
idempotency key beside its inputs. Agent code passes the model's arguments through, so the
key must be something the model writes: the exported schema gets a required ``request_id``
string property, described as unique per intended change. ``split_request_id`` takes it
back out before the call goes to the daemon, where it travels outside the inputs.

Shapes, as published (checked against these sources):

- OpenAI: ``ChatCompletionToolParam`` / ``FunctionDefinition`` in ``openai-python``
  (``{"type": "function", "function": {"name", "description", "parameters", "strict"}}``,
  name ``[a-zA-Z0-9_-]{1,64}``); for the Responses API, ``FunctionToolParam`` in
  ``openai-python`` (``types/responses/function_tool_param.py``: the same fields, flat:
  ``{"type": "function", "name", "description", "parameters", "strict"}``); and the strict-mode rules of the function-calling and
  structured-outputs guides, as implemented by ``openai-python``'s ``to_strict_json_schema``
  and the keyword handling of pydantic-ai's ``OpenAIJsonSchemaTransformer``.
- Anthropic: ``ToolParam`` in ``anthropic-sdk-python`` (``name``, ``description``,
  ``input_schema`` with ``type: "object"``; name ``^[a-zA-Z0-9_-]{1,64}$``).
- MCP: ``Tool`` and ``ToolAnnotations`` in the 2025-11-25 ``schema.json`` of
  modelcontextprotocol/modelcontextprotocol (``name``, ``description``, ``inputSchema``
  with ``type: "object"``, optional ``annotations``; JSON Schema 2020-12 by default).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from rungd.core.envelope import Envelope
from rungd.protocol import ToolDefinition

Format = Literal["openai", "openai-responses", "anthropic", "mcp", "jsonschema"]
FORMATS: tuple[Format, ...] = ("openai", "openai-responses", "anthropic", "mcp", "jsonschema")

REQUEST_ID = "request_id"
REQUEST_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "description": "Unique per intended change; reuse only to retry the same change. "
    "A new change needs a new value, e.g. a fresh UUID.",
    "examples": ["5f0c2c1e-8d3a-4b7e-9c1a-2e6f3b7d9a10"],
}

# Both OpenAI and Anthropic document this pattern for a tool's name; MCP only recommends
# 1-128 characters of [A-Za-z0-9_.-], which every name passing this one also meets.
PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class ExportError(ValueError):
    """A definition cannot be exported as the provider requires (the message says why)."""


# --- the exporters -------------------------------------------------------------------------


def export(defs: Iterable[ToolDefinition], fmt: Format) -> list[dict[str, Any]]:
    """The definitions in one provider's shape, in the order given.

    Args:
        defs: definitions as the daemon serves them (``describe``), for the calling uid.
        fmt: ``openai``, ``openai-responses``, ``anthropic``, ``mcp`` or ``jsonschema``.

    Returns:
        One JSON-ready dict per definition.

    Raises:
        ExportError: ``fmt`` is unknown, a name breaks the providers' name rule, or a write
            already has an input called ``request_id``. ``rungctl lint`` reports both as
            fix-first; exporting them anyway would only move the failure to the provider.
    """
    try:
        exporter = _EXPORTERS[fmt]
    except KeyError:
        raise ExportError(f"unknown format {fmt!r}; the formats are {', '.join(FORMATS)}") from None
    return [exporter(d) for d in defs]


def model_schema(d: ToolDefinition) -> dict[str, Any]:
    """The input schema a model reads: the tool's own, plus ``request_id`` for a write.

    A fresh copy every time; the definition is not changed.
    """
    if not PROVIDER_NAME.match(d.name):
        raise ExportError(
            f"tool name {d.name!r} is not accepted by the providers: it must match {PROVIDER_NAME.pattern}"
        )
    schema = copy.deepcopy(d.input_schema)
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    if d.requires_request_id:
        if REQUEST_ID in schema["properties"]:
            raise ExportError(
                f"{d.name} has an input called {REQUEST_ID!r}, a name rungd keeps for the idempotency key; "
                "rename the input"
            )
        schema["properties"][REQUEST_ID] = copy.deepcopy(REQUEST_ID_SCHEMA)
        schema["required"] = [*schema["required"], REQUEST_ID]
    return schema


def to_anthropic(d: ToolDefinition) -> dict[str, Any]:
    """A Messages API tool: ``{"name", "description", "input_schema"}``."""
    return {"name": d.name, "description": d.description, "input_schema": model_schema(d)}


def to_jsonschema(d: ToolDefinition) -> dict[str, Any]:
    """One self-contained JSON Schema (2020-12) document for the tool's arguments.

    The tool's name is the ``title`` and the six-slot description the ``description``, for
    frameworks that take a bare schema and read the tool's name and purpose from it.

    The contract's heading (rung, step down, session), when the tool declares one, rides
    along as ``x-rungd-heading``: an unknown keyword, which JSON Schema keeps as an
    annotation and validators ignore, so an operator's tooling can read it and a model's
    description does not grow.
    """
    schema = model_schema(d)
    heading = {"x-rungd-heading": d.heading} if d.heading else {}
    return {"$schema": JSON_SCHEMA_DIALECT, "title": d.name, "description": d.description, **schema, **heading}


def tool_title(name: str) -> str:
    """A person's title for a tool, from its name: ``inventory_count_set`` -> ``Inventory count set``.

    From the name rather than the description's first slot: a name is short and always
    there, and a client shows titles side by side in a list.
    """
    text = " ".join(name.replace("-", " ").replace("_", " ").split())
    return text[:1].upper() + text[1:] if text else name


def root_schema(struct: type, title: str, description: str) -> dict[str, Any]:
    """A msgspec struct's JSON Schema with the struct itself at the root, as MCP requires of an
    ``outputSchema`` (``type: object`` at the root); the structs it refers to stay in ``$defs``."""
    generated = msgspec.json.schema(struct)
    defs = generated["$defs"]
    root = defs.pop(struct.__name__)
    root.pop("description", None)  # the struct's docstring speaks to rungd's developers
    return {**root, "title": title, "description": description, **({"$defs": defs} if defs else {})}


def envelope_schema() -> dict[str, Any]:
    """The result envelope's JSON Schema (from ``rungd.core.envelope.Envelope``): every tool's
    ``outputSchema``, since every result's ``structuredContent`` is an envelope."""
    return root_schema(
        Envelope, "rungd result envelope",
        "The result of one rungd call, success or failure: branch on status (ok | error | pending), "
        "outcome (done | not_started | unknown), effect, and error.code with next_action.",
    )


def to_mcp(d: ToolDefinition) -> dict[str, Any]:
    """An MCP ``Tool``: ``{"name", "title", "description", "inputSchema", "outputSchema", "annotations"}``.

    The annotations come from the side-effect class. The MCP schema calls every one a hint
    that clients must not trust from an untrusted server; rungd's gates, not these, decide
    whether a call runs.

    ``readOnlyHint``    true for ``read`` only.
    ``destructiveHint`` (meaningful only for writes) true for ``visible`` and ``irreversible``;
                        false for ``reversible``, whose effect another call can undo, the
                        nearest rungd class to MCP's "additive only".
    ``idempotentHint``  true for every tool: a read changes nothing, and a write repeated with
                        the same arguments carries the same ``request_id``, which the daemon
                        answers with the first result without running anything again.
    ``openWorldHint``   false: a rungd tool operates one declared legacy program on this host,
                        through declared roots, not an open set of outside entities.

    ``visible`` counts as destructive although another call may undo it: MCP's alternative,
    "additive updates only", is not true of an effect other people have already seen (a
    restarted service, records deleted from a shared view), and a client that asks its user
    before a destructive call should ask before these.

    ``title`` is made from the name (``tool_title``) and ``outputSchema`` is the result
    envelope's schema: every result's ``structuredContent`` is an envelope.
    """
    read = d.side_effect == "read"
    annotations = {
        "readOnlyHint": read,
        "destructiveHint": False if read else d.side_effect in ("visible", "irreversible"),
        "idempotentHint": True,
        "openWorldHint": False,
    }
    return {"name": d.name, "title": tool_title(d.name), "description": d.description,
            "inputSchema": model_schema(d), "outputSchema": envelope_schema(), "annotations": annotations}


def to_openai(d: ToolDefinition) -> dict[str, Any]:
    """A Chat Completions function tool in strict mode.

    ``{"type": "function", "function": {"name", "description", "parameters", "strict": true}}``;
    ``parameters`` is ``strict_schema(model_schema(d))``. See ``strict_schema`` for what strict
    mode demands and how optional inputs survive it.
    """
    return {
        "type": "function",
        "function": {
            "name": d.name,
            "description": d.description,
            "parameters": strict_schema(model_schema(d)),
            "strict": True,
        },
    }


def to_openai_responses(d: ToolDefinition) -> dict[str, Any]:
    """A Responses API function tool in strict mode: the Chat Completions fields, flat.

    ``{"type": "function", "name", "description", "parameters", "strict": true}``, as
    ``client.responses.create(tools=[...])`` takes it; ``parameters`` as in ``to_openai``.
    """
    return {"type": "function", **to_openai(d)["function"]}


_EXPORTERS = {"openai": to_openai, "openai-responses": to_openai_responses, "anthropic": to_anthropic,
              "mcp": to_mcp, "jsonschema": to_jsonschema}


# --- OpenAI strict mode --------------------------------------------------------------------

# What strict mode accepts, checked late 2025 / 2026:
# - OpenAI's structured-outputs guide, "Supported schemas"
#   (https://platform.openai.com/docs/guides/structured-outputs#supported-schemas, as quoted
#   in pydantic/pydantic-ai#2420): strings `pattern` and `format` (date-time, time, date,
#   duration, email, hostname, ipv4, ipv6, uuid); numbers `multipleOf`, `maximum`,
#   `exclusiveMaximum`, `minimum`, `exclusiveMinimum`; arrays `minItems`, `maxItems`;
#   composition `anyOf` only (not `allOf`, `not`, `if`/`then`/`else`, `dependent*`).
# - `minLength` / `maxLength`: not in the guide's list, but accepted and enforced in strict
#   mode (live-probed in pydantic/pydantic-ai#7315, 2026-08; the OpenAI Node SDK's strict
#   checks leave them in), so they stay in the schema where the model sees them.
# - `prefixItems`: refused in strict mode (same issue), so it is described in words.
# Everything else below is outside the subset. Such a constraint is not lost: it moves into
# the property's description as text, and the daemon still enforces it (BAD_INPUT).
_STRICT_UNSUPPORTED = (
    "patternProperties", "unevaluatedProperties", "propertyNames", "minProperties", "maxProperties",
    "unevaluatedItems", "contains", "minContains", "maxContains", "uniqueItems", "prefixItems",
)
_STRICT_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
_LOOKAROUND = re.compile(r"(?<!\\)\(\?<?[=!]")
_DROP = ("title", "$schema", "discriminator")


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema rewritten for OpenAI's strict mode, meaning unchanged.

    Strict mode (constrained decoding) accepts a subset of JSON Schema and demands, at every
    object level, ``additionalProperties: false`` and every property listed in ``required``.
    A model then always sends every property, so an optional input is made *nullable* and
    required: its type gains ``null`` (``["string", "null"]``, ``null`` added to an ``enum``,
    or ``anyOf [..., {"type": "null"}]``), and its description says that null means the
    default. ``split_request_id(arguments, definition)`` drops those nulls again, so the
    daemon sees the call a non-strict model would have sent and applies its own default.

    Also, as strict mode requires: ``default`` is removed (it is in the description
    instead); unsupported keywords (``uniqueItems``, ``prefixItems`` and the like, a ``format``
    outside the supported list, a ``pattern`` with look-around) move into the description as
    text, while supported ones (``pattern``, ``format``, ``minimum``/``maximum``,
    ``minLength``/``maxLength``, ``minItems``/``maxItems``) stay where the model honours them;
    ``oneOf`` becomes ``anyOf``; a ``$ref`` with sibling keywords is wrapped in ``anyOf``.
    The root stays an object. Nothing here loosens validation: the daemon validates every
    call against the tool's own schema.
    """
    root = copy.deepcopy(dict(schema))
    return _strict(root, root)


def _strict(node: dict[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    for key in _DROP:
        node.pop(key, None)
    for bucket in ("$defs", "definitions"):
        if isinstance(node.get(bucket), dict):
            node[bucket] = {name: _strict(sub, root) for name, sub in node[bucket].items()}
    notes = []
    if "default" in node:
        node.pop("default")  # refused in strict mode; an optional input says it in words (below)
    for key in _STRICT_UNSUPPORTED:
        if key in node:
            notes.append(f"{key} {json.dumps(node.pop(key))}")
    if "format" in node and node["format"] not in _STRICT_FORMATS:
        notes.append(f"format {node.pop('format')}")
    if isinstance(node.get("pattern"), str) and _LOOKAROUND.search(node["pattern"]):
        notes.append(f"pattern {node.pop('pattern')}")
    if notes:
        _add_to_description(node, "(" + "; ".join(notes) + ")")
    if "oneOf" in node:
        node["anyOf"] = [*node.get("anyOf", []), *node.pop("oneOf")]
    if "$ref" in node and len(node) > 1:
        node["anyOf"] = [{"$ref": node.pop("$ref")}, *node.get("anyOf", [])]
    for key in ("anyOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = [_strict(sub, root) if isinstance(sub, dict) else sub for sub in node[key]]
    if isinstance(node.get("items"), dict):
        node["items"] = _strict(node["items"], root)
    if node.get("type") == "object" or "properties" in node:
        properties = node.get("properties") or {}
        required = set(node.get("required", []))
        node["properties"] = {
            name: _strict_property(sub, root, optional=name not in required) for name, sub in properties.items()
        }
        node["required"] = list(node["properties"])
        node["additionalProperties"] = False
    return node


def _strict_property(prop: dict[str, Any], root: Mapping[str, Any], *, optional: bool) -> dict[str, Any]:
    if optional and not admits_null(prop, root):
        default = prop.get("default")
        said = f"Null means the default ({json.dumps(default)})." if "default" in prop else "Null means not given."
        _add_to_description(prop, said)
        return _nullable(_strict(prop, root))
    return _strict(prop, root)


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    kind = prop.get("type")
    if isinstance(kind, str) and "anyOf" not in prop and "allOf" not in prop:
        prop["type"] = [kind, "null"]
        if "const" in prop:
            prop["enum"] = [prop.pop("const")]
        if isinstance(prop.get("enum"), list) and None not in prop["enum"]:
            prop["enum"] = [*prop["enum"], None]
        return prop
    if isinstance(kind, list):
        prop["type"] = [*kind, "null"]
        if isinstance(prop.get("enum"), list) and None not in prop["enum"]:
            prop["enum"] = [*prop["enum"], None]
        return prop
    if isinstance(prop.get("anyOf"), list) and len(prop) <= 2:  # anyOf plus, at most, a description
        prop["anyOf"] = [*prop["anyOf"], {"type": "null"}]
        return prop
    outer = {k: prop.pop(k) for k in ("description", "examples") if k in prop}
    return {"anyOf": [prop, {"type": "null"}], **outer}


def _add_to_description(node: dict[str, Any], text: str) -> None:
    before = str(node.get("description", "")).strip()
    node["description"] = f"{before} {text}" if before else text


def admits_null(schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> bool:
    """Whether ``null`` is a valid value under ``schema`` (as far as its own keywords say).

    A schema that names no type at all admits anything, null included.
    """
    root = root if root is not None else schema
    if schema.get("const", 0) is None or None in (schema.get("enum") or ()):
        return True
    if "enum" in schema or "const" in schema:
        return False
    kind = schema.get("type")
    if kind is not None:
        return kind == "null" or (isinstance(kind, list) and "null" in kind)
    branches = [*schema.get("anyOf", ()), *schema.get("oneOf", ())]
    if branches:
        return any(admits_null(b, root) for b in branches if isinstance(b, Mapping))
    if "$ref" in schema:
        target = _resolve(root, schema["$ref"])
        return target is None or admits_null(target, root)
    if "allOf" in schema:
        return all(admits_null(b, root) for b in schema["allOf"] if isinstance(b, Mapping))
    return True


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any] | None:
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping) else None


# --- arguments back from the model ---------------------------------------------------------


def split_request_id(
    arguments: Mapping[str, Any], definition: ToolDefinition | None = None
) -> tuple[dict[str, Any], str | None]:
    """Split a model's tool-call arguments into the tool's inputs and the request_id.

    Args:
        arguments: the argument object the model produced for an exported definition.
        definition: the tool's definition. When given, nulls that only stand for "not
            given" (an optional input made nullable for OpenAI's strict mode, see
            ``strict_schema``) are dropped again, at every level of nesting, so the daemon
            applies the input's default. Nulls the tool's own schema allows are kept.

    Returns:
        ``(inputs, request_id)``. ``request_id`` is None when the model sent none, or sent
        something that is not a string; for a write the daemon then answers BAD_INPUT with a
        hint the model can act on, rather than this function guessing a key.
    """
    inputs = dict(arguments)
    raw = inputs.pop(REQUEST_ID, None)
    request_id = raw if isinstance(raw, str) else None
    if definition is not None:
        inputs = drop_strict_nulls(inputs, definition.input_schema)
    return inputs, request_id


def drop_strict_nulls(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """``value`` with the nulls removed that strict mode forced into optional properties."""
    root = root if root is not None else schema
    schema = _object_branch(schema, root) if isinstance(value, dict) else schema
    if "$ref" in schema:
        schema = _resolve(root, schema["$ref"]) or {}
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        required = set(schema.get("required", ()))
        out = {}
        for key, item in value.items():
            sub = properties.get(key)
            if sub is None:
                out[key] = item  # not ours to judge; the daemon names unknown inputs
            elif item is None and key not in required and not admits_null(sub, root):
                continue
            else:
                out[key] = drop_strict_nulls(item, sub, root)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [drop_strict_nulls(item, schema["items"], root) for item in value]
    return value


def _object_branch(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """For an object value under a union (``Model | None``): the union's first object branch."""
    for branch in schema.get("anyOf", ()):
        target = _resolve(root, branch["$ref"]) if "$ref" in branch else branch
        if target is not None and target.get("type") == "object":
            return target
    return schema


# --- sizes ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DefinitionSize:
    """What one exported definition costs on every model pass it rides along on."""

    name: str
    bytes: int
    tokens: int


def compact_json(value: Any) -> str:
    """JSON as sent on the wire: no spaces, UTF-8 kept as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def definition_name(exported: Mapping[str, Any]) -> str:
    """The tool's name inside any exported shape."""
    if isinstance(exported.get("function"), Mapping):
        return str(exported["function"].get("name", ""))
    return str(exported.get("name") or exported.get("title") or "")


def sizes(exported: Iterable[Mapping[str, Any]]) -> list[DefinitionSize]:
    """Bytes (compact JSON, UTF-8) and estimated tokens of each exported definition.

    The bytes are exact for what agent code sends. The tokens are ``estimate_tokens`` of
    that JSON: a model provider wraps tool definitions in its own framing (and Anthropic
    adds a tool-use system prompt once per request), so the real count differs by a
    per-request constant plus the estimate's error.
    """
    out = []
    for item in exported:
        text = compact_json(item)
        out.append(DefinitionSize(definition_name(item), len(text.encode("utf-8")), estimate_tokens(text)))
    return out


def size_table(rows: Iterable[DefinitionSize]) -> str:
    """An aligned table of sizes with a total line, for a person (``export-tools`` stderr)."""
    rows = list(rows)
    width = max([len("tool"), len("total"), *(len(r.name) for r in rows)])
    lines = [f"{'tool':<{width}}  {'bytes':>7}  {'~tokens':>7}"]
    lines += [f"{r.name:<{width}}  {r.bytes:>7,}  {r.tokens:>7,}" for r in rows]
    lines.append(f"{'total':<{width}}  {sum(r.bytes for r in rows):>7,}  {sum(r.tokens for r in rows):>7,}")
    return "\n".join(lines)


# The pre-tokenizer of OpenAI's cl100k/o200k BPE vocabularies, written with stdlib ``re``:
# a contraction, a run of letters with at most one leading non-letter (" name", "_item",
# "\"type"), up to three digits, a run of punctuation, or whitespace.
_LETTERS = r"[^\W\d_]"
_PIECE = re.compile(
    rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?{_LETTERS}+|\d{{1,3}}"
    r"| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Each piece costs one token per four characters, at least one. Calibrated once against
# o200k_base (the bpe-openai package, not a dependency) on 53 samples: rungd's demo and
# test tools in all four formats, the JSON of seed 002 and prose from DESIGN.md and
# STYLE.md. Error: at most 7%, mean 2%; ``bytes / 4`` on the same set: at most 19%
# (prose), mean 3%. tests/authoring/test_definitions.py keeps a few of those counts as a regression.
_CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """An estimate of how many tokens a model's tokenizer makes of ``text``; stdlib only.

    Splits ``text`` the way OpenAI's BPE pre-tokenizer does (``_PIECE``) and counts one
    token per four characters of each piece, at least one (words rounded down, other
    pieces up): a common word or JSON's ``":"`` is one token, a long identifier or a run
    of brackets several. Claude's tokenizer
    is not published and differs; treat the number as a size class, not a bill.
    """
    tokens = 0
    for piece in _PIECE.findall(text):
        core = piece.strip() or piece
        if core[-1].isalpha():  # a word: a common one is a single token even when long
            tokens += max(1, len(core) // _CHARS_PER_TOKEN)
        else:  # digits, punctuation, whitespace
            tokens += -(-len(core) // _CHARS_PER_TOKEN)
    return tokens
