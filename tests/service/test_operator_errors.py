"""What an operator meets when a file or path is wrong: one line naming the file, path or
key, a hint, and the documented exit status (2 for a bad config, 1 for a path serve cannot
use), from ``rungd check-config`` and ``rungd serve`` alike."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import trio

from rungd import main as rungd_main
from rungd.config import embedded_configs, load_config
from rungd.service.credentials import CredentialStore
from rungd.service.daemon import Daemon
from rungd.core.errors import ConfigError
from rungd.testing import write_config
from tests.conftest import TEST_PLUGINS

NOT_UTF8 = b"# caf\xe9\n[program]\n"  # Latin-1, as an editor on an old host saves it


@pytest.fixture(autouse=True)
def _no_log_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    # rungd.main points the "rungd" logger at stdout; in-process that would outlive capsys.
    monkeypatch.setattr(rungd_main, "setup_logging", lambda *a, **k: None)

    async def served(daemon: Daemon) -> None:  # a config these tests refuse must never get here
        raise AssertionError("serve got past loading the config")

    monkeypatch.setattr(rungd_main, "run_until_signalled", served)


def rungd(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run ``rungd ARGS`` in this process: its exit status and its stderr, asserted one line."""
    status = rungd_main.main(list(args))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unexpected failure" not in err, err
    assert err.count("\n") == 1 and err.startswith("rungd: "), err
    return status, err


def with_tools(folder: Path, body: str = "") -> Path:
    tools = folder / "tools"
    tools.mkdir()
    shutil.copy(embedded_configs() / "tools" / "host.toml", tools / "host.toml")
    return write_config(folder, f'[plugins]\ntool_dirs = ["{tools}"]\n{body}', demo_plugins=False)


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_tool_file_not_in_utf8_is_named_with_its_line_and_exits_2(short_tmp, capsys, command) -> None:
    config = with_tools(short_tmp)
    (short_tmp / "tools" / "bin.toml").write_bytes(b"\n" + NOT_UTF8)
    status, err = rungd(capsys, command, "--config", str(config))
    assert status == 2
    assert f"{short_tmp / 'tools' / 'bin.toml'}: not valid UTF-8 (line 2, byte 0xe9)" in err and "hint:" in err


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_config_not_in_utf8_is_named_and_exits_2(short_tmp, capsys, command) -> None:
    config = short_tmp / "rungd.toml"
    config.write_bytes(b"[server]\n" + NOT_UTF8)
    status, err = rungd(capsys, command, "--config", str(config))
    assert status == 2
    assert f"{config}: not valid UTF-8 (line 2, byte 0xe9)" in err and "iconv" in err


def test_a_credentials_file_not_in_utf8_or_unreadable_is_named(short_tmp) -> None:
    creds = short_tmp / "credentials.toml"
    creds.write_bytes(b'pw = "s\xe9cret"\n')
    creds.chmod(0o600)
    with pytest.raises(ConfigError, match=rf"credentials.file: {creds}: not valid UTF-8 \(line 1, byte 0xe9\)"):
        CredentialStore(creds)
    creds.unlink()
    creds.mkdir(mode=0o700)  # a folder where the file should be: read fails with EISDIR
    with pytest.raises(ConfigError, match=rf"credentials.file: {creds}: cannot read it: Is a directory; hint:"):
        CredentialStore(creds)


def test_a_credential_from_systemd_not_in_utf8_is_named_without_its_bytes(short_tmp, monkeypatch) -> None:
    (short_tmp / "pw").write_bytes(b"s\xe9cret")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(short_tmp))
    with pytest.raises(ConfigError) as caught:
        CredentialStore(None).get("pw", "some_tool")
    assert str(caught.value).startswith("$CREDENTIALS_DIRECTORY/pw: not valid UTF-8; hint:")
    assert "e9" not in str(caught.value)


def test_a_reload_that_meets_a_file_not_in_utf8_logs_its_name(short_tmp, caplog) -> None:
    daemon = Daemon(load_config(with_tools(short_tmp)))
    bad = short_tmp / "tools" / "bin.toml"
    bad.write_bytes(NOT_UTF8)
    with caplog.at_level(logging.ERROR, logger="rungd"):
        daemon.reload()
    assert f"reload failed, nothing changed: {bad}: not valid UTF-8" in caplog.text
    assert set(daemon.tools) == {"host_disk_usage_show"}


def test_two_tool_files_defining_one_tool_are_both_named(short_tmp, capsys) -> None:
    config = with_tools(short_tmp)
    first, second = short_tmp / "tools" / "host.toml", short_tmp / "tools" / "host_copy.toml"
    shutil.copy(first, second)
    status, err = rungd(capsys, "check-config", "--config", str(config))
    assert status == 2
    assert f"tool 'host_disk_usage_show' is defined by two tool files: {first} and {second}" in err
    assert "rename [tools.host_disk_usage_show]" in err and "plugins.disable" not in err


