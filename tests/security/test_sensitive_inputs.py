"""Sensitive inputs: the program gets the value; pending, the ledger, the envelope, errors,
evidence and the journal show at most its keyed mark (rungd.service.sensitive).

The attack these tests replay: an agent creates an account with an initial password, the
call is held for review, and the password is read off ``rungctl pending`` by whoever looks,
off the ledger auditors tail, off the program's echo in the envelope and evidence, or off
an error that quotes it. Each test puts a password through a real daemon and greps every
place it could land.
"""

from __future__ import annotations

import json
import logging
import os
import re
import textwrap
from pathlib import Path

import msgspec
import pytest
from pydantic import Field
from rungd_ledgers import input_digest

from rungd.service import sensitive
from rungd.client import Client
from rungd.config import load_config
from rungd.core.errors import ConfigError
from rungd.sdk import Description, SettleSpec, Timing, Tool, ToolInputs
from rungd.testing import STUB_DESCRIPTION, start_daemon, write_config
from tests.ctl.test_ctl_cli import ctl
from tests.service.test_gates import OPERATOR, as_operator

PASSWORD = "hunter2-Initial"
OTHER = "correct-Horse-9"
MARK = r"<sensitive hmac:[0-9a-f]{12}>"

# A fake account program: it keeps who exists, and what password it was given (proof that
# the program, and only the program, got the value), and echoes the password like a
# careless legacy program does.
ACCOUNTS = """#!/bin/sh
db="$(dirname "$0")/users"
case "$1" in
  add) echo "$2" >> "$db"; echo "$2:$3" >> "$db.passwords"
       echo "created $2 with initial password $3";;
  show) if grep -qx "$2" "$db" 2>/dev/null; then echo "exists: yes"; else echo "exists: no"; fi;;
  check) echo "password $2 is long enough";;
esac
"""

TOOLS = f"""
[program]
name = "accounts"
command = "{{command}}"

[tools.accounts_user_add]
side_effect = "reversible"
gate = "review"
argv = ["add", "{{user}}", "{{password}}"]
log_fields = ["user", "password"]
verify = {{ tool = "accounts_user_show", inputs = {{ user = "{{user}}" }}, expect = {{ exists = "yes" }} }}
[tools.accounts_user_add.parse]
kind = "regex"
pattern = '^created (?P<user>\\S+) with initial password (?P<said>\\S*)$'
fields = {{ user = "string", said = "string" }}
[tools.accounts_user_add.description]
{STUB_DESCRIPTION}
[tools.accounts_user_add.inputs.user]
description = "The login name."
example = "bob"
pattern = "^[a-z]{{1,16}}$"
[tools.accounts_user_add.inputs.password]
description = "The account's initial password."
example = "s3cret-example"
sensitive = true

[tools.accounts_user_show]
side_effect = "read"
argv = ["show", "{{user}}"]
parse = {{ kind = "key_value", fields = {{ exists = "string" }} }}
[tools.accounts_user_show.description]
{STUB_DESCRIPTION}
[tools.accounts_user_show.inputs.user]
description = "The login name."
example = "bob"
pattern = "^[a-z]{{1,16}}$"

[tools.accounts_password_check]
side_effect = "read"
argv = ["check", "{{password}}"]
parse = {{ kind = "lines" }}
[tools.accounts_password_check.description]
{STUB_DESCRIPTION}
[tools.accounts_password_check.inputs.password]
description = "A password to check."
example = "s3cret-example"
max_length = 40
sensitive = true
"""

# A Python tool whose handler has a bug that quotes its input: the traceback goes to the journal.
PROBE = '''
from typing import Any
from pydantic import Field
from rungd.sdk import Description, Result, Tool, ToolInputs, hookimpl

class Pin(ToolInputs):
    pin: str = Field(max_length=20, description="A PIN.", examples=["0000"], json_schema_extra={"sensitive": True})

async def check(ctx: Any, inputs: Pin) -> Result:
    raise RuntimeError(f"the checker choked on {inputs.pin}")

@hookimpl
def rungd_register_tools(register: Any) -> None:
    register(Tool(name="probe_pin_check", description=Description("t.", "t.", "t.", "t.", "t.", "t."), inputs=Pin,
                  outputs={"ok": "yes"}, handler=check))
'''


