"""Tool files: a legacy program wrapped in TOML, checked at load, honest at run time."""

from __future__ import annotations

import pwd
import shutil
import textwrap
from pathlib import Path

import pytest

from rungd.config import load_config
from rungd.service.daemon import Daemon
from rungd.core.errors import ConfigError
from rungd.testing import write_config
from rungd_plugins.declarative import read_tool_file

INVENTORY = Path(__import__("rungd_plugins.demo", fromlist=["x"]).__file__).with_name("inventory.py")

TOOL_FILE = f"""
[program]
name = "stock"
command = "{INVENTORY}"

[tools.stock_item_show]
argv = ["show", "{{item}}", "--db", "DB"]
log_fields = ["item"]
[tools.stock_item_show.description]
does = "Reads one item."
use_when = "you need a count."
do_not_use_when = "you want to change it."
returns = "item, count, location."
on_error = "NOT_FOUND: check the name."
if_unknown = "ask the user."
[tools.stock_item_show.inputs.item]
description = "The item."
example = "widget"
pattern = "^[a-z]+$"
[tools.stock_item_show.parse]
kind = "key_value"
fields = {{ item = "string", count = "integer", location = "string" }}
[tools.stock_item_show.exit.3]
code = "NOT_FOUND"
hint = "the demo stock has widget, gadget, sprocket"

[tools.stock_count_set]
side_effect = "reversible"
argv = ["VERB", "{{item}}", "{{count}}", "--db", "DB"]
commit_point = "confirmation"
[tools.stock_count_set.description]
does = "Sets one item's count."
use_when = "the user asks to correct a count."
do_not_use_when = "you only need to read it."
returns = "before and after."
on_error = "UNEXPECTED_STATE: stop."
if_unknown = "ask the user."
[tools.stock_count_set.inputs.item]
description = "The item."
example = "widget"
pattern = "^[a-z]+$"
[tools.stock_count_set.inputs.count]
type = "integer"
description = "The new count."
example = 3
minimum = 0
[[tools.stock_count_set.confirm]]
pattern = '^Set \\S+ count from \\d+ to \\d+\\? \\[y/N\\]$'
answer = "y"
[tools.stock_count_set.verify]
tool = "stock_item_show"
inputs = {{ item = "{{item}}" }}
expect = {{ count = "{{count}}" }}
wait_s = 1
"""


def tool_dir(short_tmp: Path, text: str = TOOL_FILE, verb: str = "set") -> Path:
    folder = short_tmp / "tools"
    folder.mkdir(exist_ok=True)
    db = short_tmp / "stock.json"
    (folder / "stock.toml").write_text(text.replace("DB", str(db)).replace("VERB", verb))
    return folder


@pytest.fixture
def rungd_config_toml(short_tmp: Path) -> str:
    return f'[plugins]\ntool_dirs = ["{tool_dir(short_tmp)}"]\n'


async def test_read_tool_from_a_file_parses_typed_fields(rungd_daemon) -> None:
    env = await rungd_daemon.call("stock_item_show", {"item": "gadget"})
    assert env.status == "ok", env.error
    assert env.fields == {"item": "gadget", "count": 5, "location": "B-1"}
    definition = rungd_daemon.daemon.tools["stock_item_show"]
    assert definition.plugin == "declarative"
    schema = definition.tool.input_schema()
    assert schema["properties"]["item"]["examples"] == ["widget"] and schema["additionalProperties"] is False


async def test_exit_table_from_the_file(rungd_daemon) -> None:
    env = await rungd_daemon.call("stock_item_show", {"item": "nope"})
    assert (env.error.code, env.next_action) == ("NOT_FOUND", "stop")
    assert "widget, gadget" in env.error.hint


async def test_write_is_confirmed_and_read_back(rungd_daemon) -> None:
    env = await rungd_daemon.call("stock_count_set", {"item": "widget", "count": 7}, request_id="d1")
    assert (env.status, env.effect) == ("ok", "changed"), env.error
    assert (env.fields["before"]["count"], env.fields["after"]["count"]) == (12, 7)
    assert env.verified_by == "stock_item_show after the change (rung 2)"
    same = await rungd_daemon.call("stock_count_set", {"item": "widget", "count": 7}, request_id="d2")
    assert (same.status, same.effect) == ("ok", "no_change")


