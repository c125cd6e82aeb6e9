"""Every hook is documented, implemented by a test plugin, and exercised by a named test that
asserts its effect (datasette's rule, made so that it can fail).

``HOOK_TESTS`` maps each hook to the test that proves it works. The registry check fails when
a hook is added without a test, when a named test disappears or is not collected, or when no
test plugin in ``tests/plugin_fixtures/`` implements the hook; ``test_the_registry_check_can_fail``
feeds it a hook nobody tests.
"""

from __future__ import annotations

import ast
import inspect
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pluggy
import pytest

from rungd.core import hookspecs
from rungd.config import load_config
from rungd.core.errors import PluginError
from rungd.service.plugins import Hooks, make_plugin_manager
from rungd.sdk import Caller, hookimpl
from rungd.testing import write_config
from tests.conftest import TEST_PLUGINS

HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("rungd_"))

HOOK_TESTS = {
    "rungd_register_tools": "test_rungd_register_tools_gives_each_plugin_its_own_settings",
    "rungd_credential": "test_rungd_credential_hook_supplies_what_the_store_lacks",
    "rungd_observe_result": "test_rungd_observe_result_sees_every_result_and_cannot_break_one",
}


def implemented_by_fixtures(folder: Path) -> set[str]:
    """Hook names some test plugin in ``folder`` implements (top-level ``rungd_*`` functions)."""
    found = set()
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("rungd_")}
    return found


def registry_problems(hooks: Iterable[str], registry: Mapping[str, str], collected: set[str],
                      implemented: set[str]) -> list[str]:
    """What keeps the hook -> test registry from proving every hook; empty when it does."""
    problems = []
    for hook in hooks:
        test = registry.get(hook)
        if test is None:
            problems.append(f"{hook} has no test in HOOK_TESTS")
        elif test not in collected:
            problems.append(f"{hook}'s test {test} was not collected")
        if hook not in implemented:
            problems.append(f"no test plugin in {TEST_PLUGINS.name}/ implements {hook}")
    problems += [f"HOOK_TESTS names {hook}, which is not a hook" for hook in set(registry) - set(hooks)]
    return problems


def collected_here() -> set[str]:
    """The tests pytest collects from this file: its ``test_*`` functions. (Read from the
    module, not the session, so running one test by its id does not fail the check.)"""
    return {name for name, value in globals().items() if name.startswith("test_") and inspect.isfunction(value)}


def test_every_hook_is_documented_and_tested() -> None:
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Called" in doc and "Args:" in doc and "Returns:" in doc, f"{name} needs when, its arguments, its result"
    assert registry_problems(HOOKS, HOOK_TESTS, collected_here(), implemented_by_fixtures(TEST_PLUGINS)) == []


def test_the_registry_check_can_fail() -> None:
    implemented = implemented_by_fixtures(TEST_PLUGINS)
    problems = registry_problems([*HOOKS, "rungd_new_hook"], HOOK_TESTS, collected_here(), implemented)
    assert problems == ["rungd_new_hook has no test in HOOK_TESTS",
                        f"no test plugin in {TEST_PLUGINS.name}/ implements rungd_new_hook"]
    renamed = {**HOOK_TESTS, "rungd_credential": "test_that_does_not_exist"}
    assert registry_problems(HOOKS, renamed, collected_here(), implemented) == [
        "rungd_credential's test test_that_does_not_exist was not collected"]


# --- rungd_register_tools --------------------------------------------------------------------


def test_rungd_register_tools_gives_each_plugin_its_own_settings(short_tmp: Path) -> None:
    sys.modules.pop("rungd_plugin_file_settings_probe", None)
    path = write_config(short_tmp, f"""
        [plugins]
        files = ["{TEST_PLUGINS / 'settings_probe.py'}", "{TEST_PLUGINS / 'echo_tools.py'}"]

        [plugins.settings.settings_probe]
        greeting = "hello from the config"
    """)
    config = load_config(path)
    tools = Hooks.load(config).collect_tools(config)
    probe = sys.modules["rungd_plugin_file_settings_probe"]
    (seen,) = probe.SEEN
    assert seen.name == "settings_probe" and dict(seen.raw or {}) == {"greeting": "hello from the config"}
    assert seen.source == str(path) and seen.state_dir == config.state_dir / "settings_probe"
    assert not hasattr(seen, "plugins")  # its own table, not the whole config
    # Which plugin registered which tool is recorded.
    assert tools["probe_greeting_show"].plugin == "file:settings_probe"
    assert tools["test_text_echo"].plugin == "file:echo_tools"


def test_rungd_register_tools_settings_errors_name_the_file_and_key(short_tmp: Path) -> None:
    sys.modules.pop("rungd_plugin_file_settings_probe", None)
    path = write_config(short_tmp, f"""
        [plugins]
        files = ["{TEST_PLUGINS / 'settings_probe.py'}"]

        [plugins.settings.settings_probe]
        greting = "typo"
    """)
    config = load_config(path)
    with pytest.raises(Exception, match=r"key plugins\.settings\.settings_probe\.greet") as caught:
        Hooks.load(config).collect_tools(config)
    assert str(path) in str(caught.value) and 'example: greeting = "hello"' in str(caught.value)


