"""The wire protocol: length-prefixed MessagePack frames carrying tagged structs.

Each message is a 4-byte big-endian unsigned length followed by that many bytes of
MessagePack. The body is a map whose ``type`` key names the message; every other key is a
field of that message. Unknown types, unknown fields and wrong types are protocol errors,
answered with a ``protocol_error`` frame on the same connection, which stays usable.

A connection carries one request at a time: the client sends a request and reads exactly
one response. Open more connections for concurrency; any connection may ``wait`` for a call
another one started.

This module is the one place both ends take the protocol from, as msgspec's asyncio
key-value example keeps its messages and codecs together:

    Message, the requests and responses   the tagged structs, and the ``Request`` / ``Response`` unions
    REPLY_TO, daemon_time_s               per request: the reply it gets, and how long the daemon may take
    frame, decode_request/response        the codecs, built once
    FrameBuffer                           sans-IO framing: bytes in, whole frame bodies out

Adding a request type means: its struct here, one ``REPLY_TO`` entry, one handler in the
server, and one one-line method per client.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, Final

import msgspec

from rungd.core.envelope import Envelope
from rungd.core.vocabulary import INVISIBLE

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 1 << 20  # 1 MiB


class Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, omit_defaults=True):
    """Base of every frame body. The tag (``type``) is the snake_case name given below."""


# --- requests ------------------------------------------------------------------------------


class Hello(Message, tag="hello"):
    client: str = ""
    version: int = PROTOCOL_VERSION


class ListTools(Message, tag="list_tools"):
    pass


# Names and keys are short, and visible: a frame cannot smuggle a megabyte, a terminal escape
# or a line break (a forged log or `rungctl tail` line) into an error, a log or the ledger.
Name = Annotated[str, msgspec.Meta(max_length=128, pattern=f"\\A[^{INVISIBLE}]*\\Z")]
# Seconds to wait for a result: none, some, or more than the daemon waits at most (it caps
# them); never negative or NaN.
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class Describe(Message, tag="describe"):
    tool: Name


class Call(Message, tag="call"):
    tool: Name
    inputs: dict[str, Any] = {}
    request_id: Name | None = None
    wait_s: Seconds = 30.0


class Status(Message, tag="status"):
    call_id: Name


class Wait(Message, tag="wait"):
    call_id: Name
    wait_s: Seconds = 30.0


class Pending(Message, tag="pending"):
    """One page of held calls, oldest first: those whose call_id sorts after ``after``."""

    after: Name = ""
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 100


class Approve(Message, tag="approve"):
    call_id: Name
    signature: Annotated[str, msgspec.Meta(max_length=16384)] | None = None  # an SSH signature is ~300 bytes
    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""  # why: the ledger keeps it, as a denial's


class Deny(Message, tag="deny"):
    call_id: Name
    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""  # goes to the ledger and the caller


class Reconcile(Message, tag="reconcile"):
    tool: Name
    request_id: Name
    found: bool | None = None
    caller_uid: int | None = None  # an operator settling the request of this uid


class Evidence(Message, tag="evidence"):
    """Read part of one evidence file, as stored (redacted): a byte range, a line range, or
    the lines that hold a literal text.

    Give at most one of: ``offset`` (and ``length``: bytes), ``line`` (and ``count``: lines,
    numbered from 1), ``grep`` (lines holding that text, searched from ``line``). Nothing
    given reads from the first byte. The reply is capped (``evidence.reply_bytes``, and
    ``max_bytes`` when smaller) and says where to go on (``next``).
    """

    evidence_id: Annotated[str, msgspec.Meta(max_length=200)]
    offset: Annotated[int, msgspec.Meta(ge=0)] | None = None
    length: Annotated[int, msgspec.Meta(ge=0)] | None = None
    line: Annotated[int, msgspec.Meta(ge=1)] | None = None
    count: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # A literal, never a regular expression: a caller's pattern cannot make the daemon backtrack.
    grep: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None


class Resume(Message, tag="resume"):
    """Lift a tool's step-down mark, and its suspension if it was suspended (operators only).

    Evidence before the resume no longer counts toward the tool's step-down observations.
    """

    tool: Name


Request = Hello | ListTools | Describe | Call | Status | Wait | Pending | Approve | Deny | Reconcile | Evidence | Resume


# --- responses -----------------------------------------------------------------------------


class Welcome(Message, tag="welcome"):
    server: str
    version: int
    uid: int
    gid: int
    pid: int
    max_frame: int


class ToolSummary(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    side_effect: str
    summary: str
    plugin: str
    # Set when a step-down observation fired (what, when, the evidence): the wrapper may have
    # stopped fitting its program. Omitted when unset, so older clients still decode it.
    step_down: str | None = None
    suspended: bool = False


class Tools(Message, tag="tools"):
    tools: list[ToolSummary]
    # For operators only: what the daemon refused to load and why, one line each (the
    # journal's and ``rungd check-config``'s ``refused:`` lines). Empty for everyone else.
    refused: list[str] = []


class ToolDefinition(Message, tag="tool"):
    name: str
    description: str
    input_schema: dict[str, Any]
    side_effect: str
    outputs: dict[str, str]
    errors: list[dict[str, str]]
    deadline_s: float
    commit_point: str
    settle: dict[str, Any] | None = None
    requires_request_id: bool = False
    cap_bytes: int = 4096
    plugin: str = ""
    lint_waivers: dict[str, str] = {}
    # The contract's heading (``rungd.core.contract.Heading.as_dict``) and the credential names
    # the tool declares; for operators and lint, never part of the model's description.
    heading: dict[str, Any] | None = None
    credentials: list[str] = []
    step_down: str | None = None  # as ToolSummary.step_down
    suspended: bool = False


class Result(Message, tag="result"):
    envelope: Envelope


class HeldCall(msgspec.Struct, forbid_unknown_fields=True):
    call_id: str
    tool: str
    gate: str
    inputs: dict[str, Any]
    input_digest: str
    caller_uid: int
    caller_pid: int
    age_s: float
    expires_in_s: float
    approval_message: str
    plan: list[str] = []  # what the call will do, step by step (a screen tool's steps), when the tool says


class HeldCalls(Message, tag="held_calls"):
    calls: list[HeldCall]
    total: int = 0  # held calls the asker may see, on every page
    next_after: str | None = None  # send pending with after=this for the next page; None: last page


class Decision(Message, tag="decision"):
    call_id: str
    verdict: str
    by_uid: int


class ProtocolError(Message, tag="protocol_error"):
    code: str
    message: str
    hint: str = ""


class EvidenceNext(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Where the rest is: send ``evidence`` again with this ``offset`` or ``line`` (and the same ``grep``)."""

    offset: int | None = None
    line: int | None = None


