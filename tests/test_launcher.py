"""The launcher (issue 13): one small process that starts every program, born in its call's
cgroup and the daemon's own child; and the daemon's one askpass endpoint shared by its calls.

Real processes throughout: the launcher is started, asked, killed and replaced for real.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket

import pytest
import trio

from rungd import proctree, runner
from rungd.runner import launch
from rungd.runner.askpass_server import AskpassEndpoint
from tests.test_runner_refusals import make_ctx

SELF_REPORT = """
    import json, os
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    with open("/proc/self/cgroup") as file:
        cgroup = [line.split(":", 2)[2] for line in file.read().splitlines() if line.startswith("0::")]
    print(json.dumps({"ppid": os.getppid(), "pid": os.getpid(), "sid": os.getsid(0), "fds": fds,
                      "cgroup": cgroup[0] if cgroup else None, "cwd": os.getcwd()}))
"""


async def start(launcher: launch.Launcher, argv: list[str], cgroup: proctree.CallCgroup | None = None,
                cwd: str = "/") -> tuple[launch.Child, bytes]:
    started = await launcher.spawn(argv, {"PATH": "/usr/bin:/bin"}, cwd, None, [], None, cgroup)
    await started.exec_result()
    child = started.child
    assert child.stdout is not None
    out = b""
    while chunk := await child.stdout.receive_some():
        out += chunk
    await child.wait()
    for stream in (child.stdin, child.stdout, child.stderr):
        assert stream is not None
        await stream.aclose()
    return child, out


async def test_a_program_is_our_own_child_in_its_own_session_with_nothing_but_its_three_streams(
        short_tmp, fake_program) -> None:
    launcher = launch.Launcher(None)
    try:
        child, out = await start(launcher, [str(fake_program("report", SELF_REPORT))], cwd=str(short_tmp))
    finally:
        launcher.close()
    report = json.loads(out)
    assert child.returncode == 0
    # CLONE_PARENT: the daemon (here, this test) is the parent and hears the real exit status.
    assert report["ppid"] == os.getpid()
    assert report["sid"] == report["pid"] == child.pid
    # 0-2, and the descriptor listdir itself holds: not the launcher's socket, not a pipe end.
    assert report["fds"] == [0, 1, 2, 3]
    assert report["cwd"] == str(short_tmp)


async def test_a_program_is_born_in_the_cgroup_it_was_given(fake_program) -> None:
    cgroup = proctree.CallCgroup.spare()
    if cgroup is None:
        pytest.skip("no cgroup v2 hierarchy this process may make cgroups in")
    launcher = launch.Launcher(None)
    try:
        _, out = await start(launcher, [str(fake_program("report", SELF_REPORT))], cgroup)
    finally:
        launcher.close()
        await cgroup.remove_when_empty()
    # Its very first look at itself already finds it there: it never ran anywhere else.
    assert json.loads(out)["cgroup"].endswith("/" + cgroup.path.name)


async def test_a_launcher_killed_between_calls_is_replaced_and_reaped() -> None:
    launcher = launch.Launcher(None)
    try:
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
    finally:
        launcher.close()


async def test_a_program_that_cannot_be_started_says_why_and_leaves_no_process(short_tmp) -> None:
    launcher = launch.Launcher(None)
    try:
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
    finally:
        launcher.close()


async def test_a_programs_result_is_the_same_through_run(short_tmp) -> None:
    ctx = make_ctx(short_tmp)
    done = await runner.run(ctx, runner.Program(argv=("/bin/sh", "-c", "echo out; echo err >&2; exit 3")))
    assert (done.exit_status, done.stdout, done.stderr) == (3, "out\n", "err\n")
    # Both streams printed, so both are kept as evidence; a silent stream has none.
    assert sorted(name.rsplit(".", 1)[1] for name in done.evidence) == ["stderr", "stdout"]
    quiet = await runner.run(make_ctx(short_tmp), runner.Program(argv=("/bin/true",)))
    assert quiet.evidence == []


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
                conn.connect(path)
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
