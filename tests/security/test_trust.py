"""Trust follows ownership: what decides what runs is owned by root or rungd's user and
writable by no one else, all the way up its path (rungd.system.trust).

The attack these tests replay: a user who can write a folder the daemon reads (a tool folder,
a folder above a program, a plugin file) puts a file there, and a call runs it as rungd's
user. Each refusal is one line naming the path, the culprit's owner and mode, and the fix;
the tools it touches do not load and the rest of the daemon keeps serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from rungd.system import trust
from rungd.config import load_config
from rungd.testing import STUB_DESCRIPTION, serve_tool_file, start_daemon, write_config
from tests.conftest import FAKES

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def tool(name: str, command: Path | str, argv: str = "[]") -> str:
    return (f'[programs.{name}]\ncommand = "{command}"\n\n[tools.{name}]\nprogram = "{name}"\nargv = {argv}\n'
            f'[tools.{name}.description]\n{STUB_DESCRIPTION}\n[tools.{name}.parse]\nkind = "lines"\n')


def program(folder: Path, name: str, marker: Path) -> Path:
    """A program that leaves ``marker`` behind when it runs: proof that a call ran it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho ran > {marker}\necho ok\n")
    path.chmod(0o755)
    return path


# --- the rule, on real files -------------------------------------------------------------


def test_a_folder_writable_by_others_above_a_file_is_named_with_its_mode_and_fix(short_tmp) -> None:
    shared = short_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "x.toml").write_text("")
    with pytest.raises(trust.Untrusted) as caught:
        trust.check(shared / "x.toml", "tool file")
    message = str(caught.value)
    assert "\n" not in message
    assert f"bad ownership or modes for tool file {shared / 'x.toml'}" in message
    assert f"{shared} is writable by group and others (mode 0777)" in message
    assert f"chmod go-w {shared}" in message
    assert caught.value.culprit == str(shared)


def test_a_group_writable_file_is_refused_and_a_private_one_passes(short_tmp) -> None:
    path = short_tmp / "tools.toml"
    path.write_text("")
    path.chmod(0o664)
    with pytest.raises(trust.Untrusted, match=r"writable by group \(mode 0664\)"):
        trust.check(path, "tool file")
    path.chmod(0o644)
    trust.check(path, "tool file")


@as_root
def test_a_file_owned_by_another_user_is_refused_with_chown_as_the_fix(short_tmp) -> None:
    path = short_tmp / "tools.toml"
    path.write_text("")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(trust.Untrusted, match=rf"owned by .*\(uid {NOBODY}\).*hint: chown root {path}"):
        trust.check(path, "tool file")


@as_root
def test_a_sticky_world_writable_folder_is_a_parent_only_for_entries_owned_right(short_tmp) -> None:
    sticky = short_tmp / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    ours = sticky / "ours"
    ours.mkdir()
    trust.check(ours, "tool folder")  # as /tmp/x owned by root: nobody else may replace it
    theirs = sticky / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(trust.Untrusted, match="owned by"):
        trust.check(theirs, "tool folder")
    with pytest.raises(trust.Untrusted, match="writable by group and others"):
        trust.check(sticky, "tool folder")  # the sticky folder itself names what runs: refused


@as_root
def test_a_link_is_followed_and_a_link_another_user_owns_in_a_sticky_folder_is_refused(short_tmp) -> None:
    target = short_tmp / "real"
    target.mkdir()
    link = short_tmp / "link"
    link.symlink_to(target)
    trust.check(link, "tool folder")
    (short_tmp / "elsewhere").mkdir()
    (short_tmp / "elsewhere").chmod(0o777)
    (short_tmp / "elsewhere" / "t").mkdir()
    (short_tmp / "away").symlink_to(short_tmp / "elsewhere" / "t")
    with pytest.raises(trust.Untrusted, match=f"on its path: {short_tmp / 'elsewhere'}"):
        trust.check(short_tmp / "away", "tool folder")
    sticky = short_tmp / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.symlink(target, sticky / "theirs")
    os.lchown(sticky / "theirs", NOBODY, NOBODY)  # they could swap it for a link of their choice
    with pytest.raises(trust.Untrusted, match="owned by"):
        trust.check(sticky / "theirs", "tool folder")


