"""The Unix socket: binding it, knowing who is on the other end, and speaking frames.

Every connection is handled on its own, behind a wall: a bad frame costs its sender a
``protocol_error`` reply, and nothing a connection sends (a frame nested a thousand levels
deep, a length prefix of 4 GiB, a frame trickled in byte by byte, a thousand idle
connections) can end the daemon or stall another caller. The caller's identity is read
from the kernel (SO_PEERCRED) once per connection and never taken from a request.

Nor can a connection make the daemon hold much memory: a frame's body is buffered only once
its header said how long it is and who sends it may send that much. A peer that may call no
tool and decide no held call sends small frames only (``SMALL_FRAME``); what one uid may have
buffered in unfinished frames, over all its connections, is bounded (``FrameBudget``, one per daemon).
A whole frame that may decode to much (a megabyte of empty lists is 73 MB of objects:
``decoded_cost``) waits for its turn undecoded, and is decoded while no other such one is.

Errors become replies in one place: ``rungd.service.engine.outcomes``. This module only catches
what the engine raises and hands it there.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import grp
import logging
import math
import os
import pwd
import socket
import stat
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import trio

from rungd import protocol
from rungd.service.catalog import describe, summary
from rungd.config import ServerConfig
from rungd.core.contract import Caller
from rungd.service.engine import Call as CallState
from rungd.service.engine import Dispatcher, outcomes
from rungd.core.errors import ConfigError, RungdError
from rungd.service.evidence import EvidenceStore
from rungd.service.gates import approval_message, is_operator
from rungd.protocol import (
    Approve,
    Call,
    Decision,
    Deny,
    Describe,
    Evidence,
    HeldCall,
    HeldCalls,
    Hello,
    ListTools,
    Pending,
    ProtocolError,
    Reconcile,
    Response,
    Result,
    Resume,
    Resumed,
    Status,
    Tools,
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
        FileExistsError: something that is not a socket is at ``path``; it is left alone.
        OSError: the folder cannot be created (NotADirectoryError naming the file in the
            way) or the path is too long.
    """
    if len(os.fsencode(path)) + 10 > MAX_SOCKET_PATH:  # room for the staging name below
        raise OSError(errno.ENAMETOOLONG, f"socket path is too long for a Unix socket (keep it under "
                      f"{MAX_SOCKET_PATH - 10} bytes): {path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        # mkdir's own words ("File exists: /x/afile") would hide that a file is in the way.
        raise NotADirectoryError(errno.ENOTDIR, "the socket's folder is not a folder (a file is in the way)",
                                 str(path.parent)) from None
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        if (closed := _closed_to(path.parent, gid)) is not None:
            raise ConfigError(
                f"server.socket_group: members of {group} could not reach the socket {path}: the folder {closed} "
                f"(mode {stat.S_IMODE(os.stat(closed).st_mode):04o}) lets neither them nor others pass; hint: put the "
                "socket in a folder of its own they may pass through, outside the state folder (which rungd keeps "
                "0750, for its own group): e.g. socket = \"/run/rungd/rungd.sock\" with RuntimeDirectory=rungd "
                "(the unit's), or make the folder group-owned by it")
    if path.exists() and not path.is_socket():
        # Never unlink what is not a socket: a config pointing at the wrong path must not
        # delete a file there.
        raise FileExistsError(errno.EEXIST, "something that is not a socket is at the socket path", str(path))
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
        os.chown(staging, -1, gid)
    os.chmod(staging, mode)
    sock.listen(socket.SOMAXCONN)
    os.rename(staging, path)
    return sock


# What accept(2) says of the host, not of the listening socket: wait a moment and go on.
_SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


async def serve_connections(sock: trio.socket.SocketType, handle: Callable[[trio.SocketStream], Awaitable[None]],
                            nursery: trio.Nursery) -> None:
    """Accept connections on ``sock`` until cancelled, each served by ``handle`` in
    ``nursery``; the socket is closed on the way out.

    Every connection waiting is taken at each wake: trio's serve_listeners takes one per turn
    of the loop, and a turn may hold a large request's decoding (a few hundred ms), so a
    caller's burst of connections once kept another caller's hello out for five seconds.
    """
    raw = sock._sock  # non-blocking (trio made it so): accepted until the backlog is empty
    try:
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                try:
                    conn, _ = raw.accept()
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in _SHORT_OF:
                        log.error("accept failed: %s; trying again in 0.1 s", exc.strerror)
                        await trio.sleep(0.1)
                        break
                    if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                        continue  # that one connection: gone, or refused by a filter
                    raise
                nursery.start_soon(handle, trio.SocketStream(trio.socket.from_stdlib_socket(conn)))
    finally:
        sock.close()


def _closed_to(folder: Path, gid: int) -> Path | None:
    """The first folder from / down to ``folder`` that members of group ``gid`` may not
    pass through (no search right for others, nor for a group of its own that is ``gid``);
    None when they reach it. By the modes alone: an ACL that lets them through is not read."""
    for step in (*reversed(folder.parents), folder):
        info = os.stat(step)
        if info.st_mode & stat.S_IXOTH or (info.st_gid == gid and info.st_mode & stat.S_IXGRP):
            continue
        return step
    return None


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
    """A frame announced more than its sender may send now; its header is dropped, its body
    not read.

    Args:
        length: the announced length.
        why: what it exceeds, for the reply.
        close: the sender may never send it (it may call nothing): do not read the body to
            keep the connection, close it.
    """

    def __init__(self, length: int, why: str, *, close: bool = False) -> None:
        super().__init__(why)
        self.length = length
        self.why = why
        self.close = close


class TruncatedFrame(Exception):
    pass


class SlowFrame(Exception):
    """A frame was begun and not finished within the frame timeout."""


class Wire:
    """A connection's socket, read and written with no turn of the event loop when the kernel
    can answer at once (a request's frame is usually waiting, an answer usually fits).

    Trio's stream yields to the loop after every receive and send even when nothing waited:
    two turns of the loop per request, for nothing. The loop's
    fairness is kept where it matters: a receive that found its data already there (a client
    sending requests back to back) still gives the other tasks their turn.

    Args:
        stream: the accepted connection; it is closed through it.
        stall_s: how long a send waits for a client that reads nothing before it counts as
            gone (its connection and the slot it holds are let go).
    """

    def __init__(self, stream: trio.SocketStream, stall_s: float = math.inf) -> None:
        self._fd = stream.socket.fileno()
        self._stall_s = stall_s

    async def receive_some(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes, b"" at the end of the stream.

        Raises:
            trio.BrokenResourceError: the connection failed (reset by the peer).
            trio.ClosedResourceError: it was closed meanwhile.
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # never read what a cancellation would drop
        try:
            data = os.read(self._fd, max_bytes)
        except BlockingIOError:
            pass
        except OSError as exc:
            raise trio.BrokenResourceError(f"the connection failed: {exc.strerror}") from exc
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()  # there at once: the others' turn first
            return data
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                return os.read(self._fd, max_bytes)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"the connection failed: {exc.strerror}") from exc

    async def send_all(self, data: bytes) -> None:
        """Send all of ``data``, waiting while the socket is full.

        Raises:
            trio.BrokenResourceError: the peer went away.
            trio.ClosedResourceError: it was closed meanwhile.
        """
        view = memoryview(data)
        while view:
            try:
                sent = os.write(self._fd, view)
            except BlockingIOError:
                with trio.move_on_after(self._stall_s):  # a scope only when the client lags
                    await trio.lowlevel.wait_writable(self._fd)
                    continue
                raise trio.BrokenResourceError(f"the client read nothing for {self._stall_s:g} s")
            except OSError as exc:  # EPIPE (the daemon ignores SIGPIPE, as Python does), ECONNRESET
                raise trio.BrokenResourceError(f"the connection failed: {exc.strerror}") from exc
            view = view[sent:]


# What a peer that may call no tool and decide no held call may send in one frame: a hello,
# a describe, a deny with its reason (1,024 characters) fit many times over.
SMALL_FRAME = 8 << 10

# How many frames of the maximum size one uid may have the daemon buffer at once, over all
# its connections. A request arriving in one read is never counted: only one left unfinished.
FRAMES_IN_FLIGHT_PER_UID = 4


class FrameBudget:
    """Bytes of unfinished frames each uid has the daemon hold, over all its connections.

    A frame that does not arrive in one read is buffered until it is whole: up to
    ``max_frame`` bytes on each connection, so four uids with a hundred connections each
    once took the daemon from 48 to 582 MiB. Counted per uid, a caller holds at most its
    budget (``take``) however many connections it opens. A frame is counted at its announced
    size as soon as its header is read, before any more of its body is, and let go when it
    is whole or given up. The daemon's connections share one.
    """

    def __init__(self) -> None:
        self._held: dict[int, int] = {}

    def take(self, uid: int, size: int, per_uid: int) -> bool:
        """Count ``size`` more bytes for ``uid``; False, counting nothing, past ``per_uid``."""
        held = self._held.get(uid, 0) + size
        if held > per_uid:
            return False
        self._held[uid] = held
        return True

    def give_back(self, uid: int, size: int) -> None:
        left = self._held[uid] - size
        if left:
            self._held[uid] = left
        else:
            del self._held[uid]

    def held(self, uid: int) -> int:
        """Bytes of unfinished frames ``uid`` has buffered now."""
        return self._held.get(uid, 0)


class FrameReader:
    """Reads length-prefixed frames from a stream without ever buffering more than one.

    Args:
        stream: the connection.
        max_frame: the largest body accepted.
        idle_timeout_s: how long to wait for the first byte of the next frame.
        frame_timeout_s: how long a frame may take once its first byte arrived.
        small_only: asked only when a frame announces more than ``SMALL_FRAME`` bytes,
            before its body is read: whether its sender may send small frames only.
        budget: the count of unfinished frames per uid that ``uid``'s frames are held to;
            None holds them to nothing (root: it could stop the daemon anyway).
        uid: the sender.
    """

    def __init__(self, stream: trio.abc.ReceiveStream | Wire, max_frame: int, *, idle_timeout_s: float = 600.0,
                 frame_timeout_s: float = 10.0, small_only: Callable[[], bool] | None = None,
                 budget: FrameBudget | None = None, uid: int = -1) -> None:
        self._stream = stream
        self._max = max_frame
        self._idle_timeout_s = idle_timeout_s
        self._frame_timeout_s = frame_timeout_s
        self._small_only = small_only
        self._budget = budget
        self._per_uid = FRAMES_IN_FLIGHT_PER_UID * (protocol.HEADER.size + max_frame)
        self._uid = uid
        self._buf = bytearray()

    async def next(self) -> bytes | None:
        """The next frame's body, or None at a clean end of stream or after the idle timeout.

        Raises:
            FrameTooLarge: the announced length exceeds the maximum, what this sender may
                send, or what its uid has left of its budget; call ``discard`` unless it
                says ``close``.
            TruncatedFrame: the stream ended in the middle of a frame.
            SlowFrame: the frame did not complete within the frame timeout.
        """
        if self._buf:  # sent behind the last one: the other tasks' turn before it is answered
            await trio.lowlevel.checkpoint()
        # A scope of its own per wait (made directly: move_on_after adds a generator). One
        # scope for all of a connection's waits, its deadline moved, was tried: a deadline
        # passing as a frame's bytes arrived left the scope cancelled around the answer.
        started = False
        with trio.CancelScope(deadline=trio.current_time() + self._idle_timeout_s):
            started = await self._fill(1)
        if not started:
            return None
        body = self._take()  # nearly always whole already: no timeout to set up
        if body is not None:
            return body
        try:
            with trio.fail_after(self._frame_timeout_s):
                return await self._rest()
        except trio.TooSlowError:
            raise SlowFrame() from None

    def _take(self) -> bytes | None:
        """The frame at the head of the buffer if it is all there, else None.

        Raises:
            FrameTooLarge: as ``_length``.
        """
        if len(self._buf) < protocol.HEADER.size:
            return None
        end = protocol.HEADER.size + self._length()
        if len(self._buf) < end:
            return None
        body = bytes(self._buf[protocol.HEADER.size : end])
        del self._buf[:end]
        return body

    def _length(self) -> int:
        """The announced length of the frame whose header heads the buffer.

        Raises:
            FrameTooLarge: it exceeds the maximum, or ``SMALL_FRAME`` for a sender that may
                send small frames only (``close``); the header is dropped.
        """
        (length,) = protocol.HEADER.unpack_from(self._buf)
        if length > self._max:
            del self._buf[: protocol.HEADER.size]
            raise FrameTooLarge(length, f"frame of {length} bytes exceeds the maximum of {self._max}")
        if length > SMALL_FRAME and self._small_only is not None and self._small_only():
            del self._buf[: protocol.HEADER.size]
            raise FrameTooLarge(length, f"frame of {length} bytes exceeds the {SMALL_FRAME} bytes uid {self._uid} "
                                "may send: it may call no tool and decide no held call", close=True)
        return length

    async def _rest(self) -> bytes:
        if not await self._fill(protocol.HEADER.size):
            raise TruncatedFrame()
        end = protocol.HEADER.size + self._length()
        if self._budget is None:
            if not await self._fill(end):
                raise TruncatedFrame()
        else:
            # Counted before the body is read, against all the uid's connections: one uid's
            # unfinished frames never hold more than its budget, however many it opens.
            if not self._budget.take(self._uid, end, self._per_uid):
                del self._buf[: protocol.HEADER.size]
                held = self._budget.held(self._uid)
                raise FrameTooLarge(end - protocol.HEADER.size,
                                    f"uid {self._uid} already has {held} bytes of unfinished frames on its other "
                                    f"connections; this one's {end} would pass its budget of {self._per_uid} "
                                    f"({FRAMES_IN_FLIGHT_PER_UID} frames of the maximum)")
            try:
                if not await self._fill(end):
                    raise TruncatedFrame()
            finally:
                self._budget.give_back(self._uid, end)
        body = bytes(self._buf[protocol.HEADER.size : end])
        del self._buf[:end]
        return body

    async def discard(self, length: int) -> bool:
        """Read and drop ``length`` bytes (an oversize body) within the frame timeout.

        Returns:
            False if the stream ended or the body did not arrive in time.
        """
        with trio.move_on_after(self._frame_timeout_s):
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
        return False

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


class ConnectionLimits:
    """How many connections are open, per uid and in all, against the configured caps.

    One caller can then never take every descriptor the daemon has: beyond its own cap its
    new connections are told so and closed, and the total cap keeps room for everyone else.
    Root is held to the total only: it can stop the daemon anyway, and operators' tools
    should not be the ones locked out.
    """

    def __init__(self, total: int, per_uid: int) -> None:
        self.total = total
        self.per_uid = per_uid
        self._open: collections.Counter[int] = collections.Counter()

    def admit(self, uid: int) -> str | None:
        """Count a new connection of ``uid`` in, or say why it may not stay."""
        if sum(self._open.values()) >= self.total:
            return f"rungd already serves {self.total} connections, its limit"
        if uid != 0 and self._open[uid] >= self.per_uid:
            return f"uid {uid} already holds {self.per_uid} connections, the limit per caller"
        self._open[uid] += 1
        return None

    def leave(self, uid: int) -> None:
        self._open[uid] -= 1
        if self._open[uid] <= 0:
            del self._open[uid]


class Connection:
    """One client connection: read a request, answer it, repeat.

    Args:
        stream: the accepted connection.
        dispatcher: the daemon's call engine.
        server: the server settings (frame size, timeouts).
        replies: the daemon's count of answers in flight.
        frames: the daemon's count of unfinished frames per uid, shared by its connections.
        evidence: the daemon's evidence store; without it, ``evidence`` requests find nothing.
    """

    def __init__(self, stream: trio.SocketStream, dispatcher: Dispatcher, server: ServerConfig,
                 replies: Replies, frames: FrameBudget, *, evidence: EvidenceStore | None = None) -> None:
        self.stream = stream
        self.wire = Wire(stream, stall_s=server.idle_timeout_s)
        self.dispatcher = dispatcher
        self.server = server
        self.max_frame = server.max_frame_bytes
        self.replies = replies
        self.frames = frames
        self.caller = peer_of(stream.socket)
        self.evidence = evidence
        self._turn: trio.Lock | None = None  # the large requests' turn, while this one holds it
        self._handlers = {
            Hello: self._hello, ListTools: self._list_tools, Describe: self._describe, Call: self._call,
            Status: self._status, Wait: self._wait, Pending: self._pending, Approve: self._approve,
            Deny: self._deny, Reconcile: self._reconcile, Evidence: self._evidence, Resume: self._resume,
        }

    async def refuse(self, why: str) -> None:
        """Tell a connection over its caller's cap why, and close it."""
        with trio.move_on_after(1):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._send(_error("TOO_MANY_CONNECTIONS", why,
                                        "close idle connections, or reuse one: a connection carries any number "
                                        "of requests one after another"))
        await trio.aclose_forcefully(self.stream)

    def _may_do_nothing(self) -> bool:
        """Whether this peer may call no tool and decide no held call, by the config in force
        now (a reload may grant it some): it then needs small frames only. Asked only of a
        frame over ``SMALL_FRAME``, whose body it decides whether to read at all."""
        config, caller = self.dispatcher.config, self.caller
        if is_operator(caller, config):
            return False
        return not any(config.allowed(name, caller.uid, caller.groups) for name in self.dispatcher.policy.tools)

    async def serve(self) -> None:
        """Serve requests until the client hangs up, goes idle too long, or trickles a frame.

        Cancellation: the daemon cancels connections at shutdown after calls have ended;
        the stream is closed on the way out either way.
        """
        uid = self.caller.uid
        reader = FrameReader(self.wire, self.max_frame, idle_timeout_s=self.server.idle_timeout_s,
                             frame_timeout_s=self.server.frame_timeout_s, small_only=self._may_do_nothing,
                             budget=self.frames if uid != 0 else None, uid=uid)
        try:
            while True:
                body = await self._next(reader)
                if body is None:
                    return
                with self.replies:
                    await self._send(await self._answer(body))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the client went away; its calls keep running
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    async def _next(self, reader: FrameReader) -> bytes | None:
        """The next request body; None to close the connection (after saying why)."""
        while True:
            try:
                return await reader.next()
            except FrameTooLarge as exc:
                # A body up to a few maximums is read and dropped, so the connection stays
                # usable; beyond that, or from a sender that may call nothing, reading it
                # would only feed a sender that means harm.
                keep = exc.length <= 4 * self.max_frame and not exc.close
                hint = ("ask the operator for access to a tool ([access])" if exc.close else
                        "send smaller requests, or large ones one after another; the limit is in the welcome reply")
                await self._send(_error("FRAME_TOO_LARGE", exc.why,
                                        hint + ("" if keep else "; this connection is closed")))
                if not keep or not await reader.discard(exc.length):
                    return None
            except TruncatedFrame:
                await self._send(_error("TRUNCATED", "the stream ended in the middle of a frame",
                                        "send each frame whole: a 4-byte length, then that many bytes; "
                                        "this connection is closed"))
                return None
            except SlowFrame:
                await self._send(_error("SLOW_FRAME",
                                        f"a frame took longer than {self.server.frame_timeout_s:g} s to arrive",
                                        "send each frame whole, at once; this connection is closed"))
                return None

    async def _send(self, response: Response) -> None:
        await self.wire.send_all(protocol.frame(response))

    async def _answer(self, body: bytes) -> Response:
        if decoded_cost(body) > LARGE_REQUEST:
            # Decoded, checked and admitted while no other large request is (_admitted lets
            # go): its objects may take many times its bytes, and the loop a few hundred ms.
            turn = self.dispatcher.big_requests
            await turn.acquire()
            self._turn = turn  # held: only now is it this request's to let go
        try:
            return await self._decoded(body)
        finally:
            self._admitted()

    def _admitted(self) -> None:
        """Let the next large request take its turn, if this one held it."""
        if self._turn is not None:
            turn, self._turn = self._turn, None
            turn.release()

    async def _decoded(self, body: bytes) -> Response:
        try:
            request = protocol.decode_request(body)
        except msgspec.ValidationError as exc:
            return _error("INVALID_MESSAGE", str(exc)[:500],
                          "each frame is a map with a known 'type' and only that type's fields")
        except msgspec.DecodeError as exc:
            return _error("NOT_MSGPACK", f"the frame is not MessagePack: {str(exc)[:200]}",
                          "encode each request as a MessagePack map behind a 4-byte big-endian length")
        except RecursionError:
            return _error("INVALID_MESSAGE", "the frame is nested too deeply to decode",
                          f"inputs may nest at most {MAX_NESTING} levels")
        if not isinstance(request, Call):
            self._admitted()  # only a call's inputs are checked and admitted in its turn
        try:
            return await self._handlers[type(request)](request)
        except RungdError as exc:  # refused before any call existed: the boundary says how
            return outcomes.protocol_error(exc)
        except Exception:  # a bug must cost this request its answer, never the daemon its life
            log.exception("request %s failed", type(request).__name__)
            return _error("INTERNAL", "rungd failed to answer this request; the operator's log has the details",
                          "try again; if it persists, report it with the time of the failure")

    # --- one handler per request type ---------------------------------------------------------

    async def _hello(self, request: Hello) -> Response:
        caller = self.caller
        return Welcome(server="rungd", version=protocol.PROTOCOL_VERSION, uid=caller.uid, gid=caller.gid,
                       pid=caller.pid, max_frame=self.max_frame)

    async def _list_tools(self, request: ListTools) -> Response:
        dispatcher = self.dispatcher
        marks = dispatcher.step_downs.marks() if dispatcher.step_downs is not None else {}
        refused = list(dispatcher.policy.refused) if is_operator(self.caller, dispatcher.config) else []
        return Tools(tools=[summary(r.tool, r.plugin, marks.get(r.tool.name))
                            for r in dispatcher.visible_tools(self.caller)], refused=refused)

    async def _describe(self, request: Describe) -> Response:
        watch = self.dispatcher.step_downs
        reg = self.dispatcher.lookup(request.tool, self.caller)
        return describe(reg.tool, reg.plugin, watch.mark(reg.tool.name) if watch is not None else None)

    async def _call(self, request: Call) -> Response:
        if _depth(request.inputs) > MAX_NESTING:
            return _error("INVALID_MESSAGE", f"inputs nest deeper than {MAX_NESTING} levels",
                          "flatten the inputs: tool inputs are a few plain values")
        call = await self.dispatcher.start(request.tool, request.inputs, request.request_id, self.caller)
        self._admitted()  # validated: the call runs on, and the next large request may be decoded
        return Result(envelope=await self.dispatcher.wait(call.call_id, request.wait_s, self.caller))

    async def _status(self, request: Status) -> Response:
        return Result(envelope=self.dispatcher.status(request.call_id, self.caller))

    async def _wait(self, request: Wait) -> Response:
        return Result(envelope=await self.dispatcher.wait(request.call_id, request.wait_s, self.caller))

    async def _pending(self, request: Pending) -> Response:
        held = sorted(self.dispatcher.held_calls(self.caller), key=lambda call: call.call_id)
        page = [call for call in held if call.call_id > request.after][: request.limit]
        more = len(page) == request.limit and page[-1].call_id != held[-1].call_id
        return HeldCalls(calls=[_held(call) for call in page], total=len(held),
                         next_after=page[-1].call_id if more else None)

    async def _approve(self, request: Approve) -> Response:
        verdict = await self.dispatcher.decide(request.call_id, self.caller, approve=True,
                                               signature=request.signature, reason=request.reason)
        return Decision(call_id=request.call_id, verdict=verdict, by_uid=self.caller.uid)

    async def _deny(self, request: Deny) -> Response:
        verdict = await self.dispatcher.decide(request.call_id, self.caller, approve=False, reason=request.reason)
        return Decision(call_id=request.call_id, verdict=verdict, by_uid=self.caller.uid)

    async def _reconcile(self, request: Reconcile) -> Response:
        envelope = await self.dispatcher.reconcile(request.tool, request.request_id, self.caller, request.found,
                                                   of_uid=request.caller_uid)
        return Result(envelope=envelope)

    async def _resume(self, request: Resume) -> Response:
        watch = self.dispatcher.step_downs
        if watch is None:  # a Connection built without a daemon (tests of the framing)
            return _error("UNKNOWN_TOOL", f"no step-down watch here to resume {request.tool}", "")
        lifted, was_suspended = await watch.resume(request.tool, self.caller, self.dispatcher.policy.tools)
        return Resumed(tool=request.tool, lifted=lifted.observation if lifted else None,
                       was_suspended=was_suspended, by_uid=self.caller.uid)

    async def _evidence(self, request: Evidence) -> Response:
        if self.evidence is None:  # a Connection built without a store (tests of the framing)
            return _error("UNKNOWN_EVIDENCE", "no evidence with that id is known to you",
                          "this daemon serves no evidence")
        return await self.evidence.read(request, self.caller)


# A request that may decode to more than this (an import's rows, or a caller's flood) is
# decoded and admitted while no other large one is (decoded_cost).
LARGE_REQUEST = 256 << 10

# Bytes of MessagePack that may begin an object Python allocates: a map, a list, a string,
# a binary, an extension, a float, an int (past the few small ones CPython keeps). The rest
# (0x00-0x7f, nil, the bools) decode to a pointer to a kept object, or lie inside a string.
_FREE = bytes([*range(0x80), 0xC0, 0xC1, 0xC2, 0xC3])


def decoded_cost(body: bytes) -> int:
    """An upper bound, in bytes, of what decoding ``body`` makes Python hold: 240 for each
    byte that may begin an object (a map of one entry, three bytes on the wire, takes 232)
    and 24 for every byte (a pointer, or a map's share of its table). A bound, not a count:
    text beyond ASCII is counted as if each of its bytes began an object, which only makes
    such a request wait for its turn. Two passes over the body, only past 1 KiB."""
    if len(body) <= 1024:
        return 240 * len(body)  # at most a quarter of a MiB: never a turn to wait for
    heads = len(body.translate(None, _FREE))
    return 24 * len(body) + 240 * heads


# Tool inputs are a few plain values; a request nested deeper than this is refused before
# validation, whose recursion it could otherwise exhaust.
MAX_NESTING = 32


def _depth(value: object, limit: int = MAX_NESTING + 1) -> int:
    """How deeply ``value`` nests lists and maps, counted without recursion, up to ``limit``:
    a level at a time, with no object made per item (a megabyte of empty lists is a million
    items; a tuple each held the loop half a second)."""
    depth, level = 0, [value]
    while depth < limit:
        inner: list[object] = []
        for item in level:
            if isinstance(item, list):
                inner += item
            elif isinstance(item, dict):
                inner += item.values()
        if not inner:
            return depth
        depth, level = depth + 1, inner
    return depth


def _held(call: CallState) -> HeldCall:
    assert call.held is not None
    now = time.time()
    return HeldCall(
        call_id=call.call_id, tool=call.tool, gate=call.gate, inputs=call.held.inputs.model_dump(),
        input_digest=call.digest, caller_uid=call.caller.uid, caller_pid=call.caller.pid,
        age_s=round(now - call.held.since, 1), expires_in_s=round(max(0.0, call.held.expires - now), 1),
        approval_message=approval_message(call.call_id, call.tool, call.digest).decode(),
        plan=list(call.held.plan),
    )


def _error(code: str, message: str, hint: str = "") -> ProtocolError:
    return ProtocolError(code=code, message=message, hint=hint)
