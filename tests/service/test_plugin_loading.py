"""Which plugins load: demo-only plugins stay off unless a config opts in (issue 14)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from rungd.config import Config, embedded_configs, load_config
from rungd.service.plugins import Hooks, make_plugin_manager
from rungd.testing import write_config

DEMO_TOOLS = {"inventory_item_show", "inventory_count_set", "ledgerbook_invoices_list", "ledgerbook_invoices_import"}


def tool_names(config: Config) -> set[str]:
    return set(Hooks.load(config).collect_tools(config))


def test_a_config_that_says_nothing_offers_no_demo_tools(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, demo_plugins=False))
    pm = make_plugin_manager(config)
    assert not pm.has_plugin("demo") and not pm.has_plugin("ledgerbook")
    assert tool_names(config) & DEMO_TOOLS == set()


def test_the_embedded_default_offers_the_demo_tools(monkeypatch: pytest.MonkeyPatch, short_tmp: Path) -> None:
    monkeypatch.delenv("RUNGD_CONFIG", raising=False)
    monkeypatch.chdir(short_tmp)
    assert DEMO_TOOLS <= tool_names(load_config())


def test_a_settings_table_opts_one_demo_plugin_in(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, "[plugins.settings.demo]\n", demo_plugins=False))
    names = tool_names(config)
    assert "inventory_item_show" in names and "ledgerbook_invoices_list" not in names


def test_the_production_example_offers_no_demo_tools() -> None:
    raw = tomllib.loads((embedded_configs() / "rungd.example.toml").read_text(encoding="utf-8"))
    assert not {"demo", "ledgerbook"} & set(raw["plugins"].get("settings", {}))
    # Its groups and tool folder exist only on a real host; the plugin choice is what matters.
    raw["plugins"]["tool_dirs"] = []
    config = Config.model_validate({**raw, "server": {}, "access": {}, "gates": {}})
    assert tool_names(config) & DEMO_TOOLS == set()


def test_disable_still_wins_over_an_opt_in(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, '[plugins]\ndisable = ["demo"]\n'))
    assert "inventory_item_show" not in tool_names(config)
