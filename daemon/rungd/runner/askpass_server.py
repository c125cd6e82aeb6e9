"""The call's private folder and the askpass endpoint in it.

GIT_ASKPASS, SSH_ASKPASS and SUDO_ASKPASS point at a script in this folder that runs
``rungd.askpass.main``; that helper hands the exact question to :class:`AskpassServer` over a
Unix socket in the same folder, and prints the answer only if it gets one. Credential files
a tool declares live here too, so they go when the folder goes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import trio

from rungd import askpass


class AskpassServer:
    """The call's private folder: the askpass socket, the script GIT_ASKPASS, SSH_ASKPASS and
    SUDO_ASKPASS point at, and credential files. Removed when the call ends."""

    def __init__(self, work_dir: Path) -> None:
        # Inside the call's work folder, which the daemon removes (and recovery sweeps
        # after a crash), so credential files never outlive it; in /tmp only when that
        # path is too long for a Unix socket (107 bytes).
        if len(os.fsencode(work_dir)) < 80:
            self.folder = Path(tempfile.mkdtemp(prefix=".rungd-", dir=work_dir))  # 0700, unique per run
        else:
            self.folder = Path(tempfile.mkdtemp(prefix="rungd-askpass-"))
        self.socket_path = self.folder / "s"
        self.script = self.folder / "askpass"
        self.script.write_text(f"#!{sys.executable}\nimport sys\nfrom rungd.askpass import main\nsys.exit(main())\n")
        self.script.chmod(0o700)
        self._sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock._sock.bind(str(self.socket_path))  # local path: binding does not block
        self._sock.listen(8)
        self.env = {
            "GIT_ASKPASS": str(self.script),
            "SSH_ASKPASS": str(self.script),
            "SSH_ASKPASS_REQUIRE": "force",
            "SUDO_ASKPASS": str(self.script),
            askpass.SOCKET_ENV: str(self.socket_path),
        }

    def secret_file(self, label: str, secret: str) -> Path:
        """Write a credential into a 0600 file in this call's private folder (removed at the end)."""
        path = self.folder / f"secret-{label}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secret)
        return path

    async def serve(self, answer: Callable[[str], str | None]) -> None:
        """Answer askpass questions until the call ends.

        Args:
            answer: gives the credential for a question, or None to refuse it.

        Cancellation: stops at once; a helper left waiting gets no answer and fails.
        """
        while True:
            conn, _ = await self._sock.accept()
            with conn:
                question = b""
                while len(question) < askpass.MAX_QUESTION and (chunk := await conn.recv(4096)):
                    question += chunk
                secret = answer(question.decode("utf-8", "replace"))
                reply = b"NO\n" if secret is None else b"OK\n" + secret.encode()
                with contextlib.suppress(OSError):  # the helper may have died meanwhile
                    while reply:
                        reply = reply[await conn.send(reply):]

    def close(self) -> None:
        self._sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)
