"""`rungctl check`: every built-in tool file holds up against adverse stand-ins for its
program, and a tool file that would answer any question is caught."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from rungd.authoring.check import check_files

ROOT = Path(__file__).resolve().parents[2]
BUILT_IN = sorted((ROOT / "configs" / "tools").glob("*.toml")) + sorted((ROOT / "configs" / "examples").glob("*.toml"))
LINE = re.compile(r"^PASS (\S+)  fixtures=(\d+) stableCodes=(\d+) secretHits=0 unknownWriteRetries=0 "
                  r"verifiedFromSkipped=false$")


async def test_built_in_tool_files_pass_every_adverse_fixture() -> None:
    receipts = await check_files(BUILT_IN)
    assert receipts, "no built-in tool files found"
    for receipt in receipts:
        assert receipt.passed, (receipt.line(), receipt.problems)
        match = LINE.match(receipt.line())
        assert match and match[2] == match[3], receipt.line()
    by_tool = {r.tool: r for r in receipts}
    # A write is checked against every fixture, acting-then-dying and doing nothing included.
    fixtures = {f.fixture: f.runs[0] for f in by_tool["apt_package_remove"].fixtures}
    assert len(fixtures) == 9
    assert fixtures["noop"].endswith("UNEXPECTED_STATE")
    assert fixtures["hang_after"].split()[1] != "not_started"  # it acted before it hung
    assert fixtures["acts_dies"].split()[1] != "not_started"
    # "no matches" vs "cannot answer": an empty export is ok, a missing one is an error.
    export = {f.fixture: f.runs[0] for f in by_tool["erp_stock_list"].fixtures}
    assert export["empty"].startswith("ok ")
    assert export["missing"].startswith("error ")
    # A program that printed nothing is never an empty ok for a parsing read.
    assert {f.fixture: f.runs[0] for f in by_tool["host_disk_usage_show"].fixtures}["empty"].endswith("SURFACE_CHANGED")


async def test_a_tool_that_counts_exit_1_as_an_answer_is_judged_by_where_the_secret_shows(short_tmp: Path) -> None:
    # ok_exit = [0, 1] is the tool's word that 1 is an answer (the guide's stat read): the
    # check cannot tell it from a failure taken for success, so it judges what it can see:
    # the secret the stand-in prints shows nowhere.
    tool_file = short_tmp / "echoer.toml"
    tool_file.write_text(textwrap.dedent("""\
        [program]
        name = "echoer"
        command = "echo"

        [tools.echoer_text_show]
        argv = ["hello"]
        deadline_s = 5
        ok_exit = [0, 1]

        [tools.echoer_text_show.description]
        does = "Prints a greeting. Changes nothing."
        use_when = "you need a greeting."
        do_not_use_when = "never otherwise."
        returns = "nothing parsed."
        on_error = "TIMEOUT (retry once)."
        if_unknown = "ask the user."
    """), encoding="utf-8")
    [receipt] = await check_files([tool_file])
    assert " secretHits=0 " in receipt.line() + " ", receipt.line()
    assert not any(p.startswith("secret:") for p in receipt.problems), receipt.problems


async def test_rungctl_check_prints_receipts_for_tool_files_and_python_plugins(short_tmp: Path) -> None:
    config = short_tmp / "rungd.toml"
    config.write_text(f'[server]\nsocket = "{short_tmp}/s.sock"\n[state]\ndir = "{short_tmp}/state"\n'
                      f'[plugins]\ntool_dirs = ["{ROOT}/configs/tools"]\n[plugins.settings.demo]\n',
                      encoding="utf-8")
    done = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--config", str(config), "check"],
                                  capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode()
    # The demo's reads give example_output: every fixture in the check reaches where it aims.
    assert done.returncode == 0, (out, done.stderr.decode())
    assert LINE.match(next(line for line in out.splitlines() if "host_disk_usage_show" in line))
    # The demo plugin's tools get the fixtures a stand-in can play without knowing their output.
    show = next(line for line in out.splitlines() if " inventory_item_show " in line)
    assert LINE.match(show) and " fixtures=5 " in show, show
    # Its write reads before it acts; that read's example_output lets the act fixtures reach it.
    count_set = next(line for line in out.splitlines() if " inventory_count_set " in line)
    assert LINE.match(count_set) and " fixtures=8 " in count_set, count_set
    unknown = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--config", str(config), "check",
                                      "no_such_tool"], capture_stdout=True, capture_stderr=True, check=False)
    assert unknown.returncode == 2
    assert "no_such_tool: no such tool in this config; hint:" in unknown.stderr.decode()


async def test_a_python_plugins_programs_are_stood_in_for_where_it_starts_them(short_tmp: Path) -> None:
    config = short_tmp / "rungd.toml"
    config.write_text(f'[server]\nsocket = "{short_tmp}/s.sock"\n[state]\ndir = "{short_tmp}/state"\n'
                      f'[plugins]\nfiles = ["{ROOT}/tests/plugin_fixtures/checked_tools.py"]\n', encoding="utf-8")
    done = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--config", str(config), "--json", "check"],
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 1, done.stderr.decode()  # the swallowing read fails its receipt
    receipts = {r["tool"]: r for r in json.loads(done.stdout)}
    # Its program does not exist: that every fixture but "missing" got where it aims shows
    # that the stand-in ran in its place.
    add = receipts["ck_note_add"]
    assert add["verdict"] == "PASS", add
    runs = {f["fixture"]: f["runs"][0] for f in add["fixtures"]}
    assert all(f["unreached"] is None for f in add["fixtures"]), add
    assert runs["hang_after"] == "error unknown none TIMEOUT", runs  # its confirmation answered: committed
    assert runs["hang_before"].endswith(" TIMEOUT")
    assert runs["acts_dies"].split()[1] == "unknown", runs  # it acted, then died: nobody knows
    assert runs["question"].endswith("PROMPT_UNEXPECTED")
    assert runs["noop"] == "error unknown none SURFACE_CHANGED", runs  # acted (it says), read back nothing
    assert add["unchecked"] == [] and [line.split(":")[0] for line in add["outside"]] == ["already"]
    assert add["source"] == "plugin file:checked_tools"
    # A read before the act with no example_output: the act fixtures never reach the act, said so.
    replace = receipts["ck_note_replace"]
    assert replace["verdict"] == "PART"
    unreached = {f["fixture"] for f in replace["fixtures"] if f["unreached"]}
    assert unreached == {"hang_after", "acts_dies", "noop"}, replace
    assert any("give that read's Program an example_output" in line for line in replace["unchecked"])
    show = receipts["ck_note_show"]
    assert show["verdict"] == "FAIL"
    assert "missing: expected an error, got ok" in show["problems"], show["problems"]
    crashes = receipts["ck_note_crash"]
    assert crashes["verdict"] == "FAIL"
    assert any("the handler raised an exception" in p for p in crashes["problems"]), crashes["problems"]
    # Checked in part and nothing failed: exit status 5.
    part = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--config", str(config), "check",
                                   "ck_note_replace"], capture_stdout=True, capture_stderr=True, check=False)
    assert part.returncode == 5, part.stdout.decode()
    assert "PART ck_note_replace " in part.stdout.decode()


async def test_a_read_back_field_of_two_values_is_shown_in_the_other_before_the_change(short_tmp: Path) -> None:
    tool_file = short_tmp / "flag.toml"
    tool_file.write_text(textwrap.dedent('''
        [program]
        name = "flag"
        command = "/bin/true"

        [tools.flag_state_show]
        argv = ["show"]
        parse = { kind = "regex", pattern = '^exists: (?P<exists>[01])$', fields = { exists = "integer" } }
        [tools.flag_state_show.description]
        does = "Shows the flag. Changes nothing."
        use_when = "you need the flag."
        do_not_use_when = "never otherwise."
        returns = "exists."
        on_error = "TIMEOUT (retry once)."
        if_unknown = "ask the user."

        [tools.flag_state_set]
        argv = ["set"]
        side_effect = "reversible"
        verify = { tool = "flag_state_show", expect = { exists = 1 } }
        [tools.flag_state_set.description]
        does = "Sets the flag. A write."
        use_when = "you must set the flag."
        do_not_use_when = "never otherwise."
        returns = "effect."
        on_error = "TIMEOUT (retry once)."
        if_unknown = "ask the user."
    '''))
    receipts = {r.tool: r for r in await check_files([tool_file])}
    # 1 before and after would be no change to see; 2 is no value [01] reads: 0 is.
    assert receipts["flag_state_set"].verdict == "PASS", receipts["flag_state_set"].line()
    # The read-back saw 0 before and 1 after: the change was shown, not assumed.
    assert {f.fixture: f.runs[0] for f in receipts["flag_state_set"].fixtures}["acts_dies"] == "error done changed FAILED"


async def test_a_file_with_several_programs_gets_every_one_replaced(short_tmp: Path) -> None:
    tool_file = short_tmp / "multi.toml"
    tool_file.write_text(textwrap.dedent('''
        [programs.show]
        command = "/bin/cat"
        [programs.edit]
        command = "/bin/true"

        [tools.mp_item_show]
        program = "show"
        argv = ["/etc/hostname"]
        [tools.mp_item_show.description]
        does = "Shows the item."
        use_when = "testing."
        do_not_use_when = "not testing."
        returns = "name."
        on_error = "codes."
        if_unknown = "ask."
        [tools.mp_item_show.parse]
        kind = "regex"
        pattern = '^(?P<name>\\S+)$'
        fields = { name = "string" }
    '''))
    [receipt] = await check_files([tool_file])
    # Stand-ins ran, not /bin/cat: the missing program and the hang were seen as their fixtures say.
    assert receipt.passed, receipt.problems
    assert receipt.line().startswith("PASS mp_item_show  fixtures=6 stableCodes=6 secretHits=0")


WRITES = """
    [programs.show]
    command = "/bin/cat"
    [programs.edit]
    command = "/bin/true"

    [tools.kv_value_show]
    program = "show"
    argv = ["/etc/hostname"]
    [tools.kv_value_show.description]
    {slots}
    [tools.kv_value_show.parse]
    kind = "key_value"
    fields = {{ value = "string", serial = "string" }}

    [tools.kv_value_set]
    program = "edit"
    side_effect = "reversible"
    argv = ["set", "{{value}}"]
    [tools.kv_value_set.inputs.value]
    description = "The value."
    example = "on"
    pattern = "^[a-z]+$"
    [tools.kv_value_set.description]
    {slots}
    [tools.kv_value_set.verify]
    tool = "kv_value_show"
    expect = {expect}
