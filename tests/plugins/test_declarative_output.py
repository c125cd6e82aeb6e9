"""What a tool file's parse makes of a program's output, said truthfully: a listing cut past
``max_lines`` says so and gives the total, a read-back too cut to decide never calls a
write's state unexpected, counts follow the byte cap's cuts, and a program that fails on
stderr but exits 0 is FAILED with its words, never a changed surface."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rungd.testing import STUB_DESCRIPTION, serve_tool_file
from tests.conftest import FAKES


def tool(name: str, program: str, argv: list[str], *, parse: str, extra: str = "") -> str:
    """One tool of a tool file: ``parse`` is the body of its parse table."""
    quoted = ", ".join(f'"{word}"' for word in argv)
    return (f'[tools.{name}]\nprogram = "{program}"\nargv = [{quoted}]\n{extra}\n'
            f"[tools.{name}.description]\n{STUB_DESCRIPTION}\n[tools.{name}.parse]\n{parse}\n")


async def serve(short_tmp: Path, nursery, text: str):
    return await serve_tool_file(nursery, short_tmp, text)


SEQ = '[programs.seq]\ncommand = "seq"\n\n' + tool("num_seq_show", "seq", ["150"], parse='kind = "lines"')


async def test_lines_past_max_lines_are_reported_cut_with_their_total(short_tmp, nursery) -> None:
    daemon = await serve(short_tmp, nursery, SEQ)
    env = await daemon.call("num_seq_show", {})
    assert env.status == "ok", env.error
    assert (len(env.fields["lines"]), env.fields["lines_shown"], env.fields["lines_total"]) == (100, 100, 150)
    assert env.fields["lines"][-1] == "100"
    assert env.truncated is True
    assert "100 of 150 lines" in env.narrow and env.evidence[0] in env.narrow
    daemon.daemon.stop()


async def test_rows_past_max_lines_are_reported_cut_with_their_total(short_tmp, nursery, fake_program) -> None:
    table = fake_program("table", """
        print("ID NAME")
        for i in range(1, 8):
            print(i, f"row{i}")
        """)
    text = ('[programs.table]\ncommand = "' + str(table) + '"\n\n'
            + tool("proc_table_show", "table", [], parse='kind = "columns"\nmax_lines = 3\n'
                   'fields = { id = "integer", name = "string" }'))
    daemon = await serve(short_tmp, nursery, text)
    env = await daemon.call("proc_table_show", {})
    assert env.status == "ok", env.error
    assert (len(env.fields["rows"]), env.fields["rows_shown"], env.fields["row_count"]) == (3, 3, 7)
    assert env.truncated is True and "3 of 7 rows" in env.narrow
    daemon.daemon.stop()


def job_queue_file(db: Path, max_lines: int) -> str:
    """at and atq, imitated: adding a job is verified by the queue listing one more line."""
    queue = FAKES / "job_queue"
    return (f'[programs.queue]\ncommand = "{queue}"\n\n'
            + tool("jobs_queue_list", "queue", ["--db", str(db), "list"],
                   parse=f'kind = "lines"\nmax_lines = {max_lines}')
            + tool("jobs_job_add", "queue", ["--db", str(db), "add", "{name}"], parse='kind = "none"',
                   extra='side_effect = "reversible"\n')
            + '[tools.jobs_job_add.inputs.name]\ndescription = "The job."\nexample = "backup"\n'
              'pattern = "^[a-z]+$"\n'
            + '[tools.jobs_job_add.verify]\ntool = "jobs_queue_list"\n'
              'expect = { lines_shown = { before_plus = 1 } }\nwait_s = 0\n')


async def test_a_read_back_cut_by_max_lines_is_too_cut_to_decide_a_write(short_tmp, nursery) -> None:
    db = short_tmp / "queue"
    db.write_text("".join(f"{i}\tThu Jan  1 00:00:00 2026 a root old\n" for i in range(1, 4)))
    daemon = await serve(short_tmp, nursery, job_queue_file(db, max_lines=3))
    # Three jobs, three lines kept: the read before shows them all; the read after shows 3 of 4.
    env = await daemon.call("jobs_job_add", {"name": "backup"}, request_id="add-1")
    assert len(db.read_text().splitlines()) == 4  # the job was added
    assert (env.status, env.error.code, env.outcome) == ("error", "OUTPUT_TOO_LARGE", "unknown"), env.error
    assert "too cut to decide" in env.error.message and "3 of 4 lines" in env.error.message
    assert env.settle is not None and env.settle.tool == "jobs_queue_list"
    # Now even the read before is cut: nothing is run that could not be judged.
    env = await daemon.call("jobs_job_add", {"name": "backup"}, request_id="add-2")
    assert (env.error.code, env.outcome) == ("OUTPUT_TOO_LARGE", "not_started"), env.error
    assert len(db.read_text().splitlines()) == 4
    daemon.daemon.stop()


async def test_a_read_back_that_shows_every_line_still_verifies_the_write(short_tmp, nursery) -> None:
    db = short_tmp / "queue"
    daemon = await serve(short_tmp, nursery, job_queue_file(db, max_lines=3))
    env = await daemon.call("jobs_job_add", {"name": "backup"}, request_id="add-1")
    assert (env.status, env.effect) == ("ok", "changed"), env.error
    assert (env.fields["before"]["lines_total"], env.fields["after"]["lines_total"]) == (0, 1)
    daemon.daemon.stop()


async def test_lines_of_output_cut_at_the_byte_cap_have_no_total(short_tmp, nursery) -> None:
    text = SEQ.replace('argv = ["150"]', 'argv = ["200000"]').replace('kind = "lines"',
                                                                       'kind = "lines"\nmax_lines = 100000')
    daemon = await serve(short_tmp, nursery, text)
    env = await daemon.call("num_seq_show", {})
    assert env.status == "ok", env.error
    assert env.truncated is True
    assert env.fields.get("lines_total") is None  # the runner kept a head and a tail: the count is unknown
    assert "byte cap" in env.narrow
    # Every line is one the program printed, whole: the gap is said in the envelope, never
    # by words among the program's (which a program could print too).
    # (A line made of two halves would break the counting; the envelope's cap may leave the
    # head only.)
    numbers = [int(line) for line in env.fields["lines"]]
    assert numbers[0] == 1 and all(1 <= n <= 200000 for n in numbers)
    jumps = [i for i in range(1, len(numbers)) if numbers[i] != numbers[i - 1] + 1]
    assert len(jumps) <= 1 and all(numbers[i] > numbers[i - 1] for i in jumps)
    daemon.daemon.stop()


async def test_counts_match_the_lines_left_after_the_byte_cap_cuts_them(short_tmp, nursery) -> None:
    text = SEQ.replace('argv = ["150"]', 'argv = ["-f", "line %g of a listing", "100"]\ncap_bytes = 1024')
    daemon = await serve(short_tmp, nursery, text)
    env = await daemon.call("num_seq_show", {})
    assert env.status == "ok", env.error
    shown = len(env.fields["lines"])
    assert shown < 100 and env.fields["lines_shown"] == shown and env.fields["lines_total"] == 100
    assert env.truncated is True and f"fields.lines: {shown} of 100 items kept" in env.narrow
    daemon.daemon.stop()


# A program that fails on stderr and still exits 0, as bc does on 1/0.
DIVIDE = "Runtime error (func=(main), adr=5): Divide by zero"
HEADING = """[tools.{name}.heading]
rung = 2
ruled_out = [{{ rung = 1, fails = "present", why = "no API" }}]
step_down = [{{ codes = ["SURFACE_CHANGED"], count = 1, to = "stop: a person checks the program" }}]
"""


def quiet_failure_file(*, status: int = 0, stderr: str = DIVIDE, lines: str = 'kind = "lines"',
                       extra: str = "") -> str:
    """exit_with as a calculator: one tool parses a number (regex), one a listing (lines)."""
    argv = [str(status), "--stderr", stderr] if stderr else [str(status)]
    return (f'[programs.calc]\ncommand = "{FAKES / "exit_with"}"\n\n'
            + tool("calc_value_show", "calc", argv,
                   parse="kind = \"regex\"\npattern = '(?P<result>-?[0-9.]+)\\n?\\Z'\nfields = { result = \"string\" }")
            + HEADING.format(name="calc_value_show")
            + tool("calc_lines_show", "calc", argv, parse=lines, extra=extra))


async def serve_suspending(short_tmp: Path, nursery, text: str):
    return await serve_tool_file(nursery, short_tmp, text, config="\n[step_down]\nsuspend = true\n")


async def test_a_failure_said_only_on_stderr_with_status_0_is_failed_never_surface_changed(short_tmp, nursery) -> None:
    daemon = await serve_suspending(short_tmp, nursery, quiet_failure_file())
    for _ in range(2):  # a step-down on one SURFACE_CHANGED would suspend the tool at once
        env = await daemon.call("calc_value_show", {})
        got = (env.status, env.error.code, env.outcome, env.next_action)
        assert got == ("error", "FAILED", "done", "stop"), env.error
        assert DIVIDE in env.error.hint and "tool file needs updating" not in env.error.hint
    listing = await daemon.call("calc_lines_show", {})
    assert (listing.status, listing.error.code) == ("error", "FAILED"), listing.fields
    assert DIVIDE in listing.error.hint
    daemon.daemon.stop()


async def test_an_empty_listing_the_tool_file_calls_an_answer_stays_an_answer(short_tmp, nursery) -> None:
    # A not-found status listed in ok_exit: what the program says with it is part of the answer.
    daemon = await serve(short_tmp, nursery, quiet_failure_file(status=1, stderr="stat: No such file or directory",
                                                                extra="ok_exit = [0, 1]\n"))
    env = await daemon.call("calc_lines_show", {})
    assert (env.status, env.fields["lines"]) == ("ok", []), env.error
    daemon.daemon.stop()


async def test_an_empty_listing_with_warnings_is_an_answer_when_the_file_says_empty_is(short_tmp, nursery) -> None:
    daemon = await serve(short_tmp, nursery, quiet_failure_file(
        stderr="Hint: you are not seeing messages of other users", lines='kind = "lines"\nempty = "answer"'))
    env = await daemon.call("calc_lines_show", {})
    assert (env.status, env.fields["lines"]) == ("ok", []), env.error
    daemon.daemon.stop()


async def test_no_output_and_nothing_on_stderr_is_still_an_empty_listing(short_tmp, nursery) -> None:
    daemon = await serve(short_tmp, nursery, quiet_failure_file(stderr=""))
    env = await daemon.call("calc_lines_show", {})
    assert (env.status, env.fields["lines"]) == ("ok", []), env.error
    daemon.daemon.stop()


def test_empty_answer_is_refused_where_no_output_cannot_parse(short_tmp) -> None:
    from rungd.core.errors import ConfigError
    from rungd_plugins.declarative import read_tool_file

    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "tools.toml").write_text(quiet_failure_file().replace(
        'fields = { result = "string" }', 'fields = { result = "string" }\nempty = "answer"'))
    with pytest.raises(ConfigError, match="only for kind"):
        read_tool_file(folder / "tools.toml")


BC = """[programs.bc]
command = "bc"

