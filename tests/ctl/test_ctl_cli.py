"""rungctl and rungd as a person meets them: one line per failure, documented exit codes,
--version, RUNGD_CONFIG, and every command word reaching exactly one function."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from rungd.ctl import app, registry
from rungd.testing import write_config

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")


async def run(module: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> trio.CompletedProcess:
    return await trio.run_process([sys.executable, "-m", module, *args], capture_stdout=True, capture_stderr=True,
                                  check=False, env={**os.environ, **(env or {})}, **kw)


async def ctl(*args: str, **kw: Any) -> trio.CompletedProcess:
    return await run("rungd.ctl", *args, **kw)


def one_line(done: trio.CompletedProcess) -> str:
    """The failure's stderr, asserted to be one line and no traceback."""
    err = done.stderr.decode()
    assert "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("rungctl: "), err
    return err


def sample_argv(command: registry.Command) -> list[str]:
    """The command's words plus a value for each argument it requires."""
    argv = command.name.split()
    for declared in command.args:
        positional = not declared.flags[0].startswith("-")
        if positional and declared.options.get("nargs") not in ("?", "*"):
            argv.append("x")
        elif declared.options.get("required"):
            argv += [declared.flags[0], declared.options.get("choices", ["x"])[0]]
    return argv


def test_every_command_word_reaches_its_own_function() -> None:
    parser = app.build_parser()
    assert len({c.run for c in registry.COMMANDS.values()}) == len(registry.COMMANDS)
    for command in registry.COMMANDS.values():
        assert parser.parse_args(sample_argv(command)).run is command.run, command.name


async def test_an_unknown_command_is_a_usage_error_not_a_wait() -> None:
    done = await ctl("c0123456789abcdef")
    assert done.returncode == 2
    assert b"invalid choice" in done.stderr and b"usage: rungctl" in done.stderr


async def test_both_commands_print_their_version() -> None:
    from rungd.ctl.cli import version

    assert (await ctl("--version")).stdout.decode() == f"rungctl {version()}\n"
    assert (await run("rungd.main", "--version")).stdout.decode() == f"rungd {version()}\n"


async def test_help_lists_exit_codes_and_describes_positionals() -> None:
    top = (await ctl("--help")).stdout.decode()
    for line in ("0  ok", "2  bad usage", "3  rungd could not be reached", "4  the call is still pending"):
        assert line in top
    describe = (await ctl("describe", "--help")).stdout.decode()
    assert "the tool's name" in describe and "exit status:" in describe
    verify = (await ctl("ledger", "verify", "--help")).stdout.decode()
    assert "shipped copy" in verify
    assert "exit status:" in (await run("rungd.main", "--help")).stdout.decode()


async def test_rungctl_honours_rungd_config(rungd_daemon) -> None:
    env = {"RUNGD_CONFIG": str(rungd_daemon.config.source), "RUNGD_SOCKET": ""}
    tools = await ctl("tools", env=env)
    assert tools.returncode == 0, tools.stderr
    assert b"inventory_item_show" in tools.stdout
    verify = await ctl("ledger", "verify", env=env)
    assert verify.returncode == 0 and b"ledger ok" in verify.stdout


async def test_unknown_and_denied_tools_exit_2_and_error_results_exit_1(rungd_daemon) -> None:
    sock = str(rungd_daemon.socket)
    unknown = await ctl("--socket", sock, "call", "inventory_itme_show", "item=widget")
    assert unknown.returncode == 2 and b"UNKNOWN_TOOL" in unknown.stdout
    failed = await ctl("--socket", sock, "call", "inventory_item_show", "item=nosuch")
    assert failed.returncode == 1


async def test_approving_a_call_no_longer_held_exits_1_and_says_so(rungd_daemon) -> None:
    env = await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    done = await ctl("--socket", str(rungd_daemon.socket), "approve", env.call_id)
    assert done.returncode == 1, done.stderr  # the daemon was reached: not 3
    assert "not waiting for approval" in one_line(done)
    unknown = await ctl("--socket", str(rungd_daemon.socket), "deny", "c0123456789abcdef")
    assert unknown.returncode == 1 and "UNKNOWN_CALL" in one_line(unknown)


async def test_a_socket_path_that_is_a_file_exits_3_with_one_line(short_tmp: Path) -> None:
    (short_tmp / "rungd.sock").write_text("")
    done = await ctl("--socket", str(short_tmp / "rungd.sock"), "tools")
    assert done.returncode == 3
    assert "not a socket" in one_line(done)


async def test_new_plugin_into_a_missing_folder_is_one_line(short_tmp: Path) -> None:
    done = await ctl("new-plugin", "erp", "--dir", str(short_tmp / "no" / "such"))
    assert done.returncode == 2
    assert "no such folder" in one_line(done) and "mkdir -p" in done.stderr.decode()
    assert not (short_tmp / "no").exists()


async def test_a_missing_ledger_path_is_one_line(short_tmp: Path) -> None:
    done = await ctl("ledger", "verify", str(short_tmp / "gone"))
    assert done.returncode == 2 and "no such folder" in one_line(done)


@as_root
async def test_a_config_the_caller_cannot_read_is_one_line_for_both_commands(short_tmp: Path) -> None:
    config = write_config(short_tmp)
    config.chmod(0o600)
    short_tmp.chmod(0o755)
    nobody: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": [], "cwd": "/"}
    done = await ctl("--config", str(config), "tools", **nobody)
    assert done.returncode == 2
    assert "cannot read it: Permission denied" in one_line(done)
    by_env = await ctl("pending", env={"RUNGD_CONFIG": str(config)}, **nobody)
    assert by_env.returncode == 2 and "Permission denied" in one_line(by_env)
    daemon = await run("rungd.main", "check-config", "--config", str(config), **nobody)
    assert daemon.returncode == 2 and b"Traceback" not in daemon.stderr
    assert daemon.stderr.decode().count("\n") == 1 and b"Permission denied" in daemon.stderr


