"""The launcher (issue 13): one small process that starts every program, born in its call's
cgroup and the daemon's own child; and the daemon's one askpass endpoint shared by its calls.

Real processes throughout: the launcher is started, asked, killed and replaced for real.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest
import trio

from rungd import runner
from rungd.runner import askpass
from rungd.system import proctree
from rungd.core.errors import AuthRequired, Failed
from rungd.runner import launch
from rungd.runner import launcher as launcher_wire
from rungd.runner.limits import Limits
from rungd.runner.askpass_server import AskpassEndpoint
from tests.conftest import record_loop_gaps
from tests.runner.test_runner_refusals import make_ctx

SELF_REPORT = """
    import json, os
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    with open("/proc/self/cgroup") as file:
        cgroup = [line.split(":", 2)[2] for line in file.read().splitlines() if line.startswith("0::")]
    print(json.dumps({"ppid": os.getppid(), "pid": os.getpid(), "sid": os.getsid(0), "fds": fds,
                      "cgroup": cgroup[0] if cgroup else None, "cwd": os.getcwd()}))
"""


async def start(launcher: launch.Launcher, argv: list[str], cgroup: proctree.CallCgroup | None = None,
                cwd: str = "/", label: str | None = None) -> tuple[launch.Child, bytes]:
    started = await launcher.spawn(argv, {"PATH": "/usr/bin:/bin"}, cwd, None, [], None, cgroup, label=label)
    await started.exec_result()
    child = started.child
    out = b""
    while chunk := await child.stdout.receive_some():
        out += chunk
    await child.wait()
    child.close_pipes()
    return child, out


@pytest.fixture
async def call_cgroup() -> AsyncIterator[proctree.CallCgroup]:
    """A new call cgroup (skips where none can be made); thawed and removed after."""
    cgroup = proctree.CallCgroup.spare()
    if cgroup is None:
        pytest.skip("no cgroup v2 hierarchy this process may make cgroups in")
    yield cgroup
    if cgroup.path.exists():
        (cgroup.path / "cgroup.freeze").write_text("0")
        await cgroup.remove_when_empty()


@pytest.fixture(params=["compiled", "python"])
def launcher(request: pytest.FixtureRequest) -> Iterator[launch.Launcher]:
    """Each launcher test runs on both launchers: the compiled one (where it was built) and the
    Python one every host has."""
    if request.param == "compiled" and launch.compiled_launcher() is None:
        pytest.skip("no compiled launcher here (built by the package's build hook where cc is present)")
    launcher = launch.Launcher(None, compiled=request.param == "compiled")
    yield launcher
    launcher.close()


async def test_a_program_is_our_own_child_in_its_own_session_with_nothing_but_its_three_streams(
        short_tmp, fake_program, launcher) -> None:
    child, out = await start(launcher, [str(fake_program("report", SELF_REPORT))], cwd=str(short_tmp))
    report = json.loads(out)
    assert child.returncode == 0
    # CLONE_PARENT: the daemon (here, this test) is the parent and hears the real exit status.
    assert report["ppid"] == os.getpid()
    assert report["sid"] == report["pid"] == child.pid
    # 0-2, and the descriptor listdir itself holds: not the launcher's socket, not a pipe end.
    assert report["fds"] == [0, 1, 2, 3]
    assert report["cwd"] == str(short_tmp)


async def test_the_start_time_a_spawn_knows_is_the_one_proc_gives(launcher) -> None:
    # The tracker takes a program's start time from the spawn (the two clock readings around
    # it fall in one tick nearly always) instead of reading /proc/PID/stat on the call's path:
    # it must be that very value, or the program's askpass questions and the kill would miss it.
    known = 0
    for _ in range(30):
        started = await launcher.spawn(["/bin/sleep", "5"], {"PATH": "/usr/bin:/bin"}, "/", None, [], None, None)
        await started.exec_result()
        child = started.child
        try:
            stat = proctree.read_stat(child.pid)
            assert stat is not None
            if child.start is not None:
                known += 1
                assert child.start == stat.start
                tracker = proctree.Tracker("c-test", child.pid, subreaper=True, start=child.start)
                assert tracker.root == proctree.Tracker("c-test", child.pid, subreaper=True).root
        finally:
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
            child.close_pipes()
    assert known  # a spawn takes a fraction of a 10 ms tick: most do not straddle one


def test_start_between_gives_a_tick_only_when_both_readings_fall_in_it() -> None:
    tick = proctree._TICK_NS
    if not tick:
        pytest.skip("USER_HZ here does not divide a second into whole nanoseconds")
    assert proctree.start_between(5 * tick + 1, 5 * tick + tick - 1) == 5
    assert proctree.start_between(5 * tick + tick - 1, 6 * tick) is None


async def test_a_program_is_born_in_the_cgroup_it_was_given(fake_program, launcher, call_cgroup) -> None:
    _, out = await start(launcher, [str(fake_program("report", SELF_REPORT))], call_cgroup)
    # Its very first look at itself already finds it there: it never ran anywhere else.
    assert json.loads(out)["cgroup"].endswith("/" + call_cgroup.path.name)


async def test_the_launcher_labels_the_cgroup_of_each_call_and_a_kept_one_is_dated(launcher,
                                                                                  call_cgroup) -> None:
    # Start-up recovery reads the label (the call a cgroup holds) and the date (an empty one
    # younger than a minute may be another daemon's spare): each call's program relabels its
    # cgroup, and one kept for the next call is dated as it is kept.
    for call_id in ("c-first", "c-second"):
        old = time.time() - 3600
        os.utime(call_cgroup.path, (old, old))
        call_cgroup.dated = time.monotonic() - 3600  # as the daemon last dated it, an hour ago
        await start(launcher, ["/bin/true"], call_cgroup, label=call_id)
        assert call_cgroup.call_id() == call_id
        launcher.give_back(call_cgroup)
        assert launcher._spares == [call_cgroup]
        assert time.time() - call_cgroup.path.stat().st_mtime < 60
        launcher.cgroup()  # the next call takes it back


async def test_a_spare_kept_idle_is_dated_again_on_the_reapers_pass(launcher, call_cgroup) -> None:
    # Another daemon's start-up sweep removes empty call cgroups unchanged for a minute: one
    # this daemon keeps unused is dated again on its reaper's passes (refill), not left to age.
    launcher.give_back(call_cgroup)
    old = time.time() - 3600
    os.utime(call_cgroup.path, (old, old))
    call_cgroup.dated = time.monotonic() - 3600
    await launcher.refill()
    assert time.time() - call_cgroup.path.stat().st_mtime < 60
    assert launcher.cgroup() is call_cgroup


async def test_a_launcher_killed_between_calls_is_replaced_and_reaped(launcher) -> None:
    child, _ = await start(launcher, ["/bin/true"])
    assert child.returncode == 0
    first = launcher._process
    assert first is not None
    os.kill(first.pid, signal.SIGKILL)
    with trio.fail_after(5):
        while first.poll() is None:
            await trio.sleep(0.01)
    child, _ = await start(launcher, ["/bin/sh", "-c", "exit 7"])
    assert child.returncode == 7
    assert launcher._process is not None and launcher._process.pid != first.pid


async def test_a_program_that_cannot_be_started_says_why_and_leaves_no_process(short_tmp, launcher) -> None:
    started = await launcher.spawn(["/nonexistent/program"], {}, "/", None, [], None, None)
    with pytest.raises(launch.SpawnError) as failure:
        await started.exec_result()
    assert failure.value.errno == errno.ENOENT
    assert await started.child.wait() == 127  # the process it made exits, and is ours to reap
    started = await launcher.spawn(["/bin/true"], {}, str(short_tmp / "gone"), None, [], None, None)
    with pytest.raises(launch.SpawnError) as failure:
        await started.exec_result()
    assert (failure.value.errno, failure.value.filename) == (errno.ENOENT, "chdir")
    await started.child.wait()


async def test_a_programs_result_is_the_same_through_run(short_tmp) -> None:
    ctx = make_ctx(short_tmp)
    done = await runner.run(ctx, runner.Program(argv=("/bin/sh", "-c", "echo out; echo err >&2; exit 3")))
    assert (done.exit_status, done.stdout, done.stderr) == (3, "out\n", "err\n")
    # Both streams printed, so both are kept as evidence; a silent stream has none.
    assert sorted(name.rsplit(".", 1)[1] for name in done.evidence) == ["stderr", "stdout"]
    quiet = await runner.run(make_ctx(short_tmp), runner.Program(argv=("/bin/true",)))
    assert quiet.evidence == []


REQUEST_REPORT = """
    import json, os, resource
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print(json.dumps({"cwd": os.getcwd(), "env": dict(os.environ), "passed": os.read(int(os.environ["FD"]), 64).decode(),
                      "nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "core": resource.getrlimit(resource.RLIMIT_CORE),
                      "fsize": resource.getrlimit(resource.RLIMIT_FSIZE), "cpu": resource.getrlimit(resource.RLIMIT_CPU),
                      "no_new_privs": status["NoNewPrivs"].strip()}))
