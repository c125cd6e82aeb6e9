"""The tool-file schema is the one source: every key is described there, and the guide's key
reference and the scaffold are generated from it (rungd_plugins.declarative.reference)."""

from __future__ import annotations

import re
import tomllib

from rungd_plugins.declarative import reference
from rungd_plugins.declarative.schema import ToolFile
from tests.authoring.test_scaffold import fill_in

REWRITE = f"run {reference.COMMAND}"


def test_every_key_of_every_tool_file_model_has_a_description() -> None:
    names = [model.__name__ for model in reference.models()]
    assert "ToolSpec" in names and "ExpectSpec" in names and "TakenSpec" in names  # the walk reaches the leaves
    missing = reference.undescribed()
    assert not missing, f"keys without Field(description=...) in schema.py: {', '.join(missing)}"


def test_the_guides_key_reference_is_generated_from_the_schema() -> None:
    text = reference.readme_path().read_text(encoding="utf-8")
    assert reference.readme_section(text) == reference.key_reference(), f"plugins/README.md is out of date: {REWRITE}"


def test_the_scaffold_template_is_generated_from_the_schema() -> None:
    text = reference.template_path().read_text(encoding="utf-8")
    assert text == reference.scaffold(), f"{reference.template_path()} is out of date: {REWRITE}"


def test_the_reference_names_every_key_at_its_toml_path() -> None:
    text = reference.key_reference()
    for path in ("`[tools.NAME] argv`", "`[tools.NAME.parse] kind`", "`[[tools.NAME.confirm]] pattern`",
                 "`[tools.NAME] import`", "`[tools.NAME.verify.expect.FIELD] before_plus`",
                 "`[[tools.NAME.heading.step_down]] within`", "`[tools.NAME.import.taken] receipt`"):
        assert path in text
    for model in reference.models():
        for name, info in model.model_fields.items():
            key = re.escape(info.alias or name)
            assert re.search(rf"^- `(\S+\] {key}|\[{key}(\.NAME)?\])`:", text, re.M), \
                f"{model.__name__}.{name} is missing from the reference"


def test_the_scaffold_shows_every_key_and_is_a_valid_tool_file_once_filled_in() -> None:
    text = reference.scaffold().format(system="erp")
    for model in reference.models():
        for name, info in model.model_fields.items():
            key = re.escape(info.alias or name)  # set, commented out, or a table's name
            assert re.search(rf"^(# )?({key} = |\[+(\S+\.)?{key}[.\]])|[{{ ]{key} = ", text, re.M), \
                f"{model.__name__}.{name} is not in the scaffold"
    raw = tomllib.loads(fill_in(text))
    file = ToolFile.model_validate(raw)
    assert list(file.tools) == ["erp_item_show", "erp_item_update"]
    assert "FILL" not in str(raw)
    # Unfilled, it still carries the placeholders check-config and lint refuse.
    assert "FILL IN" in str(tomllib.loads(text)["tools"]["erp_item_show"]["description"])