async def serve(nursery, folder: Path):
    """A daemon serving the accounts tool file and the probe plugin, with uid 65534 an
    operator who can reach the socket."""
    program = folder / "bin" / "accounts"
    program.parent.mkdir()
    program.write_text(ACCOUNTS)
    program.chmod(0o755)
    (folder / "tools").mkdir()
    (folder / "tools" / "accounts.toml").write_text(TOOLS.replace("{command}", str(program)))
    (folder / "probe.py").write_text(textwrap.dedent(PROBE))
    path = write_config(folder, f"""
        [access]
        uids = [0, {OPERATOR}]
        [gates]
        operator_uids = [{OPERATOR}]
        [plugins]
        tool_dirs = ["{folder / 'tools'}"]
        files = ["{folder / 'probe.py'}"]
        """)
    path.write_text(path.read_text().replace("[server]\n", '[server]\nsocket_mode = "0666"\n', 1))
    folder.chmod(0o755)
    return await start_daemon(nursery, load_config(path))


def state_files(daemon, folder: str) -> dict[str, bytes]:
    base = daemon.config.state_dir / folder
    return {p.name: p.read_bytes() for p in base.iterdir() if p.is_file()}


needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to approve as a second uid")


@needs_root
async def test_pending_shows_the_mark_of_a_sensitive_input_never_its_value(nursery, short_tmp) -> None:
    daemon = await serve(nursery, short_tmp)
    first = await daemon.call("accounts_user_add", {"user": "bob", "password": PASSWORD}, request_id="a1", wait_s=0.2)
    same = await daemon.call("accounts_user_add", {"user": "eve", "password": PASSWORD}, request_id="a2", wait_s=0.2)
    other = await daemon.call("accounts_user_add", {"user": "bob", "password": OTHER}, request_id="a3", wait_s=0.2)
    assert first.status == same.status == other.status == "pending"

    listed = await ctl("--socket", str(daemon.socket), "pending", "--json")
    assert listed.returncode == 0, listed.stderr
    assert PASSWORD.encode() not in listed.stdout and OTHER.encode() not in listed.stdout
    held = {h["call_id"]: h for h in json.loads(listed.stdout)}
    marks = {call_id: h["inputs"]["password"] for call_id, h in held.items()}
    assert all(re.fullmatch(MARK, mark) for mark in marks.values()), marks
    # The same password shows the same mark, so an approver can compare; another, another.
    assert marks[first.call_id] == marks[same.call_id] != marks[other.call_id]
    assert held[first.call_id]["inputs"]["user"] == "bob"  # the rest shows as it is
    assert len({h["input_digest"] for h in held.values()}) == 3
    # The digest is of the marks: no sha256 of a guessed password and the rest matches it.
    guessed = input_digest("accounts_user_add", {"user": "bob", "password": PASSWORD})
    assert held[first.call_id]["input_digest"] != guessed

    text = await ctl("--socket", str(daemon.socket), "pending")
    assert text.returncode == 0, text.stderr
    assert PASSWORD.encode() not in text.stdout and marks[first.call_id].encode() in text.stdout

    # The digest still tells a repeat from another request: same request_id, other password.
    mismatch = await daemon.call("accounts_user_add", {"user": "bob", "password": OTHER}, request_id="a1")
    assert mismatch.error.code == "IDEMPOTENCY_MISMATCH" and OTHER not in json.dumps(msgspec.to_builtins(mismatch))
    for call in (first, same, other):
        await daemon.run(lambda c, call_id=call.call_id: c.deny(call_id, "test over"))
    daemon.daemon.stop()


