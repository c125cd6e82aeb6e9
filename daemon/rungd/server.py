"""The Unix socket: binding it, knowing who is on the other end, and speaking frames.

Every connection is handled on its own; a bad frame costs its sender a ``protocol_error``
reply and nobody else anything. The caller's identity is read from the kernel
(SO_PEERCRED) once per connection and never taken from a request.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import socket
import struct
import time
from pathlib import Path

import msgspec
import trio

from rungd import protocol
from rungd.calls import Call as CallState
from rungd.calls import Dispatcher
from rungd.contract import Caller, Tool
from rungd.errors import RungdError
from rungd.gates import approval_message
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
    Pending,
    ProtocolError,
    Reconcile,
    Request,
    Response,
    Result,
    Status,
    ToolDefinition,
    Tools,
    ToolSummary,
    Wait,
    Welcome,
)

log = logging.getLogger("rungd.server")

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# Longest path a sockaddr_un holds on Linux, without the terminating NUL.
MAX_SOCKET_PATH = 107


class SocketInUse(Exception):
    """Another daemon is already listening on the socket path."""


def bind_unix_socket(path: Path, mode: int, group: str | None) -> trio.socket.SocketType:
    """Create, bind and listen on the Unix socket at ``path``.

    A leftover socket file nobody listens on (a crash) is replaced; a live one is not.

    Raises:
        SocketInUse: a daemon is already listening there.
        OSError: the folder cannot be created or the path is too long.
    """
    if len(os.fsencode(path)) + 10 > MAX_SOCKET_PATH:  # room for the staging name below
        raise OSError(errno.ENAMETOOLONG, f"socket path is too long for a Unix socket (keep it under "
                      f"{MAX_SOCKET_PATH - 10} bytes): {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale: nobody answers on it
        else:
            raise SocketInUse(f"a daemon is already listening on {path}")
        finally:
            probe.close()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bind beside the final name under a tight umask, set owner and mode, listen, and only
    # then rename into place: a client that sees the path can connect, and never with
    # looser permissions than configured.
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    old_umask = os.umask(0o177)
    try:
        sock._sock.bind(str(staging))  # sync bind: the path is local and the call does not block
    finally:
        os.umask(old_umask)
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        os.chown(staging, -1, gid)
    os.chmod(staging, mode)
    sock.listen(socket.SOMAXCONN)
    os.rename(staging, path)
    return sock


def peer_of(sock: trio.socket.SocketType) -> Caller:
    """The kernel's word on who is connected: pid, uid, gid and the uid's groups."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    try:
        name = pwd.getpwuid(uid).pw_name
        groups = frozenset(os.getgrouplist(name, gid))
    except KeyError:  # a uid with no passwd entry has only its primary group
        groups = frozenset({gid})
    return Caller(uid=uid, gid=gid, pid=pid, groups=groups)


class FrameTooLarge(Exception):
    def __init__(self, length: int) -> None:
        self.length = length


class TruncatedFrame(Exception):
    pass


