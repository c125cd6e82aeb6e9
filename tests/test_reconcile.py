"""Reconcile: after a timeout past the commit point, the settle read decides what happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from rungd.client import Client, RequestRejected

COUNTER = '''
    import sys, time
    from pathlib import Path
    db = Path(sys.argv[-1])
    if sys.argv[1] == "show":
        print(f"count: {db.read_text().strip() if db.exists() else 0}")
        sys.exit(0)
    value, mode = sys.argv[2], sys.argv[3]
    if mode == "hang-after":
        db.write_text(value)
    time.sleep(60)   # the legacy program never returns: the deadline kills it
'''


def tool_file(program: Path, db: Path, mode: str) -> str:
    return f"""
[program]
name = "counter"
command = "{program}"

[tools.counter_value_show]
argv = ["show", "{db}"]
[tools.counter_value_show.description]
does = "Reads the counter."
use_when = "you need it."
do_not_use_when = "changing it."
returns = "count."
on_error = "TIMEOUT."
if_unknown = "ask."
[tools.counter_value_show.parse]
kind = "key_value"
fields = {{ count = "integer" }}

[tools.counter_value_set]
side_effect = "reversible"
argv = ["set", "{{value}}", "{mode}", "{db}"]
deadline_s = 1.5
[tools.counter_value_set.description]
does = "Sets the counter."
use_when = "asked to."
do_not_use_when = "reading."
returns = "before and after."
on_error = "TIMEOUT: reconcile."
if_unknown = "ask."
[tools.counter_value_set.inputs.value]
type = "integer"
description = "The new value."
example = 5
[tools.counter_value_set.verify]
tool = "counter_value_show"
expect = {{ count = "{{value}}" }}
[tools.counter_value_set.settle]
tool = "counter_value_show"
expect = {{ count = "{{value}}" }}
at_once = false                      # left to reconcile, which these tests are about
"""


@pytest.fixture(params=["hang-after", "hang-before"])
def mode(request) -> str:
    return request.param


@pytest.fixture
def rungd_config_toml(short_tmp: Path, fake_program, mode: str) -> str:
    program = fake_program("counter", COUNTER)
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "counter.toml").write_text(tool_file(program, short_tmp / "counter.db", mode))
    return f'[plugins]\ntool_dirs = ["{folder}"]\n'


async def test_reconcile_decides_from_the_settle_read(rungd_daemon, mode) -> None:
    first = await rungd_daemon.call("counter_value_set", {"value": 5}, request_id="k1")
    assert (first.error.code, first.outcome) == ("TIMEOUT", "unknown")
    assert (first.settle.tool, first.settle.expect) == ("counter_value_show", {"count": 5})
    blind = await rungd_daemon.call("counter_value_set", {"value": 5}, request_id="k1")
    assert blind.error.code == "RECONCILE_REQUIRED"

    settled = await rungd_daemon.run(Client.reconcile, "counter_value_set", "k1")
    if mode == "hang-after":  # the value was written before the hang: the effect happened
        assert (settled.status, settled.outcome, settled.effect) == ("ok", "done", "existing")
        again = await rungd_daemon.call("counter_value_set", {"value": 5}, request_id="k1")
        assert (again.status, again.effect) == ("ok", "existing")  # answered, not run
    else:  # it hung before writing: nothing happened, and the request_id is free again
        assert (settled.status, settled.outcome, settled.effect) == ("ok", "not_started", "none")
        again = await rungd_daemon.call("counter_value_set", {"value": 5}, request_id="k1")
        assert again.call_id != first.call_id and again.error.code == "TIMEOUT"  # it ran again
    assert "settle read counter_value_show" in settled.verified_by


async def test_reconcile_of_an_unknown_request_is_refused(rungd_daemon, mode) -> None:
    with pytest.raises(RequestRejected) as caught:
        await rungd_daemon.run(Client.reconcile, "counter_value_set", "never-used")
    assert caught.value.code == "UNKNOWN_CALL"
