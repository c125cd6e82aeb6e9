"""The smallest honest peer of rungd for the cost benchmark: a Trio daemon on a Unix socket
that, for each line it reads, runs /bin/true (no shell, no TTY, a new session) and replies
with its exit status. No ledger, no cgroup, no prompt watch: what a call costs at the least.

    python bench/mini_daemon.py SOCKET
"""

import subprocess
import sys

import trio


async def serve(stream: trio.SocketStream) -> None:
    buffer = b""
    async with stream:
        while data := await stream.receive_some(4096):
            buffer += data
            while b"\n" in buffer:
                _, buffer = buffer.split(b"\n", 1)
                done = await trio.run_process(["/bin/true"], stdin=subprocess.DEVNULL, capture_stdout=True,
                                              capture_stderr=True, start_new_session=True, check=False)
                await stream.send_all(f"{done.returncode}\n".encode())


async def main(path: str) -> None:
    listeners = [trio.SocketListener(await _bind(path))]
    await trio.serve_listeners(serve, listeners)


async def _bind(path: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)
    return sock


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