"""
SLOTS = "does = 't.'\n    use_when = 't.'\n    do_not_use_when = 't.'\n    returns = 't.'\n    on_error = 't.'\n" \
        "    if_unknown = 't.'"


@pytest.mark.parametrize(("expect", "tells"), [
    ('{ value = "{value}" }', False),  # the state alone: already there reads as success
    ('{ value = "{value}", serial = { differs_from_before = true } }', True),  # the act must move it
])
async def test_a_write_whose_read_back_already_held_says_whether_it_can_tell_a_refusal(
        short_tmp: Path, expect: str, tells: bool) -> None:
    tool_file = short_tmp / "kv.toml"
    tool_file.write_text(textwrap.dedent(WRITES.format(slots=SLOTS, expect=expect)))
    receipts = {r.tool: r for r in await check_files([tool_file])}
    receipt = receipts["kv_value_set"]
    assert receipt.passed, receipt.problems
    already = {f.fixture: f.runs[0] for f in receipt.fixtures}["already"]
    if tells:
        assert already.endswith("UNEXPECTED_STATE"), already  # nothing moved: not a success
        assert not receipt.notes
    else:
        assert already == "ok done no_change -", already
        [note] = receipt.notes
        assert "cannot tell a refusal from a success" in note and "differs_from_before" in note


@pytest.mark.parametrize("expected", [
    5, "on", {"equals": 3}, {"present": True}, {"present": False}, {"absent": True}, {"contains": "web"},
    {"lacks": "web"}, {"before_plus": 1}, {"greater_than_before": True}, {"less_than_before": True},
    {"differs_from_before": True},
])
def test_a_read_back_is_given_a_before_and_an_after_its_expectation_tells_apart(expected) -> None:
    # Relative expectations ("before_plus = 1") once made rungctl check skip the write, the
    # tool most worth checking.
    from rungd.core import expectations
    from rungd.authoring.check import _before_and_after

    before, after = _before_and_after(expected)
    assert expectations.judge({"f": after}, {"f": expected}, {"f": before}) is True
    assert expectations.judge({"f": before}, {"f": expected}, {"f": before}) is not True


def test_a_question_to_a_program_fed_its_input_on_stdin_is_not_expected_to_wait() -> None:
    # bc reads the expression it is given on stdin: a question it asked would read that, so
    # the check once failed such a tool for not answering PROMPT_UNEXPECTED.
    from rungd.authoring.check import _judge
    from rungd.core.envelope import Envelope

    answered = Envelope(call_id="c1", tool="t", status="ok", outcome="done", effect="none")
    assert _judge("question", {"stdin_input": "expression"}, answered, acted=False, write=False) == []
    assert _judge("question", {}, answered, acted=False, write=False) == ["expected PROMPT_UNEXPECTED, got ok"]


def test_a_read_that_counts_exit_1_as_an_answer_may_answer_the_secret_fixture() -> None:
    # The guide's stat read (ok_exit = [0, 1]): the secret stand-in exits 1, an answer for it.
    from rungd.authoring.check import _judge
    from rungd.core.envelope import Envelope

    answered = Envelope(call_id="c1", tool="t", status="ok", outcome="done", effect="none")
    assert _judge("secret", {"ok_exit": [0, 1]}, answered, acted=False, write=False) == []
    assert _judge("secret", {}, answered, acted=False, write=False) == ["expected an error, got ok"]


def test_a_file_whose_checked_copy_does_not_load_is_one_error_not_a_crash(short_tmp: Path) -> None:
    # Raised inside the check's nurseries, it once came out as an ExceptionGroup: rungctl
    # said "unexpected failure" instead of what is wrong with the file.
    from rungd.authoring.check import CheckError, run_check

    tool_file = short_tmp / "bad.toml"
    tool_file.write_text('[program]\ncommand = "echo"\n\n[tools.bad_x_show]\nargv = []\nuser = "Not A User"\n'
                         '[tools.bad_x_show.description]\ndoes = "x."\nuse_when = "x."\ndo_not_use_when = "x."\n'
                         'returns = "x."\non_error = "x."\nif_unknown = "x."\n', encoding="utf-8")
    with pytest.raises(CheckError, match="the checked copy does not load"):
        run_check([tool_file])


async def test_a_screen_tool_file_gets_screen_fixtures_against_a_stand_in_that_plays_its_steps(
        short_tmp: Path) -> None:
    # Issue 30: the stand-in draws what each step waits for and reads the keys each presses
    # (so acts_dies, noop and already reach the commit step and the screen read-back), and
    # also: a screen no step expects, an extra dialog after the first key, a death after it.
    from tests.plugins.test_declarative_screen import tool_file

    path = short_tmp / "host.toml"
    path.write_text(tool_file(short_tmp / "hostname.txt"))
    receipts = {r.tool: r for r in await check_files([path])}
    for receipt in receipts.values():
        assert receipt.passed, (receipt.line(), receipt.problems)
    write = {f.fixture: f.runs[0] for f in receipts["host_hostname_set"].fixtures}
    assert len(write) == 11
    assert write["never"].endswith("SURFACE_CHANGED") and write["dialog"].endswith("SURFACE_CHANGED")
    assert write["dies"].endswith("FAILED") and write["noop"].endswith("UNEXPECTED_STATE")
    assert write["acts_dies"].split()[1:3] == ["done", "changed"]  # the screen read-back saw what it did
    read = {f.fixture: f.runs[0] for f in receipts["host_settings_show"].fixtures}
    assert set(read) == {"missing", "hang", "never", "dialog", "dies", "flood", "secret"}
