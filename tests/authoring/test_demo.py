"""The demo plugin end to end: what `rungd demo` shows, against the real inventory program."""

from __future__ import annotations

import signal
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


def test_demo_command_walks_through_then_serves_until_ctrl_c(short_tmp) -> None:
    demo = subprocess.Popen([sys.executable, "-m", "rungd.main", "demo"], cwd=short_tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        out = "".join(lines)
        for expected in ("effect=changed", "BAD_INPUT", "UNKNOWN_TOOL", "did you mean: inventory_item_show",
                         "NOT_FOUND", "location  A-3"):
            assert expected in out, out + demo.stderr.read()
        assert (short_tmp / "var" / "rungd.sock").exists()  # still serving for the reader to try
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=30) == 0
        assert not (short_tmp / "var" / "rungd.sock").exists()
    finally:
        demo.kill()
        demo.wait()
        demo.stdout.close()
        demo.stderr.close()
