"""A small synchronous client for the rungd socket, usable from any agent framework.

    with Client() as rungd:                      # socket from $RUNGD_SOCKET or ./var
        for tool in rungd.list_tools(): ...
        envelope = rungd.call("demo_item_show", {"item": "widget"})
        if envelope.status == "pending":
            envelope = rungd.wait(envelope.call_id)

``rungctl`` uses this client. It holds one connection and sends one request at a time;
use one client per thread.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import msgspec

from rungd import protocol
from rungd.config import SOCKET_ENV
from rungd.envelope import Envelope
from rungd.protocol import (
    Approve,
    Call,
    Decision,
    Deny,
    Describe,
    HeldCall,
    HeldCalls,
    Hello,
    ListTools,
    Message,
    Pending,
    ProtocolError,
    Reconcile,
    Response,
    Result,
    Status,
    ToolDefinition,
    Tools,
    ToolSummary,
    Wait,
    Welcome,
)

DEFAULT_SOCKET = Path("var/rungd.sock")


class ClientError(Exception):
    """Base of the client's own errors (a result envelope is never an exception)."""


class ConnectFailed(ClientError):
    """The daemon's socket could not be reached."""


class RequestRejected(ClientError):
    """The daemon answered with a protocol error (or a tool lookup error for ``describe``)."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(f"{error.code}: {error.message}" + (f" (hint: {error.hint})" if error.hint else ""))
        self.code = error.code
        self.hint = error.hint


def default_socket() -> Path:
    """``$RUNGD_SOCKET`` if set, else ``./var/rungd.sock`` (the embedded default's socket)."""
    return Path(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


class Client:
    """One connection to the daemon.

    Args:
        path: the socket; defaults to ``default_socket()``.
        timeout: seconds to wait for any one reply beyond the call's own ``wait_s``.

    Raises:
        ConnectFailed: on construction, when nothing listens at ``path``.
    """

    def __init__(self, path: Path | str | None = None, timeout: float = 30.0) -> None:
        self.path = Path(path) if path is not None else default_socket()
        self.timeout = timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(str(self.path))
        except OSError as exc:
            self._sock.close()
            raise ConnectFailed(
                f"cannot connect to rungd at {self.path}: {exc.strerror or exc}; "
                "hint: start it with `rungd serve`, or point RUNGD_SOCKET at its socket"
            ) from None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    # --- requests --------------------------------------------------------------------------

    def hello(self) -> Welcome:
        return self._expect(Hello(client="rungd.client"), Welcome)

    def list_tools(self) -> list[ToolSummary]:
        return self._expect(ListTools(), Tools).tools

    def describe(self, tool: str) -> ToolDefinition:
        return self._expect(Describe(tool=tool), ToolDefinition)

    def call(
        self, tool: str, inputs: dict[str, Any] | None = None, *, request_id: str | None = None, wait_s: float = 30.0
    ) -> Envelope:
        """Call a tool; returns its envelope, or a pending one if it ran past ``wait_s``."""
        request = Call(tool=tool, inputs=inputs or {}, request_id=request_id, wait_s=wait_s)
        return self._expect(request, Result, extra_s=wait_s).envelope

    def status(self, call_id: str) -> Envelope:
        return self._expect(Status(call_id=call_id), Result).envelope

    def wait(self, call_id: str, wait_s: float = 30.0) -> Envelope:
        return self._expect(Wait(call_id=call_id, wait_s=wait_s), Result, extra_s=wait_s).envelope

    def pending(self) -> list[HeldCall]:
        """Calls held at a gate: all of them for an operator, else the caller's own."""
        return self._expect(Pending(), HeldCalls).calls

    def approve(self, call_id: str, signature: str | None = None) -> Decision:
        return self._expect(Approve(call_id=call_id, signature=signature), Decision)

    def deny(self, call_id: str, reason: str = "") -> Decision:
        return self._expect(Deny(call_id=call_id, reason=reason), Decision)

    def reconcile(self, tool: str, request_id: str, found: bool | None = None) -> Envelope:
        """Settle a request whose outcome is unknown (see ``Dispatcher.reconcile``)."""
        return self._expect(Reconcile(tool=tool, request_id=request_id, found=found), Result, extra_s=300).envelope

    # --- framing ---------------------------------------------------------------------------

    def request(self, message: Message, *, extra_s: float = 0.0) -> Response:
        """Send one request and read its one response."""
        self._sock.settimeout(self.timeout + extra_s)
        try:
            self._sock.sendall(protocol.frame(message))
            (length,) = protocol.HEADER.unpack(self._read(protocol.HEADER.size))
            return protocol.decode_response(self._read(length))
        except (OSError, msgspec.DecodeError) as exc:
            # A late reply would answer the next request: this connection is done.
            self.close()
            raise ClientError(f"connection to rungd at {self.path} failed: {exc}") from None

    def _expect(self, message: Message, kind: type, *, extra_s: float = 0.0) -> Any:
        response = self.request(message, extra_s=extra_s)
        if isinstance(response, ProtocolError):
            raise RequestRejected(response)
        if not isinstance(response, kind):
            raise ClientError(f"expected a {kind.__name__} reply, got {type(response).__name__}")
        return response

    def _read(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self._sock.recv(size - len(chunks))
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            chunks += chunk
        return bytes(chunks)
