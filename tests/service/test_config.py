"""Configuration errors name the file, the key and a valid example; rungctl exit codes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from rungd.config import load_config
from rungd.core.errors import ConfigError


def test_wrong_type_names_file_key_and_example(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[server]\nmax_frame_bytes = "big"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert str(path) in text and "server.max_frame_bytes" in text and "example: max_frame_bytes = 1048576" in text


def test_unknown_key_lists_the_valid_ones(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nsockett = 'x'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "unknown key" in str(caught.value) and "socket_mode" in str(caught.value)


def test_unknown_group_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[access]\ngroups = ['no-such-group-here']\n")
    with pytest.raises(ConfigError, match="groupadd"):
        load_config(path)


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text("[state]\ndir = 'st'\n")
    assert load_config(path).state_dir == tmp_path / "st"


async def test_rungctl_exit_codes(rungd_daemon) -> None:
    sock = str(rungd_daemon.socket)

    async def ctl(*args: str) -> int:
        done = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--socket", sock, *args],
                                      capture_stdout=True, capture_stderr=True, check=False)
        return done.returncode

    assert await ctl("call", "inventory_item_show", "item=widget") == 0
    assert await ctl("call", "inventory_item_show", "item=nosuch") == 1
    assert await ctl("call", "inventory_item_show", "item") == 2
    assert await ctl("call", "--socket", "/nonexistent.sock", "inventory_item_show", "item=widget") == 3
