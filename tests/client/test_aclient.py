"""rungd.aclient.AsyncClient: the sync client's API, awaitable on asyncio and on Trio.

The asyncio tests run their code with ``asyncio.run`` in a worker thread while the daemon
serves in the test's Trio nursery, which is how an asyncio agent framework meets a daemon
it did not start. The Trio tests await the client directly, in the test's own loop.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from rungd_ledgers import iter_records

from rungd import protocol
from rungd.aclient import AsyncClient
from rungd.client import Client, ClientError, ConnectFailed, RequestRejected

from tests.conftest import TEST_PLUGINS


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}", "{TEST_PLUGINS / 'fake_tools.py'}"]
"""


async def in_asyncio(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await trio.to_thread.run_sync(lambda: asyncio.run(fn()))


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_") and name not in ("close", "aclose", "connect")
    }


def test_same_methods_and_arguments_as_the_sync_client() -> None:
    sync, aio = public_methods(Client), public_methods(AsyncClient)
    assert set(sync) == set(aio)
    for name, signature in sync.items():
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert aio[name] == signature, name  # same parameters, defaults and return annotation


async def test_hello_list_describe_call_status_wait(rungd_daemon) -> None:
    async def go() -> None:
        async with AsyncClient(rungd_daemon.socket) as c:
            welcome = await c.hello()
            assert (welcome.uid, welcome.pid) == (os.getuid(), os.getpid())
            assert "test_text_echo" in {t.name for t in await c.list_tools()}
            definition = await c.describe("inventory_count_set")
            assert isinstance(definition, protocol.ToolDefinition) and definition.requires_request_id
            env = await c.call("test_text_echo", {"text": "ab", "times": 2})
            assert (env.status, env.fields) == ("ok", {"text": "abab"})
            assert (await c.status(env.call_id)).fields == {"text": "abab"}
            pending = await c.call("test_clock_sleep", {"seconds": 0.5}, wait_s=0.05)
            assert pending.status == "pending"
            done = await c.wait(pending.call_id, wait_s=10)
            assert (done.status, done.call_id) == ("ok", pending.call_id)
            assert await c.pending() == []
            write = await c.call("inventory_count_set", {"item": "widget", "count": 4}, request_id="a1")
            assert (write.status, write.effect) == ("ok", "changed")

    await in_asyncio(go)


async def test_protocol_errors_raise_request_rejected_and_the_connection_stays_usable(rungd_daemon) -> None:
    async def go() -> None:
        async with AsyncClient(rungd_daemon.socket) as c:
            with pytest.raises(RequestRejected) as info:
                await c.describe("inventory_itme_show")
            assert info.value.code == "UNKNOWN_TOOL"
            with pytest.raises(RequestRejected) as info:
                await c.status("c-no-such-call")
            assert info.value.code == "UNKNOWN_CALL"
            assert (await c.hello()).uid == os.getuid()

    await in_asyncio(go)


async def test_concurrent_requests_on_one_client_take_turns(rungd_daemon) -> None:
    async def go() -> None:
        async with AsyncClient(rungd_daemon.socket) as c:
            envs = await asyncio.gather(*(c.call("test_text_echo", {"text": str(i)}) for i in range(8)))
            assert [e.fields["text"] for e in envs] == [str(i) for i in range(8)]

    await in_asyncio(go)


async def test_nothing_listening_is_connect_failed(short_tmp) -> None:
    async def go() -> None:
        with pytest.raises(ConnectFailed, match="rungd serve"):
            async with AsyncClient(short_tmp / "nobody.sock"):
                pass

    await in_asyncio(go)


