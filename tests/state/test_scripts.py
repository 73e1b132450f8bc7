"""The Lua scripts: package data, each named by the module that loads it, called with a header and lists."""

from __future__ import annotations

import asyncio
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from compaction_worker.local.cluster import EmbeddedRedisCluster
from compaction_worker.runtime.connections import connect_redis
from compaction_worker.settings import RedisSettings
from compaction_worker.state import scripts
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import Pipeline, PositionalScript, Script
from tests.conftest import cluster_tests

STATE = Path(scripts.__file__).parent


@pytest.mark.parametrize("package", ["state", "conversation"])
def test_every_lua_file_is_loaded_by_a_module(package: str) -> None:
    """No dead Lua: each file in a package's lua/ is named in the Python of state/ or conversation/,
    as its own (``name.lua``: state/lua; ``conversation:name.lua``: conversation/lua)."""
    files = {f.name for f in resources.files(f"compaction_worker.{package}").joinpath("lua").iterdir()}
    python = "\n".join(
        p.read_text() for folder in (STATE, STATE.parent / "conversation") for p in folder.glob("*.py")
    )
    prefix = "" if package == "state" else f"{package}:"
    named = set(re.findall(rf'"{prefix}(\w+\.lua)"', python))
    assert files == named


def test_a_script_is_its_files_in_order() -> None:
    """Libraries come first, so the body can call what they define."""
    text = scripts.source("push.lua", "conversation:turn.lua")
    assert text.index("local function push(") < text.index("push(transcript")


class Inline(Script):
    """A script whose body is given here, after the ``args.lua`` library every script starts with."""

    def __init__(self, redis: redis.asyncio.Redis, body: str) -> None:
        self._script = redis.register_script(scripts.source("args.lua") + "\n" + body)


@pytest.mark.integration
async def test_lists_arrive_as_header_fields(redis_client: redis.asyncio.Redis) -> None:
    """Lists follow the header as they are (any bytes) and reach the script by name, in order."""
    script = Inline(redis_client, "local h = arguments()\nreturn {h.n, h.a[1], h.a[2], #h.b, h.c[1]}")
    got = await script(
        ["k"], {"a": ["x", b"\x00\xff"], "b": [], "c": ['{"q": "\\""}']}, n="12345678901234567"
    )
    assert got == [b"12345678901234567", b"x", b"\x00\xff", 0, b'{"q": "\\""}']


@pytest.mark.integration
async def test_a_script_is_loaded_again_after_a_primary_restart(
    redis_client: RedisClient, redis_cluster: EmbeddedRedisCluster
) -> None:
    """Cluster: the primary that owns the key restarts with an empty script cache; the call reloads it (NOSCRIPT)."""
    assert isinstance(redis_client, RedisCluster)
    acquire = Script(redis_client, "expiry.lua", "lock_acquire.lua")
    lock, fence, meta = "{c}:lock", "{c}:fence", "{c}:meta"
    assert await acquire([lock, fence, meta], token="a", ttl_ms="60000") == [1, 1]
    owner = redis_client.get_node_from_key(lock)
    assert owner is not None
    redis_cluster.restart(redis_cluster.ports.index(int(owner.port)))
    (held, remaining) = await acquire([lock, fence, meta], token="b", ttl_ms="60000")
    assert held == 0
    assert 0 < remaining <= 60000


class InlinePositional(PositionalScript):
    """A positional script whose body is given here."""

    def __init__(self, redis: RedisClient, body: str, pipeline: Pipeline | None = None) -> None:
        super().__init__(redis, pipeline=pipeline)
        self._script = redis.register_script(body)


ECHO = (
    "if ARGV[1] == 'bad' then return redis.error_reply('refused ' .. KEYS[1]) end return {KEYS[1], ARGV[1]}"
)