class FrameReader:
    """Reads length-prefixed frames from a stream without ever buffering more than one."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_frame: int) -> None:
        self._stream = stream
        self._max = max_frame
        self._buf = bytearray()

    async def next(self) -> bytes | None:
        """The next frame's body, or None at a clean end of stream.

        Raises:
            FrameTooLarge: the announced length exceeds the maximum; call ``discard``.
            TruncatedFrame: the stream ended in the middle of a frame.
        """
        if not await self._fill(protocol.HEADER.size):
            if self._buf:
                raise TruncatedFrame()
            return None
        (length,) = protocol.HEADER.unpack_from(self._buf)
        if length > self._max:
            del self._buf[: protocol.HEADER.size]
            raise FrameTooLarge(length)
        if not await self._fill(protocol.HEADER.size + length):
            raise TruncatedFrame()
        body = bytes(self._buf[protocol.HEADER.size : protocol.HEADER.size + length])
        del self._buf[: protocol.HEADER.size + length]
        return body

    async def discard(self, length: int) -> bool:
        """Read and drop ``length`` bytes (an oversize body). False if the stream ended."""
        while length > 0:
            if not self._buf:
                chunk = await self._stream.receive_some(min(length, 1 << 16))
                if not chunk:
                    return False
                self._buf += chunk
            dropped = min(length, len(self._buf))
            del self._buf[:dropped]
            length -= dropped
        return True

    async def _fill(self, size: int) -> bool:
        while len(self._buf) < size:
            chunk = await self._stream.receive_some(1 << 16)
            if not chunk:
                return False
            self._buf += chunk
        return True


class Replies:
    """How many connections are between reading a request and sending its answer.

    At shutdown the daemon waits (bounded) for this to reach zero before it closes
    connections, so a client waiting on a call that just finished still hears the result.
    """

    def __init__(self) -> None:
        self._busy = 0
        self._quiet = trio.Event()
        self._quiet.set()

    def __enter__(self) -> None:
        self._busy += 1
        self._quiet = trio.Event() if self._quiet.is_set() else self._quiet

    def __exit__(self, *exc: object) -> None:
        self._busy -= 1
        if not self._busy:
            self._quiet.set()

    async def wait_quiet(self) -> None:
        await self._quiet.wait()


class Connection:
    """One client connection: read a request, answer it, repeat."""

    def __init__(self, stream: trio.SocketStream, dispatcher: Dispatcher, max_frame: int, replies: Replies) -> None:
        self.stream = stream
        self.dispatcher = dispatcher
        self.max_frame = max_frame
        self.replies = replies
        self.caller = peer_of(stream.socket)

    async def serve(self) -> None:
        """Serve requests until the client hangs up.

        Cancellation: the daemon cancels connections at shutdown after calls have ended;
        the stream is closed on the way out either way.
        """
        reader = FrameReader(self.stream, self.max_frame)
        try:
            while True:
                try:
                    body = await reader.next()
                except FrameTooLarge as exc:
                    await self._send(_error("FRAME_TOO_LARGE",
                                            f"frame of {exc.length} bytes exceeds the maximum of {self.max_frame}",
                                            "send smaller requests; the limit is in the welcome reply"))
                    if not await reader.discard(exc.length):
                        return
                    continue
                except TruncatedFrame:
                    await self._send(_error("TRUNCATED", "the stream ended in the middle of a frame"))
                    return
                if body is None:
                    return
                with self.replies:
                    await self._send(await self._answer(body))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the client went away; its calls keep running
        finally:
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    async def _decide(self, call_id: str, *, approve: bool, signature: str | None = None,
                      reason: str = "") -> Response:
        try:
            await self.dispatcher.decide(call_id, self.caller, approve=approve, signature=signature, reason=reason)
        except RungdError as exc:
            return _error(exc.code, exc.message, exc.hint)
        return Decision(call_id=call_id, verdict="approved" if approve else "denied", by_uid=self.caller.uid)

    async def _send(self, response: Response) -> None:
        await self.stream.send_all(protocol.frame(response))

    async def _answer(self, body: bytes) -> Response:
        try:
            request = protocol.decode_request(body)
        except msgspec.ValidationError as exc:
            return _error("INVALID_MESSAGE", str(exc),
                          "each frame is a map with a known 'type' and only that type's fields")
        except msgspec.DecodeError as exc:
            return _error("NOT_MSGPACK", f"the frame is not MessagePack: {exc}",
                          "encode each request as a MessagePack map behind a 4-byte big-endian length")
        try:
            return await self._respond(request)
        except KeyError:
            return _error("UNKNOWN_CALL", "no call with that call_id (or request_id) is known to you",
                          "call_ids are kept for a while after the call ends; start a new call")
        except Exception:  # a bug must cost this request its answer, never the daemon its life
            log.exception("request %s failed", type(request).__name__)
            return _error("INTERNAL", "rungd failed to answer this request; the operator's log has the details",
                          "try again; if it persists, report it with the time of the failure")

    async def _respond(self, request: Request) -> Response:
        dispatcher = self.dispatcher
        caller = self.caller
        match request:
            case Hello():
                return Welcome(server="rungd", version=protocol.PROTOCOL_VERSION, uid=caller.uid,
                               gid=caller.gid, pid=caller.pid, max_frame=self.max_frame)
            case ListTools():
                return Tools(tools=[
                    ToolSummary(name=r.tool.name, side_effect=r.tool.side_effect,
                                summary=r.tool.description.does, plugin=r.plugin)
                    for r in dispatcher.visible_tools(caller)
                ])
            case Describe(tool=name):
                try:
                    reg = dispatcher.lookup(name, caller)
                except RungdError as exc:
                    return _error(exc.code, exc.message, exc.hint)
                return describe(reg.tool, reg.plugin)
            case Call(tool=name, inputs=inputs, request_id=request_id, wait_s=wait_s):
                return Result(envelope=await dispatcher.call(name, inputs, request_id, caller, wait_s))
            case Status(call_id=call_id):
                return Result(envelope=dispatcher.status(call_id, caller))
            case Wait(call_id=call_id, wait_s=wait_s):
                return Result(envelope=await dispatcher.wait(call_id, wait_s, caller))
            case Pending():
                return HeldCalls(calls=[_held(call) for call in dispatcher.held_calls(caller)])
            case Approve(call_id=call_id, signature=signature):
                return await self._decide(call_id, approve=True, signature=signature)
            case Deny(call_id=call_id, reason=reason):
                return await self._decide(call_id, approve=False, reason=reason)
            case Reconcile(tool=name, request_id=request_id, found=found):
                try:
                    return Result(envelope=await dispatcher.reconcile(name, request_id, caller, found))
                except RungdError as exc:
                    return _error(exc.code, exc.message, exc.hint)
        raise AssertionError(f"unhandled request {request!r}")  # the union is closed


def _held(call: CallState) -> HeldCall:
    assert call.held is not None
    now = time.time()
    return HeldCall(
        call_id=call.call_id, tool=call.tool, gate=call.gate, inputs=call.held.inputs.model_dump(),
        input_digest=call.digest, caller_uid=call.caller.uid, caller_pid=call.caller.pid,
        age_s=round(now - call.held.since, 1), expires_in_s=round(max(0.0, call.held.expires - now), 1),
        approval_message=approval_message(call.call_id, call.tool, call.digest).decode(),
    )


def describe(tool: Tool, plugin: str) -> ToolDefinition:
    """The full definition of a tool: what a model reads plus what an operator checks."""
    definition = tool.definition()
    return ToolDefinition(
        name=tool.name,
        description=definition["description"],
        input_schema=definition["input_schema"],
        side_effect=tool.side_effect,
        outputs=dict(tool.outputs),
        errors=[{"code": r.code, "retry": r.retry, "next_action": r.next_action, "hint": r.hint}
                for r in tool.errors],
        deadline_s=tool.timing.deadline_s,
        commit_point=tool.timing.commit_point,
        settle={"tool": tool.timing.settle.tool, "inputs": dict(tool.timing.settle.inputs)}
        if tool.timing.settle else None,
        requires_request_id=tool.requires_request_id,
        cap_bytes=tool.cap_bytes,
        plugin=plugin,
        lint_waivers=dict(tool.lint_waivers),
    )


def _error(code: str, message: str, hint: str = "") -> ProtocolError:
    return ProtocolError(code=code, message=message, hint=hint)