async def silent_server(path: Path, reply: bytes | None, fn: Callable[[], Awaitable[None]]) -> None:
    """Run ``fn`` while a server at ``path`` answers every request with ``reply`` (or nothing)."""
    handlers: list[asyncio.Future[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        done = asyncio.get_running_loop().create_future()
        handlers.append(done)
        try:
            await reader.read(4096)
            if reply is not None:
                writer.write(reply)
                await writer.drain()
            await reader.read()  # until the client hangs up
        finally:
            writer.close()
            done.set_result(None)

    server = await asyncio.start_unix_server(handle, str(path))
    async with server:
        await fn()
        # Let every handler see the client hang up and close its side before the loop ends.
        await asyncio.wait_for(asyncio.gather(*handlers), 5)


async def test_no_reply_in_time_closes_the_connection(short_tmp) -> None:
    async def go() -> None:
        c = AsyncClient(short_tmp / "silent.sock", timeout=0.2)
        await c.connect()
        with pytest.raises(ClientError, match="no reply in time"):
            await c.hello()
        with pytest.raises(ClientError, match="not connected"):  # out of step: not reused
            await c.hello()
        await c.aclose()

    await in_asyncio(lambda: silent_server(short_tmp / "silent.sock", None, go))


async def test_a_reply_that_is_not_a_frame_is_a_client_error(short_tmp) -> None:
    async def go() -> None:
        async with AsyncClient(short_tmp / "junk.sock") as c:
            with pytest.raises(ClientError, match="cannot read"):
                await c.hello()

    await in_asyncio(lambda: silent_server(short_tmp / "junk.sock", b"\x00\x00\x00\x02\xc1\xc1", go))


async def test_cancelled_request_closes_the_connection(short_tmp) -> None:
    async def go() -> None:
        async with AsyncClient(short_tmp / "slow.sock") as c:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await c.hello()
            with pytest.raises(ClientError, match="not connected"):
                await c.hello()

    await in_asyncio(lambda: silent_server(short_tmp / "slow.sock", None, go))


# --- Trio, and what a cancelled request leaves behind -----------------------------------------

SLOW_WRITE = {"program": "busy", "args": ["--mode", "sleep", "--seconds", "1"]}


def dispatches(daemon: Any, tool: str) -> int:
    ledger = daemon.config.state_dir / "ledger"
    return sum(1 for r in iter_records(ledger) if r.tool == tool and r.event == "dispatched")


async def test_works_under_trio_without_a_thread(rungd_daemon) -> None:
    async with AsyncClient(rungd_daemon.socket) as c:
        assert (await c.hello()).pid == os.getpid()
        env = await c.call("test_text_echo", {"text": "t", "times": 3})
        assert (env.status, env.fields) == ("ok", {"text": "ttt"})
        async with trio.open_nursery() as nursery:  # concurrent awaits on one client take turns
            for i in range(4):
                nursery.start_soon(c.call, "test_text_echo", {"text": str(i)})
        with pytest.raises(RequestRejected) as info:
            await c.describe("no_such_tool")
        assert info.value.code == "UNKNOWN_TOOL"


async def test_nothing_listening_is_connect_failed_under_trio(short_tmp) -> None:
    with pytest.raises(ConnectFailed, match="rungd serve") as caught:
        async with AsyncClient(short_tmp / "nobody.sock"):
            pass
    assert caught.value.reason == "missing"


async def test_a_cancelled_write_keeps_running_and_its_request_id_gets_the_result_under_trio(rungd_daemon) -> None:
    async with AsyncClient(rungd_daemon.socket) as c:
        with trio.move_on_after(0.3) as waiting:
            await c.call("fake_write_slow", SLOW_WRITE, request_id="cancel-trio")
        assert waiting.cancelled_caught
        # The client says what happened to the request, not merely "use async with".
        with pytest.raises(ClientError, match=r"not connected.*call fake_write_slow \(request_id cancel-trio\)"):
            await c.hello()
        await c.connect()
        again = await c.call("fake_write_slow", SLOW_WRITE, request_id="cancel-trio", wait_s=20)
    # The first call's result: "changed" if the repeat waited for it, "existing" once it is in the ledger.
    assert again.status == "ok" and again.effect in ("changed", "existing"), again.error
    assert dispatches(rungd_daemon, "fake_write_slow") == 1  # the repeat ran nothing


async def test_a_cancelled_write_keeps_running_and_its_request_id_gets_the_result_under_asyncio(rungd_daemon) -> None:
    async def go() -> Any:
        async with AsyncClient(rungd_daemon.socket) as c:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await c.call("fake_write_slow", SLOW_WRITE, request_id="cancel-aio")
            with pytest.raises(ClientError, match=r"not connected.*request_id cancel-aio"):
                await c.status("c0123456789abcdef")
            await c.connect()
            return await c.call("fake_write_slow", SLOW_WRITE, request_id="cancel-aio", wait_s=20)

    again = await in_asyncio(go)
    # The first call's result: "changed" if the repeat waited for it, "existing" once it is in the ledger.
    assert again.status == "ok" and again.effect in ("changed", "existing"), again.error
    assert dispatches(rungd_daemon, "fake_write_slow") == 1
