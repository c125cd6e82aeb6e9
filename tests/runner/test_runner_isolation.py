"""A call's program obtains nothing of another call's: not its askpass answers, not its
credential files, and it cannot end the other call by asking at its door (issue 17.1).

Both calls run as the same uid (root here), so file modes separate nothing; what separates
them is the askpass endpoint's check of its peer (a descendant of its own call's child) and
credential files that have no path (in-memory files the child inherits).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import trio

from rungd import runner
from rungd.runner.askpass_server import AskpassServer
from tests.conftest import nest_folders
from tests.runner.test_runner_refusals import FAKES, make_ctx

SECRET = "victim-Pw-77q-never-shared"
QUESTION = "Password for 'http://ops@127.0.0.1':"

# The victim: holds a credential file and, after a while, asks its declared askpass question.
VICTIM = """
    import os, subprocess, sys, time
    time.sleep(float(sys.argv[1]))
    with open(os.environ["APP_PW_FILE"]) as file:
        from_file = file.read()
    got = subprocess.run([os.environ["SSH_ASKPASS"], sys.argv[2]], stdout=subprocess.PIPE).stdout.decode().strip()
    print("file ok" if from_file == os.environ["EXPECT"] else "file wrong")
    print("askpass ok" if got == os.environ["EXPECT"] else "askpass wrong")
"""


async def test_a_program_cannot_take_another_calls_askpass_answer_or_credential_file(short_tmp, fake_program) -> None:
    victim_program = runner.Program(
        argv=(str(fake_program("victim", VICTIM)), "2", QUESTION),
        env={"EXPECT": SECRET},
        file_credentials={"APP_PW_FILE": "pw"},
        askpass=(runner.CredentialPrompt(re.compile(r"^Password for 'http://ops@"), "pw"),),
    )
    thief_program = runner.Program(argv=(str(FAKES / "thief"), str(short_tmp)))
    results: dict[str, object] = {}

    async def victim() -> None:
        results["victim"] = await runner.run(make_ctx(short_tmp, {"pw": SECRET}), victim_program)

    async def thief() -> None:
        work = short_tmp / "work"
        while not list(work.glob("*/.rungd-*/s")):  # the victim's door is open
            await trio.sleep(0.02)
        results["thief"] = await runner.run(make_ctx(short_tmp), thief_program)

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(victim)
            nursery.start_soon(thief)

    stolen = results["thief"]
    assert isinstance(stolen, runner.Completed)
    assert stolen.exit_status == 0, stolen.stderr
    lines = stolen.stdout.splitlines()
    # It found the victim's door and knocked: the attack was tried, and got nothing back.
    knocks = [line for line in lines if line.startswith("socket ")]
    assert knocks, stolen.stdout
    # Closed unanswered: an empty reply, or a broken pipe if it closed before the question.
    assert all(line.endswith((": b''", "Broken pipe", "Connection reset by peer")) for line in knocks), stolen.stdout
    assert not [line for line in lines if line.startswith("file ")], stolen.stdout  # no file to find
    assert SECRET not in stolen.stdout + stolen.stderr
    # The stranger's question did not end the victim's call, nor reach it.
    done = results["victim"]
    assert isinstance(done, runner.Completed)
    assert done.stdout.split() == ["file", "ok", "askpass", "ok"], done.stdout
    assert done.answered == ["askpass pw"]


async def test_a_stranger_on_the_door_is_refused_without_ending_the_call(short_tmp, fake_program) -> None:
    # A process outside the call (this test itself) asks at the call's door while it runs.
    import socket

    waiter = fake_program("waiter", """
        import time
        time.sleep(1.5)
        print("finished")
    """)
    ctx = make_ctx(short_tmp, {"pw": SECRET})
    program = runner.Program(argv=(str(waiter),), askpass=(runner.CredentialPrompt(re.compile("."), "pw"),))
    replies: list[bytes] = []

    async def stranger() -> None:
        while not (doors := list(ctx.work_dir.glob(".rungd-*/s"))):
            await trio.sleep(0.02)
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(3)
            try:
                conn.connect(str(doors[0]))
                conn.sendall(QUESTION.encode())
                conn.shutdown(socket.SHUT_WR)
                replies.append(await trio.to_thread.run_sync(conn.recv, 100))
            except (BrokenPipeError, ConnectionResetError):
                replies.append(b"")  # closed on it before it could even ask

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stranger)
            done = await runner.run(ctx, program)
    assert replies == [b""]
    assert done.stdout.strip() == "finished" and done.answered == []


async def test_a_long_state_path_keeps_the_askpass_folder_inside_the_work_folder(short_tmp, fake_program) -> None:
    # Issue 17.10: a socket path longer than sun_path no longer sends the folder to /tmp.
    deep = short_tmp / ("long-state-folder-" * 8)
    deep.mkdir()
    shows = fake_program("shows", """
        import os, subprocess
        print(os.environ["SSH_ASKPASS"])
        print(os.environ["APP_PW_FILE"])
        print(subprocess.run([os.environ["SSH_ASKPASS"], "Password:"], stdout=subprocess.PIPE).stdout.decode().strip())
    """)
    before = set(Path("/tmp").glob("rungd-askpass-*"))
    ctx = make_ctx(deep, {"pw": SECRET})
    program = runner.Program(argv=(str(shows),), file_credentials={"APP_PW_FILE": "pw"},
                             askpass=(runner.CredentialPrompt(re.compile("^Password:"), "pw"),))
    with trio.fail_after(10):
        done = await runner.run(ctx, program)
    helper, secret_file, answer = done.stdout.split("\n")[:3]
    assert len(os.fsencode(helper)) > 108
    assert Path(helper).parent.parent == ctx.work_dir
    assert secret_file.startswith("/dev/fd/")
    assert answer == "[REDACTED]"  # answered through the long path, and redacted in what is kept
    assert set(Path("/tmp").glob("rungd-askpass-*")) == before
    assert not list(ctx.work_dir.glob(".rungd-*"))


async def test_a_private_askpass_folder_a_program_nested_deep_in_is_removed_at_the_end(tmp_path) -> None:
    # Without a daemon a call's askpass folder is its own, and its program may work in it:
    # folders nested past a recursive removal's reach (and any path's) must not make the
    # call's end raise.
    server = AskpassServer(tmp_path)
    nest_folders(server.workdir, 3000)
    server.close()
    assert not server.folder.exists()