@pytest.mark.integration
async def test_calls_made_together_travel_together_on_one_connection(redis_url: str) -> None:
    """Twenty conversations' calls made in one turn of the loop: one connection, each its own reply;
    a call the script refuses fails alone."""
    if cluster_tests():
        pytest.skip("a cluster client sends each call itself")
    client = connect_redis(RedisSettings(url=redis_url))
    counter = redis.asyncio.Redis.from_url(redis_url)
    try:
        before = int((await counter.info("clients"))["connected_clients"])
        script = InlinePositional(client, ECHO)
        replies = await asyncio.gather(
            *(script([f"{{c{i}}}:meta"], ["bad" if i == 7 else str(i)]) for i in range(20)),
            return_exceptions=True,
        )
        assert int((await counter.info("clients"))["connected_clients"]) == before + 1
        assert isinstance(replies[7], ResponseError)
        assert "refused {c7}:meta" in str(replies[7])
        assert [r for i, r in enumerate(replies) if i != 7] == [
            [f"{{c{i}}}:meta".encode(), str(i).encode()] for i in range(20) if i != 7
        ]
    finally:
        await client.aclose()
        await counter.aclose()


@pytest.mark.integration
async def test_calls_after_the_script_cache_is_emptied_load_it_again(redis_client: RedisClient) -> None:
    """A restarted or flushed Redis has no scripts: the calls of that round trip are sent again once it is loaded."""
    script = InlinePositional(redis_client, ECHO)
    assert await script(["{a}:k"], ["1"]) == [b"{a}:k", b"1"]
    await redis_client.script_flush()
    replies = await asyncio.gather(*(script([f"{{a{i}}}:k"], [str(i)]) for i in range(5)))
    assert replies == [[f"{{a{i}}}:k".encode(), str(i).encode()] for i in range(5)]


SLOW = """
if ARGV[1] == 'slow' then
  local start = redis.call('TIME')
  repeat
    local now = redis.call('TIME')
  until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > 200000
end
return {KEYS[1], ARGV[1]}
"""


@pytest.mark.integration
async def test_calls_made_while_a_round_trip_is_in_flight_go_together_after_it(redis_url: str) -> None:
    """Issue 35: one round trip in flight; the calls made meanwhile (two scripts' alike) wait for it
    and travel in one more, each with its own reply."""
    if cluster_tests():
        pytest.skip("a cluster client sends each call itself")
    client = connect_redis(RedisSettings(url=redis_url))
    try:
        pipeline = Pipeline(client)
        slow, echo = InlinePositional(client, SLOW, pipeline), InlinePositional(client, ECHO, pipeline)
        first = asyncio.ensure_future(slow(["{a}:k"], ["slow"]))
        await asyncio.sleep(0.05)  # sent: Redis runs it for 200 ms
        assert pipeline.sends == 1
        later = [
            asyncio.ensure_future((slow if i % 2 else echo)([f"{{b{i}}}:k"], [str(i)])) for i in range(10)
        ]
        await asyncio.sleep(0.05)
        assert pipeline.sends == 1
        assert not any(call.done() for call in later)
        assert await first == [b"{a}:k", b"slow"]
        assert await asyncio.gather(*later) == [[f"{{b{i}}}:k".encode(), str(i).encode()] for i in range(10)]
        assert pipeline.sends == 2
    finally:
        await client.aclose()


@pytest.mark.integration
def test_a_round_trip_left_in_flight_by_another_loop_does_not_hold_the_next_loops_calls(
    redis_url: str,
) -> None:
    """A store can outlive an event loop (tests, tools): the next loop's calls still go."""
    if cluster_tests():
        pytest.skip("a cluster client sends each call itself")
    first = connect_redis(RedisSettings(url=redis_url))
    pipeline = Pipeline(first)

    async def send() -> None:
        call = asyncio.ensure_future(InlinePositional(first, ECHO, pipeline)(["{a}:k"], ["1"]))
        for _ in range(3):  # the round trip is sent; its reply is never read
            await asyncio.sleep(0)
        assert not call.done()

    async def call() -> Any:
        pipeline._redis = connect_redis(RedisSettings(url=redis_url))
        try:
            echo = InlinePositional(pipeline._redis, ECHO, pipeline)
            return await asyncio.wait_for(echo(["{b}:k"], ["2"]), timeout=10)
        finally:
            await pipeline._redis.aclose()

    async def end() -> None:
        """The first loop's round trip and client, ended on their loop: left pending when it
        closes, they outlive it, and collecting them later crashed the interpreter."""
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await first.aclose()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(send())  # the loop stops with the round trip in flight
        assert asyncio.run(call()) == [b"{b}:k", b"2"]
    finally:
        loop.run_until_complete(end())
        loop.close()