class EvidenceSlice(Message, tag="evidence_slice"):
    """Part of one evidence file.

    ``text`` is the file's bytes from ``offset`` to ``end``, decoded as UTF-8 (a cut never
    splits a character; bytes that are not UTF-8 read as U+FFFD). For ``grep`` it is the
    matching lines, each as ``LINE:text``. ``size`` and ``lines`` count the whole file now.
    ``truncated`` says the cap (or the search's time bound) stopped the answer short of what
    was asked; ``next`` says where the rest of the file goes on, None at its end.
    ``not_kept`` counts what the program printed past the end of the file that rungd did not
    keep, and ``not_kept_why`` says why (the evidence cap, a full disk): rungd's words, never
    the program's (the file holds only what it printed).
    """

    evidence_id: str
    text: str
    size: int
    lines: int
    offset: int
    end: int
    first_line: int = 0
    matches: int = 0
    truncated: bool = False
    next: EvidenceNext | None = None
    not_kept: int = 0
    not_kept_why: str = ""


class Resumed(Message, tag="resumed"):
    """A ``resume`` done: the mark it lifted (None when the tool was not marked)."""

    tool: str
    lifted: str | None
    was_suspended: bool
    by_uid: int


Response = Welcome | Tools | ToolDefinition | Result | HeldCalls | Decision | EvidenceSlice | Resumed | ProtocolError

#: For each request type, the response type that answers it. Any request may instead get a
#: ``ProtocolError``. Both clients check replies against this table, so a client method is
#: one line; a test fails when a request type is missing from it.
REPLY_TO: Final[dict[type[Message], type[Message]]] = {
    Hello: Welcome,
    ListTools: Tools,
    Describe: ToolDefinition,
    Call: Result,
    Status: Result,
    Wait: Result,
    Pending: HeldCalls,
    Approve: Decision,
    Deny: Decision,
    Reconcile: Result,
    Evidence: EvidenceSlice,
    Resume: Resumed,
}

