"""rungctl new-plugin: what it writes loads, and the generated tests pass as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rungd.core.errors import ConfigError
from rungd.core.settings import PluginSettings
from rungd.authoring.scaffold import new_plugin
from rungd.testing import write_config
from rungd_plugins.declarative import read_tool_file


def fill_in(text: str) -> str:
    """What an author does to a scaffolded tool file: every FILL IN replaced by real words."""
    text = text.replace("FILL IN: the question, e.g. ", "")
    for line in text.splitlines():
        if "FILL" in line and "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            if '"FILL-IN"' in value:
                text = text.replace(line, f'{key}= "example-1"')
            elif "FILL IN" in value.split("#")[0]:
                text = text.replace(line, f'{key}= "Written by the author."')
    return text


def test_python_scaffold_tests_pass_as_generated(tmp_path: Path) -> None:
    written = new_plugin("erp", tmp_path, python=True)
    root = tmp_path / "rungd-erp"
    assert root / "rungd_erp" / "__init__.py" in written
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout  # the read's three and the write's read-back


def test_tool_file_scaffold_loads_once_its_program_exists(tmp_path: Path, fake_program) -> None:
    (path,) = new_plugin("erp", tmp_path)
    text = path.read_text()
    for slot in ("does =", "use_when =", "do_not_use_when =", "returns =", "on_error =", "if_unknown =",
                 "side_effect", "deadline_s", "commit_point", "verify", "log_fields", "cap_bytes"):
        assert slot in text
    program = fake_program("erp", "print('item: x')\n")
    path.write_text(fill_in(text.replace("/usr/bin/erp", str(program))))
    loaded = read_tool_file(path)
    assert [t.name for t in loaded.tools] == ["erp_item_show", "erp_item_update"]


def test_scaffold_refuses_bad_names_and_overwrites(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one lower-case word"):
        new_plugin("My ERP", tmp_path)
    new_plugin("erp", tmp_path)
    with pytest.raises(ValueError, match="refusing to overwrite"):
        new_plugin("erp", tmp_path)


def test_python_scaffold_lints_clean_of_fix_first_findings(tmp_path: Path, monkeypatch) -> None:
    import importlib

    from rungd.authoring.lint import lint_tool

    new_plugin("erp", tmp_path, python=True)
    monkeypatch.syspath_prepend(str(tmp_path / "rungd-erp"))
    module = importlib.import_module("rungd_erp")
    tools = []
    fake = tmp_path / "rungd-erp" / "tests" / "fake_erp"
    module.rungd_register_tools(tools.append, PluginSettings("rungd_erp", {"program": str(fake)}, "test"))
    assert [t.name for t in tools] == ["erp_item_show", "erp_item_set"]  # a read, and a write to copy
    names = [t.name for t in tools]
    for tool in tools:
        findings = lint_tool(tool, "erp", known_tools=names)
        assert not [f for f in findings if f.rank == "fix-first"], findings
        assert not [f for f in findings if f.rank == "should-fix"], findings


def test_an_unfilled_tool_file_names_its_file_and_keys(tmp_path: Path, fake_program) -> None:
    (path,) = new_plugin("erp", tmp_path)
    path.write_text(path.read_text().replace("/usr/bin/erp", str(fake_program("erp", "print('item: x')\n"))))
    with pytest.raises(ConfigError) as caught:
        read_tool_file(path)
    text = str(caught.value)
    assert str(path) in text
    assert "key tools.erp_item_show.description.use_when: still the scaffold's FILL IN placeholder" in text


@pytest.mark.parametrize("command", [["rungd.main", "check-config"], ["rungd.ctl", "lint", "--offline"]])
def test_an_unfilled_scaffold_fails_check_config_and_lint(short_tmp: Path, fake_program, command) -> None:
    tools = short_tmp / "tools"
    tools.mkdir()
    (path,) = new_plugin("erp", tools)
    path.write_text(path.read_text().replace("/usr/bin/erp", str(fake_program("erp", "print('item: x')\n"))))
    config = write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n')
    done = subprocess.run([sys.executable, "-m", *command, "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert str(path) in done.stderr and "tools.erp_item_show.description.use_when" in done.stderr
    assert "Traceback" not in done.stderr


def test_scaffolded_pyproject_does_not_depend_on_rungd_by_name(tmp_path: Path) -> None:
    import tomllib

    new_plugin("erp", tmp_path, python=True)
    project = tomllib.loads((tmp_path / "rungd-erp" / "pyproject.toml").read_text())["project"]
    # rungd is not on PyPI: a bare "rungd" would install whatever someone uploads under it.
    assert not [d for d in project["dependencies"] if re.match(r"(?i)rungd\s*($|[<>=!~\[;@])", d)]
    assert project["entry-points"]["rungd.plugins"] == {"rungd_erp": "rungd_erp"}
