"""The embedded Redis Cluster: three primaries covering every slot, a primary restarted with its data."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from compaction_worker.errors import ConfigError
from compaction_worker.local.cluster import EmbeddedRedisCluster
from compaction_worker.runtime.connections import connect_redis
from compaction_worker.settings import RedisSettings

pytestmark = pytest.mark.integration


def test_the_cluster_client_is_chosen_by_flag_or_url_scheme() -> None:
    """``redis.cluster`` or a ``+cluster`` scheme gives the cluster client; a plain URL the single-server one."""
    assert isinstance(connect_redis(RedisSettings(url="redis://127.0.0.1:1/0")), Redis)
    assert isinstance(connect_redis(RedisSettings(url="redis+cluster://127.0.0.1:1")), RedisCluster)
    assert isinstance(connect_redis(RedisSettings(url="redis://127.0.0.1:1", cluster=True)), RedisCluster)
    assert RedisSettings(url="rediss+cluster://h:1").uses_cluster
    assert not RedisSettings(url="rediss://h:1").uses_cluster


async def test_three_primaries_and_a_restart_that_keeps_the_data() -> None:
    cluster = EmbeddedRedisCluster()
    try:
        cluster.start()
    except ConfigError as e:
        pytest.skip(f"no embedded Redis: {e}")
    try:
        client = connect_redis(RedisSettings(url=cluster.url))
        assert isinstance(client, RedisCluster)
        try:
            keys = [f"{{k{i}}}" for i in range(30)]
            for key in keys:
                await client.set(key, key)
            assert {client.get_node_from_key(key).port for key in keys} == set(cluster.ports)  # type: ignore[union-attr]
            cluster.restart(1, down_seconds=0.2)
            assert [await client.get(key) for key in keys] == [key.encode() for key in keys]
            await client.flushall()  # every primary
            assert await client.keys("*", target_nodes=RedisCluster.PRIMARIES) == []
        finally:
            await client.aclose()
    finally:
        cluster.close()
