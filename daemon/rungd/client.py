"""A small synchronous client for the rungd socket, usable from any agent framework.

    with Client() as rungd:                      # $RUNGD_HOST, else $RUNGD_SOCKET, else ./var
        for tool in rungd.list_tools(): ...
        envelope = rungd.call("demo_item_show", {"item": "widget"})
        if envelope.status == "pending":
            envelope = rungd.wait(envelope.call_id)

    with Client(host="ssh://alice@ops1") as rungd: ...    # ops1's /run/rungd/rungd.sock, over ssh

``rungctl`` uses this client. It holds one connection and sends one request at a time;
use one client per thread. With ``host``, it runs ``ssh -N -L`` for as long as it is open
(``rungd.ssh_host``): the daemon there sees the ssh user as the caller, and ssh ends with
``close``, or with this process however it dies (SIGKILL too, from any thread).

Errors (a result envelope, failed or not, is never an exception):

    ClientError            the exchange failed; the connection is closed
    ├── ConnectFailed      nothing could be reached at the socket path (or over ssh);
    │                      ``reason`` says why
    └── RequestRejected    the daemon answered with a protocol error; ``code`` and ``hint``

What each request is answered with comes from ``protocol.REPLY_TO``; this module and
``rungd.aclient`` share the checks (``check_reply``, ``connect_failed``), so a request type
added to the protocol is one line in each client.
"""

from __future__ import annotations

import errno
import grp
import os
import socket
import stat
from pathlib import Path
from typing import Any, Literal

import msgspec

from rungd import protocol
from rungd.config import SOCKET_ENV
from rungd.core.envelope import Envelope
from rungd.protocol import (
    Approve,
    Call,
    Decision,
    Deny,
    Describe,
    Evidence,
    EvidenceSlice,
    FrameBuffer,
    FrameError,
    HeldCall,
    Hello,
    ListTools,
    Message,
    Pending,
    ProtocolError,
    Reconcile,
    Resume,
    Resumed,
    Response,
    Status,
    ToolDefinition,
    ToolSummary,
    Tools,
    Wait,
    Welcome,
)
from rungd.ssh_host import SshHost, Tunnel, TunnelFailed, host_from_env

DEFAULT_SOCKET = Path("var/rungd.sock")
# Replies are capped envelopes or tool definitions; a bigger frame means the other end is
# not rungd (or is broken), and reading it whole would only cost memory.
MAX_REPLY_FRAME = 16 << 20

ConnectReason = Literal["missing", "permission", "refused", "not_socket", "ssh", "other"]


class ClientError(Exception):
    """Base of the client's own errors (a result envelope is never an exception)."""


class ConnectFailed(ClientError):
    """The daemon's socket could not be reached.

    Attributes:
        path: the socket path tried.
        reason: ``missing`` (no such file: rungd not running, or a wrong path),
            ``permission`` (the caller may not open it), ``refused`` (a socket nobody
            listens on: a stale socket or a dead ssh tunnel), ``not_socket`` (the path is
            some other kind of file), ``ssh`` (a client given a host: ssh could not log in,
            or not reach the socket there; the message says which) or ``other``.
    """

    def __init__(self, message: str, path: Path | None = None, reason: ConnectReason = "other") -> None:
        super().__init__(message)
        self.path = path
        self.reason: ConnectReason = reason


