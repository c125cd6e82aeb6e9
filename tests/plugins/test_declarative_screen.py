"""Issue 30: a screen program wrapped by a tool file (terminal = "screen"): a read that takes
fields off a screen, a write that navigates, fills a field, commits and is read back, and the
tool-file checks that keep a session honest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rungd.client import Client
from rungd.service import health
from rungd.sdk import ConfigError
from rungd.testing import STUB_DESCRIPTION, serve_tool_file
from rungd_plugins.declarative import read_tool_file

FAKE = Path(__file__).parents[1] / "fakes" / "screen_config"

TOOLS = """
[program]
name = "screen_config"
command = "{fake}"
env = {{ SCREEN_CONFIG_STATE = "{state}" }}

[tools.host_settings_show]
terminal = "screen"
argv = [{extra}]
[tools.host_settings_show.description]
""" + STUB_DESCRIPTION + """
[tools.host_settings_show.screen]
end = "kill"
[[tools.host_settings_show.screen.steps]]
wait = {{ text = "Show settings", rows = [3, 5], attribute = "reverse" }}
timeout_s = 2
keys = ["Enter"]
[[tools.host_settings_show.screen.steps]]
wait = {{ text = "Hostname:", row = 3, column = 2 }}
read.hostname = {{ row = 3, column = 12, width = 40 }}
read.owner = {{ row = 4, pattern = 'Owner:\\s+(\\S+)' }}

[tools.host_hostname_set]
side_effect = "reversible"
terminal = "screen"
commit_point = "confirmation"
argv = [{extra}]
[tools.host_hostname_set.inputs.hostname]
description = "The new hostname."
example = "web01"
pattern = "[a-z][a-z0-9-]{{0,19}}"
[tools.host_hostname_set.description]
""" + STUB_DESCRIPTION + """
[tools.host_hostname_set.verify]
tool = "host_settings_show"
expect = {{ hostname = "{{hostname}}" }}
[tools.host_hostname_set.screen]
[[tools.host_hostname_set.screen.steps]]
wait = {{ text = "Set hostname", rows = [3, 5], attribute = "reverse", absent = true }}
timeout_s = 2
keys = ["Down"]
[[tools.host_hostname_set.screen.steps]]
wait = {{ text = "Set hostname", rows = [3, 5], attribute = "reverse" }}
keys = ["Enter"]
[[tools.host_hostname_set.screen.steps]]
wait = {{ text = "New hostname:" }}
type = "{{hostname}}"
keys = ["Enter"]
[[tools.host_hostname_set.screen.steps]]
wait = {{ pattern = "Save hostname '.*'\\\\? \\\\(y/n\\\\)" }}
type = "y"
commit = true
[[tools.host_hostname_set.screen.steps]]
wait = {{ text = "Saved." }}
keys = ["Enter"]
[[tools.host_hostname_set.screen.steps]]
wait = {{ text = "Quit", attribute = "reverse", absent = true }}
keys = ["Down"]
[[tools.host_hostname_set.screen.steps]]
wait = {{ text = "Quit", attribute = "reverse" }}
keys = ["Enter"]
"""


def tool_file(state: Path, *extra: str) -> str:
    return TOOLS.format(fake=FAKE, state=state, extra=", ".join(json.dumps(e) for e in extra))


async def test_a_screen_read_returns_the_fields_on_its_screen(nursery, short_tmp) -> None:
    state = short_tmp / "hostname.txt"
    state.write_text("alpha\n")
    daemon = await serve_tool_file(nursery, short_tmp, tool_file(state))
    env = await daemon.call("host_settings_show", {})
    assert env.status == "ok", env.error
    assert env.fields["hostname"] == "alpha" and env.verified_by == "read off the screen"
    assert any(e.endswith(".cast") for e in env.evidence) and any(e.endswith(".screen") for e in env.evidence)
    daemon.daemon.stop()


async def test_a_screen_read_at_its_deadline_may_be_tried_again(nursery, short_tmp) -> None:
    # A step that waits past the call's deadline: a read has nothing to reconcile (the code's
    # defaults are a write's), and it ran: done, retry.
    state = short_tmp / "hostname.txt"
    state.write_text("alpha\n")
    slow = tool_file(state).replace('[tools.host_settings_show]\n', '[tools.host_settings_show]\ndeadline_s = 1.5\n', 1)
    slow = slow.replace('wait = { text = "Hostname:", row = 3, column = 2 }', 'wait = { text = "never drawn" }\ntimeout_s = 30')
    daemon = await serve_tool_file(nursery, short_tmp, slow)
    env = await daemon.call("host_settings_show", {})
    assert env.error is not None and env.error.code == "TIMEOUT", env
    assert (env.outcome, env.error.retry, env.next_action, env.settle) == ("done", "yes", "retry_later", None), env
    daemon.daemon.stop()


async def test_a_screen_write_commits_and_is_read_back(nursery, short_tmp) -> None:
    state = short_tmp / "hostname.txt"
    state.write_text("alpha\n")
    daemon = await serve_tool_file(nursery, short_tmp, tool_file(state))
    env = await daemon.call("host_hostname_set", {"hostname": "web07"}, request_id="s1")
    assert env.status == "ok", env.error
    assert env.effect == "changed" and env.fields["after"] == {"hostname": "web07", "owner": "root"}
    assert state.read_text() == "web07\n"
    again = await daemon.call("host_hostname_set", {"hostname": "web07"}, request_id="s2")
    assert again.status == "ok" and again.effect == "no_change"
    daemon.daemon.stop()


async def test_an_unexpected_dialog_ends_the_write_before_it_acts(nursery, short_tmp) -> None:
    state = short_tmp / "hostname.txt"
    state.write_text("alpha\n")
    daemon = await serve_tool_file(nursery, short_tmp, tool_file(state, "--license"))
    env = await daemon.call("host_hostname_set", {"hostname": "web08"}, request_id="s3")
    assert env.error is not None and env.error.code == "SURFACE_CHANGED"
    assert "You must accept the license to go on." in env.fields["screen"]
    # Its program ran, so the settle read decides: it shows nothing moved.
    assert env.outcome in ("not_started", "done") and state.read_text() == "alpha\n"
    # The health view (and the step-down watch, from the same records) counts it as any tool's.
    report = health.compute(daemon.config.state_dir / "ledger", since=0)
    assert report["tools"]["host_hostname_set"]["codes"] == {"SURFACE_CHANGED": 1}
    daemon.daemon.stop()


@pytest.mark.parametrize(("change", "complaint"), [
    ('keys = ["Enter"]', 'keys = ["Sideways"]'),
    ("commit = true", "commit = true\nkeys = [\"Enter\"]\n[[tools.host_hostname_set.screen.steps]]\ncommit = true"),
    ('terminal = "screen"\ncommit_point', 'commit_point'),
    ('type = "{hostname}"', 'type = "{host}"'),
])
def test_tool_file_mistakes_in_a_screen_are_refused_at_load(short_tmp, change, complaint) -> None:
    text = tool_file(short_tmp / "hostname.txt").replace(change, complaint, 1)
    (short_tmp / "t.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_tool_file(short_tmp / "t.toml")
    assert "screen" in str(caught.value) or "Sideways" in str(caught.value)


async def test_a_held_screen_write_shows_its_steps_to_the_approver_and_runs_only_after(nursery, short_tmp) -> None:
    state = short_tmp / "hostname.txt"
    state.write_text("alpha\n")
    daemon = await serve_tool_file(nursery, short_tmp, tool_file(state), config='[gates]\nreversible = "review"\n')
    held = await daemon.call("host_hostname_set", {"hostname": "web09"}, request_id="h1", wait_s=0.2)
    assert held.status == "pending" and state.read_text() == "alpha\n"  # no session waits for an approver
    [listed] = await daemon.run(Client.pending)  # what rungctl pending prints under the call
    plan = listed.plan
    assert plan[2] == "step 3: wait for 'New hostname:' on the screen; type 'web09' (hostname); press Enter"
    assert plan[3].startswith("step 4 (commits): wait for /Save hostname")
    daemon.daemon.stop()


DIALOG = """
[program]
name = "dialog"
command = "{dialog}"

