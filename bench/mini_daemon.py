"""The smallest honest peers of rungd for the cost benchmark: a Trio daemon on a Unix socket
that, for each line it reads, runs /bin/true (no shell, a new session) and replies
with its exit status. No ledger, no cgroup, no prompt watch: what a call costs at the least.

    python bench/mini_daemon.py SOCKET              spawn with trio.run_process (a fork of Python)
    python bench/mini_daemon.py SOCKET --launcher   spawn through rungd's own launcher with a
                                                    terminal the daemon owns, as rungd does: the
                                                    floor of rungd's design, without everything
                                                    else a call does
"""

import functools
import subprocess
import sys

import trio


async def run_process() -> int:
    done = await trio.run_process(["/bin/true"], stdin=subprocess.DEVNULL, capture_stdout=True,
                                  capture_stderr=True, start_new_session=True, check=False)
    return done.returncode


async def through_launcher(launcher) -> int:
    from rungd.runner.terminal import Terminal  # the other peer owes rungd nothing

    # The daemon-owned terminal every rungd call's program gets (issue 29) is part of the floor.
    terminal = Terminal()
    try:
        started = await launcher.spawn(["/bin/true"], {"PATH": "/usr/bin:/bin"}, "/", None, [], None, None,
                                       terminal=terminal.slave)
        await started.exec_result()
        child = started.child
        # The exit first, then the pipes, at end of file by then: /bin/true prints nothing (a
        # program that fills a pipe would need it read while it runs, as rungd does).
        status = await child.wait()
        for pipe in (child.stdout, child.stderr):
            while await pipe.receive_some():
                pass
        child.close_pipes()
    finally:
        terminal.close()
    return status


async def serve(stream: trio.SocketStream, spawn) -> None:
    buffer = b""
    async with stream:
        while data := await stream.receive_some(4096):
            buffer += data
            while b"\n" in buffer:
                _, buffer = buffer.split(b"\n", 1)
                await stream.send_all(f"{await spawn()}\n".encode())


async def main(path: str, spawn) -> None:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)
    await trio.serve_listeners(lambda stream: serve(stream, spawn), [trio.SocketListener(sock)])


if __name__ == "__main__":
    spawn = run_process
    if "--launcher" in sys.argv[2:]:  # imported only here: the other peer owes rungd nothing
        from rungd.runner import launch

        spawn = functools.partial(through_launcher, launch.Launcher(None))
    trio.run(main, sys.argv[1], spawn)