async def test_a_program_that_lies_about_success_is_caught_by_the_read_back(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    lying = TOOL_FILE.replace("commit_point = \"confirmation\"", "").replace(
        "[[tools.stock_count_set.confirm]]\npattern = '^Set \\S+ count from \\d+ to \\d+\\? \\[y/N\\]$'\nanswer = \"y\"\n",
        "")
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tool_dir(short_tmp, lying, "lie")}"]\n'))
    daemon = await start_daemon(nursery, config)
    env = await daemon.call("stock_count_set", {"item": "widget", "count": 99}, request_id="d3")
    assert (env.error.code, env.outcome, env.next_action) == ("UNEXPECTED_STATE", "done", "stop")
    assert "nothing changed" in env.error.message
    daemon.daemon.stop()


async def test_output_in_a_new_format_is_surface_changed(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    newer = TOOL_FILE.replace('argv = ["show", "{item}", "--db", "DB"]',
                              'argv = ["show", "{item}", "--new-format", "--db", "DB"]')
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tool_dir(short_tmp, newer)}"]\n'))
    daemon = await start_daemon(nursery, config)
    env = await daemon.call("stock_item_show", {"item": "widget"})
    assert (env.error.code, env.next_action) == ("SURFACE_CHANGED", "stop")
    assert "count" in env.error.hint
    daemon.daemon.stop()


ESCAPED_SECRET = '''
    import json, os, sys
    token = os.environ["TOKEN"]
    # As PHP's json_encode prints it ('/' escaped), and as a URL would carry it.
    print(json.dumps({"token": token}).replace("/", "\\\\/"))
'''


async def test_a_secret_printed_escaped_is_redacted_from_the_parsed_fields_and_the_evidence(
        short_tmp, nursery, fake_program, monkeypatch) -> None:
    from rungd.testing import start_daemon

    secret = "s3cr3t/T0ken+xyz=="
    monkeypatch.setenv("RUNGD_CRED_APITOKEN", secret)
    program = fake_program("leak", ESCAPED_SECRET)
    text = columns_file(program).replace('argv = ["secret"]', 'argv = []').replace(
        'credential_files = { APP_PASSWORD_FILE = "app_password" }', 'credentials = { TOKEN = "apitoken" }')
    text = text[:text.index("[tools.proc_secret_check.parse]")] + "[tools.proc_secret_check.parse]\nkind = \"json\"\n"
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "leak.toml").write_text(text)
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    env = await daemon.call("proc_secret_check", {})
    assert env.status == "ok", env.error
    assert env.fields["token"] == "[REDACTED]"  # the parser decoded "s3cr3t\\/T0ken..." back to the secret
    kept = "".join((daemon.config.state_dir / "evidence" / name).read_text()
                   for name in env.evidence if (daemon.config.state_dir / "evidence" / name).exists())
    assert kept and secret not in str(env) and "T0ken" not in kept, kept
    daemon.daemon.stop()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (("[program]", "[program]\ncolour = 1"), "program.colour: unknown key"),
        (('argv = ["show", "{item}"', 'argv = ["show", "{itme}"'), "{itme} is not one of its inputs"),
        (("[tools.stock_count_set.verify]", "[tools.stock_count_set.not_verify]"), "unknown key"),
        ((f'command = "{INVENTORY}"', 'command = "/no/such/program"'), "program.command"),
        (("pattern = '^Set", "pattern = '(^Set"), "not a valid regular expression"),
        (('tool = "stock_item_show"', 'tool = "stock_count_set"'), "must be a read tool"),
        (('expect = { count', 'expect = { qty'), "does not parse a field 'qty'"),
        # It loaded, then hung: stdin closed before the input's data could be sent.
        (("[tools.stock_count_set]\n", '[tools.stock_count_set]\nstdin = "eof"\nstdin_input = "count"\n'),
         "stdin = \"eof\" closes stdin before any data"),
        # It loaded, and typed "{count}" as written (a real-program trial: chage got "{max_days}").
        (('answer = "y"', 'answer = "{count}"'), "confirm[0].answer: '{count}' is typed as written"),
    ],
)
def test_mistakes_in_a_tool_file_name_the_file_and_key(short_tmp, change, words) -> None:
    folder = tool_dir(short_tmp, TOOL_FILE.replace(*change))
    with pytest.raises(ConfigError) as caught:
        read_tool_file(folder / "stock.toml")
    assert str(folder / "stock.toml") in str(caught.value)
    assert words in str(caught.value)