"""


async def run_to_end(launcher: launch.Launcher, argv: list[str], env: dict[str, str], cwd: str = "/", *,
                     limits: Limits | None = None, pass_fds: list[int] = (),  # type: ignore[assignment]
                     user: tuple[int, int, list[int]] | None = None, make_cwd: bool = False) -> tuple[int, bytes]:
    """Start a program with every part of a request and read it to the end: (status, stdout)."""
    started = await launcher.spawn(argv, env, cwd, limits, pass_fds, user, None, make_cwd=make_cwd)
    await started.exec_result()
    child = started.child
    out = b""
    while chunk := await child.stdout.receive_some():
        out += chunk
    status = await child.wait()
    child.close_pipes()
    return status, out


async def test_every_part_of_a_request_reaches_the_program(short_tmp, fake_program, launcher) -> None:
    program = fake_program("request_report", REQUEST_REPORT)
    passed_r, passed_w = os.pipe()
    os.write(passed_w, b"through fd")
    os.close(passed_w)
    cwd = short_tmp / "made" / "for" / "it"
    env = {"PATH": f"{program.parent}:/usr/bin:/bin", "FD": str(passed_r), "LANG": "C.UTF-8", "EMPTY": ""}
    try:
        # A bare name is looked up on the request's PATH, not the launcher's (it has none).
        status, out = await run_to_end(
            launcher, [program.name], env, str(cwd), make_cwd=True, pass_fds=[passed_r],
            limits=Limits(cpu_s=30, open_files=77, file_size_bytes=1 << 20, core_bytes=0, no_new_privs=True))
    finally:
        os.close(passed_r)
    report = json.loads(out)
    assert status == 0
    assert report["cwd"] == str(cwd) and oct(cwd.stat().st_mode & 0o777) == oct(0o700)
    assert report["env"] == env  # exactly the request's environment, nothing of the launcher's
    assert report["passed"] == "through fd"
    assert report["nofile"] == [77, 77] and report["core"] == [0, 0] and report["fsize"] == [1 << 20] * 2
    assert report["cpu"] == [30, 30] and report["no_new_privs"] == "1"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to start a program as another user")
async def test_a_program_runs_as_the_user_and_groups_it_was_given(launcher) -> None:
    said = {}
    for which in ("-u", "-g", "-G"):
        status, out = await run_to_end(launcher, ["id", which], {"PATH": "/usr/bin:/bin"},
                                       user=(65534, 65534, [65534, 4]))
        assert status == 0
        said[which] = out.decode().split()
    assert said == {"-u": ["65534"], "-g": ["65534"], "-G": ["65534", "4"]}


class _WithAmbientCapabilities(launch.Launcher):
    """The compiled launcher run as uid 65534 holding CAP_SETUID and CAP_SETGID as ambient
    capabilities: a daemon given them (AmbientCapabilities=) to run tools as other users."""

    def command(self) -> list[str]:
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=+setuid,+setgid",
                "--ambient-caps=+setuid,+setgid", *super().command()]


@pytest.mark.parametrize("user", [None, (65533, 65533, [65533])])
async def test_a_program_never_holds_the_capabilities_the_daemon_runs_users_with(user) -> None:
    # An ambient set survives exec, and a switch from one non-root user to another keeps it:
    # a program run as postgres once held CAP_SETUID, and could make itself root.
    if os.getuid() != 0 or shutil.which("setpriv") is None or launch.compiled_launcher() is None:
        pytest.skip("needs root, setpriv and the compiled launcher (a Python one as uid 65534 cannot read "
                    "this interpreter)")
    launcher = _WithAmbientCapabilities(None, compiled=True)
    try:
        status, out = await run_to_end(launcher, ["/bin/cat", "/proc/self/status"], {}, user=user)
        held = Path(f"/proc/{launcher._process.pid}/status").read_text()
    finally:
        launcher.close()
    assert "CapAmb:\t00000000000000c0" in held  # the launcher did hold them
    caps = dict(line.split(":\t", 1) for line in out.decode().splitlines() if line.startswith("Cap"))
    # None of them, not even inheritable: a file with inheritable capabilities would gain them.
    assert status == 0
    assert (caps["CapInh"], caps["CapAmb"], caps["CapPrm"], caps["CapEff"]) == ("0000000000000000",) * 4


class _WithInheritable(launch.Launcher):
    """A launcher started holding CAP_CHOWN in its inheritable set (as a daemon given it)."""

    def command(self) -> list[str]:
        return ["setpriv", "--inh-caps=+chown", *super().command()]


@pytest.mark.parametrize("compiled", [False, True])
async def test_both_launchers_empty_the_inheritable_set_of_every_program(compiled: bool) -> None:
    if os.getuid() != 0 or shutil.which("setpriv") is None or (compiled and launch.compiled_launcher() is None):
        pytest.skip("needs root, setpriv (and the compiled launcher)")
    launcher = _WithInheritable(None, compiled=compiled)
    try:
        status, out = await run_to_end(launcher, ["/bin/cat", "/proc/self/status"], {})
        held = Path(f"/proc/{launcher._process.pid}/status").read_text()
    finally:
        launcher.close()
    assert "CapInh:\t0000000000000001" in held
    assert status == 0 and "CapInh:\t0000000000000000" in out.decode()


@pytest.mark.parametrize("argv, env", [
    (["/bin/echo", "a\0b"], {}),
    (["/bin/true"], {"A=B": "c"}),
    (["/bin/true"], {"": "c"}),
    (["/bin/true"], {"A": "b\0c"}),
])
async def test_a_nul_in_a_string_or_an_equals_sign_in_a_name_is_refused_and_nothing_runs(
        launcher, argv: list[str], env: dict[str, str]) -> None:
    # execve would cut the string at the NUL (or read A=B=c as A): refused, as Python's execve does.
    with pytest.raises(launch.SpawnError) as failure:
        started = await launcher.spawn(argv, env, "/", None, [], None, None)
        try:
            await started.exec_result()
        finally:
            assert await started.child.wait() == 127  # the process made, if any, exits before exec
            started.child.close_pipes()
    assert (failure.value.errno, failure.value.filename) == (errno.EINVAL, "exec")


def test_the_wire_carries_every_field_and_refuses_what_it_did_not_make() -> None:
    fields = {"argv": [b"/bin/x", b"", b"\xff\xfe"], "env": {b"A": b"1", b"B": b""}, "cwd": b"/srv/x",
              "mkdir": True, "limits": (1, None, 3, None, 5, 0, True), "user": (1000, 1001, [4, 27]),
              "targets": [0, 1, 2, -1, 9], "cgroup": True, "label": b"c-0123"}
    body = launcher_wire.encode_start(fields["argv"], fields["env"], fields["cwd"], mkdir=True,
                                      limits=fields["limits"], user=fields["user"], targets=fields["targets"],
                                      cgroup=True, label=b"c-0123")
    assert launcher_wire.decode(body) == fields
    for label in (b"", b"c\0", b"c" * 256):
        with pytest.raises(launcher_wire.Unencodable):
            launcher_wire.encode_start([b"x"], {}, b"/", mkdir=False, limits=None, user=None, targets=[-1],
                                       cgroup=True, label=label)
    with pytest.raises(launcher_wire.Unencodable):  # a label names the call a cgroup holds: none here
        launcher_wire.encode_start([b"x"], {}, b"/", mkdir=False, limits=None, user=None, targets=[-1],
                                   cgroup=False, label=b"c-1")
    plain = launcher_wire.encode_start([b"x"], {}, b"/", mkdir=False, limits=None, user=None, targets=[-1],
                                       cgroup=False)
    assert launcher_wire.decode(plain)["limits"] is None and launcher_wire.decode(plain)["user"] is None
    assert launcher_wire.decode(plain)["label"] is None
    assert launcher_wire.decode(launcher_wire.encode_spare(b"/sys/fs/cgroup/x")) == {"spare": b"/sys/fs/cgroup/x"}
    for cut in range(1, len(body)):
        with pytest.raises(ValueError):
            launcher_wire.decode(body[:cut])
    with pytest.raises(ValueError):
        launcher_wire.decode(body + b"\0")
    with pytest.raises(ValueError):
        launcher_wire.decode(b"X" + body[1:])


async def test_a_request_no_daemon_sends_stops_nothing_but_itself(launcher) -> None:
    # Only the daemon holds the socket; still, a broken message must never start anything or
    # leave the daemon without a launcher.
    await start(launcher, ["/bin/true"])
    first = launcher._process
    assert first is not None and launcher._sock is not None
    for body in (b"R", b"R\x00\x00\x01", b"Q-unknown", b"R" + b"\xff" * 40):
        assert launch._Request(body, []).write_now(launcher._sock)
    child, _ = await start(launcher, ["/bin/sh", "-c", "exit 4"])
    assert child.returncode == 4 and launcher._process is first  # the same launcher went on
    # One that announces more than any request holds: the launcher stops, and is replaced.
    launcher._sock.send(launcher_wire.HEADER.pack(launcher_wire.MAX_BODY + 1, 0))
    with trio.fail_after(5):
        while first.poll() is None:
            await trio.sleep(0.01)
    child, _ = await start(launcher, ["/bin/sh", "-c", "exit 6"])
    assert child.returncode == 6 and launcher._process is not first


async def raw_request(launcher: launch.Launcher, body: bytes, fds: list[int], count: int | None = None) -> None:
    """Send one request as bytes, its descriptors attached, ``count`` of them in the header."""
    launcher.start()
    assert launcher._sock is not None
    request = launch._Request(body, fds)
    request.data = memoryview(launcher_wire.HEADER.pack(len(body), len(fds) if count is None else count) + body)
    assert request.write_now(launcher._sock)


@pytest.mark.parametrize("cgroup_flag, count", [(True, None), (False, 0)])
async def test_a_request_whose_descriptors_did_not_all_come_starts_nothing(
        launcher, short_tmp, cgroup_flag: bool, count: int | None) -> None:
    # With the cgroup's descriptor missing the program would run outside its cgroup; with a
    # count short of the targets, on descriptors of no request.
    marker = short_tmp / "ran"
    err_r, err_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    body = launcher_wire.encode_start([b"/usr/bin/touch", os.fsencode(marker)], {}, b"/", mkdir=False, limits=None,
                                      user=None, targets=[0, 1, 2, -1], cgroup=cgroup_flag)
    try:
        await raw_request(launcher, body, [null, null, null, err_w], count)
        serving = launcher._process
        os.close(err_w)
        with trio.fail_after(5):
            said = await trio.to_thread.run_sync(os.read, err_r, 512)
    finally:
        os.close(err_r)
        os.close(null)
    assert said == b""  # no P, no C: nothing was made
    await trio.sleep(0.2)
    assert not marker.exists()
    child, _ = await start(launcher, ["/bin/true"])  # and the same launcher goes on
    assert child.returncode == 0 and launcher._process is serving


async def test_a_program_whose_daemon_stopped_listening_before_its_first_line_never_runs(launcher, short_tmp) -> None:
    marker = short_tmp / "ran"
    err_r, err_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    os.close(err_r)  # the daemon gave up on the call: nobody would ever learn of the process
    body = launcher_wire.encode_start([b"/usr/bin/touch", os.fsencode(marker)], {}, b"/", mkdir=False, limits=None,
                                      user=None, targets=[0, 1, 2, -1], cgroup=False)
    try:
        await raw_request(launcher, body, [null, null, null, err_w])
    finally:
        os.close(err_w)
        os.close(null)
    await trio.sleep(0.5)
    assert not marker.exists()
    # CLONE_PARENT: the process made (it exited 127 at once) is this test's child to reap.
    for child in psutil.Process().children():
        if child.pid != launcher._process.pid and child.status() == psutil.STATUS_ZOMBIE:
            os.waitpid(child.pid, 0)


async def test_a_working_folder_with_a_trailing_slash_is_made_0700_and_a_nul_fails_its_step(
        launcher, short_tmp) -> None:
    folder = short_tmp / "a" / "b"
    started = await launcher.spawn(["/bin/true"], {}, f"{folder}/", None, [], None, None, make_cwd=True)
    await started.exec_result()
    assert await started.child.wait() == 0
    started.child.close_pipes()
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    started = await launcher.spawn(["/bin/true"], {}, "/tmp/x\0y", None, [], None, None)
    with pytest.raises(launch.SpawnError) as failure:
        await started.exec_result()
    assert (failure.value.errno, failure.value.filename) == (errno.EINVAL, "chdir")
    assert await started.child.wait() == 127
    started.child.close_pipes()


async def test_limits_no_launcher_can_apply_are_refused_before_anything_runs(launcher) -> None:
    with pytest.raises(launch.SpawnError) as failure:
        await launcher.spawn(["/bin/true"], {}, "/", Limits(file_size_bytes=1 << 64), [], None, None)
    assert (failure.value.errno, failure.value.filename) == (errno.EINVAL, "limits")
    with pytest.raises(launch.SpawnError) as failure:
        await launcher.spawn(["/bin/true"], {}, "/", None, [], (1 << 32, 0, []), None)
    assert (failure.value.errno, failure.value.filename) == (errno.EINVAL, "user")
    # RLIM_INFINITY is a limit like any other: no limit.
    status, out = await run_to_end(launcher, ["/bin/sh", "-c", "ulimit -f"], {"PATH": "/usr/bin:/bin"},
                                   limits=Limits(file_size_bytes=resource.RLIM_INFINITY))
    assert (status, out) == (0, b"unlimited\n")


def test_a_compiled_launcher_built_from_another_source_is_not_used(monkeypatch, fake_program, caplog) -> None:
    stale = fake_program("rungd-launcher", "print('0123456789abcdef')")
    monkeypatch.setattr(launch, "_COMPILED", stale)
    launch.compiled_launcher.cache_clear()
    try:
        assert launch.compiled_launcher() is None
        assert "built from another source" in caplog.text and "reinstall rungd" in caplog.text
        assert launch.Launcher(None).command()[-1].endswith("launcher.py")
        with pytest.raises(OSError, match="no compiled launcher"):
            launch.Launcher(None, compiled=True).command()
    finally:
        monkeypatch.undo()
        launch.compiled_launcher.cache_clear()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: rungd uses the Python launcher here")
def test_where_there_is_a_compiler_the_install_built_the_launcher_and_uses_it() -> None:
    # Else a broken compile would pass every test on the Python launcher and ship slower.
    binary = launch.compiled_launcher()
    assert binary is not None, "the build hook did not compile launcher.c; reinstall (pip install -e .) to see why"
    assert launch.for_reaper(None).command() == [str(binary)]


ASKER = """
    import os, subprocess, sys
    got = subprocess.run([os.environ["SSH_ASKPASS"], sys.argv[1]], stdout=subprocess.PIPE).stdout.decode()
    print(got.strip())