def test_a_recheck_sees_a_folder_made_writable_after_it_was_trusted(short_tmp) -> None:
    folder = short_tmp / "bin"
    path = program(folder, "tool", short_tmp / "ran")
    cache = trust.Trust()
    cache.program(str(path), "/usr/bin")
    folder.chmod(0o777)
    with pytest.raises(trust.Untrusted, match="writable by group and others"):
        cache.program(str(path), "/usr/bin")


def test_a_bare_name_is_refused_when_a_folder_searched_before_it_is_writable(short_tmp) -> None:
    early = short_tmp / "early"
    early.mkdir()
    early.chmod(0o777)  # whoever may write it could put a `true` in front of /usr/bin's
    with pytest.raises(trust.Untrusted, match=f"folder on PATH searched for true {early}"):
        trust.Trust().program("true", f"{early}:/usr/bin:/bin")
    trust.Trust().program("true", "/usr/bin:/bin")
    # A folder on PATH that does not exist is judged by the folder that would hold it.
    with pytest.raises(trust.Untrusted, match="folder above"):
        trust.Trust().program("true", f"{early}/missing:/usr/bin")


def test_a_path_a_tool_fixes_in_argv_is_judged_as_what_it_names(short_tmp) -> None:
    sticky = short_tmp / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    trust.check_operand(sticky, "path")  # df /tmp: a sticky folder named is fine
    trust.check_operand("/dev/null", "path")  # 0666, but what it gives is the kernel's
    trust.check_operand(sticky / "report.out", "path")  # not made yet: only root's or ours can be
    shared = short_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(trust.Untrusted, match=f"{shared} is writable by group and others"):
        trust.check_operand(shared, "path")
    with pytest.raises(trust.Untrusted, match=f"on its path: {shared}"):
        trust.check_operand(shared / "job.sql", "path")  # anyone could make it first
    theirs = sticky / "job.sql"
    theirs.write_text("select 1;\n")
    os.chown(theirs, NOBODY, NOBODY) if os.geteuid() == 0 else theirs.chmod(0o666)
    with pytest.raises(trust.Untrusted):
        trust.check_operand(theirs, "path")


def test_a_path_not_made_at_first_is_judged_again_once_someone_makes_it(short_tmp) -> None:
    sticky = short_tmp / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    cache = trust.Trust()
    cache.operand(str(sticky / "job.sql"), "path")
    (sticky / "job.sql").write_text("select 1;\n")
    (sticky / "job.sql").chmod(0o666)
    with pytest.raises(trust.Untrusted, match="job.sql is writable by group and others"):
        cache.operand(str(sticky / "job.sql"), "path")


# --- a daemon: what is refused does not load, the rest serves -----------------------------


async def test_a_tool_folder_others_can_write_loads_nothing_and_the_other_folder_serves(short_tmp, nursery) -> None:
    marker = short_tmp / "ran"
    good, bad = short_tmp / "good", short_tmp / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "good.toml").write_text(tool("good_list_show", "/bin/echo", '["hello"]'))
    (bad / "bad.toml").write_text(tool("evil_list_show", program(short_tmp / "p", "evil", marker)))
    bad.chmod(0o777)
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{good}", "{bad}"]\n'))
    daemon = await start_daemon(nursery, config)
    assert "good_list_show" in daemon.daemon.tools and "evil_list_show" not in daemon.daemon.tools
    [refused] = daemon.daemon.hooks.refused
    assert f"bad ownership or modes for tool folder {bad}" in refused and "chmod go-w" in refused
    env = await daemon.call("evil_list_show", {})
    assert env.error.code == "UNKNOWN_TOOL"
    assert (await daemon.call("good_list_show", {})).status == "ok"
    assert not marker.exists()
    daemon.daemon.stop()