@pytest.mark.parametrize("answer", ["{", "y}", "yes{", "{{count}}"])
def test_a_confirmation_answer_with_braces_that_name_nothing_loads(short_tmp, answer) -> None:
    # The refusal of "{count}" once made a lone brace stop every tool file from loading.
    folder = tool_dir(short_tmp, TOOL_FILE.replace('answer = "y"', f'answer = "{answer}"'))
    assert read_tool_file(folder / "stock.toml").tools


def test_a_write_without_read_back_is_refused(short_tmp) -> None:
    text = TOOL_FILE.split("[tools.stock_count_set.verify]")[0]
    folder = tool_dir(short_tmp, text)
    with pytest.raises(ConfigError, match="needs a read-back"):
        read_tool_file(folder / "stock.toml")


def test_the_shipped_tool_files_load(short_tmp) -> None:
    from rungd.config import embedded_configs

    for path in sorted((embedded_configs() / "tools").glob("*.toml")):
        assert read_tool_file(path).tools
    config = load_config(write_config(short_tmp, textwrap.dedent(f"""
        [plugins]
        tool_dirs = ["{embedded_configs() / 'tools'}"]
    """)))
    assert "host_disk_usage_show" in Daemon(config).tools


TABLE_AND_SECRET = '''
    import os, sys
    if sys.argv[1] == "table":
        print("PID   STATE     NAME")
        print("101   running   web server")   # the last column takes the rest of the line
        print("102   sleeping  cron")
        sys.exit(0)
    path = os.environ["APP_PASSWORD_FILE"]
    print("mode", oct(os.stat(path).st_mode & 0o777))
    print("match", open(path).read() == "file-secret-Kq2")
    print("path", path)
'''


def columns_file(program: Path) -> str:
    return f"""
[program]
name = "proc"
command = "{program}"

[tools.proc_table_show]
argv = ["table"]
[tools.proc_table_show.description]
does = "Reads a table."
use_when = "testing."
do_not_use_when = "not testing."
returns = "rows."
on_error = "SURFACE_CHANGED."
if_unknown = "ask."
[tools.proc_table_show.parse]
kind = "columns"
fields = {{ pid = "integer", state = "string", name = "string" }}

[tools.proc_secret_check]
argv = ["secret"]
credential_files = {{ APP_PASSWORD_FILE = "app_password" }}
[tools.proc_secret_check.description]
does = "Checks a credential file."
use_when = "testing."
do_not_use_when = "not testing."
returns = "lines."
on_error = "AUTH_REQUIRED."
if_unknown = "ask."
[tools.proc_secret_check.parse]
kind = "key_value"
separator = " "
fields = {{ mode = "string", match = "boolean", path = "string" }}
"""


async def test_columns_are_matched_by_header_name(short_tmp, nursery, fake_program) -> None:
    from rungd.testing import start_daemon

    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "proc.toml").write_text(columns_file(fake_program("proc", TABLE_AND_SECRET)))
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    env = await daemon.call("proc_table_show", {})
    assert env.status == "ok", env.error
    assert env.fields["rows"] == [{"pid": 101, "state": "running", "name": "web server"},
                                  {"pid": 102, "state": "sleeping", "name": "cron"}]
    daemon.daemon.stop()


async def test_a_credential_file_is_private_and_gone_after_the_call(short_tmp, nursery, fake_program,
                                                                      monkeypatch) -> None:
    from rungd.testing import start_daemon

    monkeypatch.setenv("RUNGD_CRED_APP_PASSWORD", "file-secret-Kq2")
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "proc.toml").write_text(columns_file(fake_program("proc", TABLE_AND_SECRET)))
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    env = await daemon.call("proc_secret_check", {})
    assert env.status == "ok", env.error
    assert (env.fields["mode"], env.fields["match"]) == ("0o600", True)
    assert not Path(env.fields["path"]).exists()
    assert "file-secret-Kq2" not in str(env)
    daemon.daemon.stop()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (('expect = {{ count = "{{count}}" }}'.replace("{{", "{").replace("}}", "}"), "expect = {}"),
         "proves a change only by what it expects"),
        (('expect = { count = "{count}" }', 'expect = { count = "n-{count}" }'), "one whole input"),
        ((f'command = "{INVENTORY}"', 'command = "/bin/sh"'), "shell or script interpreter"),
    ],
)
def test_tool_files_refuse_what_would_make_results_lie_or_run_code(short_tmp, change, words) -> None:
    folder = tool_dir(short_tmp, TOOL_FILE.replace(*change))
    with pytest.raises(ConfigError, match=words):
        read_tool_file(folder / "stock.toml")