def test_a_tool_file_clashing_with_a_python_plugin_is_not_fixed_by_disabling_every_tool_file(short_tmp, capsys) -> None:
    tools = short_tmp / "tools"
    tools.mkdir()
    (tools / "echo.toml").write_text((embedded_configs() / "tools" / "host.toml").read_text()
                                     .replace("host_disk_usage_show", "test_text_echo"))
    config = write_config(short_tmp, f'[plugins]\ntool_dirs = ["{tools}"]\n'
                                     f'files = ["{TEST_PLUGINS / "echo_tools.py"}"]\n', demo_plugins=False)
    status, err = rungd(capsys, "check-config", "--config", str(config))
    assert status == 2
    assert "'test_text_echo' is registered by two plugins" in err
    assert "rename [tools.test_text_echo] in its tool file" in err and "would drop every tool file" in err


@pytest.mark.parametrize(("body", "key", "guess"), [
    ("[plugins.settings.gti_repo]\n", "plugins.settings.gti_repo: no plugin named 'gti_repo'",
     "did you mean git_repo?"),
    ('[plugins]\ndisable = ["gitrepo"]\n', "plugins.disable: no plugin named 'gitrepo'", "did you mean git_repo?"),
])
@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_misspelled_plugin_name_is_refused_with_the_closest(short_tmp, capsys, command, body, key, guess) -> None:
    config = write_config(short_tmp, body, demo_plugins=False)
    status, err = rungd(capsys, command, "--config", str(config))
    assert status == 2
    assert f"{config}: key {key}; hint: {guess}" in err and "systemd_service" in err
    assert not (short_tmp / "state").exists()  # refused before serve made anything


