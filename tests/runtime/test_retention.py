"""Retention: a conversation's keys expire together when it goes idle, and never while it is active.

The deadline lives in the meta (lua/expiry.lua): every script that creates a key gives it that
deadline, and a turn moves it (for every key) only once less than half the retention is left.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio

from compaction_worker.testing import turn_bytes
from tests.orchestration import Published, assistant, compact_now, make_parts, make_settings, user

pytestmark = pytest.mark.integration

RETENTION = 3
"""Seconds: short, so that the idle conversation expires within the test."""
WATCH = 2.5 * RETENTION


def turn(cid: str, seq: int, **fields: Any) -> bytes:
    message = (
        user(f"question {seq}: " + "detail " * 60) if seq % 2 else assistant(f"answer {seq}: " + "so " * 60)
    )
    return turn_bytes(cid, seq, [message], context_window=2048, **fields)


async def present(client: redis.asyncio.Redis, keys: tuple[str, ...]) -> set[str]:
    """The keys that exist, read at one instant: in one transaction, so the deadline the keys share
    cannot pass between two reads (one EXISTS at a time, a read straddling it saw the first key
    present and the rest gone)."""
    async with client.pipeline(transaction=True) as pipe:
        for key in keys:
            pipe.exists(key)
        found = await pipe.execute()
    return {k for k, n in zip(keys, found, strict=True) if n}


async def test_idle_keys_expire_together_and_active_ones_never(
    redis_client: redis.asyncio.Redis, published: Published
) -> None:
    parts = make_parts(redis_client, make_settings(redis={"retention_seconds": 3600}), published)
    parts.store.retention_ms = parts.appends.retention_ms = (
        RETENTION * 1000
    )  # under the settings' minute, to watch it happen
    seqs = {}
    for cid in ("idle", "active"):
        for seq in range(1, 16):
            await parts.turns.handle(turn(cid, seq), cid.encode())
        await parts.turns.handle(turn(cid, 16, compaction={"mode": "force"}), cid.encode())
        done = await compact_now(parts.jobs, parts.compactor, cid)
        assert done.outcome.value == "compacted", (done.outcome, done.error, done.notes)
        seqs[cid] = 16
    await parts.turns.handle(turn("idle", 20), b"idle")  # held behind a gap: the pending hash
    lasting = {cid: parts.store.keys(cid).lasting() for cid in seqs}
    stable = {cid: await present(redis_client, lasting[cid]) for cid in seqs}
    for cid in seqs:
        names = {k.rsplit(":", 1)[1] for k in stable[cid]}
        assert {"meta", "transcript", "entries", "fingerprints", "chunks", "compactions", "fence"} <= names, (
            names
        )
    assert parts.store.keys("idle").pending in stable["idle"]

    idle_gone_at = None
    started = time.monotonic()
    while time.monotonic() - started < WATCH:
        seqs["active"] += 1
        await parts.turns.handle(turn("active", seqs["active"]), b"active")
        # The active conversation keeps every key it had (its job and outbox come and go by design).
        assert stable["active"] <= await present(redis_client, lasting["active"])
        # The idle one has all its keys, or none: never some.
        idle = await present(redis_client, lasting["idle"])
        assert idle in (set(), stable["idle"]) or stable["idle"] <= idle, sorted(idle)
        if not idle and idle_gone_at is None:
            idle_gone_at = time.monotonic() - started
        if idle_gone_at is not None:
            assert not idle, f"keys came back: {sorted(idle)}"
        await asyncio.sleep(0.2)
    assert idle_gone_at is not None, "the idle conversation never expired"
    assert await present(redis_client, parts.store.keys("idle").all()) == set()
