"""The sharded indexes: buckets by conversation, merged sweeps, counts, the pre-bucket key."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import LeasedIndex, ShardedIndex, bucket_key, bucket_keys, shard_of
from compaction_worker.state.jobs import JobQueue, jobs_index_key

pytestmark = pytest.mark.integration

CIDS = [f"conv-{i}" for i in range(40)]


def test_a_conversation_has_one_stable_bucket() -> None:
    """CRC-32 of the id: the same bucket in every process and version; ids spread over the buckets."""
    assert shard_of("conv-1", 16) == shard_of("conv-1", 16) == 3736203980 % 16
    assert len({shard_of(cid, 16) for cid in CIDS}) > 8
    assert bucket_keys("t:jobs", 3) == ("{t:jobs:0}", "{t:jobs:1}", "{t:jobs:2}")
    assert bucket_key("t:jobs", "conv-1", 16) == f"{{t:jobs:{shard_of('conv-1', 16)}}}"


async def test_due_merges_the_buckets_oldest_first_and_bounded(redis_client: RedisClient) -> None:
    index = ShardedIndex(redis_client, "t:jobs", 4)
    for score, cid in enumerate(reversed(CIDS)):
        await index.add(cid, 1000 + score)
    assert len({index.key_of(cid) for cid in CIDS}) == 4
    assert await index.due(5, 2000) == list(reversed(CIDS))[:5]
    assert await index.due(100, 1000 + 9) == list(reversed(CIDS))[:10]
    assert await index.due(100, 999) == []
    stats = await index.stats()
    assert (stats.count, stats.lowest_ms) == (40, 1000.0)


async def test_add_flags_and_remove(redis_client: RedisClient) -> None:
    index = ShardedIndex(redis_client, "t:gaps", 4)
    await index.add("a", 50, existing_only=True)
    assert await index.score("a") is None
    await index.add("a", 50, lower_only=True)
    await index.add("a", 70, lower_only=True)
    assert await index.score("a") == 50
    await index.remove("a")
    assert (await index.stats()).count == 0


async def test_the_pre_bucket_key_is_swept_into_the_buckets(redis_client: RedisClient) -> None:
    """A job indexed by a version before buckets is found, moved to its bucket, and claimed."""
    queue = JobQueue(redis_client, "t", lease_seconds=5, shards=4)
    await redis_client.zadd(jobs_index_key("t"), {"old": 10, "later": 10**15})
    assert await queue.pending_count() == 2  # counted before it moves
    assert await queue.due(10) == ["old"]
    assert await redis_client.zscore(jobs_index_key("t"), "old") is None
    assert await redis_client.zscore(queue.index.key_of("old"), "old") == 10
    assert await queue.claim("old") is not None
    assert await redis_client.zscore(jobs_index_key("t"), "later") == 10**15  # not due: left for later


async def test_a_leased_entry_moves_with_its_lease(redis_client: RedisClient) -> None:
    """An entry an older worker leased keeps its score; a bucket entry that exists is not overwritten."""
    leased = LeasedIndex(redis_client, "t:outbox", 4)
    await redis_client.zadd("t:outbox", {"x": 5, "y": 6})
    await leased.arm("y", 7)
    assert await leased.due(10, at_ms=100) == ["x", "y"]
    assert await leased.index.score("y") == 7
    assert await redis_client.zcard("t:outbox") == 0
    assert await leased.drop("x", 5)


async def test_buckets_spread_over_the_cluster_primaries(redis_client: RedisClient) -> None:
    if not isinstance(redis_client, RedisCluster):
        pytest.skip("cluster only (COMPACTION_TEST_REDIS_CLUSTER=1)")
    nodes = {getattr(redis_client.get_node_from_key(key), "name", None) for key in bucket_keys("cw:jobs", 16)}
    assert len(nodes) == len(redis_client.get_primaries()) == 3
