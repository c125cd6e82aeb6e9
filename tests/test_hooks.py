"""Every hook is documented and tested (datasette's rule): registration is tested all over
the suite; these cover the credential and observer hooks."""

from __future__ import annotations

import inspect
import os

import pytest

from rungd import hookspecs
from tests.conftest import TEST_PLUGINS

HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("rungd_"))


def test_every_hook_is_documented_and_tested() -> None:
    assert HOOKS == ["rungd_credential", "rungd_observe_result", "rungd_register_tools"]
    tests = "".join(p.read_text() for p in (TEST_PLUGINS.parent).glob("test_*.py"))
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert len(doc) > 80, f"{name} needs a docstring saying when it is called and what it returns"
        assert name in tests, f"{name} has no test"


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


async def test_rungd_observe_result_sees_every_result_and_cannot_break_one(rungd_daemon) -> None:
    import sys

    probe = next(m for n, m in sys.modules.items() if n.startswith("rungd_plugin_file_hook_probe"))
    env = await rungd_daemon.call("test_text_echo", {"text": "hi"})
    assert env.status == "ok"  # the observer raised; the caller still gets the truth
    bad = await rungd_daemon.call("test_text_echo", {"text": 5})
    assert ("test_text_echo", "ok", str(os.getuid())) in probe.SEEN
    assert ("test_text_echo", "error", str(os.getuid())) in probe.SEEN
    assert bad.error.code == "BAD_INPUT"