LIAR = '''
    import sys
    from pathlib import Path
    db = Path(sys.argv[-1])
    if sys.argv[1] == "show":
        print(f"value: {db.read_text().strip() if db.exists() else 'none'}")
        sys.exit(0)
    db.write_text(sys.argv[2])          # the change happens...
    sys.stderr.write("Password: ")      # ...then it asks for a password nobody declared
    sys.stderr.flush()
    sys.stdin.readline()
'''


@pytest.mark.parametrize("acts_first", [True, False])
async def test_a_write_stopped_at_a_question_is_decided_by_its_settle_read(short_tmp, nursery, fake_program,
                                                                           acts_first) -> None:
    """Whatever the declared commit point, a write whose program ran is unknown until a read
    says whether anything moved; the settle read runs at once and decides, naming itself."""
    from rungd.testing import start_daemon

    program = fake_program("liar", LIAR if acts_first else LIAR.replace(
        "    db.write_text(sys.argv[2])          # the change happens...\n", "").replace(
        "    sys.stdin.readline()\n", "    sys.stdin.readline()\n    db.write_text(sys.argv[2])\n"))
    db = short_tmp / "liar.db"
    text = f"""
[program]
name = "kv"
command = "{program}"
[tools.kv_value_show]
argv = ["show", "{db}"]
[tools.kv_value_show.description]
does = "Reads the value."
use_when = "t."
do_not_use_when = "t."
returns = "value."
on_error = "t."
if_unknown = "t."
[tools.kv_value_show.parse]
kind = "key_value"
fields = {{ value = "string" }}
[tools.kv_value_set]
side_effect = "reversible"
commit_point = "confirmation"        # declared: nothing happens before a confirmation
argv = ["set", "{{value}}", "{db}"]
[[tools.kv_value_set.confirm]]
pattern = 'Really\\?'
answer = "y"
[tools.kv_value_set.description]
does = "Sets the value."
use_when = "t."
do_not_use_when = "t."
returns = "t."
on_error = "t."
if_unknown = "t."
[tools.kv_value_set.inputs.value]
description = "The value."
example = "one"
pattern = "^[a-z]+$"
[tools.kv_value_set.verify]
tool = "kv_value_show"
expect = {{ value = "{{value}}" }}
"""
    folder = short_tmp / "kv"
    folder.mkdir()
    (folder / "kv.toml").write_text(text)
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    env = await daemon.call("kv_value_set", {"value": "two"}, request_id="liar-1")
    assert env.error.code == "AUTH_REQUIRED"
    assert env.verified_by is not None and env.verified_by.startswith("settle read kv_value_show")
    if acts_first:
        assert db.read_text() == "two"  # it did change, before the question
        assert (env.outcome, env.effect, env.next_action) == ("done", "changed", "request_authority")
        repeat = await daemon.call("kv_value_set", {"value": "two"}, request_id="liar-1")
        assert (repeat.outcome, repeat.effect) == ("done", "existing")  # a repeat changes nothing more
    else:
        assert not db.exists()  # stopped at the question: nothing moved, and the read says so
        assert (env.outcome, env.effect, env.next_action) == ("not_started", "none", "request_authority")
    daemon.daemon.stop()


def test_a_misspelled_key_gets_the_closest_valid_ones(short_tmp) -> None:
    folder = tool_dir(short_tmp, TOOL_FILE.replace("log_fields = [\"item\"]", "log_feilds = [\"item\"]", 1))
    with pytest.raises(ConfigError) as caught:
        read_tool_file(folder / "stock.toml")
    assert "key tools.stock_item_show.log_feilds: unknown key; did you mean log_fields?" in str(caught.value)


GUIDE = Path(__file__).resolve().parents[2] / "plugins" / "README.md"