"""


async def test_one_endpoint_answers_each_call_with_its_own_credential_and_strangers_with_nothing(
        short_tmp, fake_program) -> None:
    asker = fake_program("asker", ASKER)
    endpoint = AskpassEndpoint(short_tmp / "askpass")
    results: dict[str, runner.Completed] = {}
    stranger: list[bytes] = []

    async def call(name: str, secret: str) -> None:
        ctx = make_ctx(short_tmp, {"pw": secret})
        ctx.askpass = endpoint
        program = runner.Program(argv=(str(asker), f"Password for {name}:"),
                                 askpass=(runner.CredentialPrompt(re.compile("^Password for"), "pw"),))
        results[name] = await runner.run(ctx, program)

    async def knock() -> None:
        # This test process descends from no call: it is closed on, unanswered.
        path = endpoint.env["RUNGD_ASKPASS_SOCKET"]
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(3)
            try:
                with askpass.socket_address(path) as address:  # an abstract name, '@...'
                    conn.connect(address)
                conn.sendall(b"Password for anyone:")
                conn.shutdown(socket.SHUT_WR)
                stranger.append(await trio.to_thread.run_sync(conn.recv, 100))
            except (BrokenPipeError, ConnectionResetError):
                stranger.append(b"")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.run)
            async with trio.open_nursery() as calls:
                calls.start_soon(call, "alpha", "alpha-Secret-1")
                calls.start_soon(call, "beta", "beta-Secret-2")
                calls.start_soon(knock)
            nursery.cancel_scope.cancel()
    # Each call's answer went to its own program, and was redacted from what it printed.
    for name in ("alpha", "beta"):
        assert results[name].answered == ["askpass pw"]
        assert "Secret" not in results[name].stdout
        assert results[name].stdout.strip() != ""
    assert stranger == [b""]
    assert endpoint._calls == {}  # every call left the endpoint when it ended


async def test_a_question_asked_while_the_daemons_loop_is_busy_still_reaches_its_call(short_tmp, fake_program) -> None:
    # The loop stalls (as under load) around the moment the program starts: its question may
    # arrive before the call has read its pid; it waits for the claim instead of being refused.
    asker = fake_program("asker", ASKER)
    endpoint = AskpassEndpoint(short_tmp / "askpass")
    done: list[tuple[float, runner.Completed]] = []

    async def call(stall_at: float) -> None:
        ctx = make_ctx(short_tmp, {"pw": "stall-Secret-9"})
        ctx.askpass = endpoint
        program = runner.Program(argv=(str(asker), "Password for stall:"),
                                 askpass=(runner.CredentialPrompt(re.compile("^Password for"), "pw"),))
        done.append((stall_at, await runner.run(ctx, program)))

    async def stall(stall_at: float) -> None:
        await trio.sleep(stall_at)
        time.sleep(0.4)  # blocks the whole loop, on purpose

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.run)
            for stall_at in (0.0, 0.003, 0.02):
                async with trio.open_nursery() as both:
                    both.start_soon(call, stall_at)
                    both.start_soon(stall, stall_at)
            nursery.cancel_scope.cancel()
    assert [(stall_at, result.answered) for stall_at, result in done] == [
        (stall_at, ["askpass pw"]) for stall_at in (0.0, 0.003, 0.02)]


async def test_a_stopped_launcher_fails_one_call_without_stalling_the_loop_and_is_replaced(
        monkeypatch: pytest.MonkeyPatch, launcher) -> None:
    monkeypatch.setattr(launch, "_PID_TIMEOUT_S", 0.5)
    monkeypatch.setattr(launch, "_SEND_TIMEOUT_S", 0.5)
    gaps: list[float] = []
    await start(launcher, ["/bin/true"])
    stopped = launcher._process
    assert stopped is not None
    os.kill(stopped.pid, signal.SIGSTOP)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(record_loop_gaps, gaps, 0.01)
        with pytest.raises(OSError) as failure:
            await launcher.spawn(["/bin/true"], {}, "/", None, [], None, None)
        assert failure.value.errno == errno.EAGAIN
        child, _ = await start(launcher, ["/bin/sh", "-c", "exit 5"])  # a new launcher
        nursery.cancel_scope.cancel()
    assert child.returncode == 5
    assert stopped.poll() is not None  # killed and reaped, not left stopped
    assert max(gaps) < 0.3, max(gaps)  # the loop kept running while it waited


FREEZER = """
    import os
    with open("/proc/self/cgroup") as file:
        path = [line.split(":", 2)[2] for line in file.read().splitlines() if line.startswith("0::")][0]
    mounts = [line.split() for line in open("/proc/self/mounts") if line.split()[2] == "cgroup2"]
    with open(os.path.join(mounts[0][1], path.lstrip("/"), "cgroup.freeze"), "w") as file:
        file.write("1")
