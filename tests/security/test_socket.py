"""The socket against hostile frames and floods, through a live daemon: nothing a
connection sends may end the daemon, pin it, or lock other callers out."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rungd import protocol
from rungd.client import Client
from rungd.config import load_config
from rungd.service import server
from rungd.testing import start_daemon, write_config
from tests.conftest import TEST_PLUGINS

TIGHT = f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}"]
"""


async def tight_daemon(nursery: trio.Nursery, folder: Path, **server: object):
    """A daemon with small connection limits and short timeouts, its socket open to all."""
    config = load_config(write_config(folder, TIGHT))
    settings = {"socket_mode": "0666", "idle_timeout_s": 1.0, "frame_timeout_s": 1.0,
                "max_connections_per_uid": 4, **server}
    config = config.model_copy(update={"server": config.server.model_copy(update=settings)})
    folder.chmod(0o755)
    return await start_daemon(nursery, config)


async def read_reply(stream: trio.SocketStream) -> protocol.Response | None:
    """One reply frame, or None when the daemon closed the connection first."""
    buf = b""
    while len(buf) < 4:
        chunk = await stream.receive_some(4 - len(buf))
        if not chunk:
            return None
        buf += chunk
    (length,) = protocol.HEADER.unpack(buf)
    body = b""
    while len(body) < length:
        body += await stream.receive_some(length - len(body))
    return protocol.decode_response(body)


async def exchange(sock: Path, payload: bytes) -> protocol.Response | None:
    async with await trio.open_unix_socket(str(sock)) as stream:
        await stream.send_all(payload)
        return await read_reply(stream)


def nested_inputs_frame(depth: int) -> bytes:
    """A call whose inputs nest ``depth`` one-element arrays: a kilobyte for a thousand levels."""
    inner = b"\x91" * depth + b"\xc0"  # fixarray of 1, ..., nil
    body = msgspec.msgpack.encode({"type": "call", "tool": "test_text_echo"})
    # Rebuild the map with a third key whose value is the raw nested bytes.
    body = b"\x83" + body[1:] + msgspec.msgpack.encode("inputs") + b"\x81" + msgspec.msgpack.encode("x") + inner
    return protocol.HEADER.pack(len(body)) + body


async def serves(daemon) -> bool:
    env = await daemon.call("test_text_echo", {"text": "alive"})
    return env.status == "ok"


@pytest.mark.parametrize("depth", [40, 1000, 5000])
async def test_deeply_nested_inputs_are_refused_and_the_daemon_lives(nursery, short_tmp, depth) -> None:
    daemon = await tight_daemon(nursery, short_tmp)
    frame = nested_inputs_frame(depth)
    assert len(frame) < depth + 100  # a small frame, well under any size limit
    reply = await exchange(daemon.socket, frame)
    assert isinstance(reply, protocol.ProtocolError) and reply.code == "INVALID_MESSAGE", reply
    assert "nest" in reply.message
    assert await serves(daemon)


async def test_inputs_with_tens_of_thousands_of_names_are_refused_without_describing_each(nursery, short_tmp) -> None:
    # Once, each unknown name cost the loop an error dict, twice: 0.65 s a frame, a stall for
    # every caller while one caller's connections sent them.
    daemon = await tight_daemon(nursery, short_tmp)
    inputs = {f"k{i}": i for i in range(60_000)}
    body = msgspec.msgpack.encode({"type": "call", "tool": "test_text_echo", "inputs": inputs})
    assert server.decoded_cost(body) > server.LARGE_REQUEST  # decoded while no other large one is
    reply = await exchange(daemon.socket, protocol.HEADER.pack(len(body)) + body)
    assert isinstance(reply, protocol.Result), reply
    error = reply.envelope.error
    assert error is not None and error.code == "BAD_INPUT"
    assert "(and 59997 more) are not inputs of test_text_echo" in error.message
    assert "its inputs are text" in error.hint
    assert await serves(daemon)


