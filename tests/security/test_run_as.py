"""Run-as with only the capabilities the README's drop-in grants: a tool's `user =` works with
CAP_SETUID, CAP_SETGID and CAP_CHOWN, says so truly without CAP_CHOWN, and leaves nothing.

systemd is not PID 1 here, so the daemon runs as the unit's drop-in would make it, by hand:
root's uid with its capabilities cut to the drop-in's (`setpriv --bounding-set`), so no
CAP_DAC_OVERRIDE, CAP_FOWNER or CAP_KILL stands in for one it lacks. (A non-root uid cannot
run this test's interpreter, which lives under /root.)
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rungd.client import Client
from rungd.core.envelope import Envelope
from rungd.testing import STUB_DESCRIPTION
from tests.service.test_reliability import DaemonProcess

pytestmark = pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to run the daemon with the drop-in's capabilities")

# Leaves nested folders of its own (0700) in its working folder, and links to a folder and a
# file of root's (which taking its folder back must not chown), then says who it is.
PROGRAM = """#!/bin/sh
mkdir -p kept/deeper && echo x > kept/deeper/file && chmod 700 kept/deeper kept
ln -s {victim} kept/deeper/to-folder && ln -s {victim}/file kept/to-file
id -u
grep '^Cap' /proc/self/status
"""


def serve_as_nobody(folder: Path, capabilities: str) -> DaemonProcess:
    programs = folder / "programs"  # reachable by nobody, writable by root alone
    programs.mkdir()
    folder.chmod(0o755)
    victim = folder / "victim"
    victim.mkdir()
    (victim / "file").write_text("root's\n")
    program = programs / "who"
    program.write_text(PROGRAM.format(victim=victim))
    program.chmod(0o755)
    tools = folder / "tools"
    tools.mkdir()
    (tools / "who.toml").write_text(
        f'[program]\nname = "who"\ncommand = "{program}"\nuser = "nobody"\n\n[tools.host_who_show]\n'
        f'[tools.host_who_show.description]\n{STUB_DESCRIPTION}[tools.host_who_show.parse]\nkind = "lines"\n')
    daemon = DaemonProcess(folder, f'[plugins]\ntool_dirs = ["{tools}"]\n',
                           wrapper=("setpriv", f"--bounding-set=-all,{capabilities}"))
    daemon.start()
    return daemon


def private_folders() -> set[str]:
    return set(glob.glob("/tmp/.rungd-*"))


def call_as_nobody(folder: Path, capabilities: str) -> tuple[Envelope, set[str]]:
    """The tool's envelope, and the private folders left in /tmp that were not there before."""
    before = private_folders()
    daemon = serve_as_nobody(folder, capabilities)
    try:
        with Client(daemon.socket) as client:
            env = client.call("host_who_show", {})
    finally:
        daemon.stop()
    return env, private_folders() - before


def test_a_user_tool_runs_with_the_drop_ins_capabilities_and_leaves_nothing(short_tmp) -> None:
    env, left = call_as_nobody(short_tmp, "+setuid,+setgid,+chown")
    assert env.status == "ok", env.error
    lines = env.fields["lines"]
    assert lines[0] == "65534"
    assert "CapInh:\t0000000000000000" in lines and "CapAmb:\t0000000000000000" in lines
    assert not left  # what nobody left in its folder went with the call
    victim = short_tmp / "victim"
    assert (victim.stat().st_uid, (victim / "file").stat().st_uid) == (0, 0)  # links were not followed
    assert (victim / "file").read_text() == "root's\n"


def test_without_cap_chown_a_user_tool_says_what_is_missing_and_runs_nothing(short_tmp) -> None:
    env, left = call_as_nobody(short_tmp, "+setuid,+setgid")
    assert (env.error.code, env.error.retry, env.outcome) == ("FAILED", "no", "not_started"), env.error
    assert "CAP_CHOWN" in env.error.hint and "free space" not in env.error.hint
    assert not left


def test_a_run_as_folder_a_killed_daemon_left_is_swept_at_its_next_start() -> None:
    from rungd.runner.askpass_server import RunAsFolder

    first = RunAsFolder("t3stsw33p")
    os.close(first._fd)  # killed: nothing of it ran its close
    left = first.path
    (left / "c-x").mkdir()  # a call's folder, its account's
    if os.geteuid() == 0:
        os.chown(left / "c-x", 65534, 65534)
    others = Path(tempfile.mkdtemp(prefix=".rungd-as-0therd43-"))  # another daemon's: not ours to sweep
    planted = Path(tempfile.mkdtemp(prefix=".rungd-as-t3stsw33p-"))  # our name, someone else's folder
    if os.geteuid() == 0:
        os.chown(planted, 65534, 65534)
    try:
        second = RunAsFolder("t3stsw33p")
        try:
            assert not left.exists()
            assert others.exists()
            assert planted.exists() == (os.geteuid() == 0)  # as root, nobody's is left alone
        finally:
            second.close()
        assert not second.path.exists()
    finally:
        shutil.rmtree(others, ignore_errors=True)
        shutil.rmtree(planted, ignore_errors=True)
