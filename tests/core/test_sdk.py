"""rungd.sdk is the plugin author's one front door: complete, documented, and the same objects
the daemon uses. rungd.testing imports without pytest."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import rungd.sdk as sdk
from rungd import runner
from rungd.core import contract, errors
from rungd.config import Config
from rungd.core.errors import ConfigError
from rungd.sdk import PluginSettings
from rungd.service.plugins import settings_for

ROOT = Path(__file__).resolve().parents[2]
# What issue 10 says a plugin author needs; removing one breaks plugins.
REQUIRED = {
    "Tool", "ToolInputs", "NoInputs", "Description", "ErrorRule", "Timing", "SettleSpec", "Result",
    "CallContext", "Caller", "ToolError", "SurfaceChanged", "UnexpectedState", "AuthRequired", "Locked",
    "ConfigError", "hookimpl", "run", "Program", "Confirmation", "CredentialPrompt", "Limits", "check_exit",
    "Completed", "PluginSettings", "exchange", "Export", "ExportSpec", "Importer", "ImportSpec",
}


def test_the_sdk_exports_what_a_plugin_needs_and_documents_each_name() -> None:
    assert REQUIRED <= set(sdk.__all__)
    doc = sdk.__doc__ or ""
    undocumented = [name for name in sdk.__all__ if name not in doc]
    assert undocumented == []
    assert all(hasattr(sdk, name) for name in sdk.__all__)


def test_sdk_names_are_the_objects_the_daemon_checks_against() -> None:
    # The host tests isinstance(tool, Tool) and catches RungdError: a copy would not do.
    assert sdk.Tool is contract.Tool and sdk.ToolError is errors.ToolError
    assert sdk.run is runner.run and sdk.Program is runner.Program


def test_every_name_a_plugin_imports_from_the_sdk_exists() -> None:
    missing = []
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "rungd.sdk":
                missing += [f"{path.name}: {a.name}" for a in node.names if a.name not in sdk.__all__]
    assert missing == []


def test_plugin_settings_parse_names_the_file_the_key_and_an_example() -> None:
    from pydantic import BaseModel, ConfigDict

    class Settings(BaseModel):
        model_config = ConfigDict(extra="forbid")
        repos: dict[str, str]

    assert PluginSettings("git_repo", None, "/etc/rungd/rungd.toml").parse(Settings, "repos = {}") is None
    ok = PluginSettings("git_repo", {"repos": {"app": "/srv/app"}}, "/etc/rungd/rungd.toml")
    assert ok.parse(Settings, "repos = {}") == Settings(repos={"app": "/srv/app"})
    bad = PluginSettings("git_repo", {"repo": {}}, "/etc/rungd/rungd.toml")
    with pytest.raises(ConfigError) as caught:
        bad.parse(Settings, 'repos = { app = "/srv/app" }')
    text = str(caught.value)
    assert text.startswith("/etc/rungd/rungd.toml: key plugins.settings.git_repo.")
    assert 'example: repos = { app = "/srv/app" }' in text


def test_plugin_settings_cannot_be_changed_by_a_plugin() -> None:
    config = Config.model_validate({"plugins": {"settings": {"probe": {"a": 1}}}})
    settings = settings_for("file:probe", config)
    assert settings.name == "probe" and settings.raw == {"a": 1}
    with pytest.raises(TypeError):
        settings.raw["a"] = 2  # type: ignore[index]


def test_rungd_testing_imports_without_pytest() -> None:
    # Only the test extra installs pytest; a plugin's own helpers may import rungd.testing.
    code = ("import sys; sys.modules['pytest'] = None\n"
            "import rungd.testing as t\n"
            "assert callable(t.write_config) and callable(t.start_daemon)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_rungd_testing_fixtures_are_still_found_by_pytest(short_tmp: Path, fake_program) -> None:
    # short_tmp and fake_program come from rungd.testing through its lazy module __getattr__.
    path = fake_program("hello", "print('hi')\n")
    assert path.parent.parent == short_tmp and path.stat().st_mode & 0o111
