"""The asyncio client for the rungd socket: ``rungd.client.Client``, awaitable.

Agent frameworks built on asyncio await it without a worker thread:

    async with AsyncClient() as rungd:            # socket from $RUNGD_SOCKET or ./var
        for tool in await rungd.list_tools(): ...
        envelope = await rungd.call("inventory_item_show", {"item": "widget"})
        if envelope.status == "pending":
            envelope = await rungd.wait(envelope.call_id)

Same methods, arguments, return types and exceptions as the sync client (``ConnectFailed``,
``RequestRejected``, ``ClientError``); a result envelope, failed or not, is never an
exception. One connection carries one request at a time (the protocol says so): concurrent
awaits on one client queue behind a lock, so open one client per concurrent call when calls
must overlap (a ``wait`` can pick up a call started on any connection).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Self

import msgspec

from rungd import protocol
from rungd.client import ClientError, ConnectFailed, RequestRejected, default_socket
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

__all__ = ["AsyncClient", "ClientError", "ConnectFailed", "RequestRejected"]


class AsyncClient:
    """One connection to the daemon, for asyncio.

    Args:
        path: the socket; defaults to ``default_socket()``.
        timeout: seconds to wait for any one reply beyond the call's own ``wait_s``.

    The connection opens on ``async with`` (or ``await client.connect()``) and closes on
    exit (or ``await client.aclose()``).

    Raises:
        ConnectFailed: on connecting, when nothing listens at ``path``.

    Cancellation: cancelling a request mid-exchange (or its timeout) leaves the connection
    out of step with the daemon, so the client closes it; later requests raise
    ``ClientError``. A ``call`` the daemon had already received keeps running there; its
    envelope is still available by ``wait``/``status`` on a new connection, by call_id.
    """

    def __init__(self, path: Path | str | None = None, timeout: float = 30.0) -> None:
        self.path = Path(path) if path is not None else default_socket()
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def connect(self) -> Self:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(str(self.path))
        except OSError as exc:
            raise ConnectFailed(
                f"cannot connect to rungd at {self.path}: {exc.strerror or exc}; "
                "hint: start it with `rungd serve`, or point RUNGD_SOCKET at its socket"
            ) from None
        return self

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        writer = self._drop()
        if writer is None:
            return
        try:
            await writer.wait_closed()
        except OSError:
            pass  # the daemon went first; the socket is closed either way

    def _drop(self) -> asyncio.StreamWriter | None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
        return writer

    # --- requests (the same as rungd.client.Client) ----------------------------------------

    async def hello(self) -> Welcome:
        return await self._expect(Hello(client="rungd.aclient"), Welcome)

    async def list_tools(self) -> list[ToolSummary]:
        return (await self._expect(ListTools(), Tools)).tools

    async def describe(self, tool: str) -> ToolDefinition:
        return await self._expect(Describe(tool=tool), ToolDefinition)

    async def call(
        self, tool: str, inputs: dict[str, Any] | None = None, *, request_id: str | None = None, wait_s: float = 30.0
    ) -> Envelope:
        """Call a tool; returns its envelope, or a pending one if it ran past ``wait_s``."""
        request = Call(tool=tool, inputs=inputs or {}, request_id=request_id, wait_s=wait_s)
        return (await self._expect(request, Result, extra_s=wait_s)).envelope

    async def status(self, call_id: str) -> Envelope:
        return (await self._expect(Status(call_id=call_id), Result)).envelope

    async def wait(self, call_id: str, wait_s: float = 30.0) -> Envelope:
        return (await self._expect(Wait(call_id=call_id, wait_s=wait_s), Result, extra_s=wait_s)).envelope

    async def pending(self) -> list[HeldCall]:
        """Calls held at a gate: all of them for an operator, else the caller's own."""
        return (await self._expect(Pending(), HeldCalls)).calls

    async def approve(self, call_id: str, signature: str | None = None) -> Decision:
        return await self._expect(Approve(call_id=call_id, signature=signature), Decision)

    async def deny(self, call_id: str, reason: str = "") -> Decision:
        return await self._expect(Deny(call_id=call_id, reason=reason), Decision)

    async def reconcile(self, tool: str, request_id: str, found: bool | None = None) -> Envelope:
        """Settle a request whose outcome is unknown (see ``Dispatcher.reconcile``)."""
        request = Reconcile(tool=tool, request_id=request_id, found=found)
        return (await self._expect(request, Result, extra_s=300)).envelope

    # --- framing ---------------------------------------------------------------------------

    async def request(self, message: Message, *, extra_s: float = 0.0) -> Response:
        """Send one request and read its one response.

        Raises:
            ClientError: not connected, the connection failed, no reply in time, or the
                reply was not a frame this client understands. The connection is closed,
                since it can no longer tell which reply belongs to which request.
        """
        async with self._lock:
            if self._writer is None or self._reader is None:
                raise ClientError(f"not connected to rungd at {self.path}; use `async with AsyncClient(...)`")
            reader, writer = self._reader, self._writer
            finished = False
            try:
                async with asyncio.timeout(self.timeout + extra_s):
                    writer.write(protocol.frame(message))
                    await writer.drain()
                    (length,) = protocol.HEADER.unpack(await reader.readexactly(protocol.HEADER.size))
                    body = await reader.readexactly(length)
                response = protocol.decode_response(body)
                finished = True
                return response
            except TimeoutError:
                raise ClientError(f"connection to rungd at {self.path} failed: no reply in time") from None
            except asyncio.IncompleteReadError:
                raise ClientError(
                    f"connection to rungd at {self.path} failed: the daemon closed the connection"
                ) from None
            except (ConnectionError, OSError) as exc:
                raise ClientError(f"connection to rungd at {self.path} failed: {exc}") from None
            except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
                raise ClientError(f"rungd at {self.path} sent a reply this client cannot read: {exc}") from None
            finally:
                if not finished:
                    # No await here: a cancelled caller must still leave no half-read
                    # stream behind, and closing the transport needs no round trip.
                    self._drop()

    async def _expect(self, message: Message, kind: type, *, extra_s: float = 0.0) -> Any:
        response = await self.request(message, extra_s=extra_s)
        if isinstance(response, ProtocolError):
            raise RequestRejected(response)
        if not isinstance(response, kind):
            raise ClientError(f"expected a {kind.__name__} reply, got {type(response).__name__}")
        return response
