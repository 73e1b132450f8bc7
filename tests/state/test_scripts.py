"""The Lua scripts: package data, each named by the module that loads it, called with a header and lists."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from compaction_worker.local.cluster import EmbeddedRedisCluster
from compaction_worker.state import scripts
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import Script

STATE = Path(scripts.__file__).parent


def test_every_lua_file_is_loaded_by_a_state_module() -> None:
    """No dead Lua: each file in lua/ is named in the Python of state/."""
    files = {f.name for f in resources.files("compaction_worker.state").joinpath("lua").iterdir()}
    python = "\n".join(p.read_text() for p in STATE.glob("*.py"))
    named = set(re.findall(r'"(\w+\.lua)"', python))
    assert files == named


def test_a_script_is_its_files_in_order() -> None:
    """Libraries come first, so the body can call what they define."""
    text = scripts.source("push.lua", "turn.lua")
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
