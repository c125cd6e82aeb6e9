"""rungd.protocol: the sans-IO FrameBuffer both clients read with, and the reply table."""

from __future__ import annotations

import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rungd import protocol
from rungd.protocol import FrameBuffer, FrameTooLarge, TruncatedFrame


def framed(*bodies: bytes) -> bytes:
    return b"".join(protocol.HEADER.pack(len(body)) + body for body in bodies)


def drain(frames: FrameBuffer) -> list[bytes]:
    bodies = []
    while (body := frames.next_frame()) is not None:
        bodies.append(body)
    return bodies


def test_whole_frames_in_one_feed_come_out_in_order() -> None:
    frames = FrameBuffer()
    frames.feed(framed(b"one", b"", b"three"))
    assert drain(frames) == [b"one", b"", b"three"]
    assert frames.buffered == 0 and not frames.ended


@given(bodies=st.lists(st.binary(max_size=40), max_size=6), cuts=st.lists(st.integers(0, 300), max_size=10))
def test_any_split_of_the_stream_gives_the_same_frames(bodies: list[bytes], cuts: list[int]) -> None:
    stream = framed(*bodies)
    frames = FrameBuffer(64)
    out: list[bytes] = []
    points = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    for start, end in zip(points, points[1:], strict=False):
        frames.feed(stream[start:end])
        out += drain(frames)
    frames.feed(b"")
    out += drain(frames)
    assert out == bodies


def test_a_frame_above_the_maximum_is_skipped_and_the_next_one_still_reads() -> None:
    frames = FrameBuffer(max_frame=8)
    frames.feed(protocol.HEADER.pack(20) + b"x" * 5)
    with pytest.raises(FrameTooLarge) as caught:
        frames.next_frame()
    assert (caught.value.length, caught.value.limit) == (20, 8)
    assert frames.buffered == 0  # the oversize body is dropped, never held
    frames.feed(b"x" * 15 + framed(b"ok"))
    assert drain(frames) == [b"ok"]


def test_the_stream_ending_inside_a_frame_is_truncated() -> None:
    frames = FrameBuffer()
    frames.feed(protocol.HEADER.pack(10) + b"abc")
    assert frames.next_frame() is None  # more may come
    frames.feed(b"")
    with pytest.raises(TruncatedFrame) as caught:
        frames.next_frame()
    assert caught.value.missing == 7


def test_the_stream_ending_inside_a_header_is_truncated() -> None:
    frames = FrameBuffer()
    frames.feed(b"\x00\x00")
    frames.feed(b"")
    with pytest.raises(TruncatedFrame):
        frames.next_frame()


def test_a_clean_end_between_frames_is_none_and_ended() -> None:
    frames = FrameBuffer()
    frames.feed(framed(b"last"))
    frames.feed(b"")
    assert frames.next_frame() == b"last"
    assert frames.next_frame() is None and frames.ended
    with pytest.raises(RuntimeError):
        frames.feed(b"late")


def test_every_request_type_declares_the_response_that_answers_it() -> None:
    requests = set(typing.get_args(protocol.Request))
    responses = set(typing.get_args(protocol.Response))
    assert set(protocol.REPLY_TO) == requests
    assert set(protocol.REPLY_TO.values()) <= responses - {protocol.ProtocolError}


def test_daemon_time_is_the_wait_a_request_asks_for() -> None:
    assert protocol.daemon_time_s(protocol.Hello()) == 0
    assert protocol.daemon_time_s(protocol.Call(tool="t", wait_s=7)) == 7
    assert protocol.daemon_time_s(protocol.Wait(call_id="c1", wait_s=3)) == 3
    assert protocol.daemon_time_s(protocol.Reconcile(tool="t", request_id="r")) == protocol.RECONCILE_TIME_S


def test_frame_round_trips_through_the_buffer_and_the_decoder() -> None:
    frames = FrameBuffer()
    frames.feed(protocol.frame(protocol.Describe(tool="inventory_item_show")))
    body = frames.next_frame()
    assert body is not None
    assert protocol.decode_request(body) == protocol.Describe(tool="inventory_item_show")


@pytest.mark.parametrize("wait_s", [float("nan"), -1.0, float("-inf")])
@pytest.mark.parametrize("kind", ["call", "wait"])
def test_a_wait_that_is_negative_or_not_a_number_is_refused(kind: str, wait_s: float) -> None:
    import msgspec

    name = {"call": {"tool": "t"}, "wait": {"call_id": "c1"}}[kind]
    with pytest.raises(msgspec.ValidationError, match=r">= 0.0 - at `\$.wait_s`"):
        protocol.decode_request(msgspec.msgpack.encode({"type": kind, **name, "wait_s": wait_s}))
    assert protocol.decode_request(msgspec.msgpack.encode({"type": kind, **name, "wait_s": 0})).wait_s == 0
