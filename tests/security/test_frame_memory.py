"""What a connection can make the daemon hold: a big frame's body is buffered only for a
peer that may call something, and one uid's unfinished frames share one budget, however
many connections it opens. Four uids with a hundred connections each once took the daemon
from 48 to 582 MiB with frames they never finished.

The hostile peer is uid 65534, a process that drops to it before connecting, so the daemon
learns it from SO_PEERCRED exactly as it would in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from rungd.config import load_config
from rungd.service.server import FRAMES_IN_FLIGHT_PER_UID, SMALL_FRAME
from rungd.testing import start_daemon, write_config
from tests.conftest import TEST_PLUGINS

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another uid")

NOBODY = 65534


async def daemon_for(nursery: trio.Nursery, folder: Path, uids: list[int]):
    """A daemon whose tools ``uids`` may call, its socket open to all, frames given 10 s."""
    body = f'[access]\nuids = {uids}\n\n[plugins]\nfiles = ["{TEST_PLUGINS / "echo_tools.py"}"]\n'
    config = load_config(write_config(folder, body))
    settings = {"socket_mode": "0666", "frame_timeout_s": 10.0, "max_connections_per_uid": 16}
    config = config.model_copy(update={"server": config.server.model_copy(update=settings)})
    folder.chmod(0o755)
    return await start_daemon(nursery, config)


# Run as uid 65534 (the interpreter lives under /root: imports first, then the drop).
PRELUDE = f"""
import json, os, socket, sys
from rungd import protocol
from rungd.client import Client
os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})
path = sys.argv[1]

def reply(s, timeout):
    '''The code of the reply on ``s``, "closed" when the daemon hung up, None when it said nothing.'''
    s.settimeout(timeout)
    head = b""
    try:
        while len(head) < 4:
            chunk = s.recv(4 - len(head))
            if not chunk:
                return "closed"
            head += chunk
    except TimeoutError:
        return None
    (length,) = protocol.HEADER.unpack(head)
    body = b""
    while len(body) < length:
        body += s.recv(length - len(body))
    answer = protocol.decode_response(body)
    return getattr(answer, "code", type(answer).__name__)
"""


async def test_a_peer_that_may_call_nothing_is_closed_at_a_big_frames_header(nursery, short_tmp) -> None:
    daemon = await daemon_for(nursery, short_tmp, [0])  # nobody may call nothing, nor decide
    script = PRELUDE + f"""
s = socket.socket(socket.AF_UNIX); s.connect(path)
s.sendall(protocol.frame(protocol.Hello()))
small = reply(s, 5)  # a small frame is answered as ever
s.sendall(protocol.HEADER.pack({SMALL_FRAME + 1}))  # and not a byte of the body
big = reply(s, 5)
print(json.dumps([small, big, reply(s, 5)]))
"""
    with trio.fail_after(8):  # before the fix: the body was awaited until SLOW_FRAME, 10 s
        done = await trio.run_process([sys.executable, "-c", script, str(daemon.socket)], capture_stdout=True)
    assert json.loads(done.stdout) == ["Welcome", "FRAME_TOO_LARGE", "closed"]
    assert daemon.daemon._frames.held(NOBODY) == 0
    daemon.daemon.stop()


async def test_one_uids_unfinished_frames_never_hold_more_than_its_budget(nursery, short_tmp) -> None:
    daemon = await daemon_for(nursery, short_tmp, [0, NOBODY])
    limit = daemon.config.server.max_frame_bytes
    budget = FRAMES_IN_FLIGHT_PER_UID * (limit + 4)
    opened = 8
    script = PRELUDE + f"""
held = []
for _ in range({opened}):  # each: the header of a maximum frame and half its body, then nothing
    s = socket.socket(socket.AF_UNIX); s.connect(path)
    s.sendall(protocol.HEADER.pack({limit}) + bytes({limit // 2}))
    held.append(s)
codes = [reply(s, 0.5) for s in held]
refused = held[codes.index("FRAME_TOO_LARGE")]
refused.sendall(bytes({limit - limit // 2}) + protocol.frame(protocol.Hello()))  # the rest, dropped
usable = reply(refused, 5)
with Client(path) as c:  # a small call of the same uid still goes through
    echoed = c.call("test_text_echo", {{"text": "x"}}).status
print(json.dumps([codes, usable, echoed]), flush=True)
sys.stdin.readline()  # hold the connections open while the daemon's count is read
"""
    attacker = await trio.lowlevel.open_process([sys.executable, "-c", script, str(daemon.socket)],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                line += await attacker.stdout.receive_some(4096)
        codes, usable, echoed = json.loads(line)
        frames = daemon.daemon._frames
        assert frames.held(NOBODY) == FRAMES_IN_FLIGHT_PER_UID * (limit + 4) <= budget
        assert codes.count(None) == FRAMES_IN_FLIGHT_PER_UID  # read, within the budget
        assert codes.count("FRAME_TOO_LARGE") == opened - FRAMES_IN_FLIGHT_PER_UID  # told why
        assert (usable, echoed) == ("Welcome", "ok")  # refused frames cost no connection
        env = await daemon.call("test_text_echo", {"text": "root too"})  # another uid, untouched
        assert env.status == "ok"
    finally:
        with trio.move_on_after(5):  # end of stdin ends it
            await attacker.stdin.aclose()
            await attacker.wait()
        if attacker.poll() is None:
            attacker.kill()
            await attacker.wait()
        await attacker.stdout.aclose()
    with trio.fail_after(5):  # given back when the connections go
        while frames.held(NOBODY):
            await trio.sleep(0.05)
    daemon.daemon.stop()