@as_root
async def test_tail_and_verify_by_a_user_who_cannot_read_the_ledger_are_one_line(rungd_daemon, short_tmp) -> None:
    await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    config = rungd_daemon.config.source
    ledger = rungd_daemon.config.state_dir / "ledger"
    short_tmp.chmod(0o755)
    state = rungd_daemon.config.state_dir
    state.chmod(0o755)
    os.chown(ledger, 0, 4)  # root and its group (adm here; rungd on a host the unit runs on)
    ledger.chmod(0o750)
    nobody: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": [], "cwd": "/"}
    for args in (("tail",), ("ledger", "verify"), ("tail", "-f"), ("health",)):
        done = await ctl("--config", str(config), *args, **nobody)
        assert done.returncode == 2, args
        message = one_line(done)
        assert "cannot read the ledger" in message and "usermod -aG adm" in message, args
    # A state folder this user may not even enter (Python 3.11's is_dir raises then): the same
    # line, not "unexpected failure" (issue 31).
    os.chown(state, 0, 4)
    state.chmod(0o750)
    for args in (("tail",), ("ledger", "verify"), ("health",)):
        done = await ctl("--config", str(config), *args, **nobody)
        assert done.returncode == 2, (args, done.stderr)
        assert "cannot read the ledger" in one_line(done) and "usermod -aG adm" in one_line(done), args


async def test_an_edited_ledger_is_told_in_one_line_by_tail_and_by_a_starting_daemon(rungd_daemon, short_tmp) -> None:
    # An attacker's trial: a time of 1e308 ended rungctl tail in OverflowError, -1e18 was
    # told as a permission problem; a line the daemon cannot read stopped its start with
    # "unexpected failure ... report it".
    import json
    import shutil

    await rungd_daemon.call("inventory_item_show", {"item": "widget"})
    copy = short_tmp / "copy"
    copy.mkdir()
    config = write_config(copy)  # its own state folder: the running daemon holds its ledger
    shutil.copytree(rungd_daemon.config.state_dir / "ledger", copy / "state" / "ledger")
    ledger = next((copy / "state" / "ledger").glob("ledger-*.jsonl"))
    lines = ledger.read_bytes().splitlines(keepends=True)
    for when in (1e308, -1e18):
        record = json.loads(lines[0])
        record["time"] = when
        ledger.write_bytes(json.dumps(record).encode() + b"\n" + b"".join(lines[1:]))
        done = await ctl("--config", str(config), "tail")
        assert done.returncode == 0 and f"{when!r} (not a time)" in done.stdout.decode(), done.stderr
    ledger.write_bytes(b"null\n" + b"".join(lines[1:]))
    done = await run("rungd.main", "serve", "--config", str(config))
    err = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in err, err
    assert "rungd: the ledger cannot be read" in err and "unexpected" not in err, err


def test_an_unexpected_failure_is_one_line_and_the_traceback_only_when_asked(monkeypatch, capsys) -> None:
    def broken(self: registry.Context) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(registry.Context, "client", property(broken))
    monkeypatch.delenv("RUNGD_DEBUG", raising=False)
    assert app.main(["tools"]) == 1
    err = capsys.readouterr().err
    assert err == ("rungctl: unexpected failure: RuntimeError: boom; hint: run again with RUNGD_DEBUG=1 for the "
                   "traceback, and report it with what you ran\n")
    monkeypatch.setenv("RUNGD_DEBUG", "1")
    assert app.main(["tools"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_main_in_process_leaves_the_callers_sigpipe_alone(capsys) -> None:
    # CI once died of SIGPIPE (exit 141) in a later test: app.main had set it to default for
    # the whole pytest process, and the next write to a pipe whose reader had gone killed it.
    before = signal.getsignal(signal.SIGPIPE)
    with pytest.raises(SystemExit):
        app.main(["--help"])
    capsys.readouterr()
    assert signal.getsignal(signal.SIGPIPE) == before == signal.SIG_IGN


async def test_the_script_piped_into_a_reader_that_stops_ends_quietly() -> None:
    reader, writer = os.pipe()
    os.close(reader)  # like `rungctl --help | head -c0`: nobody reads
    try:
        done = await trio.run_process([sys.executable, "-m", "rungd.ctl", "--help"], stdout=writer,
                                      capture_stderr=True, check=False)
    finally:
        os.close(writer)
    assert done.returncode == -signal.SIGPIPE
    assert done.stderr == b""


def test_names_with_controls_are_refused_at_the_protocol() -> None:
    import msgspec

    from rungd import protocol

    for name in ("a\nb", "x\x1b[31m", "q\u202e", "end\n", "t\tab"):
        with pytest.raises(msgspec.ValidationError):
            protocol.decode_request(msgspec.msgpack.encode({"type": "call", "tool": name, "inputs": {}}))
        with pytest.raises(msgspec.ValidationError):
            protocol.decode_request(msgspec.msgpack.encode({"type": "call", "tool": "t", "inputs": {},
                                                            "request_id": name}))
    protocol.decode_request(msgspec.msgpack.encode({"type": "call", "tool": "inventory_item_show", "inputs": {},
                                                    "request_id": "ünï-7"}))


async def test_lint_with_no_daemon_says_it_can_lint_offline(short_tmp: Path) -> None:
    done = await ctl("--socket", str(short_tmp / "absent.sock"), "lint")
    assert done.returncode == 3
    assert "rungctl lint --offline" in one_line(done)
