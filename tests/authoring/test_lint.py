"""``rungctl lint``: the built-ins lint clean of fix-first findings; bad tools are caught by code."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Annotated, Any

import pytest
from pydantic import Field
from rungd.config import embedded_configs, load_config
from rungd.core.contract import (
    Description,
    ErrorRule,
    Heading,
    Result,
    RuledOut,
    SettleSpec,
    StepDown,
    Timing,
    Tool,
    ToolInputs,
)
from rungd.authoring.lint import (
    SET,
    Finding,
    definitions_from_config,
    exit_status,
    format_json,
    format_text,
    lint,
    lint_tool,
    parse_slots,
    too_close,
)
from rungd.protocol import ToolDefinition
from rungd.service.server import describe
from rungd.testing import write_config

from tests.conftest import FAKES, TEST_PLUGINS


def codes_by_tool(findings: list[Finding]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for f in findings:
        out[f.tool].add(f.code)
    return out


def definition(**overrides: Any) -> ToolDefinition:
    """A hand-made definition, as a client would receive one, for tools no plugin declares."""
    fields: dict[str, Any] = {
        "name": "legacy_record_show", "description": "", "input_schema": {"type": "object", "properties": {}},
        "side_effect": "read", "outputs": {}, "errors": [], "deadline_s": 30.0, "commit_point": "spawn",
    }
    fields.update(overrides)
    fields.setdefault("requires_request_id", fields["side_effect"] != "read")
    return ToolDefinition(**fields)


@pytest.fixture
def builtin_definitions(short_tmp) -> list[ToolDefinition]:
    """Every built-in tool: the plugins declared as entry points, each configured so that it
    registers its tools, and the shipped tool files."""
    config = load_config(write_config(short_tmp, f"""
        [plugins]
        tool_dirs = ["{embedded_configs() / 'tools'}"]

        [plugins.settings.git_repo]
        repos = {{ app = "{short_tmp}" }}

        [plugins.settings.systemd_service]
        services = ["web"]
        systemctl = "{FAKES / 'systemctl'}"
    """))
    return definitions_from_config(config)


# --- the built-ins and the bad tool file -----------------------------------------------------


def test_builtin_tools_have_no_fix_first_findings(builtin_definitions) -> None:
    plugins = {d.plugin for d in builtin_definitions}
    assert {"demo", "declarative"} <= plugins  # and every other entry point configured above
    assert "host_disk_usage_show" in {d.name for d in builtin_definitions}
    findings = lint(builtin_definitions)
    assert [f for f in findings if f.rank == "fix-first"] == []
    assert exit_status(findings) == 0


def test_bad_tool_file_produces_the_expected_findings(short_tmp) -> None:
    config = load_config(write_config(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "bad_tools.py"}"]\n'))
    findings = lint(definitions_from_config(config))
    found = codes_by_tool(findings)
    assert {
        "description.restates_name",       # "Runs."
        "description.slot_missing",        # five empty slots
        "description.repeat_unstated",
        "input.untyped", "input.undescribed", "input.no_example", "input.closed_set_not_enum",
        "name.too_short", "name.vague_verb", "name.write_not_named",
        "write.settle_missing",
        "errors.timeout_missing",
        "output.fields_undeclared",
    } <= found["run"]
    assert {
        "description.restates_name",       # a one-line description: "Does stuff."
        "description.slot_missing",
        "name.not_snake_case", "name.vague_verb", "name.write_not_named",
        "write.settle_unknown_tool",       # settled by a tool that does not exist
        "errors.timeout_blind_retry",      # TIMEOUT retry=yes on a write
        "errors.hint_missing", "errors.code_style",
    } <= found["doStuff"]
    assert {"name.write_named_as_read", "name.too_close"} <= found["billing_customers_get"]
    assert "name.too_close" in found["billing_customer_get"]
    slots = {f.message for f in findings if f.tool == "doStuff" and f.code == "description.slot_missing"}
    assert len(slots) == 5 and all("is missing" in m for m in slots)
    assert exit_status(findings) == 1
    # The demo plugin loads beside them and stays clean of fix-first findings.
    assert not [f for f in findings if f.tool.startswith("inventory_") and f.rank == "fix-first"]


def test_seed_002_flawed_definition_gets_the_seed_s_findings_without_its_false_alarm() -> None:
    create_refund = definition(
        name="create_refund", description="Create a refund.", side_effect="irreversible",
        input_schema={"type": "object", "properties": {
            "charge": {"type": "string"}, "amount": {"type": "number"}, "reason": {"type": "string"}}},
    )
    findings = lint([create_refund])
    by_code = {f.code: f for f in findings}
    assert by_code["description.restates_name"].rank == "fix-first"   # the seed's one fix-first
    missing = {f.message for f in findings if f.code == "description.slot_missing"}
    assert {"the 'Use when' slot is missing", "the 'Returns' slot is missing"} <= missing
    assert "schema.required_missing" in by_code                        # nothing marked required
    assert len([f for f in findings if f.code == "input.undescribed"]) == 3
    assert "description.repeat_unstated" in by_code                    # nothing makes a retry safe
    assert "schema.open_object" in by_code                             # extra properties allowed
    assert "description.undo_unstated" in by_code                      # undone or not
    assert "input.closed_set_not_enum" in by_code                      # reason: a closed set
    # The seed's false alarm ("refund" read as a second verb, no object): not here.
    assert not {c for c in by_code if c.startswith("name.")}


def test_seed_002_repaired_description_fills_every_slot_as_prose() -> None:
    repaired = (
        "Refunds one charge to the customer's original payment method. Permanent: a refund cannot be undone. "
        "Use when the customer has asked for money back on a specific charge and you hold its charge_ref from "
        "find_refundable_charges. Do not use to look charges up or to cancel an order; call "
        "find_refundable_charges first. Returns the refund reference, the amount refunded in cents and the "
        "amount still refundable on the charge. Safe to retry: repeating this call within the same run returns "
        "the existing refund, flagged as pre-existing, and moves no more money. On error returns a code, a "
        "message, whether a retry can help, and a hint. If you do not know the charge_ref, do not guess."
    )
    slots = parse_slots(repaired)
    assert slots["does"] == "Refunds one charge to the customer's original payment method."
    assert all(text is not None for text in slots.values())
    findings = lint([definition(name="refund_payment", description=repaired, side_effect="irreversible")])
    assert not [f for f in findings if f.code.startswith("description.")]


# --- single checks ---------------------------------------------------------------------------


class ItemInputs(ToolInputs):
    item: Annotated[str, Field(pattern=r"^[a-z]{1,16}$", description="The item's name, lower case.",
                               examples=["widget"])]


async def handler(ctx: Any, inputs: Any) -> Result:  # pragma: no cover - never run
    return Result()


GOOD = Description(
    does="Marks one item of the test store as counted. Undone by marking it again; a repeat with the same "
    "request_id changes nothing more.",
    use_when="the user says an item was counted.",
    do_not_use_when="you only want to read it; use test_item_show instead.",
    returns="item, counted.",
    on_error="NOT_FOUND (check the name), TIMEOUT (settle with test_item_show first).",
    if_unknown="if you do not know the item, ask the user; do not guess.",
)
ERRORS = (ErrorRule("NOT_FOUND", "no", "repair", "check the item name"), ErrorRule.core("SURFACE_CHANGED"),
          ErrorRule.core("TIMEOUT"), ErrorRule.core("AUTH_REQUIRED"))


def tool(**overrides: Any) -> Tool:
    fields: dict[str, Any] = {
        "name": "test_item_mark", "description": GOOD, "inputs": ItemInputs,
        "outputs": {"item": "the item", "counted": "whether it is marked counted"}, "handler": handler,
        "side_effect": "reversible", "errors": ERRORS, "cap_bytes": 1024,
        "timing": Timing(deadline_s=10, settle=SettleSpec("test_item_show", {"item": "$item"})),
        # A well-made write names the observation that steps it down (issue 16).
        "heading": Heading(2, (RuledOut(1, "present"),), (StepDown("SURFACE_CHANGED", count=3),)),
    }
    fields.update(overrides)
    return Tool(**fields)


def test_a_well_made_write_lints_clean() -> None:
    assert lint_tool(tool(), known_tools=["test_item_show"]) == []


@pytest.mark.parametrize(
    ("overrides", "code", "rank"),
    [
        ({"timing": Timing(deadline_s=10)}, "write.settle_missing", "fix-first"),
        ({"timing": Timing(deadline_s=10, settle=SettleSpec("test_item_show", {"item": "$name"}))},
         "write.settle_input_unbound", "should-fix"),
        ({"errors": ERRORS[:2] + ERRORS[3:]}, "errors.timeout_missing", "should-fix"),
        ({"errors": (*ERRORS[:2], ErrorRule("TIMEOUT", "yes", "retry_later"), ERRORS[3])},
         "errors.timeout_blind_retry", "fix-first"),
        ({"errors": ERRORS[:3]}, "errors.auth_required_missing", "consider"),
        ({"errors": (ERRORS[0], *ERRORS[2:])}, "errors.surface_changed_missing", "should-fix"),
        ({"cap_bytes": 100}, "output.cap_small", "should-fix"),
        ({"cap_bytes": 65536}, "output.cap_large", "should-fix"),
        ({"name": "store_item_show", "side_effect": "visible"}, "name.write_named_as_read", "fix-first"),
        ({"name": "test_item_set", "side_effect": "read", "timing": Timing()}, "name.read_named_as_write",
         "should-fix"),
        ({"name": "store_item_things"}, "name.write_not_named", "should-fix"),
        ({"name": "mark_item"}, "name.verb_not_last", "consider"),
        ({"name": "test_item_set_mark_now_please"}, "name.too_long", "consider"),
        ({"name": "test_show_item"}, "name.verb_not_last", "consider"),
        ({"outputs": {}}, "output.fields_undeclared", "should-fix"),
    ],
)
def test_each_check_reports_its_code_and_rank(overrides, code, rank) -> None:
    found = [f for f in lint_tool(tool(**overrides), known_tools=["test_item_show"]) if f.code == code]
    assert found and found[0].rank == rank, lint_tool(tool(**overrides), known_tools=["test_item_show"])


def test_a_settle_read_that_holds_on_the_state_alone_is_told_it_cannot_tell_a_refusal() -> None:
    def found(expect: dict[str, Any]) -> set[str]:
        settle = SettleSpec("test_item_show", {"item": "$item"}, expect)
        return {f.code for f in lint_tool(tool(timing=Timing(deadline_s=10, settle=settle)),
                                          known_tools=["test_item_show"])}

    assert "write.read_cannot_tell_refusal" in found({"counted": True})
    assert "write.read_cannot_tell_refusal" not in found({"counted": True, "serial": {"differs_from_before": True}})
    assert "write.read_cannot_tell_refusal" not in found({"marks": {"before_plus": 1}})


def test_settle_must_be_a_read_that_gets_its_required_inputs() -> None:
    settle_write = describe(tool(name="test_item_set"), "t")
    mark = describe(tool(timing=Timing(settle=SettleSpec("test_item_set", {}))), "t")
    found = codes_by_tool(lint([mark, settle_write]))
    assert {"write.settle_is_write", "write.settle_inputs_incomplete"} <= found["test_item_mark"]


def test_description_checks_codes_and_neighbours() -> None:
    wrong = Description(GOOD.does, GOOD.use_when, "you only read it; use test_item_peek instead.", GOOD.returns,
                        "ITEM_GONE when it vanished.", GOOD.if_unknown)
    found = {f.code for f in lint_tool(tool(description=wrong), known_tools=["test_item_show"])}
    assert {"description.neighbor_unknown", "description.on_error_unknown_code",
            "description.on_error_omits_code"} <= found


def test_inputs_nested_and_listed_are_checked_too() -> None:
    schema = {
        "type": "object", "additionalProperties": False, "required": ["rows"],
        "properties": {"rows": {"type": "array", "description": "Rows to write, at most ten.",
                                "examples": [[{"key": "a"}]], "items": {"$ref": "#/$defs/Row"}},
                       "note": {"type": "array", "description": "Free notes for the log.", "examples": [["x"]]}},
        "$defs": {"Row": {"type": "object", "properties": {"key": {"type": "string"}}}},
    }
    found = lint([definition(input_schema=schema)])
    where = {(f.code, f.message.split("'")[1]) for f in found if f.code.startswith("input.")}
    assert ("input.untyped", "note") in where                  # list[Any]
    assert ("input.undescribed", "rows[].key") in where
    assert any(f.code == "schema.open_object" and "rows[]" in f.message for f in found)


def test_a_pattern_a_value_only_has_to_contain_is_a_should_fix() -> None:
    def schema(pattern: str) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"name": {"type": "string", "description": "The record's name.", "examples": ["a"],
                                        "maxLength": 32, "pattern": pattern}}}

    found = [f for f in lint([definition(input_schema=schema("[a-z0-9._-]+"))]) if f.code == "input.pattern_unanchored"]
    assert [f.rank for f in found] == ["should-fix"] and "'name'" in found[0].message
    for anchored in (r"^[a-z]+$", r"\A[a-z]+\Z", r"(?i)^[a-z]+$"):
        assert not [f for f in lint([definition(input_schema=schema(anchored))])
                    if f.code == "input.pattern_unanchored"], anchored


def test_names_close_enough_to_confuse_are_reported_on_both() -> None:
    assert too_close("get_customer", "get_customers")
    assert too_close("inventory_item_show", "inventory-item-show")
    assert not too_close("git_repo_pull", "git_repo_push")
    assert not too_close("inventory_item_show", "inventory_count_set")
    found = lint([definition(name="billing_customer_show"), definition(name="billing_customers_show")])
    close = [f for f in found if f.code == "name.too_close"]
    assert sorted(f.tool for f in close) == ["billing_customer_show", "billing_customers_show"]
    assert {f.rank for f in close} == {"should-fix"}


def test_close_names_whose_descriptions_state_the_boundary_are_only_considered() -> None:
    a = definition(name="svc_unit_show", description="Does: one unit. Do not use when: all; use svc_units_show.")
    b = definition(name="svc_units_show", description="Does: all units. Do not use when: one; use svc_unit_show.")
    assert {f.rank for f in lint([a, b]) if f.code == "name.too_close"} == {"consider"}


def test_a_large_definition_and_a_large_set_are_reported() -> None:
    big = definition(name="legacy_report_show", description="Does: " + "reads the report. " * 300)
    assert any(f.code == "size.large" and f.rank == "should-fix" for f in lint([big]))
    many = [definition(name=f"legacy_{word}_show") for word in (
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
        "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform")]
    assert any(f.tool == SET and f.code == "set.too_many_tools" for f in lint(many))


def test_duplicate_names_and_reserved_request_id_are_fix_first() -> None:
    reserved = definition(name="legacy_record_set", side_effect="reversible", input_schema={
        "type": "object", "additionalProperties": False, "required": ["request_id"],
        "properties": {"request_id": {"type": "string", "description": "The record.", "examples": ["r"]}}})
    found = lint([reserved, definition(), definition()])
    assert {("name.duplicate", "fix-first"), ("input.request_id_reserved", "fix-first")} <= {
        (f.code, f.rank) for f in found}


def test_a_waiver_drops_only_the_code_it_names() -> None:
    import dataclasses

    declared = tool(errors=ERRORS[:3])
    base = describe(declared, "t")
    waived = describe(dataclasses.replace(
        declared, lint_waivers={"errors.auth_required_missing": "inventory never asks for one"}), "t")
    assert waived.lint_waivers == {"errors.auth_required_missing": "inventory never asks for one"}
    assert "errors.auth_required_missing" in {f.code for f in lint([base], ["test_item_show"])}
    assert lint([waived], ["test_item_show"]) == []


# --- output ----------------------------------------------------------------------------------


def test_text_output_is_ranked_aligned_and_summarised(short_tmp) -> None:
    config = load_config(write_config(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "bad_tools.py"}"]\n'))
    defs = definitions_from_config(config)
    findings = lint(defs)
    text = format_text(findings, len(defs)).splitlines()
    ranks = [line.split()[0] for line in text[:-1:2]]
    assert ranks == sorted(ranks, key=["fix-first", "should-fix", "consider"].index)
    message_col = {line.index(f.message) for line, f in zip(text[:-1:2], findings, strict=True)}
    fix_col = {line.index("fix: ") for line in text[1:-1:2]}
    assert len(message_col) == 1 and fix_col == message_col
    assert text[-1].startswith(f"{sum(f.rank == 'fix-first' for f in findings)} fix-first, ")
    assert text[-1].endswith(f"in {len(defs)} tools")
    assert format_text([], 3) == "no findings in 3 tools"


def test_json_output_carries_every_field_and_the_verdict() -> None:
    findings = lint_tool(tool(timing=Timing()), known_tools=["test_item_show"])
    doc = json.loads(format_json(findings))
    assert doc["ok"] is False and doc["counts"]["fix-first"] == 1
    assert doc["findings"][0] == {"tool": "test_item_mark", "rank": "fix-first", "code": "write.settle_missing",
                                  "message": findings[0].message, "fix": findings[0].fix}


# --- scaffold placeholders ---------------------------------------------------------------------


def test_a_fill_in_placeholder_is_a_fix_first_finding_naming_its_key() -> None:
    clean = definition(description=Description(
        "Reads one record. Changes nothing.", "you need a record.", "you want to change it; use nothing.",
        "the record.", "NOT_FOUND (check the name).", "ask the user; do not guess.").text())
    assert "text.placeholder" not in {f.code for f in lint([clean])}
    unfinished = definition(
        description=clean.description.replace("you need a record.", "FILL IN: the situations."),
        input_schema={"type": "object", "properties": {"id": {"type": "string", "description": "FILL IN",
                                                             "examples": ["FILL-IN"]}},
                      "required": ["id"], "additionalProperties": False},
    )
    found = [f for f in lint([unfinished]) if f.code == "text.placeholder"]
    assert {f.rank for f in found} == {"fix-first"}
    assert sorted(f.message.split(" still")[0] for f in found) == [
        "description", "input_schema.properties.id.description", "input_schema.properties.id.examples[0]"]
    assert exit_status(found) == 1


def test_lint_does_not_import_the_server() -> None:
    import subprocess
    import sys

    code = "import sys, rungd.authoring.lint; print('rungd.service.server' in sys.modules, 'trio' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_a_tool_files_fixes_are_written_in_the_tool_files_keys() -> None:
    # Issue 31: a tool file's author reads TOML, not Timing(...) or ErrorRule.core(...).
    write = {"name": "legacy_record_change", "side_effect": "reversible", "outputs": {"id": "the id"},
             "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}}}
    python = {f.code: f.fix for f in lint([definition(**write, plugin="legacy")])}
    in_file = {f.code: f.fix for f in lint([definition(**write, plugin="declarative")])}
    assert "Timing(settle=SettleSpec(" in python["write.settle_missing"]
    for code in ("write.settle_missing", "input.undescribed", "input.no_example", "heading.step_down_missing",
                 "errors.surface_changed_missing"):
        assert in_file[code].startswith(("[tools.legacy_record_change", "SURFACE_CHANGED")), (code, in_file[code])
        assert not any(word in in_file[code] for word in ("Timing(", "Field(", "ErrorRule", "Heading(")), in_file[code]
    assert '[tools.legacy_record_change.heading] step_down = [{ codes = ["SURFACE_CHANGED"' in \
        in_file["heading.step_down_missing"]
