"""Reconcile: after a timeout past the commit point, the settle read decides what happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from rungd.client import Client, RequestRejected
from rungd.config import load_config
from rungd.testing import start_daemon, write_config

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


def as_uid(uid: int, socket: Path, code: str) -> object:
    """Run ``code`` with ``c`` a client connected as ``uid``; returns what it prints as JSON."""
    script = ("import json, os\nfrom rungd.client import Client, RequestRejected\n"
              f"os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n"
              f"c = Client({str(socket)!r})\n" + textwrap.dedent(code))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("mode", ["hang-before"])
async def test_an_operator_settles_one_of_two_callers_requests_by_naming_its_uid(nursery, short_tmp, fake_program,
                                                                               mode) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to call as two other uids")
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "counter.toml").write_text(tool_file(fake_program("counter", COUNTER), short_tmp / "counter.db", mode))
    config = load_config(write_config(short_tmp, f'[access]\nuids = [0, 65533, 65534]\n\n'
                                                 f'[plugins]\ntool_dirs = ["{folder}"]\n'))
    config = config.model_copy(update={"server": config.server.model_copy(update={"socket_mode": "0666"})})
    short_tmp.chmod(0o755)
    daemon = await start_daemon(nursery, config)
    first = 'e = c.call("counter_value_set", {"value": 5}, request_id="k9"); print(json.dumps(e.error.code))'
    for uid in (65533, 65534):  # two callers, one request_id each: two requests
        assert await trio.to_thread.run_sync(as_uid, uid, daemon.socket, first) == "TIMEOUT"
    with pytest.raises(RequestRejected) as caught:
        await daemon.run(Client.reconcile, "counter_value_set", "k9")
    assert caught.value.code == "UNKNOWN_CALL" and "uids 65533, 65534" in str(caught.value)
    assert "--uid UID" in caught.value.hint
    refused = await trio.to_thread.run_sync(as_uid, 65533, daemon.socket, """
        try:
            c.reconcile("counter_value_set", "k9", caller_uid=65534); print(json.dumps("settled"))
        except RequestRejected as e:
            print(json.dumps(e.code))
    """)
    assert refused == "DENIED"  # another caller's request is not its to settle
    settled = await daemon.run(lambda c: c.reconcile("counter_value_set", "k9", False, caller_uid=65534))
    assert (settled.status, settled.outcome) == ("ok", "not_started")
    mine = await trio.to_thread.run_sync(as_uid, 65533, daemon.socket, """
        e = c.call("counter_value_set", {"value": 5}, request_id="k9"); print(json.dumps(e.error.code))
    """)
    assert mine == "RECONCILE_REQUIRED"  # 65533's own request is still unknown: only 65534's was settled
    daemon.daemon.stop()
