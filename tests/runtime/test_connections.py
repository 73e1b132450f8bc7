"""Redis connections from settings (compaction_worker.runtime.connections): commands packed with hiredis."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from compaction_worker.runtime.connections import connect_redis, hiredis_packing
from compaction_worker.settings import RedisSettings
from tests.conftest import cluster_tests

COMMANDS: list[tuple[Any, ...]] = [
    ("SET", "k", "é", "PX", 1500),
    ("EVALSHA", "a" * 40, 2, "k1", "k2", b"\x00bytes\xff", 0.1 + 0.2, 1e20, -7, ""),
    ("CLIENT SETNAME", "worker"),
    (b"CONFIG GET", b"maxmemory"),
    ("SET", "k", memoryview(b"view")),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_packs_the_bytes_redis_py_packs(args: tuple[Any, ...]) -> None:
    ours = hiredis_packing(Connection)()

    assert b"".join(ours.pack_command(*args)) == b"".join(Connection().pack_command(*args))


def test_refuses_what_redis_py_refuses() -> None:
    ours = hiredis_packing(Connection)()

    with pytest.raises(DataError):
        Connection().pack_command("SET", "k", True)
    with pytest.raises(DataError):
        ours.pack_command("SET", "k", True)


@pytest.mark.parametrize("kind", [Connection, SSLConnection, UnixDomainSocketConnection])
def test_keeps_the_connection_kind(kind: type[Connection]) -> None:
    packing = hiredis_packing(kind)

    assert issubclass(packing, kind)
    assert packing is hiredis_packing(kind)


async def test_a_client_from_settings_packs_with_hiredis_and_talks_to_redis(redis_url: str) -> None:
    if cluster_tests():
        pytest.skip("the cluster client makes its nodes' connections itself")
    client = connect_redis(RedisSettings(url=redis_url))
    try:
        await client.set("connections-test", "é" * 3)
        pipe = client.pipeline(transaction=False)
        pipe.get("connections-test")
        pipe.delete("connections-test")
        value, deleted = await pipe.execute()

        assert isinstance(client, Redis)
        assert client.connection_pool.connection_class.__name__.startswith("Hiredis")
        assert (value, deleted) == ("é".encode() * 3, 1)
    finally:
        await client.aclose()