#: How long a ``reconcile`` may take in the daemon: its settle read runs under the settle
#: tool's own deadline, which no request field states.
RECONCILE_TIME_S: Final = 300.0


def daemon_time_s(request: Message) -> float:
    """Seconds the daemon may spend on ``request`` by design, before its reply is late.

    A client adds this to its own timeout for the round trip: a ``call`` or ``wait`` may
    legitimately answer only after its ``wait_s``.
    """
    match request:
        case Call(wait_s=wait_s) | Wait(wait_s=wait_s):
            return wait_s
        case Reconcile():
            return RECONCILE_TIME_S
    return 0.0


_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_response_decoder = msgspec.msgpack.Decoder(Response)


def frame(message: Message) -> bytes:
    """Encode one message as a complete frame: length prefix plus body."""
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


def decode_request(body: bytes) -> Request:
    """Decode a request body.

    Raises:
        msgspec.ValidationError: a MessagePack map that is not a known request.
        msgspec.DecodeError: not MessagePack at all (ValidationError is a subclass).
    """
    return _request_decoder.decode(body)


def decode_response(body: bytes) -> Response:
    """Decode a response body; raises like ``decode_request``."""
    return _response_decoder.decode(body)


# --- framing, without I/O -------------------------------------------------------------------


class FrameError(Exception):
    """Base of the framing errors ``FrameBuffer.next_frame`` raises."""


class FrameTooLarge(FrameError):
    """A frame announced a body above the maximum.

    The buffer skips that body as it arrives and goes on with the frame after it, so a
    server can answer with a protocol error and keep the connection.

    Attributes:
        length: the announced body length.
        limit: the maximum the buffer was built with.
    """

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds the maximum of {limit}")
        self.length = length
        self.limit = limit


class TruncatedFrame(FrameError):
    """The stream ended in the middle of a frame."""

    def __init__(self, missing: int) -> None:
        super().__init__(f"the stream ended {missing} bytes short of the end of a frame")
        self.missing = missing


class FrameBuffer:
    """Length-prefixed frames from a byte stream, with no I/O of its own (sans-IO).

    The owner of the socket feeds it what it receives and takes whole frame bodies out, so
    both clients share one framing (the server's ``FrameReader`` is to move onto it), and a
    test can drive it with plain bytes:

        frames = FrameBuffer(max_frame)
        while (body := frames.next_frame()) is None:
            if frames.ended:
                break                         # a clean end of stream, between frames
            frames.feed(sock.recv(65536))     # b"" marks the end of the stream

    Args:
        max_frame: the largest body accepted; a bigger one raises ``FrameTooLarge``.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversize body still to drop
        self._ended = False

    @property
    def ended(self) -> bool:
        """True once ``feed(b"")`` has marked the end of the stream."""
        return self._ended

    @property
    def buffered(self) -> int:
        """Bytes held that are not yet part of a returned frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        """Add bytes received from the stream; ``b""`` means the stream ended.

        Raises:
            RuntimeError: bytes fed after the end of the stream.
        """
        if not data:
            self._ended = True
            return
        if self._ended:
            raise RuntimeError("data fed after the end of the stream")
        if self._skip:
            # Drop an oversize body as it arrives instead of holding it: that is the point
            # of having a maximum.
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next whole frame body, or None when more bytes are needed (or at a clean end).

        Raises:
            FrameTooLarge: the next frame announces more than ``max_frame`` bytes; its body
                is skipped, and the next call goes on with the frame after it.
            TruncatedFrame: the stream ended with part of a frame buffered.
        """
        size = HEADER.size
        if len(self._buf) >= size:
            (length,) = HEADER.unpack_from(self._buf)
            if length > self.max_frame:
                dropped = min(length, len(self._buf) - size)
                del self._buf[: size + dropped]
                self._skip = length - dropped
                raise FrameTooLarge(length, self.max_frame)
            if len(self._buf) >= size + length:
                body = bytes(self._buf[size : size + length])
                del self._buf[: size + length]
                return body
            missing = size + length - len(self._buf)
        else:
            missing = size - len(self._buf) if self._buf else 0
        if self._ended and (missing or self._skip):
            raise TruncatedFrame(missing or self._skip)
        return None
