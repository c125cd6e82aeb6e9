"""rungctl export-tools and lint, as a CI job or an agent developer would run them."""

from __future__ import annotations

import json
import os
import pwd
import sys

import trio

from tests.conftest import TEST_PLUGINS


async def ctl(*args: str) -> trio.CompletedProcess:
    return await trio.run_process([sys.executable, "-m", "rungd.ctl", *args], capture_stdout=True,
                                  capture_stderr=True, check=False)


async def test_export_tools_prints_provider_json_and_sizes(rungd_daemon) -> None:
    done = await ctl("--socket", str(rungd_daemon.socket), "export-tools", "--format", "anthropic",
                     "--tools", "inventory_item_show,inventory_count_set")
    assert done.returncode == 0, done.stderr
    exported = json.loads(done.stdout)
    assert [d["name"] for d in exported] == ["inventory_item_show", "inventory_count_set"]
    assert "request_id" in exported[1]["input_schema"]["required"]  # writes carry their key
    assert b"~tokens" in done.stderr and b"total" in done.stderr
    unknown = await ctl("--socket", str(rungd_daemon.socket), "export-tools", "--format", "mcp", "--tools", "nope")
    assert unknown.returncode == 2 and b"unknown tools nope" in unknown.stderr


async def test_lint_passes_on_the_builtins_and_fails_a_bad_tool(short_tmp) -> None:
    from rungd.testing import write_config

    good = write_config(short_tmp, "")
    done = await ctl("lint", "--offline", "--config", str(good))
    assert done.returncode == 0, done.stdout
    assert b"fix-first" not in done.stdout or b"0 fix-first" in done.stdout
    bad = short_tmp / "bad"
    bad.mkdir()
    config = write_config(bad, f'[plugins]\nfiles = ["{TEST_PLUGINS / "bad_tools.py"}"]\n')
    failed = await ctl("lint", "--offline", "--json", "--config", str(config))
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["ok"] is False


async def test_key_value_passes_an_optional_integer_so_conflict_is_reachable(rungd_daemon) -> None:
    # Issue 31: expected_count is `int | None` (anyOf integer, null): it was sent as a string.
    done = await ctl("--socket", str(rungd_daemon.socket), "--json", "call", "inventory_count_set", "item=widget",
                     "count=5", "expected_count=99999", "--request-id", "r-opt-int")
    env = json.loads(done.stdout)
    assert env["error"]["code"] == "CONFLICT", env


async def test_a_held_call_is_said_at_once_with_the_command_that_approves_it(short_tmp) -> None:
    import time

    from rungd.testing import write_config

    config = write_config(short_tmp, '[gates]\nreversible = "review"\n')
    socket = short_tmp / "rungd.sock"
    async with trio.open_nursery() as nursery:
        from rungd.config import load_config
        from rungd.service.inprocess import start_daemon

        daemon = await start_daemon(nursery, load_config(config))
        started = time.monotonic()
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "rungd.ctl", "--socket", str(socket), "call", "inventory_count_set", "item=widget",
             "count=5", "--request-id", "r-held", "--wait", "6"], stderr=-1, stdout=-1)
        said = await process.stderr.receive_some(4096)
        heard_at = time.monotonic() - started
        await process.wait()
        out = b""
        while chunk := await process.stdout.receive_some(4096):
            out += chunk
        listed = await ctl("--socket", str(socket), "pending")
        daemon.daemon.stop()
    # The approver reads who asked by name (and uid), not a bare number.
    me = pwd.getpwuid(os.getuid()).pw_name
    assert f"review    {me}({os.getuid()})" in listed.stdout.decode() and "inventory_count_set" in listed.stdout.decode()
    assert b"is held at its gate until an operator approves it: rungctl approve c" in said, said
    assert heard_at < 4, heard_at  # at once, not after the 6 s wait
    assert process.returncode == 4 and b"pending" in out and b"why" in out, out