"""


async def test_a_process_that_never_runs_its_first_line_fails_its_start_in_seconds(launcher, call_cgroup) -> None:
    # Born into a frozen cgroup, it never says its first line: the start fails (nothing ran)
    # in a few seconds, not at the call's deadline.
    (call_cgroup.path / "cgroup.freeze").write_text("1")
    started = await launcher.spawn(["/bin/true"], {}, "/", None, [], None, call_cgroup)
    with trio.fail_after(launch._PID_TIMEOUT_S + 5), pytest.raises(OSError, match="did not start within"):
        await started.exec_result()
    call_cgroup.kill()
    (call_cgroup.path / "cgroup.freeze").write_text("0")
    assert await started.child.wait() == -signal.SIGKILL
    started.child.close_pipes()


async def test_a_cgroup_its_program_froze_is_not_given_to_the_next_call(fake_program, launcher,
                                                                       call_cgroup) -> None:
    started = await launcher.spawn([str(fake_program("freezer", FREEZER))], {"PATH": "/usr/bin:/bin"}, "/",
                                   None, [], None, call_cgroup)
    await started.exec_result()
    with trio.fail_after(10):
        while b"frozen 1" not in proctree.read_file(call_cgroup.path / "cgroup.events"):
            await trio.sleep(0.01)
    (call_cgroup.path / "cgroup.kill").write_text("1")  # its tree dies; not through kill(), which marks it
    await started.child.wait()
    started.child.close_pipes()
    with trio.fail_after(5):
        while call_cgroup.populated():
            await trio.sleep(0.01)
    assert not call_cgroup.killed and not call_cgroup.reusable()  # empty, but frozen
    launcher.give_back(call_cgroup)
    assert launcher._spares == []  # retired, not given to the next call


async def test_spare_cgroups_removed_under_the_daemon_cost_the_call_nothing(short_tmp) -> None:
    spares = [proctree.CallCgroup.spare() for _ in range(3)]
    if None in spares:
        pytest.skip("no cgroup v2 hierarchy this process may make cgroups in")
    # Another daemon's sweep removes every spare at once (kept unused for over a minute): the
    # call makes a new one and runs.
    shared = launch.for_reaper(None)
    for spare in spares:
        shared._spares.append(spare)
        spare.remove()
    done = await runner.run(make_ctx(short_tmp), runner.Program(argv=("/bin/sh", "-c", "echo ran")))
    assert done.stdout == "ran\n"
    assert not any(spare in shared._spares for spare in spares)


async def test_a_cgroup_once_killed_is_never_given_to_another_call(launcher, call_cgroup) -> None:
    # This kernel kills every process born (CLONE_INTO_CGROUP) into a cgroup that was written
    # cgroup.kill once: the next call would die at birth.
    started = await launcher.spawn(["/bin/sleep", "30"], {}, "/", None, [], None, call_cgroup)
    await started.exec_result()
    assert call_cgroup.kill()
    assert await started.child.wait() == -signal.SIGKILL
    started.child.close_pipes()
    with trio.fail_after(5):
        while call_cgroup.populated():
            await trio.sleep(0.01)
    assert not call_cgroup.reusable()
    # The same cgroup, used anyway, says what happened, and the launcher stays.
    survivor = launcher._process
    again = await launcher.spawn(["/bin/true"], {}, "/", None, [], None, proctree.CallCgroup(call_cgroup.path))
    with pytest.raises(OSError, match="killed as it was made"):
        await again.exec_result()
    assert await again.child.wait() == -signal.SIGKILL
    again.child.close_pipes()
    assert launcher._process is survivor
    launcher.give_back(call_cgroup)
    assert launcher._spares == []


async def test_a_credential_store_that_fails_mid_question_fails_the_call_not_the_endpoint(
        short_tmp, fake_program) -> None:
    asker = fake_program("asker", ASKER)
    endpoint = AskpassEndpoint(short_tmp / "askpass")

    def vault_down(name: str) -> str:
        raise RuntimeError("the vault is down: pw-Leaked-1")

    program = runner.Program(argv=(str(asker), "Password for x:"),
                             askpass=(runner.CredentialPrompt(re.compile("^Password for"), "pw"),))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.run)
            ctx = make_ctx(short_tmp)
            ctx.askpass, ctx.credentials = endpoint, vault_down
            with pytest.raises(Failed, match="could not read the credential 'pw'") as failed:
                await runner.run(ctx, program)
            assert "Leaked" not in str(failed.value) + str(failed.value.hint)
            # The endpoint still answers the next call.
            ctx = make_ctx(short_tmp, {"pw": "next-Secret-2"})
            ctx.askpass = endpoint
            done = await runner.run(ctx, program)
            assert done.answered == ["askpass pw"]
            nursery.cancel_scope.cancel()


LATE_ASKER = """
    import os, signal, subprocess, sys, threading
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # it tidies up on SIGTERM: waits for it
    def ask(question):
        return subprocess.run([os.environ["SSH_ASKPASS"], question], stdout=subprocess.PIPE,
                              preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})).stdout
    threading.Thread(target=ask, args=("Something undeclared:",), daemon=True).start()  # refused
    signal.sigwait({signal.SIGTERM})
    with open(sys.argv[1], "wb", buffering=0) as out:
        out.write(b"asked;")
        got = ask("Password for x:")  # declared: answered while the call runs, never after
        out.write(b"got:" + got)
