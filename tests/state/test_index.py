"""The sharded indexes: buckets by conversation, merged sweeps and when to look next, counts,
wake-up announcements."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

from compaction_worker.conversation.keys import bucket_keys, shard_of
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import Scan, ShardedIndex
from compaction_worker.state.wake import Wakes

pytestmark = pytest.mark.integration

CIDS = [f"conv-{i}" for i in range(40)]


def test_a_conversation_has_one_stable_bucket() -> None:
    """CRC-32 of the id: the same bucket in every process and version; ids spread over the buckets."""
    assert shard_of("conv-1", 16) == shard_of("conv-1", 16) == 3736203980 % 16
    assert len({shard_of(cid, 16) for cid in CIDS}) > 8
    assert bucket_keys("t:jobs", 3) == ("{t:jobs:0}", "{t:jobs:1}", "{t:jobs:2}")


async def test_due_merges_the_buckets_oldest_first_and_bounded(redis_client: RedisClient) -> None:
    index = ShardedIndex(redis_client, "t:jobs", 4)
    for score, cid in enumerate(reversed(CIDS)):
        await index.add(cid, 1000 + score)
    assert len({index.key_of(cid) for cid in CIDS}) == 4
    assert index.key_of("conv-1") == f"{{t:jobs:{shard_of('conv-1', 4)}}}"
    assert (await index.scan(5, 2000)).due == list(reversed(CIDS))[:5]
    assert (await index.scan(100, 1000 + 9)).due == list(reversed(CIDS))[:10]
    assert (await index.scan(100, 999)).due == []
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


async def test_a_scan_says_what_is_due_and_when_the_next_entry_is(redis_client: RedisClient) -> None:
    """One read of the buckets gives the due members and the lowest score after them, so that a
    worker sleeps until then instead of polling; a full page of due members means "look again now"."""
    index = ShardedIndex(redis_client, "t:jobs", 4)
    for score, cid in enumerate(CIDS[:12]):
        await index.add(cid, 1000 + 10 * score)
    scan = await index.scan(100, 1035)
    assert (scan.due, scan.next_ms) == (CIDS[:4], 1040)
    assert (await index.scan(2, 1035)).next_ms == 1035  # more due than it took
    assert (await index.scan(100, 5000)).next_ms is None  # nothing after them
    assert await index.scan(100, 999) == Scan([], 1000)


async def test_arming_announces_and_a_conditional_write_only_when_it_changes(
    redis_client: RedisClient,
) -> None:
    """Every write that arms an entry announces when it is due (held turns: a timeout after their
    score); a conditional write that changes nothing announces nothing."""
    wakes = Wakes(redis_client, "t")
    index = ShardedIndex(redis_client, "t:gaps", 4, wakes=wakes, due_after_ms=500)
    await index.add("a", 1000, lower_only=True)
    wake = await wakes.next(1)
    assert wake is not None
    assert (wake.kind, wake.conversation_id, wake.at_ms) == ("gaps", "a", 1500)
    await index.add("a", 2000, lower_only=True)  # not lower: unchanged
    await index.add("a", 3000, later_only=True, existing_only=True)
    await index.add("b", 3000, later_only=True, existing_only=True)  # not indexed: unchanged
    wake = await wakes.next(1)
    assert wake is not None
    assert (wake.conversation_id, wake.at_ms) == ("a", 3500)
    assert await wakes.next(0.01) is None
    assert await index.score("b") is None


async def test_buckets_spread_over_the_cluster_primaries(redis_client: RedisClient) -> None:
    if not isinstance(redis_client, RedisCluster):
        pytest.skip("cluster only (COMPACTION_TEST_REDIS_CLUSTER=1)")
    nodes = {getattr(redis_client.get_node_from_key(key), "name", None) for key in bucket_keys("cw:jobs", 16)}
    assert len(nodes) == len(redis_client.get_primaries()) == 3
