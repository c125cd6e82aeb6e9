"""The smallest honest peers of rungd for the cost benchmark: a Trio daemon on a Unix socket
that, for each line it reads, runs /bin/true (no shell, a new session) and replies
with its exit status. No ledger, no cgroup, no prompt watch: what a call costs at the least.

    python bench/mini_daemon.py SOCKET              spawn with trio.run_process (a fork of Python)
    python bench/mini_daemon.py SOCKET --launcher   spawn through rungd's own launcher with a
                                                    terminal the daemon owns, as rungd does
    python bench/mini_daemon.py SOCKET --floor DIR  the floor daemon of issue 32: what every rungd
                                                    read costs by design and nothing else. rungd's
                                                    wire (msgspec frames, a Result envelope), the
                                                    launcher and the daemon-owned terminal, a cgroup
                                                    per call (kept empty ones reused, as rungd's),
                                                    two batches of hash-chained ledger records in DIR
                                                    (received and dispatched, then finished; synced
                                                    within a second, as a read's are). No admission,
                                                    gates, work folder, prompt watch or evidence.
"""

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio


async def run_process() -> int:
    done = await trio.run_process(["/bin/true"], stdin=subprocess.DEVNULL, capture_stdout=True,
                                  capture_stderr=True, start_new_session=True, check=False)
    return done.returncode


async def through_launcher(launcher, cgroup=None, label: str | None = None) -> int:
    """/bin/true through rungd's launcher (in ``cgroup``, labelled with the call's id)."""
    from rungd.runner.terminal import Terminal  # the other peer owes rungd nothing

    # The daemon-owned terminal every rungd call's program gets (issue 29) is part of the floor.
    terminal = Terminal()
    try:
        started = await launcher.spawn(["/bin/true"], {"PATH": "/usr/bin:/bin"}, "/", None, [], None, cgroup,
                                       label=label, terminal=terminal.slave)
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


async def floor_call(tool: str, launcher, ledger) -> object:
    """One read as the design's floor: its ledger records around a spawn in a call cgroup."""
    from rungd.core.envelope import Envelope

    call_id = f"c-{os.urandom(6).hex()}"
    await _record(ledger, [("received", call_id, tool, {"caller_uid": os.getuid()}),
                           ("dispatched", call_id, tool, {})], keep_reserve=True)
    cgroup = launcher.cgroup()
    status = await through_launcher(launcher, cgroup, call_id)
    if cgroup is not None:
        events = cgroup.events()
        if b"populated 1" in events:
            cgroup.kill()
        launcher.give_back(cgroup, events)
    await _record(ledger, [("finished", call_id, tool, {"outcome": "done", "effect": "none"})])
    return Envelope(call_id=call_id, tool=tool, status="ok" if status == 0 else "error", outcome="done",
                    effect="none")


async def _record(ledger, events, keep_reserve: bool = False) -> None:
    """A read's records as rungd writes them: on the loop when the writer is free."""
    if ledger.append_now(events, keep_reserve=keep_reserve) is None:
        await trio.to_thread.run_sync(functools.partial(ledger.append_many, events, sync=False,
                                                        keep_reserve=keep_reserve))


async def serve_frames(stream: trio.SocketStream, launcher, ledger) -> None:
    from rungd.protocol import Call, FrameBuffer, Result, decode_request, frame

    frames = FrameBuffer()
    async with stream:
        while True:
            body = frames.next_frame()
            if body is None:
                frames.feed(await stream.receive_some(65536))
                if frames.ended:
                    return
                continue
            request = decode_request(body)
            assert isinstance(request, Call)
            envelope = await floor_call(request.tool, launcher, ledger)
            await stream.send_all(frame(Result(envelope=envelope)))


async def floor_main(path: str, folder: Path) -> None:
    from rungd.runner import launch
    from rungd_ledgers import Ledger

    ledger = Ledger.open(folder)
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)
    launcher = launch.Launcher(None)

    async def sync_each_second() -> None:  # what makes a read's records durable within a second
        while True:
            await trio.sleep(1)
            if ledger.unsynced:
                await trio.to_thread.run_sync(ledger.flush)

    async def stop_on_sigterm(nursery: trio.Nursery) -> None:  # its cgroups go with it
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sync_each_second)
            nursery.start_soon(stop_on_sigterm, nursery)
            nursery.start_soon(trio.serve_listeners, lambda stream: serve_frames(stream, launcher, ledger),
                               [trio.SocketListener(sock)])
    finally:
        launcher.close()
        ledger.close()


if __name__ == "__main__":
    if sys.argv[2:3] == ["--floor"]:
        trio.run(floor_main, sys.argv[1], Path(sys.argv[3]))
        sys.exit()
    spawn = run_process
    if "--launcher" in sys.argv[2:]:  # imported only here: the other peer owes rungd nothing
        from rungd.runner import launch

        spawn = functools.partial(through_launcher, launch.Launcher(None))
    trio.run(main, sys.argv[1], spawn)