@needs_root
async def test_an_approved_call_gives_the_program_the_value_and_shows_it_nowhere(nursery, short_tmp, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    daemon = await serve(nursery, short_tmp)
    held = await daemon.call("accounts_user_add", {"user": "bob", "password": PASSWORD}, request_id="b1", wait_s=0.2)
    verdict = await as_operator(daemon.socket, f"print(json.dumps(c.approve({held.call_id!r}).verdict))")
    assert verdict == "approved"
    done = await daemon.run(Client.wait, held.call_id, 20)
    assert (done.status, done.effect) == ("ok", "changed"), done.error
    # The program got the password itself, as its argument.
    assert (short_tmp / "bin" / "users.passwords").read_text() == f"bob:{PASSWORD}\n"
    # Its echo is redacted from the fields, and from the evidence kept on disk.
    assert done.fields["said"] == "[REDACTED]"
    assert PASSWORD not in json.dumps(msgspec.to_builtins(done))
    evidence = state_files(daemon, "evidence")
    assert any(b"created bob" in body for body in evidence.values())
    assert not [name for name, body in evidence.items() if PASSWORD.encode() in body]
    # The ledger keeps the mark (log_fields names it) and the keyed digest; never the value.
    ledger = b"".join(state_files(daemon, "ledger").values())
    assert PASSWORD.encode() not in ledger
    assert re.search(MARK.encode(), ledger)
    assert PASSWORD not in caplog.text
    daemon.daemon.stop()


@needs_root
async def test_a_refused_sensitive_value_is_never_quoted_in_the_error(nursery, short_tmp) -> None:
    daemon = await serve(nursery, short_tmp)
    # Refused where the argument is built: a whole argument may not hold a '/'.
    slashed = "hunter2/Initial"
    env = await daemon.call("accounts_password_check", {"password": slashed})
    assert env.error.code == "BAD_INPUT", env.error
    assert "password" in env.error.message and slashed not in json.dumps(msgspec.to_builtins(env))
    # Refused by the schema: longer than max_length.
    long = "hunter2-" * 8
    env = await daemon.call("accounts_password_check", {"password": long})
    assert env.error.code == "BAD_INPUT" and long not in json.dumps(msgspec.to_builtins(env))
    # A read echoing it returns it redacted.
    env = await daemon.call("accounts_password_check", {"password": PASSWORD})
    assert env.status == "ok" and env.fields["lines"] == ["password [REDACTED] is long enough"]
    daemon.daemon.stop()


@needs_root
async def test_a_handler_crash_quoting_a_sensitive_input_reaches_the_journal_redacted(
        nursery, short_tmp, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    daemon = await serve(nursery, short_tmp)
    env = await daemon.call("probe_pin_check", {"pin": "8675309x"})
    assert env.error.code == "FAILED"
    assert "the checker choked on [REDACTED]" in caplog.text  # the traceback is there, for the operator
    assert "8675309x" not in caplog.text and "8675309x" not in json.dumps(msgspec.to_builtins(env))
    daemon.daemon.stop()


def settle_tool(**timing_and_more) -> Tool:
    class Inputs(ToolInputs):
        user: str = Field(description="u", examples=["bob"])
        password: str = Field(description="p", examples=["x"], json_schema_extra={"sensitive": True})

    async def handler(ctx, inputs):  # never run
        raise AssertionError

    return Tool("accounts_user_add", Description("t.", "t.", "t.", "t.", "t.", "t."), Inputs, {}, handler,
                side_effect="reversible", **timing_and_more)


def test_a_settle_read_that_would_echo_a_sensitive_input_is_refused_at_declaration() -> None:
    # The settle read is in the envelope and in the ledger for reconcile: it may not carry it.
    with pytest.raises(TypeError, match=r"settle read or precondition names the sensitive inputs \['password'\]"):
        settle_tool(timing=Timing(settle=SettleSpec("accounts_user_show", {"user": "$user", "p": "$password"})))
    with pytest.raises(TypeError, match="sensitive"):
        settle_tool(timing=Timing(settle=SettleSpec("accounts_user_show", {"user": "$user"},
                                                    {"said": {"equals": "$password"}})))
    settle_tool(timing=Timing(settle=SettleSpec("accounts_user_show", {"user": "$user"})))


def test_a_tool_file_whose_read_back_settles_with_a_sensitive_input_does_not_load(short_tmp) -> None:
    from rungd.service.daemon import Daemon

    program = short_tmp / "accounts"
    program.write_text(ACCOUNTS)
    program.chmod(0o755)
    text = TOOLS.replace("{command}", str(program)).replace(
        'inputs = { user = "{user}" }, expect', 'inputs = { user = "{user}", password = "{password}" }, expect')
    (short_tmp / "tools").mkdir()
    (short_tmp / "tools" / "accounts.toml").write_text(text)
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{short_tmp / "tools"}"]\n'))
    with pytest.raises(ConfigError, match=r"key tools\.accounts_user_add\.verify\.inputs\.password: \{password\} is "
                                        r"sensitive.*name a settle read that does not need it"):
        Daemon(config)


def test_the_key_is_made_once_private_and_kept_so_a_mark_means_the_same_value_after_a_restart(short_tmp) -> None:
    before = sensitive.Marks.of_state(short_tmp).mark(PASSWORD)
    key = short_tmp / sensitive.KEY_FILE
    assert (key.stat().st_mode & 0o777, key.stat().st_size) == (0o600, 32)
    assert sensitive.Marks.of_state(short_tmp).mark(PASSWORD) == before  # read, not made again
    assert sensitive.Marks(os.urandom(32)).mark(PASSWORD) != before  # keyed: another key, another mark


def test_a_key_others_can_read_stops_the_start_with_its_fix(short_tmp) -> None:
    sensitive.Marks.of_state(short_tmp)
    key = short_tmp / sensitive.KEY_FILE
    key.chmod(0o640)
    with pytest.raises(ConfigError, match=rf"{key} is open to group or others \(mode 0640\).*hint: chmod 600 {key}"):
        sensitive.Marks.of_state(short_tmp)
