"""The health port of a running worker: /livez, /readyz and /metrics before, during and after a Redis outage.

Readiness follows Redis (and the broker and the group); liveness does not, so that an
outage of a shared dependency never gets every pod restarted at once.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.local.demo import synthetic_turns
from compaction_worker.local.embedded import EmbeddedRedis, free_port
from compaction_worker.observability.health import LIVEZ, METRICS, READYZ
from compaction_worker.runtime.worker import build_worker
from tests.orchestration import make_settings

from .helpers import poll_until
from .processes import WorkerProcess

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

pytestmark = pytest.mark.integration

LIVENESS_TIMEOUT = 6.0
"""Long enough that a loaded test machine never starves a loop this long; the outage below outlasts it."""


def get(port: int, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:port/path: the status and body (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def aget(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(get, port, path)


def health_sections() -> dict[str, dict[str, Any]]:
    """These tests' settings sections: the health port on (a free one), short timeouts, quick retries."""
    health = {
        "enabled": True,
        "port": free_port(),
        "liveness_timeout_seconds": LIVENESS_TIMEOUT,
        "check_timeout_seconds": 1.0,
    }
    return {"health": health, "retry": {"base_seconds": 0.2, "cap_seconds": 0.2}}


async def test_ready_follows_redis_and_live_holds_through_its_outage(
    kafka_bootstrap: str, own_redis: EmbeddedRedis, make_topics: MakeTopics
) -> None:
    """Up: live, ready, metrics. Redis stopped: not ready (the body names redis), still live
    for longer than the liveness timeout. Redis back: ready again, without a restart."""
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=2)
    settings = make_settings(kafka_bootstrap, own_redis.url, topics, **health_sections())
    port = settings.health.port
    worker = build_worker(settings)
    async with worker.running():
        # Both polled, as a startup probe would: the first consume beat may follow the group join.
        await poll_until(lambda: _status(port, READYZ, 200), 60, "ready")
        await poll_until(lambda: _status(port, LIVEZ, 200), 30, "live")
        assert await aget(port, READYZ) == (200, "redis: ok\nbroker: ok\ngroup: ok\n")
        assert await aget(port, LIVEZ) == (200, "ok\n")
        status, metrics = await aget(port, METRICS)
        assert status == 200
        assert "# TYPE python_info gauge" in metrics.splitlines()

        await asyncio.to_thread(own_redis.stop)
        await poll_until(lambda: _status(port, READYZ, 503), 30, "not ready with Redis stopped")
        status, body = await aget(port, READYZ)
        assert (status, body) == (503, "redis: failed\nbroker: ok\ngroup: ok\n")
        # Longer than the liveness timeout: a loop stuck on the outage would show here.
        for _ in range(int(LIVENESS_TIMEOUT * 2) + 1):
            assert await aget(port, LIVEZ) == (200, "ok\n")
            await asyncio.sleep(0.5)
        assert (await aget(port, METRICS))[0] == 200

        await asyncio.to_thread(own_redis.start)
        await poll_until(lambda: _status(port, READYZ, 200), 30, "ready again with Redis back")
        assert await aget(port, LIVEZ) == (200, "ok\n")
    with pytest.raises(urllib.error.URLError, match="refused"):
        get(port, LIVEZ)  # the port closes with the worker


async def test_the_cli_worker_serves_health_when_enabled_by_environment(
    kafka_bootstrap: str, redis_url: str, make_topics: MakeTopics, tmp_path: Path
) -> None:
    """`compaction-worker run` with COMPACTION_HEALTH__* set says where it listens and answers there."""
    topics = await make_topics("turn", "started", "completed", "dlq", partitions=2)
    settings = make_settings(kafka_bootstrap, redis_url, topics, **health_sections())
    port = settings.health.port
    process = WorkerProcess(settings, tmp_path, "health")
    process.start()
    try:
        await asyncio.to_thread(process.wait_consuming)
        assert f"health endpoints on http://127.0.0.1:{port} (/livez /readyz /metrics)" in process.log()
        await poll_until(lambda: _status(port, READYZ, 200), 60, "ready", detail=lambda: aget(port, READYZ))
        await poll_until(lambda: _status(port, LIVEZ, 200), 30, "live", detail=lambda: aget(port, LIVEZ))
        # The metrics of a handled turn, through OpenTelemetry's Prometheus reader (installed by `run`).
        cid = f"health-{uuid.uuid4().hex[:8]}"
        async with Client.connect(settings) as client:
            for event in synthetic_turns(cid, 2):
                await client.publish_turn(event)
        appended = 'compaction_turns_total{status="appended"}'
        await poll_until(
            lambda: _metric(port, appended) == 2.0,
            60,
            "2 appended turns on /metrics",
            detail=lambda: aget(port, METRICS),
        )
        assert _metric(port, "compaction_jobs_pending") is not None  # a gauge, read at each scrape
    finally:
        await asyncio.to_thread(process.stop)


def _metric(port: int, series: str) -> float | None:
    """The value of one series on /metrics (labels as written, other labels ignored), or None."""
    name, _, labels = series.partition("{")
    wanted = [label for label in labels.rstrip("}").split(",") if label]
    for line in get(port, METRICS)[1].splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(label in head for label in wanted):
            return float(value)
    return None


async def _status(port: int, path: str, expected: int) -> bool:
    try:
        return (await aget(port, path))[0] == expected
    except OSError:  # not listening yet
        return False
