"""The health port: liveness from loop beats, readiness from named checks, Prometheus metrics.

The server is exercised over real TCP connections; the worker wiring and outages are in
tests/integration/test_health.py.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, Counter

from compaction_worker.observability.health import LIVEZ, METRICS, READYZ, HealthServer, Liveness
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.pool import CompactionPool
from compaction_worker.settings import HealthSettings
from compaction_worker.state.jobs import JobQueue

Reply = tuple[int, dict[str, str], str]


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def request(port: int, path: str, method: str = "GET", raw: bytes | None = None) -> Reply:
    """One HTTP/1.1 request over a fresh connection: the status, headers and body of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw if raw is not None else f"{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    await writer.wait_closed()
    if not data:
        return 0, {}, ""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, body.decode()


def check(result: bool | Exception | None) -> Callable[[], Awaitable[bool]]:
    """A readiness check answering ``result``, raising it, or (None) never answering."""

    async def run() -> bool:
        if result is None:
            await asyncio.sleep(3600)
        if isinstance(result, Exception):
            raise result
        return bool(result)

    return run


Serve = Callable[..., Awaitable[HealthServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start health servers on free ports; stopped after the test."""
    servers: list[HealthServer] = []

    async def start(
        liveness: Liveness | None = None,
        checks: Mapping[str, Callable[[], Awaitable[bool]]] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> HealthServer:
        settings = HealthSettings(enabled=True, port=0, check_timeout_seconds=0.3)
        server = HealthServer(
            settings,
            liveness or Liveness(60),
            checks if checks is not None else {"redis": check(True)},
            registry or CollectorRegistry(),
        )
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


class TestLiveness:
    def test_fresh_is_live(self) -> None:
        """Just created, nothing is stale: the loops get the timeout to make their first beat."""
        assert Liveness(10, clock=Clock()).stale() == {}

    def test_a_loop_without_beats_goes_stale(self) -> None:
        """A loop that never beats is stale once the timeout has passed since creation."""
        clock = Clock()
        liveness = Liveness(10, clock=clock)
        clock.now += 9
        liveness.beat("consume")
        clock.now += 2
        assert liveness.stale() == {"sweep": pytest.approx(11)}

    def test_each_beat_restarts_its_loop_timer(self) -> None:
        """Beating both loops keeps the worker live however long it runs."""
        clock = Clock()
        liveness = Liveness(10, clock=clock)
        for _ in range(5):
            clock.now += 8
            liveness.beat("consume")
            liveness.beat("sweep")
        assert liveness.stale() == {}
        clock.now += 10.5
        assert set(liveness.stale()) == {"consume", "sweep"}

    def test_unwatched_names_do_not_count(self) -> None:
        """Only the watched loops decide; another name's beats neither help nor hurt."""
        clock = Clock()
        liveness = Liveness(10, watched=("consume",), clock=clock)
        clock.now += 11
        liveness.beat("sweep")
        assert set(liveness.stale()) == {"consume"}


class TestEndpoints:
    async def test_livez_answers_200_while_loops_beat(self, serve: Serve) -> None:
        server = await serve()
        status, headers, body = await request(server.port, LIVEZ)
        assert (status, body) == (200, "ok\n")
        assert headers["content-length"] == "3"

    async def test_livez_answers_503_naming_the_stale_loop(self, serve: Serve) -> None:
        """The body says which loop stopped making progress."""
        clock = Clock()
        liveness = Liveness(5, clock=clock)
        server = await serve(liveness)
        clock.now += 6
        liveness.beat("sweep")
        status, _, body = await request(server.port, LIVEZ)
        assert status == 503
        assert body == "consume: no progress for 6s\n"

    async def test_livez_ignores_failing_readiness_checks(self, serve: Serve) -> None:
        """An outage of a dependency is not a reason to restart the pod."""
        server = await serve(checks={"redis": check(False), "broker": check(ConnectionError())})
        assert (await request(server.port, LIVEZ))[0] == 200
        assert (await request(server.port, READYZ))[0] == 503

    async def test_readyz_answers_200_when_every_check_passes(self, serve: Serve) -> None:
        server = await serve(checks={"redis": check(True), "broker": check(True), "group": check(True)})
        status, _, body = await request(server.port, READYZ)
        assert status == 200
        assert body == "redis: ok\nbroker: ok\ngroup: ok\n"

    async def test_readyz_says_which_check_failed(self, serve: Serve) -> None:
        """False, an exception and a timeout all fail their check; the others still report ok."""
        checks = {
            "redis": check(False),
            "broker": check(True),
            "group": check(RuntimeError("boom")),
            "slow": check(None),
        }
        server = await serve(checks=checks)
        status, _, body = await request(server.port, READYZ)
        assert status == 503
        assert body.splitlines() == ["redis: failed", "broker: ok", "group: failed", "slow: failed"]

    async def test_metrics_is_the_registry_in_prometheus_text(self, serve: Serve) -> None:
        registry = CollectorRegistry()
        Counter("cw_test_turns", "Turns seen.", ["status"], registry=registry).labels("appended").inc(3)
        server = await serve(registry=registry)
        status, headers, body = await request(server.port, METRICS)
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=")
        assert 'cw_test_turns_total{status="appended"} 3.0' in body.splitlines()

    async def test_head_has_headers_without_body(self, serve: Serve) -> None:
        server = await serve()
        status, headers, body = await request(server.port, LIVEZ, method="HEAD")
        assert (status, headers["content-length"], body) == (200, "3", "")

    async def test_unknown_path_and_method(self, serve: Serve) -> None:
        server = await serve()
        assert (await request(server.port, "/nope"))[0] == 404
        assert (await request(server.port, READYZ, method="POST"))[0] == 405
        assert (await request(server.port, f"{LIVEZ}?verbose=1"))[0] == 200

    async def test_garbage_gets_400_and_the_server_goes_on(self, serve: Serve) -> None:
        server = await serve()
        status, _, _ = await request(server.port, "", raw=b"hello there\r\n\r\n")
        assert status == 400
        assert (await request(server.port, LIVEZ))[0] == 200

    async def test_serving_leaves_the_signal_handlers_to_the_app(self, serve: Serve) -> None:
        """uvicorn takes no SIGINT or SIGTERM: the worker's FastStream app shuts down on them, once."""
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        server = await serve()
        assert (await request(server.port, LIVEZ))[0] == 200  # uvicorn is serving by now
        assert {sig: signal.getsignal(sig) for sig in before} == before

    async def test_a_port_in_use_fails_the_start(self, serve: Serve) -> None:
        """Binding fails in start() itself, as an OSError the worker's start-up reports."""
        server = await serve()
        taken = HealthServer(
            HealthSettings(enabled=True, port=server.port), Liveness(60), {}, CollectorRegistry()
        )
        with pytest.raises(OSError, match="in use"):
            await taken.start()
        assert (await request(server.port, LIVEZ))[0] == 200

    async def test_stop_closes_the_port(self, serve: Serve) -> None:
        server = await serve()
        port = server.port
        await server.stop()
        with pytest.raises(ConnectionRefusedError):
            await request(port, LIVEZ)


class _FailingJobs:
    """A job index whose Redis is away: every call fails."""

    async def due(self, limit: int) -> list[str]:
        raise ConnectionError("Redis is away")


async def test_sweeper_beats_even_when_its_sweep_fails() -> None:
    """The pool's sweeper keeps /livez green through a Redis outage: it beats after failed passes too."""
    clock = Clock()
    liveness = Liveness(5, clock=clock)
    jobs: Any = _FailingJobs()
    pool = CompactionPool(
        cast(Compactor, None), cast(JobQueue, jobs), size=1, sweep_interval=0.01, liveness=liveness
    )
    clock.now += 6
    assert "sweep" in liveness.stale()
    pool.start()
    try:
        for _ in range(100):
            await asyncio.sleep(0.01)
            if "sweep" not in liveness.stale():
                break
        assert set(liveness.stale()) == {"consume"}
    finally:
        await pool.stop(0)
