"""The async client for the rungd socket: ``rungd.client.Client``, awaitable, on asyncio or Trio.

Agent frameworks await it without a worker thread, whichever event loop they run on (it
uses anyio, which runs on both):

    async with AsyncClient() as rungd:            # $RUNGD_HOST, else $RUNGD_SOCKET, else ./var
        for tool in await rungd.list_tools(): ...
        envelope = await rungd.call("inventory_item_show", {"item": "widget"})
        if envelope.status == "pending":
            envelope = await rungd.wait(envelope.call_id)

Same methods, arguments, return types and exceptions as the sync client (``ConnectFailed``,
``RequestRejected``, ``ClientError``); a result envelope, failed or not, is never an
exception; ``AsyncClient(host="ssh://alice@ops1")`` reaches another host's daemon as
``Client(host=...)`` does, its ssh started on connecting and stopped by ``aclose`` or when
this process dies (even by SIGKILL, on either event loop). One
connection carries one request at a time (the protocol says so): concurrent
awaits on one client queue behind a lock, so open one client per concurrent call when calls
must overlap (a ``wait`` can pick up a call started on any connection).

Cancellation: a request you stop waiting for (a cancel scope, ``asyncio.timeout``, a task
cancelled, or this client's own ``timeout``) is not withdrawn. Once its frame has left, the
daemon has it, and a ``call`` keeps running there to its end, writes included: cancelling the
await cancels your waiting, never the effect. The connection is closed at once, since a late
reply would otherwise answer your next request; the next request on this client raises
``ClientError`` ("not connected ...", naming the abandoned request) until you ``connect()``
again. What you learn about the abandoned call, and how to learn the rest:

* nothing from this client: it may not have started, be running, or be done;
* repeat the same ``call`` with the same ``request_id`` (on any connection): the daemon
  answers from its ledger with the first call's result (``effect="existing"``), or
  ``pending`` with its call_id while it still runs, and never runs it twice. This is why
  every write takes a ``request_id``;
* if you had its call_id (a ``pending`` envelope), ``wait`` or ``status`` by call_id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc
import msgspec

from rungd import protocol
from rungd.client import (
    MAX_REPLY_FRAME,
    ClientError,
    ConnectFailed,
    RequestRejected,
    check_reply,
    chosen_host,
    connect_failed,
    default_socket,
    ssh_failed,
)
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
from rungd.ssh_host import SshHost, Tunnel, TunnelFailed

__all__ = ["AsyncClient", "ClientError", "ConnectFailed", "RequestRejected"]


class AsyncClient:
    """One connection to the daemon, for asyncio or Trio.

    The connection opens on ``async with`` (or ``await client.connect()``) and closes on
    exit (or ``await client.aclose()``). After a request failed or was cancelled,
    ``connect()`` opens a fresh connection on the same client.

    Args:
        path: the socket; defaults to ``default_socket()``, unless ``$RUNGD_HOST`` is set.
        timeout: seconds to wait for any one reply beyond the call's own ``wait_s``.
        host: ``ssh://[user@]host[:port][/socket]`` (or an ``SshHost``) instead of ``path``,
            as for ``rungd.client.Client``. ssh starts on connecting, is started again by
            ``connect()`` if the connection to the host dropped, and stops on ``aclose`` or
            when this process dies (even by SIGKILL).

    Raises:
        ConnectFailed: on connecting, when nothing listens at ``path``; its message says
            why (no such file, permission, a stale socket or dead tunnel, or ssh's failure
            with reason ``ssh``) and what to do.
        ValueError: on construction, both ``path`` and ``host``, or a host that is not an
            ssh:// URL.

    Cancellation: see the module docstring. In short, a cancelled request closes the
    connection and keeps running in the daemon; repeat it with the same ``request_id`` to
    learn its result.
    """

    def __init__(self, path: Path | str | None = None, timeout: float = 30.0, *,
                 host: str | SshHost | None = None) -> None:
        self.host = chosen_host(path, host)
        # With a host, the local end of its tunnel once connected.
        self.path: Path | None = None
        if self.host is None:
            self.path = Path(path) if path is not None else default_socket()
        self.timeout = timeout
        self._tunnel: Tunnel | None = None
        self._stream: anyio.abc.SocketStream | None = None
        self._frames = FrameBuffer(MAX_REPLY_FRAME)
        # Why the last connection was closed under the caller, said on the next request.
        self._closed_because = ""
        self._lock = anyio.Lock()

    async def connect(self) -> Self:
        """Open the connection (again, after a failed or cancelled request); a no-op when open.

        Raises:
            ConnectFailed: nothing could be reached at ``path``, or ssh could not reach the
                daemon of ``host``.

        Cancellation: safe; nothing was sent, and the client stays unconnected (an ssh
        being started is stopped).
        """
        if self._stream is not None:
            return self
        if self.host is not None and (self._tunnel is None or not self._tunnel.running):
            await self._stop_tunnel()  # ssh ended (the host dropped us): start it again
            tunnel = Tunnel(self.host)
            try:
                self.path = await tunnel.aopen()
            except TunnelFailed as exc:
                raise ssh_failed(self.host, exc) from None
            self._tunnel = tunnel
        assert self.path is not None
        try:
            self._stream = await anyio.connect_unix(self.path)
        except OSError as exc:
            raise connect_failed(self.path, exc) from None
        self._frames = FrameBuffer(MAX_REPLY_FRAME)
        self._closed_because = ""
        return self

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection, and stop ssh when the client has a host; calls the
        connection carried keep running in the daemon.

        Cancellation: the socket is closed, and ssh stopped, even when the caller is being
        cancelled.
        """
        stream, self._stream = self._stream, None
        self._closed_because = ""
        if stream is not None:
            # Forcefully: closing a Unix socket needs no round trip, and a caller being
            # cancelled must still leave nothing open.
            await anyio.aclose_forcefully(stream)
        await self._stop_tunnel()

    async def _stop_tunnel(self) -> None:
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            await tunnel.aclose()

    @property
    def where(self) -> str:
        """The daemon as messages name it: the host's URL, or the socket path."""
        return self.host.url if self.host is not None else str(self.path)

    # --- requests: one line each, the same as rungd.client.Client -------------------------

    async def hello(self) -> Welcome:
        return await self._ask(Hello(client="rungd.aclient"))

    async def list_tools(self) -> list[ToolSummary]:
        return (await self.tool_listing()).tools

    async def tool_listing(self) -> Tools:
        """The tools this caller may use and, for an operator, what the daemon refused to load."""
        return await self._ask(ListTools())

    async def describe(self, tool: str) -> ToolDefinition:
        return await self._ask(Describe(tool=tool))

    async def call(
        self, tool: str, inputs: dict[str, Any] | None = None, *, request_id: str | None = None, wait_s: float = 30.0
    ) -> Envelope:
        """Call a tool; returns its envelope, or a pending one if it ran past ``wait_s``.

        Cancellation: the call keeps running in the daemon; see the module docstring.
        """
        return (await self._ask(Call(tool=tool, inputs=inputs or {}, request_id=request_id, wait_s=wait_s))).envelope

    async def status(self, call_id: str) -> Envelope:
        return (await self._ask(Status(call_id=call_id))).envelope

    async def wait(self, call_id: str, wait_s: float = 30.0) -> Envelope:
        return (await self._ask(Wait(call_id=call_id, wait_s=wait_s))).envelope

    async def pending(self) -> list[HeldCall]:
        """Calls held at a gate: all of them for an operator, else the caller's own (every page)."""
        held, page = [], await self._ask(Pending())
        while True:
            held += page.calls
            if page.next_after is None:
                return held
            page = await self._ask(Pending(after=page.next_after))

    async def approve(self, call_id: str, signature: str | None = None, reason: str = "") -> Decision:
        return await self._ask(Approve(call_id=call_id, signature=signature, reason=reason))

    async def deny(self, call_id: str, reason: str = "") -> Decision:
        return await self._ask(Deny(call_id=call_id, reason=reason))

    async def resume(self, tool: str) -> Resumed:
        """Lift a tool's step-down mark and suspension (operators only)."""
        return await self._ask(Resume(tool=tool))

    async def reconcile(self, tool: str, request_id: str, found: bool | None = None, *,
                        caller_uid: int | None = None) -> Envelope:
        """Settle a request whose outcome is unknown (see ``Dispatcher.reconcile``); an
        operator names with ``caller_uid`` whose request it is, when several used the id."""
        return (await self._ask(Reconcile(tool=tool, request_id=request_id, found=found,
                                          caller_uid=caller_uid))).envelope

    async def evidence(self, evidence_id: str, *, offset: int | None = None, length: int | None = None,
                       line: int | None = None, count: int | None = None, grep: str | None = None,
                       max_bytes: int | None = None) -> EvidenceSlice:
        """Part of one evidence file: a byte range, a line range, or the lines holding ``grep`` (one of them)."""
        return await self._ask(Evidence(evidence_id=evidence_id, offset=offset, length=length, line=line,
                                        count=count, grep=grep, max_bytes=max_bytes))

    # --- framing ---------------------------------------------------------------------------

    async def request(self, message: Message, *, extra_s: float | None = None) -> Response:
        """Send one request and read its one response.

        Args:
            message: any request.
            extra_s: seconds beyond ``timeout`` the reply may take; by default what the
                protocol allows the daemon for this request (``protocol.daemon_time_s``).

        Raises:
            ClientError: not connected, the connection failed, no reply in time, or the
                reply was not a frame this client understands. The connection is closed,
                since it can no longer tell which reply belongs to which request.

        Cancellation: the connection is closed and the request keeps running in the
        daemon; the next request says so. See the module docstring.
        """
        extra = protocol.daemon_time_s(message) if extra_s is None else extra_s
        async with self._lock:
            stream = self._stream
            if stream is None:
                raise ClientError(self._not_connected())
            finished = False
            try:
                with anyio.fail_after(self.timeout + extra):
                    await stream.send(protocol.frame(message))
                    body = await self._next_frame(stream)
                response = protocol.decode_response(body)
                finished = True
                return response
            except TimeoutError:
                raise ClientError(f"connection to rungd at {self.where} failed: no reply in time") from None
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise ClientError(
                    f"connection to rungd at {self.where} failed: the daemon closed the connection"
                ) from None
            except OSError as exc:
                raise ClientError(f"connection to rungd at {self.where} failed: {exc}") from None
            except (FrameError, msgspec.DecodeError) as exc:  # ValidationError is a DecodeError
                raise ClientError(f"rungd at {self.where} sent a reply this client cannot read: {exc}") from None
            finally:
                if not finished:
                    await self._abandon(stream, message)

    async def _next_frame(self, stream: anyio.abc.SocketStream) -> bytes:
        while (body := self._frames.next_frame()) is None:
            if self._frames.ended:
                raise anyio.EndOfStream
            try:
                self._frames.feed(await stream.receive())
            except anyio.EndOfStream:
                self._frames.feed(b"")
        return body

    async def _abandon(self, stream: anyio.abc.SocketStream, message: Message) -> None:
        """Close a connection whose reply will not be read, and remember why for the next request."""
        if self._stream is stream:
            self._stream = None
        self._closed_because = (
            f"the connection was closed when {_describe(message)} ended without its reply (cancelled, timed "
            "out or failed); the daemon may still be running it"
        )
        await anyio.aclose_forcefully(stream)

    def _not_connected(self) -> str:
        if self._closed_because:
            return (f"not connected to rungd at {self.where}: {self._closed_because}; reconnect with "
                    "`await client.connect()`, then repeat a call with the same request_id to get its result")
        return f"not connected to rungd at {self.where}; use `async with AsyncClient(...)` or `await client.connect()`"

    async def _ask(self, message: Message) -> Any:
        return check_reply(message, await self.request(message))


def _describe(message: Message) -> str:
    """A request as a person would name it: ``call inventory_count_set (request_id a1)``."""
    tag = type(message).__struct_config__.tag
    if isinstance(message, Call):
        return f"call {message.tool}" + (f" (request_id {message.request_id})" if message.request_id else "")
    if isinstance(message, Wait | Status):
        return f"{tag} {message.call_id}"
    return f"the {tag} request"
