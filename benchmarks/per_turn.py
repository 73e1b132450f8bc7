"""Per-turn cost versus history length: the per-turn path must not grow with the history.

Run: python benchmarks/per_turn.py [--turns 300]

It starts an embedded Redis, builds conversations of several lengths, then times the
whole per-turn path (parse, validate, count, append script, budget check) for new
one-message turns on each, interleaved so that machine noise hits every size alike, and
prints the medians and their ratio to the shortest history.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from redis.asyncio import Redis

from compaction_worker.local.embedded import EmbeddedRedis
from compaction_worker.runtime.components import build_components
from compaction_worker.settings import Settings
from compaction_worker.state.store import NewMessage
from compaction_worker.testing import turn_payload

SIZES = (10, 1_000, 10_000, 50_000)
MODEL = "gpt-4.1"  # a 1M-token window: no compaction interferes with the timing


async def _publish(topic: str, payload: bytes, key: bytes | None) -> None:
    return None


async def main(turns: int) -> None:
    with EmbeddedRedis() as server:
        redis = Redis.from_url(server.url)
        settings = Settings(redis={"key_prefix": "bench", "retention_seconds": None})
        parts = build_components(settings, redis, _publish)
        store, handler = parts.store, parts.turns
        for size in SIZES:
            cid = f"h{size}"
            filler = [NewMessage({"role": "user", "content": f"message {i} " * 5}, 15) for i in range(size)]
            await store.append_turn(cid, 1, filler, {"model": MODEL}, expected_count=0)
        timings: dict[int, list[float]] = {size: [] for size in SIZES}
        for turn in range(turns):
            for size in SIZES:
                cid = f"h{size}"
                payload = json.dumps(
                    turn_payload(
                        cid, turn + 2, [{"role": "assistant", "content": f"reply {turn} " * 20}], model=MODEL
                    )
                ).encode()
                start = time.perf_counter()
                outcome = await handler.handle(payload, cid.encode())
                timings[size].append(time.perf_counter() - start)
                assert outcome.status.value == "appended", outcome
        await redis.aclose()
    base = statistics.median(timings[SIZES[0]])
    print(
        f"per-turn path, {turns} turns per history size (median, p95, ratio of medians to {SIZES[0]} messages)"
    )
    for size in SIZES:
        median = statistics.median(timings[size])
        p95 = statistics.quantiles(timings[size], n=20)[-1]
        print(
            f"  history {size:>6} messages: {median * 1000:6.2f} ms  p95 {p95 * 1000:6.2f} ms  ratio {median / base:4.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    asyncio.run(main(parser.parse_args().turns))
