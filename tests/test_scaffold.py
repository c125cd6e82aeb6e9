"""rungctl new-plugin: what it writes loads, and the generated tests pass as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rungd.scaffold import new_plugin
from rungd_plugins.declarative import read_tool_file


def test_python_scaffold_tests_pass_as_generated(tmp_path: Path) -> None:
    written = new_plugin("erp", tmp_path, python=True)
    root = tmp_path / "rungd-erp"
    assert root / "rungd_erp" / "__init__.py" in written
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_tool_file_scaffold_loads_once_its_program_exists(tmp_path: Path, fake_program) -> None:
    (path,) = new_plugin("erp", tmp_path)
    text = path.read_text()
    for slot in ("does =", "use_when =", "do_not_use_when =", "returns =", "on_error =", "if_unknown =",
                 "side_effect", "deadline_s", "commit_point", "verify", "log_fields", "cap_bytes"):
        assert slot in text
    program = fake_program("erp", "print('item: x')\n")
    path.write_text(text.replace("/usr/bin/erp", str(program)).replace("FILL IN: the question, e.g. ", ""))
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

    from rungd.lint import lint_tool

    new_plugin("erp", tmp_path, python=True)
    monkeypatch.syspath_prepend(str(tmp_path / "rungd-erp"))
    module = importlib.import_module("rungd_erp")
    tools = []
    module.rungd_register_tools(tools.append, None)
    findings = lint_tool(tools[0], "erp")
    assert not [f for f in findings if f.rank == "fix-first"], findings
    assert not [f for f in findings if f.rank == "should-fix"], findings