"""


async def test_nothing_is_answered_once_the_call_is_decided_not_even_in_the_kills_grace(
        short_tmp, fake_program) -> None:
    asker = fake_program("late_asker", LATE_ASKER)
    endpoint = AskpassEndpoint(short_tmp / "askpass")
    report = short_tmp / "late.out"
    program = runner.Program(argv=(str(asker), str(report)), grace_s=3.0,
                             askpass=(runner.CredentialPrompt(re.compile("^Password for"), "pw"),))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.run)
            ctx = make_ctx(short_tmp, {"pw": "late-Secret-3"})
            ctx.askpass = endpoint
            with pytest.raises(AuthRequired, match="Something undeclared"):
                await runner.run(ctx, program)
            nursery.cancel_scope.cancel()
    # SIGTERM came in the grace period; the question it asked then got no answer: its helper
    # was closed on (it then holds until the kill, or gives up with nothing).
    assert report.read_bytes() in (b"asked;", b"asked;got:")


def test_the_daemon_keeps_ambient_capabilities_for_its_launcher_alone(short_tmp) -> None:
    # Given CAP_SETUID and CAP_SETGID (to run tools as their users), the daemon's threads
    # passed them to every child but the tools' programs: ssh-keygen, a regex parse's child.
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    from rungd.client import Client
    from rungd.testing import write_config
    from tests.conftest import TEST_PLUGINS

    config = write_config(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "fake_tools.py"}"]\n')
    daemon = subprocess.Popen(["setpriv", "--inh-caps=+setuid,+setgid", "--ambient-caps=+setuid,+setgid",
                               sys.executable, "-m", "rungd.main", "serve", "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (short_tmp / "rungd.sock").exists():
            assert daemon.poll() is None and time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.05)
        with Client(short_tmp / "rungd.sock") as client:
            ran = client.call("fake_run", {"program": "argv_echo", "args": ["x"]})  # its launcher runs now
            assert ran.status == "ok", ran.error

        def ambient(status: Path) -> str:
            return next(line.split()[1] for line in status.read_text().splitlines() if line.startswith("CapAmb:"))

        threads = {ambient(task / "status") for task in Path(f"/proc/{daemon.pid}/task").iterdir()}
        launchers = [p for p in psutil.Process(daemon.pid).children()
                     if any("launcher" in part for part in p.cmdline())]
        assert threads == {"0000000000000000"}  # no thread: no child of theirs gets them
        assert [ambient(Path(f"/proc/{p.pid}/status")) for p in launchers] == ["00000000000000c0"]
    finally:
        daemon.terminate()
        daemon.wait(timeout=20)


@pytest.mark.parametrize("compiled", [False, True])
async def test_a_daemon_gone_leaves_neither_its_spare_nor_its_subtree(compiled) -> None:
    # The launcher outlives a daemon killed outright: at end of file it removes the spare
    # cgroups it was told of, then the daemon's subtree they were in (found left six times
    # on a machine after the suite's kill -9 tests).
    if compiled and launch.compiled_launcher() is None:
        pytest.skip("no compiled launcher built from this launcher.c")
    import secrets

    reaper = proctree.Reaper(set())
    reaper.cgroup_tag = f"t{secrets.token_hex(6)}"
    launcher = launch.Launcher(set(), reaper, compiled=compiled)
    await launcher.refill()  # makes a spare in the subtree and tells the launcher of it
    if not launcher._spares:
        pytest.skip("no cgroup v2 hierarchy this process may make cgroups in")
    subtree = proctree.calls_subtree(reaper.cgroup_tag)
    assert subtree is not None and [s.path.parent for s in launcher._spares] == [subtree]
    process = launcher._process
    launcher._stop_process()  # the daemon's end closes, as when it dies: only the launcher acts
    assert process is not None and process.returncode == 0
    assert not subtree.exists()
    launcher._spares.clear()
    launcher.close()
