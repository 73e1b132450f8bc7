"""The bench's Redis meter: commands sent and run inside scripts, counted exactly, the meter's own left out.

Each test starts its own Redis: the counters are the server's, and no other test may touch them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from compaction_worker.bench.meter import Meter, Monitored, Snapshot, parse_info
from compaction_worker.bench.redis_cost import sent_time
from compaction_worker.local.embedded import EmbeddedRedis

SCRIPT = """
redis.call('HSET', KEYS[1], 'seq', ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return redis.call('HGETALL', KEYS[1])
"""
TURNS = 25


@pytest.fixture
async def meter_client(own_redis: EmbeddedRedis) -> AsyncIterator[Redis]:
    """The meter's client of the test's own Redis."""
    client = Redis.from_url(own_redis.url)
    try:
        yield client
    finally:
        await client.aclose()


async def _turns(worker: Redis, count: int) -> None:
    """A worker's turns: a read before the script (as a worker may do), then the script."""
    script = worker.register_script(SCRIPT)
    for seq in range(count):
        await worker.hgetall("meta")
        await script(keys=["meta", "list"], args=[seq])


def _url(client: Redis) -> str:
    kwargs = client.get_connection_kwargs()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    return f"redis://{kwargs['host']}:{kwargs['port']}/0"


@pytest.mark.integration
async def test_monitor_splits_sent_from_inside_scripts_and_leaves_the_meter_out(meter_client: Redis) -> None:
    worker = Redis.from_url(_url(meter_client))
    try:
        await _turns(worker, 1)  # connected, the script loaded: nothing but turns is counted
        async with Meter(meter_client) as meter, meter.monitor() as counted:
            await meter.snapshot()  # the meter's own command: not counted
            await _turns(worker, TURNS)
        assert counted.sent == Counter({"hgetall": TURNS, "evalsha": TURNS})
        assert counted.inside == Counter({"hset": TURNS, "rpush": TURNS, "hgetall": TURNS})
        assert len(counted.clients) == 1
    finally:
        await worker.aclose()


@pytest.mark.integration
async def test_commandstats_deltas_count_every_executed_command_once_and_time_the_sent_ones(
    meter_client: Redis,
) -> None:
    worker = Redis.from_url(_url(meter_client))
    try:
        await _turns(worker, 1)
        async with Meter(meter_client) as meter:
            before = await meter.snapshot()
            await _turns(worker, TURNS)
            stats = await meter.snapshot() - before
            async with meter.monitor() as counted:
                await _turns(worker, TURNS)
        # The first snapshot's INFO is left out; the script's inner commands count under their names.
        assert stats.calls == Counter({"hgetall": 2 * TURNS, "evalsha": TURNS, "hset": TURNS, "rpush": TURNS})
        assert stats.calls.total() == counted.sent.total() + counted.inside.total()
        usec, split, unseen = sent_time(stats, counted)
        assert (split, unseen) == (["hgetall"], [])
        # EVALSHA's time holds its calls'; HGETALL's is halved (one sent, one inside, per turn).
        assert usec == pytest.approx(stats.usec["evalsha"] + stats.usec["hgetall"] / 2)
        assert stats.cpu_seconds > 0
    finally:
        await worker.aclose()


def test_info_parses_into_counts_times_and_the_processs_cpu() -> None:
    info = {
        "used_cpu_sys_main_thread": 1.0,
        "used_cpu_user_main_thread": 0.25,
        "used_cpu_sys": 1.5,
        "used_cpu_user": 0.25,
        "cmdstat_evalsha": {"calls": 3, "usec": 90, "usec_per_call": 30.0},
        "cmdstat_client|setinfo": {"calls": 2, "usec": 1},
        "cmdstat_info": {"calls": 1, "usec": 20},
    }
    snapshot = parse_info(info)
    assert snapshot.cpu_seconds == 1.75
    assert snapshot.calls == Counter({"evalsha": 3, "client|setinfo": 2, "info": 1})
    later = Snapshot(Counter({"evalsha": 5, "info": 2, "client|setinfo": 2}), Counter({"evalsha": 150}), 2.0)
    delta = later - snapshot
    assert delta.calls == Counter({"evalsha": 2})  # the meter's INFO and unchanged names drop out
    assert delta.usec == Counter({"evalsha": 60})
    assert delta.cpu_seconds == 0.25


def test_a_monitor_line_counts_as_sent_inside_a_script_or_the_meters_own() -> None:
    counted, own, end = Monitored(), "127.0.0.1:1", b"end-of-count-1"
    assert counted.count(b'1795590029.774122 [0 127.0.0.1:59808] "EVALSHA" "9e1a" "1" "k"', own, end)
    assert counted.count(b'1795590029.774756 [0 lua] "HSET" "k" "a" "1"', own, end)
    assert counted.count(b'1795590029.774757 [0 [::1]:6000] "client" "setinfo"', own, end)
    assert counted.count(b'1795590029.774790 [0 127.0.0.1:1] "info" "cpu"', own, end)  # the meter's: skipped
    assert not counted.count(b'1795590029.774800 [0 127.0.0.1:1] "echo" "end-of-count-1"', own, end)
    assert counted.sent == Counter({"evalsha": 1, "client": 1})
    assert counted.inside == Counter({"hset": 1})
    assert counted.clients == {"127.0.0.1:59808", "[::1]:6000"}
