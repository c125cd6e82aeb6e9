"""The askpass helper: what GIT_ASKPASS, SSH_ASKPASS and SUDO_ASKPASS point at in a call.

A legacy program that wants a credential and has no terminal runs its askpass program with
the question as its argument and reads the answer from its stdout. The runner points all
three variables at a tiny script that runs ``main`` below, which hands the exact question
to the runner over a per-call Unix socket and prints the answer only if the runner gives
one. The runner answers only a credential the tool declared for that question; anything
else is refused, and the call ends with AUTH_REQUIRED quoting the question.

Kept to the standard library and quick to start: it runs once per question.
"""

from __future__ import annotations

import os
import socket
import sys

SOCKET_ENV = "RUNGD_ASKPASS_SOCKET"
MAX_QUESTION = 4096


def main() -> int:
    question = " ".join(sys.argv[1:]).strip() or "(askpass called without a question)"
    path = os.environ.get(SOCKET_ENV)
    if not path:
        print("rungd-askpass: not started by rungd; refusing", file=sys.stderr)
        return 1
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(path)
            conn.sendall(question.encode("utf-8", "replace")[:MAX_QUESTION])
            conn.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        except OSError as exc:
            print(f"rungd-askpass: cannot reach rungd: {exc}", file=sys.stderr)
            return 1
    if not reply.startswith(b"OK\n"):
        print("rungd-askpass: rungd holds no credential declared for this question", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(reply[3:] + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
