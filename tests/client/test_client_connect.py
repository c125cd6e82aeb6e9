"""Why a client could not connect, told apart: the hint for a dead ssh tunnel is not "start rungd"."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import trio

from rungd import protocol
from rungd.client import Client, ClientError, ConnectFailed

NOBODY = 65534


def test_no_such_file_says_rungd_is_not_running_or_the_path_is_wrong(short_tmp: Path) -> None:
    with pytest.raises(ConnectFailed) as caught:
        Client(short_tmp / "nobody.sock")
    assert caught.value.reason == "missing"
    assert "no such file" in str(caught.value) and "rungd serve" in str(caught.value)


def test_a_socket_nobody_listens_on_is_a_stale_socket_or_a_dead_tunnel(short_tmp: Path) -> None:
    stale = short_tmp / "stale.sock"
    with socket.socket(socket.AF_UNIX) as left_behind:
        left_behind.bind(str(stale))  # bound, never listening: what a killed daemon or ssh -L leaves
        with pytest.raises(ConnectFailed) as caught:
            Client(stale)
    assert caught.value.reason == "refused"
    message = str(caught.value)
    assert "ssh -N -o StreamLocalBindUnlink=yes" in message and "connection refused" in message


def test_a_path_that_is_not_a_socket_says_so(short_tmp: Path) -> None:
    plain = short_tmp / "rungd.sock"
    plain.write_text("")
    with pytest.raises(ConnectFailed) as caught:
        Client(plain)
    assert caught.value.reason == "not_socket"
    assert "regular file, not a socket" in str(caught.value)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")
async def test_permission_denied_says_which_group_to_join(short_tmp: Path) -> None:
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(short_tmp / "rungd.sock"))
    listening.listen()
    os.chmod(short_tmp / "rungd.sock", 0o660)  # owner and group root only
    short_tmp.chmod(0o755)
    script = ("from rungd.client import Client, ConnectFailed\n"
              f"try:\n    Client({str(short_tmp / 'rungd.sock')!r})\n"
              "except ConnectFailed as e:\n    print(e.reason, e)\n")
    try:
        done = await trio.run_process([sys.executable, "-c", script], capture_stdout=True, user=NOBODY,
                                      group=NOBODY, extra_groups=[])
    finally:
        listening.close()
    out = done.stdout.decode()
    assert out.startswith("permission ") and "Permission denied" in out
    assert "join its group 'root'" in out and "usermod -aG root" in out


async def test_a_reply_above_the_client_maximum_is_a_client_error_not_a_huge_read(short_tmp: Path) -> None:
    path = short_tmp / "huge.sock"
    listener = trio.socket.socket(trio.socket.AF_UNIX)
    await listener.bind(str(path))
    listener.listen()

    async def serve_once() -> None:
        conn, _ = await listener.accept()
        with conn:
            await conn.recv(4096)
            await conn.send(protocol.HEADER.pack(1 << 30))  # announces 1 GiB
            await trio.sleep(5)

    def ask() -> str:
        with Client(path, timeout=5) as client:
            with pytest.raises(ClientError) as caught:
                client.hello()
            return str(caught.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_once)
        message = await trio.to_thread.run_sync(ask)
        nursery.cancel_scope.cancel()
    listener.close()
    assert "exceeds the maximum" in message