def test_a_plugin_that_raises_while_registering_is_one_error_naming_it(short_tmp: Path) -> None:
    # It once came out as "unexpected failure ... report it", blaming rungd, with exit status 1.
    plugin = short_tmp / "boom.py"
    plugin.write_text("from rungd.sdk import hookimpl\n\n@hookimpl\ndef rungd_register_tools(register):\n"
                      "    raise RuntimeError('boom in register')\n")
    path = write_config(short_tmp, f'[plugins]\nfiles = ["{plugin}"]\n')
    config = load_config(path)
    with pytest.raises(PluginError, match=r"plugin 'file:boom' failed while registering its tools: "
                                          r"RuntimeError: boom in register; hint: .*plugins\.disable"):
        Hooks.load(config).collect_tools(config)
    done = subprocess.run([sys.executable, "-m", "rungd.main", "check-config", "--config", str(path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "failed while registering its tools" in done.stderr, done.stderr
    assert "report it" not in done.stderr


def test_a_plugin_still_asking_for_config_works_and_is_warned(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp))
    seen: list[Any] = []

    class OldStyle:
        @hookimpl
        def rungd_register_tools(self, register: Any, config: Any) -> None:
            seen.append(config)

    pm = make_plugin_manager(config)
    with pytest.warns(DeprecationWarning, match="settings"):
        pm.register(OldStyle(), name="old_style")
    Hooks(pm).collect_tools(config)
    assert seen == [config]


# --- rungd_credential ------------------------------------------------------------------------


@pytest.fixture
def rungd_config_toml() -> str:
    return f'[plugins]\nfiles = ["{TEST_PLUGINS / "fake_tools.py"}", "{TEST_PLUGINS / "hook_probe.py"}", ' \
           f'"{TEST_PLUGINS / "echo_tools.py"}"]\n'


async def test_rungd_credential_hook_supplies_what_the_store_lacks(rungd_daemon, monkeypatch) -> None:
    monkeypatch.delenv("RUNGD_CRED_FAKE_PASSWORD", raising=False)
    env = await rungd_daemon.call("fake_run", {"program": "password", "args": ["--expect", "from-the-hook-Zz9"],
                                               "credential": True})
    assert env.status == "ok", env.error
    assert "from-the-hook-Zz9" not in str(env)


def plugin_manager(*plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("rungd")
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


def test_rungd_credential_first_value_wins() -> None:
    asked: list[str] = []

    class Passes:
        @hookimpl
        def rungd_credential(self, name: str, tool: str) -> str | None:
            asked.append("passes")
            return None

    class Knows:
        @hookimpl
        def rungd_credential(self, name: str, tool: str) -> str | None:
            asked.append("knows")
            return f"{name}-for-{tool}"

    class Later:
        @hookimpl
        def rungd_credential(self, name: str, tool: str) -> str | None:
            asked.append("later")
            return "never-used"

    # pluggy calls the last registered first: Passes, then Knows; Later is never asked.
    hooks = Hooks(plugin_manager(Later(), Knows(), Passes()))
    assert hooks.credential("token", "x_show") == "token-for-x_show"
    assert asked == ["passes", "knows"]
    assert Hooks(plugin_manager()).credential("token", "x_show") is None


# --- rungd_observe_result --------------------------------------------------------------------


async def test_rungd_observe_result_sees_every_result_and_cannot_break_one(rungd_daemon) -> None:
    probe = next(m for n, m in sys.modules.items() if n.startswith("rungd_plugin_file_hook_probe"))
    env = await rungd_daemon.call("test_text_echo", {"text": "hi"})
    assert env.status == "ok"  # the observer raised; the caller still gets the truth
    bad = await rungd_daemon.call("test_text_echo", {"text": 5})
    assert ("test_text_echo", "ok", str(os.getuid())) in probe.SEEN
    assert ("test_text_echo", "error", str(os.getuid())) in probe.SEEN
    assert bad.error.code == "BAD_INPUT"


def test_an_observer_that_raises_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    class Quiet:
        @hookimpl
        def rungd_observe_result(self, tool: str, envelope: Any, caller: Caller) -> None:
            seen.append(tool)

    class Broken:
        @hookimpl
        def rungd_observe_result(self, tool: str, envelope: Any, caller: Caller) -> None:
            raise RuntimeError("observer bug")

    hooks = Hooks(plugin_manager(Quiet(), Broken()))  # Broken is called first
    with caplog.at_level(logging.ERROR, logger="rungd.plugins"):
        hooks.observe_result("x_show", object(), Caller(uid=1, gid=1, pid=1))
    assert seen == ["x_show"]
    assert "result observer" in caplog.text and "observer bug" in caplog.text
