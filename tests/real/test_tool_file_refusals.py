"""What a tool file may not say, refused when it loads with its file and key: programs that
would run a command rungd cannot see (judged by what would be executed, through symlinks
and wrappers' argv), literal braces that would crash a call, and expectations that could
not be judged. Real programs of this host are resolved; nothing is run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rungd.core.errors import ConfigError
from rungd.system.trust import Untrusted
from rungd_plugins.declarative import read_tool_file

BASE = """
[program]
name = "x"
command = "{cmd}"

[tools.x_item_show]
argv = {argv}
{more}

[tools.x_item_show.description]
does = "a"
use_when = "a"
do_not_use_when = "a"
returns = "a"
on_error = "a"
if_unknown = "a"

[tools.x_item_show.inputs.v]
description = "v"
{input}
"""


def stand_in(folder: Path, name: str) -> Path:
    """An executable named ``name``: the loader judges programs by name; nothing runs it."""
    path = folder / name
    path.write_text("#!/bin/true\n")
    path.chmod(0o755)
    return path


def load(tmp_path: Path, cmd: str, argv: str, more: str = "", input: str = 'example = "a"') -> None:
    """Load a one-tool file: ``more`` are keys of the tool, ``input`` those of its input v."""
    path = tmp_path / "x.toml"
    path.write_text(BASE.replace("{cmd}", cmd).replace("{argv}", argv).replace("{more}", more)
                    .replace("{input}", input))
    read_tool_file(path)


def refusal(tmp_path: Path, cmd: str, argv: str, more: str = "") -> str:
    """The one-line error a one-tool file is refused with at load."""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, cmd, argv, more)
    return str(caught.value)


@pytest.mark.parametrize(("cmd", "argv", "key", "words"), [
    ("nice", '["bash", "-c", "{v}"]', "program.command", "runs another program"),
    ("/usr/bin/env", '["{v}"]', "program.command", "runs another program"),
    ("timeout", '["5", "id"]', "program.command", "runs another program"),
    ("xargs", '["rm"]', "program.command", "runs another program"),
    ("sh", '["-c", "{v}"]', "program.command", "shell or script interpreter"),
    ("perl", '["-e", "{v}"]', "program.command", "shell or script interpreter"),
    ("sudo", '["id"]', "tools.x_item_show.argv[0]", "declared target user"),
    ("sudo", '["-u", "{v}", "id"]', "tools.x_item_show.argv[1]", "never an input"),
    ("sudo", '["-u", "nobody", "-s"]', "tools.x_item_show.argv[2]", "runs a shell"),
    ("sudo", '["-u", "nobody", "--", "nice", "id"]', "tools.x_item_show.argv[3]", "runs another program"),
    ("runuser", '["nobody", "-c", "id"]', "tools.x_item_show.argv[0]", "declared target user"),
    ("find", '[".", "-exec", "sh", "-c", "x", ";"]', "tools.x_item_show.argv[2]", "shell"),
    ("find", '[".", "-exec", "{v}", ";"]', "tools.x_item_show.argv[2]", "from an input"),
    ("find", '[".", "-exec", "rm", "{}", "+"]', "tools.x_item_show.argv[3]", "write {{}}"),
    ("tar", '["--to-command=sh -c x", "-xf", "a"]', "tools.x_item_show.argv[0]", "shell"),
    ("man", '["-P", "sh -c x", "{v}"]', "tools.x_item_show.argv[1]", "shell"),
    ("ls", '["{v.__class__}"]', "tools.x_item_show.argv[0]", "not a plain {input}"),
    # Read as the program's own option parser reads them: bundled short flags, unique long
    # prefixes, git's config options, ssh's -o with a space.
    ("tar", '["-xvIsh", "-f", "a"]', "tools.x_item_show.argv[0]", "shell"),
    ("tar", '["--to-com=sh", "-xf", "a"]', "tools.x_item_show.argv[0]", "shell"),
    ("git", '["-c", "alias.x=!sh -c id", "x"]', "tools.x_item_show.argv[1]", "can make git run a program"),
    ("git", '["-c", "core.pager=sh", "log"]', "tools.x_item_show.argv[1]", "can make git run a program"),
    ("ssh", '["-o", "ProxyCommand sh -c id", "host"]', "tools.x_item_show.argv[1]", "shell"),
    ("sudo", '["-u", "root", "--sh", "id"]', "tools.x_item_show.argv[2]", "runs a shell"),
    ("ssh", '["-p", "22", "host", "cat", "{v}"]', "tools.x_item_show.argv[4]", "remote shell"),
    ("sudo", '["-nuroot", "sh", "-c", "id"]', "tools.x_item_show.argv[1]", "shell"),
    ("sudo", '["-u", "root", "-X", "id"]', "tools.x_item_show.argv[2]", "not an option rungd knows"),
    # sed's e command and s///e flag run a shell, w writes files: only with --sandbox.
    ("sed", '["-n", "s/a/{v}/p", "f"]', "tools.x_item_show.argv[0]", "add '--sandbox'"),
    ("sed", '["-n", "--", "--sandbox", "f"]', "tools.x_item_show.argv[0]", "add '--sandbox'"),
    ("sudo", '["-u", "nobody", "sed", "1e id", "f"]', "tools.x_item_show.argv[3]", "add '--sandbox'"),
    # sqlite3 runs .shell, .system and edit() from its input, reads and writes files: only -safe.
    ("sqlite3", '["-batch", "db", "{v}"]', "tools.x_item_show.argv[0]", "add '-safe'"),
    ("sqlite3", '["-safe", "-cmd", "{v}", "db"]', "tools.x_item_show.argv[2]", ".trace"),
    # Options that name a program, found by attacking the loader (issue 13's review).
    ("sort", '["--compress-program=dash", "f"]', "tools.x_item_show.argv[0]", "shell"),
    ("tar", '["tIf", "sh -c x", "a.tar"]', "tools.x_item_show.argv[0]", "old-style"),
    ("tar", '["--list", "--file", "{v}"]', "tools.x_item_show.argv[2]", "--force-local"),
    ("tar", '["cf", "{v}", "/srv/src"]', "tools.x_item_show.argv[1]", "--force-local"),
    ("tar", '["--list", "-f", "x{v}.tar"]', "tools.x_item_show.argv[2]", "--force-local"),
    ("ip", '["-ba", "/srv/{v}"]', "tools.x_item_show.argv[0]", "batch"),
    ("ip", '["netns", "e", "blue", "id"]', "tools.x_item_show.argv[1]", "exec runs another program"),
    ("apt-get", '["-o", "Acquire::http::Proxy-Auto-Detect=/tmp/x", "update"]', "tools.x_item_show.argv[1]", "hooks"),
    ("git", '["-c", "safe.directory=*", "status"]', "tools.x_item_show.argv[1]", "can make git run a program"),
    ("git", '["--git-dir=/srv/{v}/.git", "status"]', "tools.x_item_show.argv[0]", "who owns"),
    ("apt-get", '["-o", "APT::Update::Post-Invoke::=id", "update"]', "tools.x_item_show.argv[1]", "hooks"),
    ("crontab", '["-u", "root", "/srv/{v}"]', "tools.x_item_show.argv[2]", "never the table"),
])
def test_a_program_that_would_run_a_hidden_command_is_refused_at_load(tmp_path, cmd, argv, key, words) -> None:
    message = refusal(tmp_path, cmd, argv)
    assert f"{tmp_path / 'x.toml'}: key {key}:" in message and words in message, message


@pytest.mark.parametrize(("cmd", "argv"), [
    ("find", '[".", "-maxdepth", "1", "-name", "*.tmp", "-exec", "rm", "--", "{{}}", "+"]'),
    ("sudo", '["-n", "-u", "nobody", "--", "id", "-un"]'),
    ("runuser", '["-u", "nobody", "--", "id"]'),
    ("man", '["-P", "cat", "{v}"]'),
    ("git", '["-c", "credential.helper=", "-c", "user.name=rungd", "log"]'),
    ("sed", '["--sandbox", "-n", "s/a/{v}/p", "f"]'),
    ("tar", '["--force-local", "--list", "--file", "{v}"]'),
    ("tar", '["--list", "--file", "/srv/out/{v}.tar"]'),
    ("tar", '["--create", "--checkpoint=10", "--file", "/srv/out/a.tar", "--", "/srv/src"]'),
    ("sqlite3", '["-safe", "-batch", "db", "SELECT 1;"]'),
])
def test_wrappers_with_a_declared_target_and_literal_programs_load(tmp_path, cmd, argv) -> None:
    load(tmp_path, cmd, argv)


@pytest.mark.parametrize(("more", "key", "words"), [
    ('stdin_input = "v"\nstdin = "eof"\nstdin_eof = true', "tools.x_item_show.stdin", "closes stdin before any data"),
    # Without stdin_eof too: it loaded, then every call hung until its deadline.
    ('stdin_input = "v"\nstdin = "eof"', "tools.x_item_show.stdin", "closes stdin before any data"),
    ("stdin_eof = true", "tools.x_item_show.stdin_eof", "without data"),
    ('program = "other"', "tools.x_item_show.program", "not a [programs.NAME]"),
    ('user = "no-such-account-rungd"', "tools.x_item_show.user", "no account"),
])
def test_stdin_program_and_user_keys_are_checked_at_load(tmp_path, more, key, words) -> None:
    message = refusal(tmp_path, "ls", '["{v}"]', more)
    assert f"key {key}:" in message and words in message, message


@pytest.mark.parametrize(("name", "argv", "more", "key"), [
    ("psql", '["-X", "-d", "app"]', 'stdin_input = "v"\nstdin_eof = true', "tools.x_item_show.stdin_input"),
    ("psql", '["-X", "-c", "{v}"]', "", "tools.x_item_show.argv[2]"),
    ("mysql", '["--execute={v}"]', "", "tools.x_item_show.argv[0]"),
    ("smbclient", '["//h/s", "-c", "get {v}"]', "", "tools.x_item_show.argv[2]"),
    ("crontab", '["-u", "root", "-"]', 'stdin_input = "v"\nstdin_eof = true', "tools.x_item_show.stdin_input"),
    ("sqlite3", '["-safe", "db"]', 'stdin_input = "v"\nstdin_eof = true', "tools.x_item_show.stdin_input"),
])
def test_a_command_client_never_runs_an_input_as_its_script(tmp_path, name, argv, more, key) -> None:
    # Their command languages run a shell (psql and mysql "\\!", smbclient "!") and cannot be
    # told not to. The client itself is a stand-in: only its name is judged, nothing runs.
    client = stand_in(tmp_path, name)
    message = refusal(tmp_path, str(client), argv, more)
    assert f"key {key}:" in message and ("reads commands" in message or "command language" in message), message
    if name != "sqlite3":
        load(tmp_path, str(client), '["-X", "-c", "SELECT 1"]')  # a fixed script loads


@pytest.mark.parametrize("name", ["vim.basic", "perl5.36-x86_64-linux-gnu", "editor", "make", "pydoc3", "logsave",
                                  "ld-linux-x86-64.so.2", "systemd-cat"])
def test_interpreters_and_wrappers_are_known_by_their_distribution_names(tmp_path, name) -> None:
    with pytest.raises(ConfigError, match=r"key program\.command: .*(interpreter|runs another program)"):
        load(tmp_path, str(stand_in(tmp_path, name)), '["{v}"]')


@pytest.mark.parametrize("key", ["credentials", "credential_files"])
def test_a_credential_is_never_given_under_a_name_that_runs_a_program(tmp_path, key) -> None:
    message = refusal(tmp_path, "ls", '["{v}"]', f'{key} = {{ GIT_SSH_COMMAND = "deploy" }}')
    assert f"key tools.x_item_show.{key}.GIT_SSH_COMMAND: a tool file may not set" in message


def test_harmless_environment_loads(tmp_path) -> None:
    load(tmp_path, "ls", '["{v}"]', 'env = { PYTHONUNBUFFERED = "1", SSL_CERT_FILE = "/etc/ssl/x.pem", '
                                    'BACKUP_DIR = "/srv/b", XDG_RUNTIME_DIR = "/run/user/0", PGHOST = "db", '
                                    'LANG = "C.UTF-8", MANWIDTH = "80", DATA_SRC = "a" }')


def test_multiline_is_only_for_the_input_fed_on_stdin(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"key tools\.x_item_show\.inputs\.v\.multiline: only the input fed"):
        load(tmp_path, "ls", '["{v}"]', input='example = "a"\nmultiline = true')


@pytest.mark.parametrize("variable", ["PAGER", "GIT_PAGER", "GIT_SSH_COMMAND", "GIT_CONFIG_KEY_0", "LD_PRELOAD",
                                      "BASH_ENV", "RUNGD_CALL", "EDITOR", "TAR_OPTIONS", "ZIPOPT", "PATH",
                                      "PYTHONWARNINGS", "BASH_FUNC_x", "BORG_PASSCOMMAND", "CLOUDSDK_PYTHON",
                                      "RUNGD_ASKPASS_SOCKET", "DISPLAY", "GPG_TTY", "VISUAL"])
def test_environment_that_names_a_program_is_refused_at_load(tmp_path, variable) -> None:
    message = refusal(tmp_path, "ls", '["{v}"]', f'env = {{ {variable} = "sh -c id" }}')
    assert f"key tools.x_item_show.env.{variable}: a tool file may not set {variable}" in message
    assert "plugins/README.md" in message  # where the table of what may be set is


@pytest.mark.parametrize("value", ["/dev/pts/3", "/dev/tty", "/dev/tty1", "/dev/console", "/srv/a:/dev/pts/0"])
def test_a_value_that_names_a_terminal_is_refused_whatever_the_variable(tmp_path, value) -> None:
    # Issue 29: sent to a terminal, a helper outside the call (a key agent's PIN entry) draws
    # there; the call's own terminal is reached by /dev/tty, never named.
    for variable in ("MY_TTY", "PINENTRY_TERMINAL", "HOME"):
        message = refusal(tmp_path, "ls", '["{v}"]', f'env = {{ {variable} = "{value}" }}')
        assert f"key tools.x_item_show.env.{variable}: {value!r} names a terminal" in message


@pytest.mark.parametrize("terminal", ["line", "none"])
def test_a_tool_says_whether_its_program_gets_a_terminal(tmp_path, terminal) -> None:
    load(tmp_path, "ls", '["{v}"]', f'terminal = "{terminal}"')
    assert "terminal" in refusal(tmp_path, "ls", '["{v}"]', 'terminal = "screen"')


@pytest.mark.parametrize("variable", ["HOME", "OPENSSL_CONF", "GIT_DIR", "WGETRC", "KUBECONFIG", "AWS_CONFIG_FILE",
                                      "GNUPGHOME", "SSH_AUTH_SOCK", "KRB5_CONFIG", "MYAPP_CONFIG_FILE"])
def test_a_variable_that_names_a_path_takes_only_a_fixed_absolute_path(tmp_path, variable) -> None:
    for value in ("sh -c id", "relative/dir", "/srv/{v}"):
        message = refusal(tmp_path, "ls", '["{v}"]', f'env = {{ {variable} = "{value}" }}')
        assert f"key tools.x_item_show.env.{variable}: {value!r} must be a fixed absolute path" in message


def test_a_path_variable_owned_right_loads_and_one_others_can_write_is_refused(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    load(tmp_path, "ls", '["{v}"]', f'env = {{ HOME = "{home}", GNUPGHOME = "{home}/.gnupg", '
                                    f'SSH_AUTH_SOCK = "{home}/agent.sock", KRB5CCNAME = "FILE:{home}/cc" }}')
    home.chmod(0o777)
    for variable in ("HOME", "GNUPGHOME", "MYAPP_DATA"):  # MYAPP_DATA: any value that is a path
        with pytest.raises(Untrusted, match=f"bad ownership or modes for path set in .* {home} is writable by "
                                             r"group and others \(mode 0777\)"):
            load(tmp_path, "ls", '["{v}"]', f'env = {{ {variable} = "{home}/x" }}')


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_user_tools_own_home_is_trusted_for_that_tool_only(tmp_path) -> None:
    home = tmp_path / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    load(tmp_path, "ls", '["{v}"]', f'user = "nobody"\nenv = {{ HOME = "{home}" }}')
    with pytest.raises(Untrusted, match=r"owned by nobody \(uid 65534\)"):
        load(tmp_path, "ls", '["{v}"]', f'env = {{ HOME = "{home}" }}')


@pytest.mark.parametrize(("name", "argv", "more", "key", "words"), [
    # Languages that read any file by name: the caller's text would print /etc/shadow back.
    ("cpp", '["-P"]', 'stdin_input = "v"\nstdin_eof = true', "tools.x_item_show.stdin_input", "#include"),
    ("gcc", '["-fsyntax-only", "-x", "c", "-"]', 'stdin_input = "v"\nstdin_eof = true',
     "tools.x_item_show.stdin_input", "#include"),
    ("as", '["-a"]', 'stdin_input = "v"\nstdin_eof = true', "tools.x_item_show.stdin_input", ".include"),
    ("groff", '["-Tutf8", "-man"]', 'stdin_input = "v"\nstdin_eof = true', "tools.x_item_show.stdin_input", ".so"),
    ("jq", '["-n", "{v}"]', "", "tools.x_item_show.argv[1]", "$ENV"),
    ("jq", '["--arg", "name", "x", "{v}"]', "", "tools.x_item_show.argv[3]", "$ENV"),
    # ps reads "e" as "show every environment"; sqlite3 reads a word an input begins as a dot-command.
    ("ps", '["-o", "pid=,args=", "{v}"]', "", "tools.x_item_show.argv[2]", "integer or an enum"),
    ("sqlite3", '["-safe", "-readonly", "/srv/n.db", "{v}"]', "", "tools.x_item_show.argv[3]", ".trace"),
    ("sqlite3", '["-safe", "/srv/n.db", "SELECT 1 WHERE x = \'{v}\'"]', "", "tools.x_item_show.argv[2]",
     "a quote in it"),
    # A URL's scheme or host from a free input: the caller would choose the server.
    ("curl", '["-s", "https://{v}/api"]', "", "tools.x_item_show.argv[1]", "scheme or host"),
    ("curl", '["-s", "{v}://api.example/x"]', "", "tools.x_item_show.argv[1]", "scheme or host"),
])
def test_a_program_that_reads_an_input_as_more_than_data_is_refused_at_load(tmp_path, name, argv, more, key,
                                                                             words) -> None:
    message = refusal(tmp_path, str(stand_in(tmp_path, name)), argv, more)
    assert f"key {key}:" in message and words in message, message


def test_the_safe_forms_of_those_programs_load(tmp_path) -> None:
    load(tmp_path, str(stand_in(tmp_path, "jq")), '["-n", "--arg", "name", "{v}", "$name"]')
    load(tmp_path, str(stand_in(tmp_path, "jq")), '["-c", ".items"]', 'stdin_input = "v"\nstdin_eof = true')  # data
    # SQL with an input held to a pattern that leaves it no quote; ps with a pid that is a number.
    load(tmp_path, str(stand_in(tmp_path, "sqlite3")),
         '["-safe", "-readonly", "/srv/n.db", "SELECT count FROM t WHERE item = \'{v}\'"]',
         input='example = "a"\npattern = "^[a-z]+$"')
    load(tmp_path, str(stand_in(tmp_path, "ps")), '["-o", "pid=", "-p", "{v}"]', input='example = 1\ntype = "integer"')


def test_a_tool_with_credentials_takes_no_free_text_that_could_say_where_they_go(tmp_path) -> None:
    # ssh {host} with a password given by askpass: the caller would send it to a host of theirs.
    ssh = str(stand_in(tmp_path, "ssh"))
    prompt = 'askpass = [{ pattern = "password:", credential = "deploy_pw" }]'
    argv = '["-o", "BatchMode=no", "{v}", "uptime"]'
    assert "key tools.x_item_show.argv[2]: the tool holds credentials" in refusal(tmp_path, ssh, argv, prompt)
    load(tmp_path, ssh, argv, prompt, input='example = "web1"\nenum = ["web1", "web2"]')  # the hosts it may reach