[tools.dialog_name_ask]
terminal = "screen"
argv = ["--output-fd", "3", "--inputbox", "Name the new host", "8", "40"]
[tools.dialog_name_ask.inputs.name]
description = "The name."
example = "web01"
pattern = "[a-z0-9]{{1,20}}"
[tools.dialog_name_ask.description]
""" + STUB_DESCRIPTION + """
[tools.dialog_name_ask.parse]
kind = "regex"
pattern = '^(?P<answer>\\S+)$'
fields = {{ answer = "string" }}
[tools.dialog_name_ask.screen]
output_fd = 3
[[tools.dialog_name_ask.screen.steps]]
wait = {{ text = "Name the new host" }}
type = "{{name}}"
keys = ["Enter"]
"""


@pytest.mark.skipif(shutil.which("dialog") is None, reason="needs dialog (Debian package dialog)")
async def test_a_screen_tool_parses_the_answer_its_program_writes_on_a_descriptor(nursery, short_tmp) -> None:
    daemon = await serve_tool_file(nursery, short_tmp, DIALOG.format(dialog=shutil.which("dialog")))
    env = await daemon.call("dialog_name_ask", {"name": "db02"})
    assert env.status == "ok", env.error
    assert env.fields == {"answer": "db02"}
    daemon.daemon.stop()


def test_a_wait_may_name_the_item_a_caller_chose(short_tmp) -> None:
    text = tool_file(short_tmp / "hostname.txt").replace(
        'wait = { text = "New hostname:" }', 'wait = { text = "{hostname}", absent = true }\n'
        '[[tools.host_hostname_set.screen.steps]]\nwait = { text = "New hostname:" }', 1)
    (short_tmp / "t.toml").write_text(text)
    [_, write] = read_tool_file(short_tmp / "t.toml").tools
    assert write.plan({"hostname": "web5"})[2] == "step 3: wait for 'web5' on the screen to go"


@pytest.mark.parametrize(("program", "argv", "why"), [
    ("nano", '["--view", "/etc/hostname"]', "--restricted"),
    ("dialog", '["--prgbox", "x", "{cmd}", "10", "40"]', "through a shell"),
])
def test_screen_programs_that_run_commands_are_refused_unless_held_back(short_tmp, program, argv, why) -> None:
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"needs {program}")
    (short_tmp / "t.toml").write_text(f"""
[program]
name = "p"
command = "{path}"
[tools.p_thing_show]
terminal = "screen"
argv = {argv}
[tools.p_thing_show.inputs.cmd]
description = "d."
example = "x"
[tools.p_thing_show.description]
""" + STUB_DESCRIPTION + """
[[tools.p_thing_show.screen.steps]]
wait = { text = "x" }
""")
    with pytest.raises(ConfigError) as caught:
        read_tool_file(short_tmp / "t.toml")
    assert why in str(caught.value)
