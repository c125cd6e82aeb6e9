"""The demo plugin end to end: what `rungd demo` shows, against the real inventory program."""

from __future__ import annotations

import os
import subprocess
import sys


async def test_read_is_parsed_into_typed_fields(rungd_daemon) -> None:
    env = await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    assert env.status == "ok", env.error
    assert env.fields == {"item": "widget", "count": 12, "location": "A-3"}
    assert (env.effect, env.outcome) == ("none", "done")


async def test_write_is_confirmed_read_back_and_reports_no_change_on_repeat(rungd_daemon) -> None:
    env = await rungd_daemon.call("inventory_count_set", {"item": "gadget", "count": 9}, request_id="r1")
    assert env.status == "ok", env.error
    assert (env.effect, env.fields["count_before"], env.fields["count_after"]) == ("changed", 5, 9)
    assert "after the change" in env.verified_by
    again = await rungd_daemon.call("inventory_count_set", {"item": "gadget", "count": 9}, request_id="r2")
    assert (again.status, again.effect) == ("ok", "no_change")


async def test_unknown_item_is_not_found_from_the_exit_status(rungd_daemon) -> None:
    env = await rungd_daemon.call("inventory_item_show", {"item": "doohickey"})
    assert (env.error.code, env.error.retry, env.next_action) == ("NOT_FOUND", "no", "repair")
    assert "no such item" in env.error.hint


def test_demo_command_walks_through_and_stops(short_tmp) -> None:
    env = {**os.environ, "RUNGD_DEMO_EXIT": "1"}
    result = subprocess.run([sys.executable, "-m", "rungd.main", "demo"], cwd=short_tmp, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for expected in ("effect=changed", "BAD_INPUT", "UNKNOWN_TOOL", "did you mean: inventory_item_show",
                     "NOT_FOUND", "location  A-3"):
        assert expected in out
    assert not (short_tmp / "var" / "rungd.sock").exists()
