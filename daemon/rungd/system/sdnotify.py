"""Telling systemd how the daemon is doing: ready, stopping, still alive (``sd_notify``).

    sdnotify.ready(status="listening on /run/rungd/rungd.sock")    the socket listens
    sdnotify.stopping()                                             shutdown has begun
    await nursery.start(sdnotify.run_watchdog)                      pings every WatchdogSec/2

A unit with ``Type=notify`` counts the service as started only once it hears ``READY=1``, and
one with ``WatchdogSec=`` kills it when the pings stop. The protocol is one datagram of
newline-separated ``NAME=value`` lines sent to the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET``: a file system path, or, with a leading ``@``, a name in the abstract
namespace. Outside systemd that variable is unset and every function here does nothing and
returns False, so the daemon calls them unconditionally.

The variables are read on every call, not once at import, so tests can set them. They are
left in the environment: the runner gives every child a fresh one, and with
``NotifyAccess=main`` systemd ignores anyone but the daemon's own process anyway.
"""

from __future__ import annotations

import logging
import os
import socket

import trio

log = logging.getLogger("rungd.sdnotify")

# A send waits at most this long when systemd's queue is full: it never holds the Trio loop
# for long, and a lost ping costs less than a stalled loop.
SEND_TIMEOUT_S = 1.0


def _address() -> str | None:
    """The socket address from ``$NOTIFY_SOCKET``, or None when there is none we can use."""
    name = os.environ.get("NOTIFY_SOCKET", "")
    if name.startswith("@"):
        return "\0" + name[1:]  # the abstract namespace: a leading NUL byte, no file
    if name.startswith("/"):
        return name
    # Unset, empty, or a form this client does not speak (systemd 253 added "vsock:").
    return None


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``, or several lines) to the service manager.

    Returns:
        True if the datagram was sent; False when not under systemd or the send failed
        (the failure is logged: for READY=1 it means systemd will time the start out).
    """
    address = _address()
    if address is None:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(SEND_TIMEOUT_S)
        try:
            sock.sendto(state.encode(), address)
        except OSError as exc:
            log.warning("cannot notify systemd (%s) at %s: %s", state.split("\n", 1)[0],
                        os.environ.get("NOTIFY_SOCKET"), exc)
            return False
    return True


def _with_status(state: str, status: str | None) -> str:
    # STATUS= is what `systemctl status rungd` shows on its "Status:" line; one line only.
    return state if status is None else f"{state}\nSTATUS={status.splitlines()[0] if status else ''}"


def ready(status: str | None = None) -> bool:
    """Report that the daemon serves: its socket is bound and listening."""
    return notify(_with_status("READY=1", status))


def stopping(status: str | None = None) -> bool:
    """Report that shutdown has begun: no new connections; running calls are finishing."""
    return notify(_with_status("STOPPING=1", status))


def watchdog() -> bool:
    """Tell the watchdog the daemon is alive."""
    return notify("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """Seconds within which systemd expects a ping, or None when no watchdog watches us.

    From ``$WATCHDOG_USEC``; when ``$WATCHDOG_PID`` is set it must name this process, or the
    watchdog is meant for another one (a parent that exec'd us without clearing it).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000


async def run_watchdog(*, task_status: trio.TaskStatus[float | None] = trio.TASK_STATUS_IGNORED) -> None:
    """Ping the watchdog at half its interval until cancelled.

    Run it in the same loop that serves calls: the pings stop when that loop is blocked or
    wedged, which is exactly when systemd should restart the daemon.

    Args:
        task_status: reports started with the interval in seconds (None: no watchdog, and the
            task returns at once), after the first ping.

    **Cancellation:** it just stops; nothing to clean up.
    """
    interval = watchdog_interval()
    if interval is None or _address() is None:
        task_status.started(None)
        return
    watchdog()
    task_status.started(interval)
    while True:
        await trio.sleep(interval / 2)
        watchdog()