async def test_a_program_in_a_folder_others_can_write_is_refused_at_load(short_tmp, nursery) -> None:
    marker = short_tmp / "ran"
    drop = short_tmp / "drop"
    evil = program(drop, "evil", marker)
    drop.chmod(0o1777)  # even sticky: the program itself is not what is checked in a sticky folder
    evil.chmod(0o777)
    daemon = await serve_tool_file(nursery, short_tmp, tool("evil_list_show", evil) + tool("echo_list_show", "/bin/echo"))
    # The whole file: one of its programs cannot be trusted.
    assert not {"evil_list_show", "echo_list_show"} & set(daemon.daemon.tools)
    [refused] = daemon.daemon.hooks.refused
    assert f"{evil} is writable by group and others (mode 0777)" in refused
    assert "the tools of" in refused
    daemon.daemon.stop()


async def test_a_program_made_replaceable_after_load_is_not_run_by_the_next_call(short_tmp, nursery) -> None:
    marker = short_tmp / "ran"
    folder = short_tmp / "bin"
    evil = program(folder, "tool", marker)
    daemon = await serve_tool_file(nursery, short_tmp, tool("t_list_show", evil))
    assert (await daemon.call("t_list_show", {})).status == "ok"
    marker.unlink()
    folder.chmod(0o777)
    env = await daemon.call("t_list_show", {})
    assert (env.status, env.error.code, env.outcome) == ("error", "FAILED", "not_started")
    assert "bad ownership or modes for program" in env.error.message
    assert not marker.exists()
    daemon.daemon.stop()


