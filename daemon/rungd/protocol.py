"""The wire protocol: length-prefixed MessagePack frames carrying tagged structs.

Each message is a 4-byte big-endian unsigned length followed by that many bytes of
MessagePack. The body is a map whose ``type`` key names the message; every other key is a
field of that message. Unknown types, unknown fields and wrong types are protocol errors,
answered with a ``protocol_error`` frame on the same connection, which stays usable.

A connection carries one request at a time: the client sends a request and reads exactly
one response. Open more connections for concurrency; any connection may ``wait`` for a call
another one started.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any

import msgspec

from rungd.envelope import Envelope

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


# Names and keys are short; a frame cannot smuggle a megabyte into an error or the ledger.
Name = Annotated[str, msgspec.Meta(max_length=128)]


class Describe(Message, tag="describe"):
    tool: Name


class Call(Message, tag="call"):
    tool: Name
    inputs: dict[str, Any] = {}
    request_id: Name | None = None
    wait_s: float = 30.0


class Status(Message, tag="status"):
    call_id: Name


class Wait(Message, tag="wait"):
    call_id: Name
    wait_s: float = 30.0


class Pending(Message, tag="pending"):
    pass


class Approve(Message, tag="approve"):
    call_id: str
    signature: str | None = None


class Deny(Message, tag="deny"):
    call_id: str
    reason: str = ""


class Reconcile(Message, tag="reconcile"):
    tool: Name
    request_id: Name
    found: bool | None = None


Request = Hello | ListTools | Describe | Call | Status | Wait | Pending | Approve | Deny | Reconcile


# --- responses -----------------------------------------------------------------------------


class Welcome(Message, tag="welcome"):
    server: str
    version: int
    uid: int
    gid: int
    pid: int
    max_frame: int


class ToolSummary(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    side_effect: str
    summary: str
    plugin: str


class Tools(Message, tag="tools"):
    tools: list[ToolSummary]


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


class HeldCalls(Message, tag="held_calls"):
    calls: list[HeldCall]


class Decision(Message, tag="decision"):
    call_id: str
    verdict: str
    by_uid: int


class ProtocolError(Message, tag="protocol_error"):
    code: str
    message: str
    hint: str = ""


Response = Welcome | Tools | ToolDefinition | Result | HeldCalls | Decision | ProtocolError

_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(Request)
_response_decoder = msgspec.msgpack.Decoder(Response)


def frame(message: Message) -> bytes:
    """Encode one message as a complete frame: length prefix plus body."""
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


def decode_request(body: bytes) -> Request:
    """Decode a request body. Raises ``msgspec.DecodeError`` (or ValidationError) when bad."""
    return _request_decoder.decode(body)


def decode_response(body: bytes) -> Response:
    return _response_decoder.decode(body)
