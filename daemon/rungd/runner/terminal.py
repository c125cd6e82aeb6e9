"""The terminal a call's program is given: a pseudo-terminal whose master the daemon holds.

A program run by rungd has pipes for stdin, stdout and stderr, so ``isatty(0)`` is false and
it behaves as in a batch job. But many programs ask their questions on ``/dev/tty`` whatever
their stdio is: a password, a passphrase, a host key, "are you sure". Given no terminal at all
they fail, or carry on as if a person had answered, each in its own words. So each call's
program gets this pseudo-terminal as its *controlling* terminal (the launcher's ``TIOCSCTTY``
after ``setsid``), holding no descriptor of it: opening ``/dev/tty`` reaches it, and then

- what the program writes there is its question, exactly and whole (read from the master);
- the slave's termios, readable from the master, says what kind of question: echo off in
  canonical mode is a secret being typed, echo on is a question, canonical mode off is a
  program that reads keys one at a time (a screen program);
- a process of the call blocked reading it is asking (:mod:`rungd.runner.procwatch`), and an
  answer the gate allowed is typed on the master.

The daemon also keeps a descriptor of the slave for the whole call: while one is open the
master never reads as hung up (EIO, and a poll that never sleeps) between the launcher's
close and the program's open of ``/dev/tty``. Closing the master is no clean stop (some
programs carry on after EIO): the call's tree is killed first, then :meth:`Terminal.close`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import struct
import termios

ROWS, COLUMNS = 24, 80


class Terminal:
    """One call's pseudo-terminal: the master (non-blocking) and a held slave descriptor.

    Raises (at construction):
        OSError: no pseudo-terminal could be made (ENOSPC: the host's ``kernel.pty.max``;
            EMFILE, ENFILE).
    """

    def __init__(self, rows: int = ROWS, columns: int = COLUMNS, *, screen: bool = False) -> None:
        """``screen``: the program draws on it (a screen tool), so its output is translated
        as a real terminal's is ("\n" moves to the next line's start); otherwise a program's
        "\n" arrives as written, for its questions to be quoted as printed."""
        self.master, self.slave = os.openpty()  # both close-on-exec; the slave without O_NOCTTY's risk
        try:
            os.set_blocking(self.master, False)
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
            if not screen:
                attrs = termios.tcgetattr(self.slave)
                attrs[1] &= ~termios.ONLCR
                termios.tcsetattr(self.slave, termios.TCSANOW, attrs)
            self.device = os.fstat(self.slave).st_rdev
        except BaseException:
            self.close()
            raise

    @functools.cached_property
    def path(self) -> str:
        """What /proc shows for a descriptor of the slave (``/dev/pts/N``), read from the
        daemon's own descriptor when first asked (most calls end before anything asks); ""
        once the terminal is closed, when the device number alone identifies it."""
        try:
            return os.readlink(f"/proc/self/fd/{self.slave}") if self.slave >= 0 else ""
        except OSError:
            return ""

    def echo(self) -> tuple[bool, bool]:
        """Whether the terminal echoes what is typed, and whether it is in canonical (line)
        mode, as the program last set them; (True, True) when they cannot be read."""
        try:
            lflag = termios.tcgetattr(self.master)[3]
        except (OSError, termios.error):
            return True, True
        return bool(lflag & termios.ECHO), bool(lflag & termios.ICANON)

    def fileno(self) -> int:
        return self.master

    def read(self, size: int = 1 << 16) -> bytes | None:
        """What the program wrote on the terminal, up to ``size`` bytes: None when nothing is
        there yet, b"" once the terminal is closed (or hung up: nothing more will come)."""
        if self.master < 0:
            return b""
        try:
            return os.read(self.master, size)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def type(self, data: bytes) -> bool:
        """Type ``data`` on the terminal, as a person at it would; False if it could not all
        be taken (nothing reads it, its input queue full), or the terminal is closed."""
        if self.master < 0:
            return False
        try:
            return os.write(self.master, data) == len(data)
        except OSError:
            return False

    def unread(self) -> int:
        """How many bytes typed on the terminal the program has not read yet (0 when it
        cannot be told)."""
        try:
            return struct.unpack("i", fcntl.ioctl(self.slave, termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return 0

    def write_some(self, data: bytes) -> int:
        """Type as much of ``data`` as the terminal's input takes now: how many bytes; 0 when
        it takes none now (full), -1 once it is closed (or hung up)."""
        if self.master < 0:
            return -1
        try:
            return os.write(self.master, data)
        except BlockingIOError:
            return 0
        except OSError:
            return -1

    def close(self) -> None:
        """Close both ends; safe twice. Kill the call's processes first."""
        for name in ("master", "slave"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