decoder_bombs = st.one_of(
    # containers that announce far more elements than the frame holds
    st.sampled_from([b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdc\xff\xff", b"\xc6\xff\xff\xff\xff"]),
    # deep nesting of maps and arrays, mixed
    st.lists(st.sampled_from([b"\x91", b"\x81\xa1k"]), min_size=50, max_size=3000).map(lambda p: b"".join(p) + b"\xc0"),
    # extension types and timestamps where a request map belongs
    st.binary(min_size=1, max_size=8).map(lambda b: b"\xc7" + bytes([len(b)]) + b"\x05" + b),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bomb=decoder_bombs)
def test_decoder_bombs_get_a_protocol_error_never_a_dead_daemon(live_daemon, bomb: bytes) -> None:
    sock, portal = live_daemon
    for body in (bomb, msgspec.msgpack.encode({"type": "call", "tool": "test_text_echo"})[:-1] + bomb):
        reply = portal(exchange, sock, protocol.HEADER.pack(len(body)) + body)
        assert isinstance(reply, protocol.ProtocolError), reply
    assert portal(exchange, sock, protocol.frame(protocol.Hello())).__class__ is protocol.Welcome


@pytest.fixture
def live_daemon(short_tmp: Path):
    """A daemon in its own process, for hypothesis (which cannot share a Trio test's loop)."""
    config = write_config(short_tmp, TIGHT)
    proc = subprocess.Popen([sys.executable, "-m", "rungd.main", "serve", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = short_tmp / "rungd.sock"
    try:
        for _ in range(200):
            if sock.exists():
                break
            trio.run(trio.sleep, 0.05)
        yield sock, lambda fn, *args: trio.run(fn, *args)
        assert proc.poll() is None, "the daemon died"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def test_a_four_gib_length_prefix_does_not_pin_its_connection(nursery, short_tmp) -> None:
    daemon = await tight_daemon(nursery, short_tmp)
    async with await trio.open_unix_socket(str(daemon.socket)) as stream:
        await stream.send_all(struct.pack(">I", 2**32 - 1))
        reply = await read_reply(stream)
        assert isinstance(reply, protocol.ProtocolError) and reply.code == "FRAME_TOO_LARGE"
        with trio.fail_after(2):  # closed at once: nobody reads 4 GiB for a sender that means harm
            assert await stream.receive_some(1) == b""
    assert await serves(daemon)


async def test_a_trickled_frame_is_cut_off_at_the_frame_timeout(nursery, short_tmp) -> None:
    daemon = await tight_daemon(nursery, short_tmp)
    frame = protocol.frame(protocol.Hello())
    async with await trio.open_unix_socket(str(daemon.socket)) as stream:
        with trio.fail_after(5):
            try:
                for i in range(len(frame)):
                    await stream.send_all(frame[i:i + 1])
                    await trio.sleep(0.4)
            except trio.BrokenResourceError:
                pass
            reply = await read_reply(stream)
    assert isinstance(reply, protocol.ProtocolError) and reply.code == "SLOW_FRAME"


async def test_an_idle_connection_is_closed_after_the_idle_timeout(nursery, short_tmp) -> None:
    daemon = await tight_daemon(nursery, short_tmp)
    async with await trio.open_unix_socket(str(daemon.socket)) as stream:
        with trio.fail_after(5):
            assert await stream.receive_some(1) == b""


def as_user(uid: int, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as ``uid`` after the imports (the interpreter lives under /root)."""
    script = "import json, os, socket, time\n" f"os.setgroups([]); os.setgid({uid}); os.setuid({uid})\n" + code
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


async def test_one_caller_cannot_take_every_connection(nursery, short_tmp) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    daemon = await tight_daemon(nursery, short_tmp, idle_timeout_s=30.0)
    flood = (
        f"held = []\n"
        f"for _ in range(50):\n"
        f"    s = socket.socket(socket.AF_UNIX); s.connect({str(daemon.socket)!r}); held.append(s)\n"
        f"time.sleep(0.5)\n"
        f"closed = 0\n"
        f"for s in held:\n"
        f"    s.settimeout(0.2)\n"
        f"    try:\n"
        f"        closed += s.recv(65536) != b'' or 0\n"
        f"    except TimeoutError:\n"
        f"        pass\n"
        f"print(json.dumps(closed))\n"
    )
    done = await trio.to_thread.run_sync(as_user, 65534, flood)
    assert done.returncode == 0, done.stderr
    refused = int(done.stdout)
    assert refused == 50 - 4, "every connection over the per-uid cap is told why and closed"
    assert await serves(daemon)  # root, and anyone else, still gets in


async def test_a_flood_of_refused_calls_is_summed_up_in_the_ledger_not_recorded_call_by_call(short_tmp) -> None:
    # 0.8 MB a second of received + rejected records once, from a caller that may call nothing.
    from rungd_ledgers import iter_records

    from rungd.service.engine.rejections import BURST

    sent = 400

    def flood(socket: Path) -> list[str]:
        with Client(socket) as client:
            return [client.call("no_such_tool", {}).error.code for _ in range(sent)]

    async with trio.open_nursery() as nursery:
        daemon = await tight_daemon(nursery, short_tmp)
        codes = await trio.to_thread.run_sync(flood, daemon.socket)
        assert codes == ["UNKNOWN_TOOL"] * sent  # every one answered
        daemon.daemon.stop()  # the summary is written at shutdown at the latest
    records = list(iter_records(short_tmp / "state" / "ledger"))
    one_by_one = [r for r in records if r.event == "rejected" and r.call_id]
    summaries = [r for r in records if r.event == "rejected" and not r.call_id]
    assert BURST <= len(one_by_one) < sent
    assert len(summaries) == 1 and summaries[0].caller_uid == os.getuid()
    left_out = int(summaries[0].note.split()[0])
    assert len(one_by_one) + left_out == sent, summaries[0].note  # none lost, none counted twice
    assert "UNKNOWN_TOOL x" in summaries[0].note and "'no_such_tool' x" in summaries[0].note


async def test_a_client_that_never_reads_its_replies_is_let_go(nursery, short_tmp) -> None:
    # Its connection once waited in send for ever, holding its caller's connection slot.
    daemon = await tight_daemon(nursery, short_tmp)  # idle_timeout_s = 1
    request = protocol.frame(protocol.Describe(tool="test_text_echo"))
    sent = 3000  # some MB of replies: far more than the socket buffers hold
    async with await trio.open_unix_socket(str(daemon.socket)) as stream:
        await stream.send_all(request * sent)
        await trio.sleep(3)  # read nothing meanwhile
        replies = 0
        with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):  # ended, or reset
            while await read_reply(stream) is not None:
                replies += 1
    assert replies < sent  # what the buffers held at most, then the end: it was let go
    assert await serves(daemon)


def empty_lists_frame(count: int) -> bytes:
    """A call whose one input is ``count`` empty arrays: a byte each on the wire, about 64 in
    memory once decoded (a caller's amplifier: a megabyte decoded to 73 MB)."""
    body = msgspec.msgpack.encode({"type": "call", "tool": "test_text_echo"})
    body = b"\x83" + body[1:] + msgspec.msgpack.encode("inputs") + b"\x81" + msgspec.msgpack.encode("text") \
        + b"\xdd" + struct.pack(">I", count) + b"\x90" * count
    return protocol.HEADER.pack(len(body)) + body


async def test_a_large_request_is_decoded_only_in_its_turn(nursery, short_tmp) -> None:
    # Each of a caller's 128 connections once decoded its megabyte of empty lists before
    # waiting its turn: 73 MB each, a daemon at 4 GB and other callers waiting 45 s (an
    # attacker's trial). A frame that may decode to much now waits undecoded.
    import gc

    daemon = await tight_daemon(nursery, short_tmp)
    frame = empty_lists_frame(200_000)
    turn = daemon.daemon.dispatcher.big_requests
    await turn.acquire()  # another large request holds the turn
    try:
        before = len(gc.get_objects())
        async with await trio.open_unix_socket(str(daemon.socket)) as waiting:
            await waiting.send_all(frame)
            # Meanwhile a small request is answered, and the large one holds its bytes only.
            assert isinstance(await exchange(daemon.socket, protocol.frame(protocol.Hello())), protocol.Welcome)
            assert len(gc.get_objects()) - before < 10_000  # not its 200,000 lists
            turn.release()
            reply = await read_reply(waiting)
    finally:
        if turn.locked() and turn.statistics().owner is trio.lowlevel.current_task():
            turn.release()
    assert isinstance(reply, protocol.Result) and reply.envelope.error.code == "BAD_INPUT", reply
    assert await serves(daemon)


@pytest.mark.parametrize("inputs", [
    {"a": [[] for _ in range(50_000)]},
    {"a": [{} for _ in range(50_000)]},
    {"rows": [{"name": "Привет, мир " * 3, "n": n} for n in range(3_000)]},
    {"rows": [{"name": "hello", "n": n * 1_000, "f": n / 7} for n in range(10_000)]},
    {"words": ["ab"] * 100_000, "big": [2 ** 40 + n for n in range(20_000)]},
    {"text": "x" * 300_000},
    {"a": [-20] * 40_000},  # past the few small ints CPython keeps (a review's counterexample)
    {"a": [{n: 0} for n in range(100)] * 100},  # maps of one entry: three bytes, 232 in memory
    {"a": [{n: 0 for n in range(128)}] * 2_000},  # wide maps of one-byte keys and values
], ids=["lists", "maps", "cyrillic", "rows", "short-strings-and-ints", "one-string", "negative-ints",
        "one-entry-maps", "wide-maps"])
def test_the_decoded_cost_bounds_what_a_request_takes_once_decoded(inputs) -> None:
    import tracemalloc

    body = msgspec.msgpack.encode({"type": "call", "tool": "t", "inputs": inputs})
    tracemalloc.start()
    try:
        decoded = protocol.decode_request(body)
        taken = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del decoded
    assert taken <= server.decoded_cost(body)


async def test_every_waiting_connection_is_taken_at_once(nursery, short_tmp) -> None:
    # trio's serve_listeners took one connection per turn of the loop; with each turn holding
    # a large request's decoding, a burst of one caller's connections kept another caller's
    # hello out for five seconds (an attacker's trial). Counted in turns, not in seconds.
    import socket as stdlib_socket

    daemon = await tight_daemon(nursery, short_tmp, max_connections_per_uid=64)
    await trio.testing.wait_all_tasks_blocked()
    waiting = []
    try:
        for _ in range(30):  # into the backlog: the loop does not run meanwhile
            sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
            sock.connect(str(daemon.socket))
            waiting.append(sock)
        for _ in range(4):
            await trio.sleep(0)
        assert sum(daemon.daemon._limits._open.values()) == 30
    finally:
        for sock in waiting:
            sock.close()
