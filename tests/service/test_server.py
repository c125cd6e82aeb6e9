"""The spine against a real daemon on a real socket: frames, tools, calls, access, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import trio

from tests.conftest import TEST_PLUGINS
from rungd import protocol
from rungd.client import Client, RequestRejected
from rungd.config import load_config
from rungd.service.daemon import Daemon
from rungd.core.errors import PluginError
from rungd.testing import write_config

ECHO = f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}"]
"""


@pytest.fixture
def rungd_config_toml() -> str:
    return ECHO


async def raw_exchange(sock_path: Path, payload: bytes) -> tuple[trio.SocketStream, protocol.Response]:
    stream = await trio.open_unix_socket(str(sock_path))
    await stream.send_all(payload)
    return stream, await read_frame(stream)


async def read_frame(stream: trio.SocketStream) -> protocol.Response:
    buf = b""
    while len(buf) < 4:
        buf += await stream.receive_some(4 - len(buf))
    (length,) = protocol.HEADER.unpack(buf)
    body = b""
    while len(body) < length:
        body += await stream.receive_some(length - len(body))
    return protocol.decode_response(body)


def body_frame(obj: object) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return protocol.HEADER.pack(len(body)) + body


async def still_serves(stream: trio.SocketStream) -> None:
    await stream.send_all(protocol.frame(protocol.Hello()))
    assert isinstance(await read_frame(stream), protocol.Welcome)


async def test_list_describe_call(rungd_daemon) -> None:
    tools = await rungd_daemon.run(Client.list_tools)
    names = [t.name for t in tools]
    assert {"test_text_echo", "inventory_item_show", "inventory_count_set"} <= set(names)
    definition = await rungd_daemon.run(Client.describe, "inventory_item_show")
    assert definition.plugin == "demo"
    assert definition.input_schema["additionalProperties"] is False
    assert definition.input_schema["properties"]["item"]["examples"] == ["widget"]
    for slot in ("Does:", "Use when:", "Do not use when:", "Returns:", "On error:", "If unknown:"):
        assert slot in definition.description
    env = await rungd_daemon.call("test_text_echo", {"text": "ab", "times": 2})
    assert (env.status, env.outcome, env.effect, env.fields) == ("ok", "done", "none", {"text": "abab"})
    assert env.call_id.startswith("c")


async def test_welcome_reports_the_peer_from_the_kernel(rungd_daemon) -> None:
    welcome = await rungd_daemon.run(Client.hello)
    assert (welcome.uid, welcome.gid, welcome.pid) == (os.getuid(), os.getgid(), os.getpid())


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"\x00\x00\x00\x03\xc1\xc1\xc1", "NOT_MSGPACK"),
        (body_frame({"type": "launch_missiles"}), "INVALID_MESSAGE"),
        (body_frame({"type": "describe", "tool": "x", "force": True}), "INVALID_MESSAGE"),
        (body_frame({"type": "describe", "tool": 42}), "INVALID_MESSAGE"),
        (body_frame([1, 2, 3]), "INVALID_MESSAGE"),
        (body_frame({"type": "status", "call_id": "c-no-such-call"}), "UNKNOWN_CALL"),
    ],
)
async def test_bad_frame_gets_protocol_error_and_connection_stays_usable(rungd_daemon, payload, code) -> None:
    stream, reply = await raw_exchange(rungd_daemon.socket, payload)
    assert isinstance(reply, protocol.ProtocolError)
    assert reply.code == code
    assert reply.message
    await still_serves(stream)
    await stream.aclose()


async def test_oversize_frame_is_refused_and_skipped(rungd_daemon) -> None:
    limit = rungd_daemon.config.server.max_frame_bytes
    stream = await trio.open_unix_socket(str(rungd_daemon.socket))
    await stream.send_all(protocol.HEADER.pack(limit + 1))
    reply = await read_frame(stream)
    assert isinstance(reply, protocol.ProtocolError) and reply.code == "FRAME_TOO_LARGE"
    await stream.send_all(b"\x00" * (limit + 1))  # the body is read and dropped, not kept
    await still_serves(stream)
    await stream.aclose()


async def test_truncated_frame_gets_an_error_and_others_are_unaffected(rungd_daemon) -> None:
    stream = await trio.open_unix_socket(str(rungd_daemon.socket))
    await stream.send_all(protocol.HEADER.pack(100) + b"\x81")
    await stream.send_eof()
    reply = await read_frame(stream)
    assert isinstance(reply, protocol.ProtocolError) and reply.code == "TRUNCATED"
    await stream.aclose()
    env = await rungd_daemon.call("test_text_echo", {"text": "still here"})
    assert env.status == "ok"