[tools.calc_expr_eval]
program = "bc"
stdin_input = "expr"
stdin_eof = true
[tools.calc_expr_eval.description]
DESCRIPTION
[tools.calc_expr_eval.inputs.expr]
description = "An expression."
example = "1+1"
pattern = "[0-9+*/ ()-]+"
[tools.calc_expr_eval.parse]
kind = "regex"
pattern = '(?P<result>-?[0-9.]+)\\n?\\Z'
fields = { result = "string" }
""".replace("DESCRIPTION", STUB_DESCRIPTION)


async def test_bc_dividing_by_zero_is_failed_with_its_words(short_tmp, nursery) -> None:
    if shutil.which("bc") is None:
        pytest.skip("bc is not installed (Debian package bc)")
    daemon = await serve(short_tmp, nursery, BC)
    ok = await daemon.call("calc_expr_eval", {"expr": "6*7"})
    assert (ok.status, ok.fields) == ("ok", {"result": "42"}), ok.error
    env = await daemon.call("calc_expr_eval", {"expr": "1/0"})
    assert (env.status, env.error.code) == ("error", "FAILED"), env.error
    assert "Divide by zero" in env.error.hint
    daemon.daemon.stop()


def test_a_hint_points_at_the_stdout_evidence_the_parse_read() -> None:
    from rungd.sdk import Completed
    from rungd_plugins.declarative.build import _evidence_of

    def done(*evidence: str) -> Completed:
        return Completed(exit_status=0, stdout="", stderr="", stdout_bytes=0, stderr_bytes=0, answered=[],
                         evidence=list(evidence), stdout_cut=True)

    assert _evidence_of(done("c1.1.stderr", "c1.2.stdout")) == "c1.2.stdout"  # stderr spoke first
    assert _evidence_of(done("c1.1.stderr")) == "c1.1.stderr"
    assert "could not hold it" in _evidence_of(done())  # never an IndexError in the error path


async def test_a_flood_on_stderr_leaves_a_small_stdout_whole_and_parsed(short_tmp, nursery, fake_program) -> None:
    # Once one flag told of both streams: warnings flooding stderr made a one-line answer on
    # stdout OUTPUT_TOO_LARGE ("printed more than the tool keeps").
    noisy = fake_program("noisy", """
        import sys
        for i in range(20000):
            sys.stderr.write(f"warning {i}: deprecated option\\n")
        print("used: 42")
        """)
    text = (f'[programs.noisy]\ncommand = "{noisy}"\n\n'
            + tool("disk_usage_show", "noisy", [], parse='kind = "regex"\npattern = "^used: (?P<used>\\\\d+)$"\n'
                   'fields = { used = "integer" }'))
    daemon = await serve(short_tmp, nursery, text)
    env = await daemon.call("disk_usage_show", {})
    assert env.status == "ok", env.error
    assert env.fields == {"used": 42} and env.truncated is False
    daemon.daemon.stop()


async def test_a_narrow_never_promises_output_the_evidence_did_not_keep(short_tmp, nursery) -> None:
    # 20 MB of lines: evidence keeps 16 MiB, and the narrow once said all of it was there.
    text = '[programs.seq]\ncommand = "seq"\n\n' + tool("num_big_show", "seq", ["3000000"], parse='kind = "lines"')
    daemon = await serve(short_tmp, nursery, text)
    env = await daemon.call("num_big_show", {})
    assert env.status == "ok" and env.truncated, env.error
    assert "up to the evidence cap (the rest was not kept)" in env.narrow and "full output" not in env.narrow
    daemon.daemon.stop()


async def test_a_narrow_says_the_full_output_is_kept_when_it_is(short_tmp, nursery) -> None:
    daemon = await serve(short_tmp, nursery, SEQ)
    env = await daemon.call("num_seq_show", {})
    assert env.truncated and "its full output is in evidence" in env.narrow
    daemon.daemon.stop()