def test_plugin_names_from_modules_and_files_are_known(short_tmp, capsys) -> None:
    config = write_config(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "settings_probe.py"}"]\n'
                                     'disable = ["file:settings_probe", "demo"]\n'
                                     '[plugins.settings.settings_probe]\n[plugins.settings.ledgerbook]\n')
    assert rungd_main.main(["check-config", "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith("config ok")


def test_the_socket_is_explicit_then_environment_then_default(short_tmp, monkeypatch) -> None:
    from rungd.ctl.app import build_parser
    from rungd.ctl.registry import Context

    config = write_config(short_tmp)
    ours, exported = short_tmp / "rungd.sock", Path("/elsewhere/rungd.sock")
    monkeypatch.setenv("RUNGD_SOCKET", str(exported))
    monkeypatch.delenv("RUNGD_CONFIG", raising=False)

    def socket(*argv: str) -> Path | None:
        return Context(build_parser().parse_args([*argv, "tools"])).socket_path()

    assert load_config(config).server.socket == ours  # rungd serve --config: the file's socket
    assert socket("--config", str(config)) == ours
    assert socket("--socket", "/given.sock", "--config", str(config)) == Path("/given.sock")
    monkeypatch.setenv("RUNGD_CONFIG", str(config))  # the environment's config: RUNGD_SOCKET wins
    assert load_config().server.socket == exported and socket() == exported
    monkeypatch.delenv("RUNGD_SOCKET")
    assert socket() == ours


async def test_rungctl_with_config_reaches_its_daemon_whatever_rungd_socket_says(rungd_daemon, short_tmp) -> None:
    from tests.ctl.test_ctl_cli import ctl

    done = await ctl("--config", str(rungd_daemon.config.source), "tools",
                     env={"RUNGD_SOCKET": str(short_tmp / "other.sock"), "RUNGD_CONFIG": ""})
    assert done.returncode == 0, done.stderr
    assert b"inventory_item_show" in done.stdout


async def test_empty_tools_and_pending_say_so_on_stderr_and_json_stays_empty(short_tmp, nursery) -> None:
    from rungd.testing import start_daemon
    from tests.ctl.test_ctl_cli import ctl

    # Access for another uid only: this caller (the uid the daemon runs as) sees no tool.
    running = await start_daemon(nursery, load_config(write_config(short_tmp, "[access]\nuids = [54321]\n")))
    sock = str(running.socket)
    tools = await ctl("--socket", sock, "tools")
    assert tools.returncode == 0 and tools.stdout == b""
    assert tools.stderr.decode() == (
        f"no tools you may call: rungd sees you as uid {os.getuid()} (gid {os.getgid()}); its config's [access] "
        "decides who may call which tool (an empty [access] allows only the uid rungd runs as); "
        "`rungd check-config` lists the tools it offers\n")
    pending = await ctl("--socket", sock, "pending")
    assert pending.returncode == 0 and pending.stdout == b""
    assert pending.stderr.decode().startswith("no calls held for approval")
    for command in ("tools", "pending"):
        as_json = await ctl("--socket", sock, command, "--json")
        assert (as_json.returncode, as_json.stdout.strip(), as_json.stderr) == (0, b"[]", b"")
    running.daemon.stop()


def socket_config(folder: Path, socket: Path) -> Path:
    config = folder / "rungd.toml"
    config.write_text(f'[server]\nsocket = "{socket}"\n[state]\ndir = "{folder / "state"}"\n')
    return config


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_socket_folder_that_is_a_file_is_named_before_anything_is_made(short_tmp, capsys, command) -> None:
    (short_tmp / "afile").write_text("")
    config = socket_config(short_tmp, short_tmp / "afile" / "rungd.sock")
    status, err = rungd(capsys, command, "--config", str(config))
    assert status == 1
    assert (f"{config}: key server.socket: {short_tmp / 'afile'} is a regular file, not a folder, "
            "so it cannot hold the socket; hint:") in err
    assert not (short_tmp / "state").exists()


def test_a_file_at_the_socket_path_is_refused_and_never_deleted(short_tmp, capsys) -> None:
    from rungd.service.server import bind_unix_socket

    precious = short_tmp / "notes.txt"
    precious.write_text("keep me")
    status, err = rungd(capsys, "check-config", "--config", str(socket_config(short_tmp, precious)))
    assert status == 1 and f"{precious} exists and is a regular file, not a socket" in err
    with pytest.raises(FileExistsError, match="not a socket"):
        bind_unix_socket(precious, 0o660, None)
    assert precious.read_text() == "keep me"


NOBODY = 65534


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")
def test_a_socket_folder_this_user_may_not_write_is_named_with_the_user(short_tmp) -> None:
    from rungd.service.preflight import check_paths

    short_tmp.chmod(0o755)  # nobody may look, not write
    (short_tmp / "run").mkdir(mode=0o755)
    (short_tmp / "state").mkdir()
    (short_tmp / "state").chmod(0o777)
    config = load_config(socket_config(short_tmp, short_tmp / "run" / "rungd.sock"))
    missing = load_config(socket_config(short_tmp, short_tmp / "gone" / "rungd.sock"))
    os.seteuid(NOBODY)
    try:
        report, later = check_paths(config), check_paths(missing)
    finally:
        os.seteuid(0)
    assert len(report.problems) == 1 and not report.notes
    assert report.problems[0].startswith(f"{config.source}: key server.socket: user nobody (uid {NOBODY}) may not "
                                         f"create files in {short_tmp / 'run'} (mode 0755, owner uid 0)")
    # A folder not there yet (systemd's RuntimeDirectory= makes it) is a note for check-config.
    assert not later.problems and len(later.notes) == 1
    assert f"{short_tmp / 'gone'} does not exist, and user nobody (uid {NOBODY}) may not create it" in later.notes[0]
    assert check_paths(config).problems == []  # root may


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user and group")
async def test_a_socket_group_that_could_not_reach_the_socket_is_refused_at_start_and_one_that_can_connects(
        short_tmp, nursery) -> None:
    # Issue 31: the state folder is kept 0750 (rungd's group), so a socket inside it cannot be
    # shared with socket_group: refused in one line with the fix, before anything listens.
    import sys

    from rungd.service.inprocess import start_daemon
    from rungd.service.server import bind_unix_socket

    short_tmp.chmod(0o755)
    state = short_tmp / "state"
    state.mkdir(mode=0o750)
    with pytest.raises(ConfigError) as caught:
        bind_unix_socket(state / "rungd.sock", 0o660, "nogroup")
    assert f"members of nogroup could not reach the socket {state / 'rungd.sock'}: the folder {state} (mode 0750)" \
        in str(caught.value) and "outside the state folder" in str(caught.value)
    assert not (state / "rungd.sock").exists()
    # Outside the state folder, in a folder they may pass through: a member connects.
    (short_tmp / "run").mkdir(mode=0o755)
    socket = short_tmp / "run" / "rungd.sock"
    config = short_tmp / "shared.toml"
    config.write_text(f'[server]\nsocket = "{socket}"\nsocket_mode = "0660"\nsocket_group = "nogroup"\n'
                      f'[state]\ndir = "{state}"\n[access]\ngroups = ["nogroup"]\n')
    running = await start_daemon(nursery, load_config(config))
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nprint('connected')")
    done = await trio.run_process([sys.executable, "-c", probe, str(socket)], capture_stdout=True,
                                  capture_stderr=True, check=False, user=NOBODY, group=65534, extra_groups=[])
    running.daemon.stop()
    assert done.stdout == b"connected\n", done.stderr