@pytest.mark.skipif(not shutil.which("getent"), reason="getent is not installed")
async def test_the_plugin_guides_getent_tool_file_parses_clean_fields(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    # The guide's section 2, as a reader would copy it.
    text = GUIDE.read_text(encoding="utf-8").split("```toml\n", 1)[1].split("```", 1)[0]
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "accounts.toml").write_text(text, encoding="utf-8")
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n'))
    daemon = await start_daemon(nursery, config)
    env = await daemon.call("accounts_user_show", {"user": "root"})
    assert env.status == "ok", env.error
    assert env.fields["shell"] == pwd.getpwnam("root").pw_shell  # no trailing newline
    assert env.fields["home"] == pwd.getpwnam("root").pw_dir and env.fields["uid"] == 0
    daemon.daemon.stop()


PRECONDITION = TOOL_FILE + '''
[tools.stock_count_set.inputs.expected_count]
type = "integer"
description = "The count you read; if it changed since, nothing is changed (CONFLICT)."
example = 12
required = false
[tools.stock_count_set.precondition]
tool = "stock_item_show"
inputs = { item = "{item}" }
expect = { count = "{expected_count}" }
lock = "stock:{item}"
'''


async def test_a_tool_file_declares_an_expected_revision(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    folder = tool_dir(short_tmp, PRECONDITION)
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    stale = await daemon.call("stock_count_set", {"item": "widget", "count": 7, "expected_count": 99},
                              request_id="p1")
    assert (stale.error.code, stale.outcome, stale.next_action) == ("CONFLICT", "not_started", "repair")
    assert stale.fields["current"]["count"] == 12  # what the read shows now
    fresh = await daemon.call("stock_count_set", {"item": "widget", "count": 7, "expected_count": 12},
                              request_id="p2")
    assert (fresh.status, fresh.effect) == ("ok", "changed"), fresh.error
    daemon.daemon.stop()


def test_a_precondition_names_only_the_tools_inputs(short_tmp) -> None:
    folder = tool_dir(short_tmp, PRECONDITION.replace('lock = "stock:{item}"', 'lock = "stock:{sku}"'))
    with pytest.raises(ConfigError, match=r"precondition\.lock: \{sku\} is not an input"):
        read_tool_file(folder / "stock.toml")


async def test_a_negative_number_never_reaches_a_program_as_an_option(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    folder = tool_dir(short_tmp, TOOL_FILE.replace('minimum = 0\n', ''))
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    env = await daemon.call("stock_count_set", {"item": "widget", "count": -5}, request_id="neg")
    assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started")
    assert "option" in env.error.message
    daemon.daemon.stop()


async def test_an_input_inside_a_path_never_leaves_its_folder(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    # No pattern on the input: the path it sits in still holds it to one name.
    text = TOOL_FILE.replace('argv = ["show", "{item}", "--db", "DB"]', 'argv = ["show", "items/{item}", "--db", "DB"]')
    text = text.replace('example = "widget"\npattern = "^[a-z]+$"\n[tools.stock_item_show.parse]',
                        'example = "widget"\n[tools.stock_item_show.parse]')
    assert text.count('"items/{item}"') == 1 and text.count('pattern = "^[a-z]+$"') == 1
    folder = tool_dir(short_tmp, text)
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    for walk in ("../../etc/shadow", "..", "a/b", ""):
        env = await daemon.call("stock_item_show", {"item": walk})
        assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started"), (walk, env.error)
        assert "would leave the folder" in env.error.message
    daemon.daemon.stop()


async def test_a_whole_argument_input_names_no_file_unless_the_tool_file_says_so(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    # `show {item}` and `--db={item}` with no pattern: as `man {page}`, `curl {url}` or
    # `ssh -F {file}` would, a value with a '/' would reach any file the daemon can read.
    text = TOOL_FILE.replace('example = "widget"\npattern = "^[a-z]+$"\n[tools.stock_item_show.parse]',
                             'example = "widget"\n[tools.stock_item_show.parse]')
    loose = text.replace('argv = ["show", "{item}", "--db", "DB"]', 'argv = ["show", "--db={item}"]')
    assert text.count('pattern = "^[a-z]+$"') == 1 and loose.count('"--db={item}"') == 1
    for index, body in enumerate((text, loose)):
        home = short_tmp / f"t{index}"
        home.mkdir()
        folder = tool_dir(home, body)
        daemon = await start_daemon(nursery, load_config(write_config(home, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
        for value in ("/etc/shadow", "file:///etc/shadow"):
            env = await daemon.call("stock_item_show", {"item": value})
            assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started"), (value, env.error)
            assert "has a '/'" in env.error.message and "allow_path = true" in env.error.hint, env.error
        for value in ("..", ".", "a/../../x"):
            env = await daemon.call("stock_item_show", {"item": value})
            assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started"), (value, env.error)
            assert "'.' or '..'" in env.error.message, env.error
        daemon.daemon.stop()


def test_a_pattern_decides_on_a_slash_but_never_lets_a_dotdot_part_through() -> None:
    from rungd.core.errors import BadInput
    from rungd_plugins.declarative.templates import names_no_file

    names_no_file("file", "/srv/data/x.csv", constrained=True, allow_path=False)
    names_no_file("file", "HEAD..main", constrained=False, allow_path=False)  # not a '..' part
    names_no_file("n", 5, constrained=False, allow_path=False)
    names_no_file("file", "../../etc/shadow", constrained=False, allow_path=True)  # said so
    with pytest.raises(BadInput, match="'.' or '..'"):
        names_no_file("file", "/srv/data/../../etc/shadow", constrained=True, allow_path=False)
    with pytest.raises(BadInput, match="has a '/'"):
        names_no_file("file", "/etc/shadow", constrained=False, allow_path=False)


SYSCTL_TOOL = """
[program]
name = "sysctl"
command = "sysctl"

[tools.kernel_setting_show]
argv = ["-n", "{key}"]
[tools.kernel_setting_show.description]
does = "Reads one kernel setting."
use_when = "you need a kernel setting."
do_not_use_when = "you want to change one."
returns = "its value."
on_error = "NOT_FOUND: check the key."
if_unknown = "ask the user."
[tools.kernel_setting_show.inputs.key]
description = "The setting, e.g. kernel.ostype."
example = "kernel.ostype"
pattern = "[a-z][a-z0-9_.=-]*"
[tools.kernel_setting_show.parse]
kind = "lines"
"""


async def test_a_pattern_holds_the_whole_value_and_sysctl_never_sets_through_a_read(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    if shutil.which("sysctl") is None:
        pytest.skip("sysctl (procps) is not installed")
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "sysctl.toml").write_text(SYSCTL_TOOL)
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    read = await daemon.call("kernel_setting_show", {"key": "kernel.ostype"})
    assert (read.status, read.fields["lines"]) == ("ok", ["Linux"]), read.error
    # The pattern has no ^...$: still held to the whole value, so no '/' rides in on its letters.
    env = await daemon.call("kernel_setting_show", {"key": "/etc/shadow"})
    assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started"), env.error
    # procps sysctl sets a value whenever a word holds '=', -w or not; the pattern allowed it.
    before = Path("/proc/sys/kernel/domainname").read_text()
    env = await daemon.call("kernel_setting_show", {"key": "kernel.domainname=rungd-test"})
    assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started"), env.error
    assert "sysctl set that value" in env.error.message
    assert Path("/proc/sys/kernel/domainname").read_text() == before
    daemon.daemon.stop()


async def test_two_inputs_that_climb_together_are_refused(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon

    text = SYSCTL_TOOL.replace('command = "sysctl"', 'command = "ls"').replace(
        'argv = ["-n", "{key}"]', 'argv = ["-d", "--", "{key}{rest}"]').replace(
        'pattern = "[a-z][a-z0-9_.=-]*"', 'pattern = "[a-z./]+"') + textwrap.dedent("""
        [tools.kernel_setting_show.inputs.rest]
        description = "More of the name."
        example = "x"
        pattern = "[a-z./]+"
        """)
    folder = short_tmp / "tools"
    folder.mkdir()
    (folder / "ls.toml").write_text(text)
    daemon = await start_daemon(nursery, load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{folder}"]\n')))
    env = await daemon.call("kernel_setting_show", {"key": "x/.", "rest": "./y"})  # each alone is fine
    assert (env.error.code, env.outcome) == ("BAD_INPUT", "not_started"), env.error
    assert "climbs out by '..'" in env.error.message
    daemon.daemon.stop()


def test_a_connection_string_never_reaches_a_libpq_program_through_an_input() -> None:
    from rungd_plugins.declarative.programs import refused_value

    assert "connection string" in refused_value(Path("/usr/bin/psql"), "host=evil port=5432 dbname=x")
    assert refused_value(Path("/usr/bin/psql"), "sales") is None
    assert refused_value(Path("/usr/bin/cat"), "a=b") is None


def test_a_settle_matches_test_never_takes_its_pattern_from_an_input(short_tmp) -> None:
    text = TOOL_FILE + '''
[tools.stock_count_set.settle]
tool = "stock_item_show"
inputs = { item = "{item}" }
expect = { item = { matches = "{item}" } }
'''
    loaded = read_tool_file(tool_dir(short_tmp, text) / "stock.toml")
    tool = next(t for t in loaded.tools if t.name == "stock_count_set")
    # Literal text, not "$item": a caller's input is never a regular expression.
    assert tool.timing.settle.expect == {"item": {"matches": "{item}"}}


def test_a_precondition_pattern_is_checked_for_backtracking_at_load(short_tmp) -> None:
    bad = PRECONDITION.replace('expect = { count = "{expected_count}" }', 'expect = { item = { matches = "^(a+)+$" } }')
    with pytest.raises(ConfigError, match=r"precondition\.expect\.item\.matches"):
        read_tool_file(tool_dir(short_tmp, bad) / "stock.toml")


def test_an_input_allowed_a_slash_names_a_subfolder_and_never_walks_out() -> None:
    from rungd.core.errors import BadInput
    from rungd_plugins.declarative.templates import inside_path

    inside_path("/srv/repos/{repo}", {"repo": "group/project"}, frozenset({"repo"}))
    inside_path("https://api.example/{path}", {"path": "users/42"})  # a URL is no path here
    for walk in ("group/../../etc", "/etc/shadow", "group//x", "."):
        with pytest.raises(BadInput, match="would leave the folder"):
            inside_path("/srv/repos/{repo}", {"repo": walk}, frozenset({"repo"}))
    with pytest.raises(BadInput):
        inside_path("/srv/repos/{repo}", {"repo": "group/project"})  # not allowed a slash


def test_a_path_part_is_judged_as_filled_in_not_input_by_input() -> None:
    # An empty extension beside a name is the name; the same inputs that fill a part with
    # nothing, '.' or '..' still leave the folder (found wrapping real programs: enum = ["", ".txt"]
    # loaded, and every call with "" was BAD_INPUT).
    from rungd.core.errors import BadInput
    from rungd_plugins.declarative.templates import inside_path

    inside_path("/srv/files/{name}{ext}", {"name": "report", "ext": ""})
    inside_path("/srv/files/{name}{ext}", {"name": "report", "ext": ".txt"})
    for values in ({"name": "", "ext": ""}, {"name": ".", "ext": ""}, {"name": ".", "ext": "."},
                   {"name": "", "ext": None}):
        with pytest.raises(BadInput, match="would leave the folder"):
            inside_path("/srv/files/{name}{ext}", values)
    for empty in ("", None, ".", ".."):
        with pytest.raises(BadInput, match="would leave the folder"):
            inside_path("/srv/files/{name}", {"name": empty})


def test_an_editors_lock_file_in_the_tool_folder_is_not_a_tool_file(short_tmp: Path) -> None:
    # Emacs leaves .#stock.toml, a symlink to nowhere, while a tool file is edited: it once
    # failed check-config, start-up and every reload.
    from rungd_plugins.declarative import tool_files

    folder = tool_dir(short_tmp)
    (folder / ".#stock.toml").symlink_to("root@host.1234:1700000000")
    (folder / ".hidden.toml").write_text("not = [toml")
    assert [path.name for path in tool_files((folder,), pytest.fail)] == ["stock.toml"]


def test_an_anchored_pattern_is_shown_as_written_and_still_holds_the_whole_value() -> None:
    # A model read '^(?:^[a-z]{1,20}$)$' in the schema and in BAD_INPUT for the author's
    # '^[a-z]{1,20}$'; an unanchored pattern is still held to the whole value.
    from rungd_plugins.declarative.build import whole_match

    assert whole_match("^[a-z]{1,20}$") == "^[a-z]{1,20}$"
    assert whole_match("[a-z0-9._-]+") == "^(?:[a-z0-9._-]+)$"
    assert whole_match("^web|db$") == "^(?:^web|db$)$"  # an alternation is anchored as a whole
    import re
    assert not re.search(whole_match("[a-z0-9._-]+"), "/etc/shadow")