async def test_unknown_tool_lists_close_names_and_runs_nothing(rungd_daemon) -> None:
    env = await rungd_daemon.call("inventory_itme_show", {"item": "widget"})
    assert env.status == "error"
    assert (env.error.code, env.error.retry, env.next_action, env.outcome) == (
        "UNKNOWN_TOOL", "no", "repair", "not_started")
    assert "inventory_item_show" in env.error.hint
    assert env.evidence == []  # nothing ran, so nothing was kept


@pytest.mark.parametrize(
    "inputs",
    [{"item": "widget", "x": 1}, {"item": 7}, {"item": "-rf"}, {"item": "wid\x00get"}, {"item": "w" * 5000}],
)
async def test_bad_input_touches_nothing(rungd_daemon, inputs) -> None:
    env = await rungd_daemon.call("inventory_count_set", {**inputs, "count": 1}, request_id="r1")
    assert (env.status, env.error.code, env.outcome, env.next_action) == ("error", "BAD_INPUT", "not_started", "repair")
    assert "item" in env.error.message + env.error.hint
    assert 'inventory_count_set {"item": "widget", "count": 15}' in env.error.hint
    assert not (rungd_daemon.config.state_dir / "demo" / "inventory.json").exists()


async def test_write_without_request_id_is_bad_input(rungd_daemon) -> None:
    env = await rungd_daemon.call("inventory_count_set", {"item": "widget", "count": 1})
    assert env.error.code == "BAD_INPUT"
    assert "request_id" in env.error.message


async def test_byte_cap_truncates_and_says_how_to_narrow(rungd_daemon) -> None:
    env = await rungd_daemon.call("test_blob_get", {"size": 50000})
    assert env.status == "ok"
    assert env.truncated is True
    assert env.narrow
    assert len(msgspec.json.encode(env)) <= 2048


async def test_pending_then_wait_from_another_connection(rungd_daemon) -> None:
    env = await rungd_daemon.call("test_clock_sleep", {"seconds": 0.6}, wait_s=0.05)
    assert env.status == "pending"
    status = await rungd_daemon.run(Client.status, env.call_id)
    assert status.status == "pending"
    done = await rungd_daemon.run(Client.wait, env.call_id, 10)
    assert (done.status, done.fields, done.call_id) == ("ok", {"slept": 0.6}, env.call_id)


async def test_deadline_gives_timeout_not_started_for_an_uncommitted_read(rungd_daemon) -> None:
    env = await rungd_daemon.call("test_clock_sleep", {"seconds": 30})  # its deadline is 5 s
    assert (env.status, env.error.code, env.outcome) == ("error", "TIMEOUT", "not_started")
    assert env.error.retry == "yes"


async def test_hundred_concurrent_clients(rungd_daemon) -> None:
    results: list[str] = []
    limiter = trio.CapacityLimiter(100)

    async def one(i: int) -> None:
        def blocking() -> str:
            with rungd_daemon.client() as client:
                return client.call("test_text_echo", {"text": f"n{i}"}).fields["text"]

        results.append(await trio.to_thread.run_sync(blocking, limiter=limiter))

    async with trio.open_nursery() as nursery:
        for i in range(100):
            nursery.start_soon(one, i)
    assert sorted(results) == sorted(f"n{i}" for i in range(100))


async def test_denied_for_a_uid_not_on_the_allow_list(short_tmp: Path, nursery) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another uid")
    config = load_config(write_config(short_tmp, ECHO.replace("[plugins]", """
[access]
uids = [65534]

[access.tools.test_text_echo]
uids = [0]

[plugins]""")))
    config = config.model_copy(update={"server": config.server.model_copy(update={"socket_mode": "0666"})})
    daemon = Daemon(config)
    await nursery.start(daemon.serve)
    short_tmp.chmod(0o755)  # mkdtemp made it 0700; the socket's folder must be searchable
    # The interpreter lives under /root, which nobody cannot read: drop to uid 65534 after
    # the imports, before connecting. SO_PEERCRED reports the credentials at connect time.
    script = (
        "import json, os; from rungd.client import Client\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        f"c = Client({str(config.server.socket)!r})\n"
        "env = c.call('test_text_echo', {'text': 'x'})\n"
        "print(json.dumps([env.status, env.error.code if env.error else None, env.next_action,"
        " sorted(t.name for t in c.list_tools())]))\n"
    )
    result = await trio.run_process([sys.executable, "-c", script], capture_stdout=True)
    status, code, next_action, visible = msgspec.json.decode(result.stdout)
    # A tool the caller may not use answers as one that does not exist: it learns nothing
    # about what it may not call.
    assert (status, code, next_action) == ("error", "UNKNOWN_TOOL", "repair")
    assert "test_text_echo" not in visible and "inventory_item_show" in visible
    daemon.stop()


def test_misspelled_hook_fails_start_up_naming_it(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, f'[plugins]\nfiles = ["{TEST_PLUGINS / "misspelled.py"}"]\n'))
    with pytest.raises(PluginError, match="rungd_register_tool"):
        Daemon(config)