class RequestRejected(ClientError):
    """The daemon answered with a protocol error (or a tool lookup error for ``describe``)."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(f"{error.code}: {error.message}" + (f" (hint: {error.hint})" if error.hint else ""))
        self.code = error.code
        self.hint = error.hint


def default_socket() -> Path:
    """``$RUNGD_SOCKET`` if set, else ``./var/rungd.sock`` (the embedded default's socket)."""
    return Path(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


def chosen_host(path: Path | str | None, host: str | SshHost | None) -> SshHost | None:
    """The host a client goes to over ssh: ``host``; else ``$RUNGD_HOST`` when no ``path``
    is given either; else None (a socket on this machine).

    Raises:
        ValueError: both ``path`` and ``host`` are given, or the host is not an ssh:// URL
            (``BadHost``).
    """
    if path is not None and host is not None:
        raise ValueError("give a client the socket path or the host, not both")
    if isinstance(host, str):
        return SshHost.parse(host)
    return host if host is not None or path is not None else host_from_env()


def ssh_failed(host: SshHost, exc: TunnelFailed) -> ConnectFailed:
    """A tunnel that did not come up, as the clients raise it."""
    return ConnectFailed(str(exc), Path(host.socket), "ssh")


def connect_failed(path: Path, exc: OSError) -> ConnectFailed:
    """Explain a failed connect: what happened, why it usually happens, what to do.

    The hint depends on the cause: telling someone whose ssh tunnel died to start rungd
    sends them to the wrong host.
    """
    where = f"cannot connect to rungd at {path}"
    kind = _file_kind(path)
    if isinstance(exc, FileNotFoundError):
        return ConnectFailed(
            f"{where}: no such file (rungd is not running, or this is not its socket); hint: start it with "
            "`rungd serve` (or `systemctl start rungd`), or point --socket / RUNGD_SOCKET at its socket",
            path, "missing")
    if isinstance(exc, PermissionError):
        group = _group_of(path)
        join = f"join its group {group!r} (usermod -aG {group} $USER, then log in again)" if group else \
            "join the group that owns it (usermod -aG GROUP $USER, then log in again)"
        return ConnectFailed(f"{where}: {exc.strerror or 'Permission denied'}; hint: {join}, "
                             "or ask the operator to add your uid to access.uids", path, "permission")
    if kind not in (None, "socket") and exc.errno in (errno.ECONNREFUSED, errno.ENOTSOCK):
        return ConnectFailed(f"{where}: it is a {kind}, not a socket; hint: point --socket / RUNGD_SOCKET "
                             "at rungd's socket (server.socket in its config)", path, "not_socket")
    if exc.errno == errno.ECONNREFUSED:
        return ConnectFailed(
            f"{where}: connection refused: nothing listens on that socket (a stale socket left by a stopped "
            "daemon, or a dead tunnel); hint: start rungd, which replaces a stale socket; if this is an ssh -L "
            "tunnel, restart it with `ssh -N -o StreamLocalBindUnlink=yes -L LOCAL.sock:/run/rungd/rungd.sock HOST`",
            path, "refused")
    return ConnectFailed(f"{where}: {exc.strerror or exc}; hint: check the path, or point --socket / "
                         "RUNGD_SOCKET at rungd's socket", path, "other")


def _file_kind(path: Path) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return "socket"
    return "directory" if stat.S_ISDIR(mode) else "regular file" if stat.S_ISREG(mode) else "special file"


def _group_of(path: Path) -> str | None:
    try:
        return grp.getgrgid(os.stat(path).st_gid).gr_name
    except (OSError, KeyError):
        return None


def check_reply(request: Message, response: Response) -> Any:
    """Return ``response`` if it is what ``protocol.REPLY_TO`` says answers ``request``.

    Raises:
        RequestRejected: the daemon answered with a protocol error.
        ClientError: any other reply type (a daemon speaking another protocol version).
    """
    if isinstance(response, ProtocolError):
        raise RequestRejected(response)
    expected = protocol.REPLY_TO[type(request)]
    if not isinstance(response, expected):
        raise ClientError(f"expected a {expected.__name__} reply, got {type(response).__name__}")
    return response


class Client:
    """One connection to the daemon.

    Args:
        path: the socket; defaults to ``default_socket()``, unless ``$RUNGD_HOST`` is set.
        timeout: seconds to wait for any one reply beyond the call's own ``wait_s``.
        host: ``ssh://[user@]host[:port][/socket]`` (or an ``SshHost``) instead of ``path``:
            the daemon of that host, through ``ssh -N -L`` with the user's ssh config and
            agent, stopped by ``close`` or when this process dies (even by SIGKILL). Its
            socket defaults to ``/run/rungd/rungd.sock``.

    Attributes:
        path: the socket connected to (with ``host``, the local end of the tunnel).
        host: the host, or None.

    Raises:
        ConnectFailed: on construction, when nothing listens at ``path``, or ssh could not
            reach the daemon of ``host`` (reason ``ssh``).
        ValueError: both ``path`` and ``host``, or a host that is not an ssh:// URL.
    """

    def __init__(self, path: Path | str | None = None, timeout: float = 30.0, *,
                 host: str | SshHost | None = None) -> None:
        self.host = chosen_host(path, host)
        self.timeout = timeout
        self._frames = FrameBuffer(MAX_REPLY_FRAME)
        self._tunnel: Tunnel | None = None
        if self.host is not None:
            tunnel = Tunnel(self.host)
            try:
                path = tunnel.open()
            except TunnelFailed as exc:
                raise ssh_failed(self.host, exc) from None
            self._tunnel = tunnel
        self.path = Path(path) if path is not None else default_socket()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(str(self.path))
        except OSError as exc:
            self.close()
            raise connect_failed(self.path, exc) from None

    @property
    def where(self) -> str:
        """The daemon as messages name it: the host's URL, or the socket path."""
        return self.host.url if self.host is not None else str(self.path)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection, and stop ssh when the client has a host."""
        self._sock.close()
        if self._tunnel is not None:
            self._tunnel.close()

    # --- requests: one line each; protocol.REPLY_TO says what answers them -----------------

    def hello(self) -> Welcome:
        return self._ask(Hello(client="rungd.client"))

    def list_tools(self) -> list[ToolSummary]:
        return self.tool_listing().tools

    def tool_listing(self) -> Tools:
        """The tools this caller may use and, for an operator, what the daemon refused to load."""
        return self._ask(ListTools())

    def describe(self, tool: str) -> ToolDefinition:
        return self._ask(Describe(tool=tool))

    def call(
        self, tool: str, inputs: dict[str, Any] | None = None, *, request_id: str | None = None, wait_s: float = 30.0
    ) -> Envelope:
        """Call a tool; returns its envelope, or a pending one if it ran past ``wait_s``."""
        return self._ask(Call(tool=tool, inputs=inputs or {}, request_id=request_id, wait_s=wait_s)).envelope

    def status(self, call_id: str) -> Envelope:
        return self._ask(Status(call_id=call_id)).envelope

    def wait(self, call_id: str, wait_s: float = 30.0) -> Envelope:
        return self._ask(Wait(call_id=call_id, wait_s=wait_s)).envelope

    def pending(self) -> list[HeldCall]:
        """Calls held at a gate: all of them for an operator, else the caller's own (every page)."""
        held, page = [], self._ask(Pending())
        while True:
            held += page.calls
            if page.next_after is None:
                return held
            page = self._ask(Pending(after=page.next_after))

    def approve(self, call_id: str, signature: str | None = None, reason: str = "") -> Decision:
        return self._ask(Approve(call_id=call_id, signature=signature, reason=reason))

    def deny(self, call_id: str, reason: str = "") -> Decision:
        return self._ask(Deny(call_id=call_id, reason=reason))

    def resume(self, tool: str) -> Resumed:
        """Lift a tool's step-down mark and suspension (operators only)."""
        return self._ask(Resume(tool=tool))

    def reconcile(self, tool: str, request_id: str, found: bool | None = None, *,
                  caller_uid: int | None = None) -> Envelope:
        """Settle a request whose outcome is unknown (see ``Dispatcher.reconcile``); an
        operator names with ``caller_uid`` whose request it is, when several used the id."""
        return self._ask(Reconcile(tool=tool, request_id=request_id, found=found, caller_uid=caller_uid)).envelope

    def evidence(self, evidence_id: str, *, offset: int | None = None, length: int | None = None,
                 line: int | None = None, count: int | None = None, grep: str | None = None,
                 max_bytes: int | None = None) -> EvidenceSlice:
        """Part of one evidence file: a byte range, a line range, or the lines holding ``grep`` (one of them)."""
        return self._ask(Evidence(evidence_id=evidence_id, offset=offset, length=length, line=line, count=count,
                                  grep=grep, max_bytes=max_bytes))

    # --- framing ---------------------------------------------------------------------------

    def request(self, message: Message, *, extra_s: float | None = None) -> Response:
        """Send one request and read its one response.

        Args:
            message: any request.
            extra_s: seconds beyond ``timeout`` the reply may take; by default what the
                protocol allows the daemon for this request (``protocol.daemon_time_s``).

        Raises:
            ClientError: the connection failed, no reply came in time, or the reply was not
                a frame this client reads. The connection is closed: a late reply would
                otherwise answer the next request.
        """
        extra = protocol.daemon_time_s(message) if extra_s is None else extra_s
        self._sock.settimeout(self.timeout + extra)
        try:
            self._sock.sendall(protocol.frame(message))
            while (body := self._frames.next_frame()) is None:
                if self._frames.ended:
                    raise ConnectionError("the daemon closed the connection")
                self._frames.feed(self._sock.recv(1 << 16))
            return protocol.decode_response(body)
        except (OSError, FrameError, msgspec.DecodeError) as exc:
            self.close()
            raise ClientError(f"connection to rungd at {self.where} failed: {exc}") from None

    def _ask(self, message: Message) -> Any:
        return check_reply(message, self.request(message))
