"""Issue 31: a call's records name the digest of the tool definition it ran with, and a reload
records which tools it added, changed or removed, so an auditor can tell what a tool was when
it acted."""

from __future__ import annotations

import shutil

import trio
from rungd_ledgers import iter_records

from rungd.testing import STUB_DESCRIPTION, serve_tool_file

TOOLS = """
[program]
name = "echo"
command = "{echo}"

[tools.echo_word_show]
argv = ["{word}"]
[tools.echo_word_show.description]
""" + STUB_DESCRIPTION + """
[tools.echo_word_show.parse]
kind = "lines"
"""

EXTRA = """
[tools.echo_other_show]
argv = ["other"]
[tools.echo_other_show.description]
""" + STUB_DESCRIPTION


def records(daemon, event: str) -> list:
    return [r for r in iter_records(daemon.config.state_dir / "ledger") if r.event == event]


async def test_calls_name_their_tools_definition_and_a_reload_says_what_changed(short_tmp, nursery) -> None:
    echo = shutil.which("echo")
    daemon = await serve_tool_file(nursery, short_tmp, TOOLS.format(echo=echo, word="one"))
    first = await daemon.call("echo_word_show", {})
    assert first.status == "ok", first.error
    digest = daemon.daemon.tools["echo_word_show"].digest
    assert len(digest) == 16
    (received,) = [r for r in records(daemon, "received") if r.call_id == first.call_id]
    assert received.tool_digest == digest

    daemon.daemon.reload()  # nothing changed: nothing recorded
    await trio.sleep(0.2)
    assert records(daemon, "reloaded") == []

    (short_tmp / "tools" / "tools.toml").write_text(TOOLS.format(echo=echo, word="two") + EXTRA)
    daemon.daemon.reload()
    await trio.sleep(0.2)
    changed = daemon.daemon.tools["echo_word_show"].digest
    added = daemon.daemon.tools["echo_other_show"].digest
    assert changed != digest
    (reloaded,) = records(daemon, "reloaded")
    assert reloaded.note == f"added: echo_other_show {added}; changed: echo_word_show {changed}"
    second = await daemon.call("echo_word_show", {})
    (received,) = [r for r in records(daemon, "received") if r.call_id == second.call_id]
    assert received.tool_digest == changed  # what it ran with, told apart from the first call

    (short_tmp / "tools" / "tools.toml").write_text(TOOLS.format(echo=echo, word="two"))
    daemon.daemon.reload()
    await trio.sleep(0.2)
    assert records(daemon, "reloaded")[-1].note == "removed: echo_other_show"
    daemon.daemon.stop()
