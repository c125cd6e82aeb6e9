"""The askpass helper: what GIT_ASKPASS, SSH_ASKPASS and SUDO_ASKPASS point at in a call.

A legacy program that wants a credential and has no terminal runs its askpass program with
the question as its argument and reads the answer from its stdout. The runner points all
three variables at a tiny script that runs ``main`` below, which hands the exact question
to the runner over a per-call Unix socket and prints the answer only if the runner gives
one. The runner answers only a credential the tool declared for that question, and only as
often as declared.

A refused question gets no answer at all, not even an empty one: many programs take a
failed or empty askpass answer as an empty secret and go on (``ssh-keygen`` then writes an
unencrypted key). So the helper never returns without an answer: it holds its caller until
rungd kills the call's tree. It ignores SIGTERM and the like for the same reason (the kill's
first round must not turn it into a non-answer), and dies with the program that ran it
(``PR_SET_PDEATHSIG``), so a program that has died leaves no helper waiting for SIGKILL.

Kept to the standard library and quick to start: it runs once per question.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from typing import NoReturn

SOCKET_ENV = "RUNGD_ASKPASS_SOCKET"
MAX_QUESTION = 4096
# sun_path holds 108 bytes with its terminating NUL.
_SUN_PATH_MAX = 107
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@contextlib.contextmanager
def socket_address(path: str) -> Iterator[str]:
    """An address for the Unix socket at ``path`` that fits in ``sun_path``, whatever its length.

    A path starting with ``@`` names an abstract socket (the daemon's endpoint binds one: a
    name in no folder, which no program can unlink or bind while the daemon holds it).
    A long path is reached through an ``O_PATH`` descriptor of its folder, as
    ``/proc/self/fd/N/NAME``: the kernel resolves the folder through the descriptor, so the
    socket still lives where ``path`` says (inside the call's work folder, which start-up
    sweeps), never in a shorter folder such as /tmp. The descriptor is closed on exit; bind
    and connect need it only while they run.
    """
    if path.startswith("@"):  # the daemon's endpoint: an abstract name, no file to replace
        yield "\0" + path[1:]
        return
    encoded = os.fsencode(path)
    if len(encoded) <= _SUN_PATH_MAX:
        yield path
        return
    folder, name = os.path.split(path)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def _hold() -> NoReturn:
    """Never give the program an answer, not even a failed one; wait to be killed."""
    while True:
        time.sleep(3600)


def _die_with_parent() -> None:
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)  # the program died before the line above: nobody is left to answer


def _ask(path: str, question: str) -> bytes | None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            with socket_address(path) as address:
                conn.connect(address)
            conn.sendall(question.encode("utf-8", "replace")[:MAX_QUESTION])
            conn.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        except OSError:
            return None
    return reply


def main() -> int:
    question = " ".join(sys.argv[1:]).strip() or "(askpass called without a question)"
    path = os.environ.get(SOCKET_ENV)
    if not path:
        print("rungd-askpass: not started by rungd; refusing", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    _die_with_parent()
    reply = _ask(path, question)
    if reply is None or not reply.startswith(b"OK\n"):
        # Refused, or rungd unreachable (the call is ending): the kill is on its way.
        _hold()
    sys.stdout.buffer.write(reply[3:] + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