def test_duplicate_tool_name_fails_start_up_naming_both_plugins(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}", "{TEST_PLUGINS / 'duplicate.py'}"]
"""))
    with pytest.raises(PluginError) as caught:
        Daemon(config)
    assert "test_text_echo" in str(caught.value)
    assert "file:echo_tools" in str(caught.value) and "file:duplicate" in str(caught.value)


def test_disable_list_blocks_a_plugin(short_tmp: Path) -> None:
    config = load_config(write_config(short_tmp, '[plugins]\ndisable = ["demo"]\n'))
    assert not any(name.startswith("inventory_") for name in Daemon(config).tools)


def test_sigterm_finishes_the_running_call_and_removes_the_socket(short_tmp: Path) -> None:
    path = write_config(short_tmp, ECHO)
    sock = short_tmp / "rungd.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "rungd.main", "serve", "--config", str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert time.monotonic() < deadline, "daemon never listened"
            assert daemon.poll() is None, daemon.stdout.read().decode()
            time.sleep(0.05)
        with Client(sock) as client:
            pending = client.call("test_clock_sleep", {"seconds": 1.0}, wait_s=0.1)
            assert pending.status == "pending"
            daemon.send_signal(signal.SIGTERM)
            finished = client.wait(pending.call_id, 10)  # the grace period lets it finish
        assert finished.status == "ok"
        assert daemon.wait(timeout=20) == 0
        assert not sock.exists()
    finally:
        daemon.kill()
        daemon.wait()
        daemon.stdout.close()


async def test_describe_unknown_tool_is_rejected_with_hint(rungd_daemon) -> None:
    with pytest.raises(RequestRejected) as caught:
        await rungd_daemon.run(Client.describe, "nope")
    assert caught.value.code == "UNKNOWN_TOOL"


async def test_values_no_tool_could_take_never_reach_the_ledger_or_kill_the_daemon(rungd_daemon) -> None:
    frame = body_frame({"type": "call", "tool": "inventory_item_show", "inputs": {"item": msgspec.msgpack.Ext(1, b"x")}})
    stream, reply = await raw_exchange(rungd_daemon.socket, frame)
    assert isinstance(reply, protocol.Result) and reply.envelope.error.code == "BAD_INPUT"
    await stream.aclose()
    long_name = body_frame({"type": "call", "tool": "x" * 10000})
    stream, reply = await raw_exchange(rungd_daemon.socket, long_name)
    assert isinstance(reply, protocol.ProtocolError) and reply.code == "INVALID_MESSAGE"
    await stream.aclose()
    env = await rungd_daemon.call("test_text_echo", {"text": "still serving"})
    assert env.status == "ok"


async def test_another_users_call_is_not_theirs_to_read(rungd_daemon) -> None:
    env = await rungd_daemon.call("test_text_echo", {"text": "mine"})
    from rungd.core.contract import Caller

    stranger = Caller(uid=4242, gid=4242, pid=1)
    with pytest.raises(KeyError):
        rungd_daemon.daemon.dispatcher.status(env.call_id, stranger)
    assert rungd_daemon.daemon.dispatcher.status(env.call_id, Caller(os.getuid(), 0, 1)).call_id == env.call_id


_FLOOD = """
import socket, sys
path, sent, hello = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
def frames(data):
    count = 0
    while len(data) >= 4:
        length = int.from_bytes(data[:4], "big")
        if len(data) < 4 + length:
            break
        data, count = data[4 + length:], count + 1
    return count
with socket.socket(socket.AF_UNIX) as flood, socket.socket(socket.AF_UNIX) as other:
    flood.connect(path)
    other.connect(path)
    flood.sendall(hello * sent)
    answered = flood.recv(1 << 16)  # the daemon is answering them now
    other.sendall(hello)
    assert frames(other.recv(1 << 16)) == 1
    # What the flood had been answered by then: one read of what is queued now. (A loop of
    # reads would race the daemon still answering the flood, and count it all.)
    flood.setblocking(False)
    try:
        answered += flood.recv(1 << 20)
    except BlockingIOError:
        pass
    print(frames(answered))
"""


async def test_requests_sent_back_to_back_keep_no_other_caller_waiting(rungd_daemon) -> None:
    # One connection sends requests back to back; another caller's request, sent while they
    # are being answered, is answered among them, not after all of them. The callers are a
    # process of their own: in this one they would wait for the daemon's loop to let go of
    # the interpreter.
    sent = 600  # their answers fit in the socket: the daemon never waits to write one
    hello = protocol.frame(protocol.Hello()).hex()
    done = await trio.run_process([sys.executable, "-c", _FLOOD, str(rungd_daemon.socket), str(sent), hello],
                                  capture_stdout=True)
    assert int(done.stdout) < sent - 10  # all of them, were the loop never given up between them