async def test_a_reload_drops_a_tool_file_made_writable_and_keeps_serving_the_rest(short_tmp, nursery) -> None:
    tools = short_tmp / "tools"
    tools.mkdir()
    (tools / "a.toml").write_text(tool("a_list_show", "/bin/echo"))
    (tools / "b.toml").write_text(tool("b_list_show", "/bin/echo"))
    config = load_config(write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n'))
    daemon = await start_daemon(nursery, config)
    assert {"a_list_show", "b_list_show"} <= set(daemon.daemon.tools)
    (tools / "b.toml").chmod(0o666)
    daemon.daemon.reload()
    assert "a_list_show" in daemon.daemon.tools and "b_list_show" not in daemon.daemon.tools
    assert "b.toml is writable by group and others" in daemon.daemon.hooks.refused[0]
    assert (await daemon.call("a_list_show", {})).status == "ok"
    daemon.daemon.stop()


async def test_a_script_a_tool_fixes_in_argv_must_be_owned_right_at_load_and_at_each_call(short_tmp, nursery) -> None:
    jobs = short_tmp / "jobs"
    jobs.mkdir()
    good, bad = jobs / "good.sql", jobs / "bad.sql"
    good.write_text("select 1;\n")
    bad.write_text("select 2;\n")
    bad.chmod(0o666)  # anyone could write the SQL this tool runs
    daemon = await serve_tool_file(nursery, short_tmp, tool("bad_list_show", "/bin/cat", f'["--", "{bad}"]'))
    assert "bad_list_show" not in daemon.daemon.tools
    [refused] = daemon.daemon.hooks.refused
    assert f"bad ownership or modes for path in {short_tmp}" in refused and "tools.bad_list_show.argv[1]" in refused
    assert f"{bad} is writable by group and others (mode 0666)" in refused and "chmod go-w" in refused
    daemon.daemon.stop()
    (short_tmp / "second").mkdir()
    daemon = await serve_tool_file(nursery, short_tmp / "second", tool("good_list_show", "/bin/cat", f'["{good}"]'))
    env = await daemon.call("good_list_show", {})
    assert (env.status, env.fields["lines"]) == ("ok", ["select 1;"]), env.error
    jobs.chmod(0o777)  # now anyone could swap the file for one of theirs
    env = await daemon.call("good_list_show", {})
    assert (env.status, env.error.code, env.outcome) == ("error", "FAILED", "not_started")
    assert f"bad ownership or modes for path in the tool's argv {good}" in env.error.message
    daemon.daemon.stop()


async def test_lint_against_the_running_daemon_names_what_it_refused_to_operators_only(short_tmp, nursery) -> None:
    tools = short_tmp / "tools"
    tools.mkdir()
    (tools / "a.toml").write_text(tool("a_list_show", "/bin/echo"))
    (tools / "b.toml").write_text(tool("b_list_show", "/bin/echo"))
    (tools / "b.toml").chmod(0o666)
    config = load_config(write_config(short_tmp, f'[access]\nuids = [0, {NOBODY}]\n[plugins]\ntool_dirs = ["{tools}"]\n'))
    config = config.model_copy(update={"server": config.server.model_copy(update={"socket_mode": "0666"})})
    short_tmp.chmod(0o755)
    daemon = await start_daemon(nursery, config)
    done = await trio.run_process([sys.executable, "-m", "rungd.ctl", "lint", "--json", "--socket", str(daemon.socket)],
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 1, done.stderr  # a fix-first finding
    [finding] = [f for f in json.loads(done.stdout)["findings"] if f["code"] == "UNTRUSTED_FILE"]
    assert f"{tools / 'b.toml'} is writable by group and others" in finding["message"]
    if os.geteuid() == 0:  # another caller learns nothing of the daemon's files
        script = (f"import os\nfrom rungd.client import Client\nos.setgroups([]); os.setgid({NOBODY}); "
                  f"os.setuid({NOBODY})\nlisting = Client({str(daemon.socket)!r}).tool_listing()\n"
                  "print('a_list_show' in [t.name for t in listing.tools], listing.refused)\n")
        seen = await trio.run_process([sys.executable, "-c", script], capture_stdout=True, capture_stderr=True)
        assert seen.stdout.decode().strip() == "True []", seen.stderr
    daemon.daemon.stop()


def test_check_config_lists_each_refusal_and_still_succeeds(short_tmp) -> None:
    tools = short_tmp / "tools"
    tools.mkdir()
    (tools / "a.toml").write_text(tool("a_list_show", "/bin/echo"))
    (tools / "b.toml").write_text(tool("b_list_show", "/bin/echo"))
    (tools / "b.toml").chmod(0o646)
    path = write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n')
    done = subprocess.run([sys.executable, "-m", "rungd.main", "check-config", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "a_list_show" in done.stdout and "b_list_show" not in done.stdout
    [line] = [line for line in done.stderr.splitlines() if "refused:" in line]
    assert f"{tools / 'b.toml'} is writable by others (mode 0646)" in line and "chmod go-w" in line
    assert "refused:   1" in done.stdout


def test_a_config_file_others_can_write_stops_start_up_with_the_fix(short_tmp) -> None:
    path = write_config(short_tmp, "")
    path.chmod(0o666)
    done = subprocess.run([sys.executable, "-m", "rungd.main", "check-config", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"bad ownership or modes for config {path}" in done.stderr and "chmod go-w" in done.stderr


async def test_a_plugin_file_others_can_write_is_not_imported(short_tmp, nursery) -> None:
    marker = short_tmp / "imported"
    plugin = short_tmp / "plugin.py"
    plugin.write_text(f"open({str(marker)!r}, 'w').close()\n")
    plugin.chmod(0o666)
    config = load_config(write_config(short_tmp, f'[plugins]\nfiles = ["{plugin}"]\n'))
    daemon = await start_daemon(nursery, config)
    assert not marker.exists()
    assert any("plugins.files" in line and "that plugin is not loaded" in line for line in daemon.daemon.hooks.refused)
    daemon.daemon.stop()


# --- the askpass helper: no program can replace what a later call runs ---------------------


REPLACER = f"""#!{sys.executable}
import os, sys
stolen = sys.argv[1]
script = os.environ["SSH_ASKPASS"]
evil = "#!/bin/sh\\necho \\"$(cat)$*\\" > " + stolen + "\\necho stolen-answer\\n"
done = []
for how in ("write", "replace", "unlink"):
    try:
        if how == "write":
            with open(script, "w") as f:
                f.write(evil)
        elif how == "replace":
            tmp = os.path.join(os.path.dirname(script), "x")
            with open(tmp, "w") as f:
                f.write(evil)
            os.chmod(tmp, 0o755)
            os.rename(tmp, script)
        else:
            os.unlink(script)
        done.append(how)
    except OSError as exc:
        done.append(how + ":" + exc.strerror)
print(" ".join(done))
"""


async def test_a_program_cannot_replace_the_askpass_helper_a_later_call_runs(short_tmp, nursery) -> None:
    stolen = short_tmp / "stolen"
    replacer = short_tmp / "replacer"
    replacer.write_text(REPLACER)
    replacer.chmod(0o755)
    act = short_tmp / "acted"
    creds = short_tmp / "creds.toml"
    creds.write_text('deploy = "s3cret-pass"\n')
    creds.chmod(0o600)
    text = (tool("evil_list_show", replacer, f'["{stolen}"]')
            + tool("key_list_show", FAKES / "askpass_asker", f'["--ask", "Passphrase:", "--act", "{act}"]')
            + '[[tools.key_list_show.askpass]]\npattern = "^Passphrase:"\ncredential = "deploy"\n')
    daemon = await serve_tool_file(nursery, short_tmp, text, config=f'[credentials]\nfile = "{creds}"\n')
    evil = await daemon.call("evil_list_show", {})
    assert evil.status == "ok", evil.error
    key = await daemon.call("key_list_show", {})
    assert key.status == "ok", key.error
    assert act.read_text() == f"secret length {len('s3cret-pass')}\n"  # the real helper answered
    assert not stolen.exists(), f"the replaced helper ran: {evil.fields}"
    daemon.daemon.stop()


def test_the_paths_a_tool_fixes_are_its_literal_absolute_words_never_its_inputs() -> None:
    from rungd_plugins.declarative.programs import fixed_paths
    argv = ["-f", "/etc/app/../app/job.sql", "--script=/opt/jobs/n.job", "{path}", "/srv/{name}",
            "--password-file={credential_file:db}", "-x=relative", "/tmp"]
    assert fixed_paths(argv) == [(1, "/etc/app/job.sql"), (2, "/opt/jobs/n.job"), (7, "/tmp")]


async def test_a_daemon_that_cannot_use_a_memfd_runs_a_helper_root_owns(short_tmp, nursery, monkeypatch) -> None:
    # A non-root daemon with the drop-in's capabilities cannot hand its programs a memfd (and
    # some hosts forbid executable ones): the branch such a daemon takes, taken here as root.
    from rungd.runner import askpass_server
    monkeypatch.setattr(askpass_server, "_sealed_helper", lambda: None)
    asked = short_tmp / "asked"
    creds = short_tmp / "creds.toml"
    creds.write_text('deploy = "s3cret-pass"\n')
    creds.chmod(0o600)
    printenv = tool("which_list_show", "/usr/bin/printenv", '["SSH_ASKPASS"]')
    text = (printenv + tool("key_list_show", FAKES / "askpass_asker", f'["--ask", "Passphrase:", "--act", "{asked}"]')
            + '[[tools.key_list_show.askpass]]\npattern = "^Passphrase:"\ncredential = "deploy"\n')
    daemon = await serve_tool_file(nursery, short_tmp, text, config=f'[credentials]\nfile = "{creds}"\n')
    which = await daemon.call("which_list_show", {})
    [script] = which.fields["lines"]
    # The run-as folder's: root's, in a folder root owns and none may list or rename in.
    folder = Path(script).parent
    assert folder.name.startswith(".rungd-as-") and Path(script).name == "askpass"
    assert (os.stat(script).st_uid, os.stat(folder).st_uid, oct(os.stat(folder).st_mode & 0o7777)) == (0, 0, "0o1733")
    assert not (daemon.config.state_dir / "work" / ".askpass").exists()
    key = await daemon.call("key_list_show", {})
    assert key.status == "ok", key.error
    assert asked.read_text() == f"secret length {len('s3cret-pass')}\n"  # that helper answered
    daemon.daemon.stop()


def test_an_installed_helper_root_does_not_own_is_not_used(short_tmp, monkeypatch) -> None:
    from rungd.runner import askpass_server
    bin_ = short_tmp / "bin"
    bin_.mkdir()
    (bin_ / "rungd-askpass").write_text("#!/bin/false\n")
    (bin_ / "rungd-askpass").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_ / "python3"))
    assert askpass_server.installed_helper() == bin_ / "rungd-askpass"
    if os.geteuid() == 0:
        os.chown(bin_ / "rungd-askpass", NOBODY, NOBODY)  # a file its programs' user could write
        assert askpass_server.installed_helper() is None
    bin_.chmod(0o777)
    assert askpass_server.installed_helper() is None
