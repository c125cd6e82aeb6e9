"""rungd.aclient.AsyncClient: the sync client's API, awaitable on asyncio.

Each test runs its asyncio code with ``asyncio.run`` in a worker thread while the daemon
serves in the test's Trio nursery, which is how an asyncio agent framework meets a daemon
it did not start.
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
from rungd import protocol
from rungd.aclient import AsyncClient
from rungd.client import Client, ClientError, ConnectFailed, RequestRejected

from tests.conftest import TEST_PLUGINS


@pytest.fixture
def rungd_config_toml() -> str:
    return f"""
[plugins]
files = ["{TEST_PLUGINS / 'echo_tools.py'}"]
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
