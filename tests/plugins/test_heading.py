"""The contract's heading: declared in Python and in tool files, served by describe, checked by lint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rungd.service.catalog import describe
from rungd.config import embedded_configs, load_config
from rungd.core.contract import Heading, RuledOut, Session, StepDown
from rungd.authoring.definitions import export
from rungd.core.errors import ConfigError, PluginError
from rungd.authoring.lint import definitions_from_config, lint, lint_tool
from rungd.testing import write_config

from tests.conftest import FAKES
from tests.authoring.test_lint import definition, tool

GOOD = Heading(2, (RuledOut(1, "present", "no API"),), (StepDown("SURFACE_CHANGED", count=3),),
               climb="an API", session=Session("the operator", ("inv_token",)))


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def test_a_write_without_a_step_down_observation_is_asked_for_one() -> None:
    bare = lint_tool(tool(heading=None), known_tools=["test_item_show"])
    assert "heading.step_down_missing" in codes(bare)
    assert [f.rank for f in bare if f.code == "heading.step_down_missing"] == ["should-fix"]
    declared = lint_tool(tool(heading=GOOD, credentials=("inv_token",)), known_tools=["test_item_show"])
    assert declared == []


def test_a_read_needs_no_step_down() -> None:
    assert "heading.step_down_missing" not in codes(lint([definition()]))


@pytest.mark.parametrize(("heading", "credentials", "code"), [
    (Heading(2, session=Session("the operator", ("other",))), ("inv_token",), "session.credential_undeclared"),
    (Heading(2, session=Session("the operator", ("inv_token",))), (), "session.credential_undeclared"),
    (Heading(2, session=Session("the operator", on_expiry="SESSION_GONE")), (), "session.expiry_code_unknown"),
    (Heading(2, step_down=(StepDown("NEVER_RETURNED"),)), (), "heading.step_down_code_unknown"),
    (Heading(3), (), "heading.ruled_out_incomplete"),
    (Heading(2, (RuledOut(1, "present"),)), ("inv_token",), "session.missing"),
])
def test_lint_checks_the_session_and_observations_against_what_the_tool_declares(
        heading: Heading, credentials: tuple[str, ...], code: str) -> None:
    assert code in codes(lint_tool(tool(heading=heading, credentials=credentials), known_tools=["test_item_show"]))


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"rung": 7}, "rungs are 1 to 6"),
    ({"rung": 2, "ruled_out": (RuledOut(3, "present"),)}, "only rungs above"),
    ({"rung": 2, "attempts": 0}, "at least 1"),
])
def test_a_heading_that_cannot_be_true_is_refused(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Heading(**kwargs)


def test_describe_and_the_json_schema_export_carry_the_heading_and_the_description_does_not(
        ) -> None:
    plain = describe(tool(heading=None), "t")
    d = describe(tool(heading=GOOD, credentials=("inv_token",)), "t")
    assert d.description == plain.description  # never grows what a model reads
    assert d.heading is not None and d.heading["rung_name"] == "command line"
    assert d.heading["step_down"][0]["text"] == "SURFACE_CHANGED 3 times in a row"
    assert d.credentials == ["inv_token"]
    assert export([d], "jsonschema")[0]["x-rungd-heading"] == d.heading
    assert "x-rungd-heading" not in export([plain], "jsonschema")[0]


TOOL_FILE = """\
[program]
name = "status"
command = "{command}"
credentials = {{ STATUS_TOKEN = "status_token" }}

[tools.status_state_show]
argv = ["/tmp"]
[tools.status_state_show.description]
does = "Reads the state. Changes nothing."
use_when = "u."
do_not_use_when = "n."
returns = "state."
on_error = "SURFACE_CHANGED (stop)."
if_unknown = "ask."
[tools.status_state_show.parse]
kind = "key_value"
fields = {{ state = "string" }}
[tools.status_state_show.heading]
rung = 2
ruled_out = [{{ rung = 1, fails = "present" }}]
step_down = [{{ codes = ["PROMPT_UNEXPECTED"], count = 2, within = "24h" }}]
session = {{ provided_by = "the operator", credentials = [{session}] }}
"""


def _tool_file(short_tmp: Path, session: str) -> list:
    tools = short_tmp / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "status.toml").write_text(TOOL_FILE.format(command=FAKES / "upgraded_status", session=session))
    return definitions_from_config(load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n',
                                                            demo_plugins=False)))


def test_a_tool_file_declares_its_heading_and_its_credentials(short_tmp: Path) -> None:
    [d] = _tool_file(short_tmp, '"status_token"')
    assert d.credentials == ["status_token"]
    assert d.heading["step_down"][0]["within_s"] == 86400
    assert d.heading["step_down"][0]["text"] == "PROMPT_UNEXPECTED twice within 24h"
    assert "session.credential_undeclared" not in codes(lint([d]))


def test_a_tool_file_session_naming_an_undeclared_credential_is_a_lint_finding(short_tmp: Path) -> None:
    [d] = _tool_file(short_tmp, '"root_password"')
    assert "session.credential_undeclared" in codes(lint([d]))


def test_a_tool_file_ruling_out_its_own_rung_stops_start_up(short_tmp: Path) -> None:
    tools = short_tmp / "tools"
    tools.mkdir()
    text = TOOL_FILE.format(command=FAKES / "upgraded_status", session="").replace(
        'ruled_out = [{ rung = 1, fails = "present" }]', 'ruled_out = [{ rung = 2, fails = "present" }]')
    (tools / "status.toml").write_text(text)
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n', demo_plugins=False))
    with pytest.raises((ConfigError, PluginError), match="heading: ruled out rung 2"):
        definitions_from_config(config)


def test_every_shipped_tool_file_and_built_in_tool_carries_a_heading(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, f"""
        [plugins]
        tool_dirs = ["{embedded_configs() / 'tools'}", "{embedded_configs() / 'examples'}"]

        [plugins.settings.git_repo]
        repos = {{ app = "{short_tmp}" }}

        [plugins.settings.systemd_service]
        services = ["web"]
        systemctl = "{FAKES / 'systemctl'}"
    """))
    defs = definitions_from_config(config)
    assert {d.plugin for d in defs} >= {"demo", "ledgerbook", "git_repo", "systemd_service", "declarative"}
    assert [d.name for d in defs if not d.heading] == []
    findings = [f for f in lint(defs) if f.code.startswith(("heading.", "session.")) and f.rank != "consider"]
    assert findings == []
