"""Redis on a core of its own for a phase (cores.py): moved, then every thread put back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from compaction_worker.bench.cores import local_pid, own_core
from compaction_worker.local.embedded import EmbeddedRedis


def _affinities(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()}


def test_redis_gets_the_last_core_and_this_process_the_others_while_the_block_runs(
    own_redis: EmbeddedRedis,
) -> None:
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        pytest.skip("one core: nothing to give Redis alone")
    client = redis.Redis.from_url(own_redis.url)
    try:
        pid = local_pid(client.info("server"))
    finally:
        client.close()
    assert pid is not None
    before = _affinities(pid)
    with own_core(pid) as alone:
        assert alone
        assert _affinities(pid) == {frozenset({max(cores)})}
        assert os.sched_getaffinity(0) == cores - {max(cores)}
    assert _affinities(pid) == before
    assert os.sched_getaffinity(0) == cores


def test_a_redis_on_another_machine_is_not_moved() -> None:
    """Its pid, read here, is some other process: its executable is not the one Redis names."""
    info = {"process_id": os.getpid(), "executable": "/usr/local/bin/redis-server"}
    assert local_pid(info) is None
    cores = os.sched_getaffinity(0)
    with own_core(None) as alone:
        assert not alone
        assert os.sched_getaffinity(0) == cores
