"""The worker's health port: ``/livez``, ``/readyz`` and ``/metrics``, an ASGI app served by uvicorn.

Liveness asks only whether the worker's loops still turn (the consume loop and the sweeper
beat a :class:`Liveness`), never whether Redis or the broker answer: an outage of either
must not get every pod restarted at once. Readiness asks exactly that: Redis answers, the
broker is reachable, the consumer group is joined. ``/metrics`` is the Prometheus text of a
``prometheus_client`` registry, which OpenTelemetry's Prometheus reader feeds.

The routes are FastStream's ASGI handlers; the server is uvicorn, started and stopped by the
worker's lifespan rather than by ``AsgiFastStream`` (docs/design.md, "Health port", says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import uvicorn
from faststream.asgi import AsgiResponse, get
from faststream.asgi.types import ASGIApp, Receive, Scope, Send
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from compaction_worker.settings import HealthSettings

log = logging.getLogger(__name__)

LIVEZ, READYZ, METRICS = "/livez", "/readyz", "/metrics"
"""The paths the server answers; the Kubernetes probes and the tests name these."""

WATCHED = ("consume", "sweep")
"""The loops a worker's liveness watches: the consume loop and the compaction pool's sweeper."""

Check = Callable[[], Awaitable[bool]]
"""A readiness check: true when its dependency is usable; raising counts as false."""


class Liveness:
    """When each watched loop last made progress; live while every one beat within ``timeout``.

    Before a loop's first beat its start is the creation of this object, so a worker that
    never gets its loops going turns stale too (the startup probe allows for slow starts).
    """

    def __init__(
        self, timeout: float, watched: Iterable[str] = WATCHED, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout = timeout
        self._clock = clock
        created = clock()
        self._last = dict.fromkeys(watched, created)

    def beat(self, name: str) -> None:
        """Record that loop ``name`` made progress now (an empty poll and a failed sweep count)."""
        self._last[name] = self._clock()

    def stale(self) -> dict[str, float]:
        """The watched loops that have not beaten within the timeout, with seconds since their last beat."""
        now = self._clock()
        return {name: now - last for name, last in self._last.items() if now - last > self.timeout}

    def __repr__(self) -> str:
        now = self._clock()
        ages = ", ".join(f"{name}={now - last:.1f}s" for name, last in self._last.items())
        return f"<Liveness timeout={self.timeout}s {ages}>"


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: whoever serves (the worker's FastStream app, the CLI) owns
    SIGINT and SIGTERM; left in place, uvicorn would take both while the port is open and raise them
    again when it closes, so one SIGTERM would reach the app twice."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(
    app: ASGIApp, host: str, port: int, *, stop_within: float | None = None, **options: Any
) -> AsyncIterator[socket.socket]:
    """Serve the ASGI ``app`` with uvicorn (no lifespan, no logs) on a socket bound here, so that a port
    in use fails at once with the ``OSError``; yields the socket. ``options`` go to ``uvicorn.Config``."""
    addresses = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    sock = socket.create_server((host, port), family=addresses[0][0])  # IPv4 or IPv6, as host is written
    config = uvicorn.Config(
        app, lifespan="off", log_config=None, log_level=logging.WARNING, access_log=False, **options
    )
    server = _Uvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))  # connections queue until uvicorn accepts them
    try:
        yield sock
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=stop_within)
        sock.close()


class HealthServer:
    """The health port of one worker: liveness from a :class:`Liveness`, readiness from named checks.

    An ASGI app of FastStream's HTTP handlers (GET and HEAD; 405 otherwise), served by uvicorn
    on a socket bound here, so that a port in use fails :meth:`start` with the ``OSError``.
    """

    def __init__(
        self,
        settings: HealthSettings,
        liveness: Liveness,
        checks: Mapping[str, Check],
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.settings = settings
        self.liveness = liveness
        self.checks = dict(checks)
        self.registry = registry
        self.routes: dict[str, ASGIApp] = {
            LIVEZ: get(self.livez, include_in_schema=False),
            READYZ: get(self.readyz, include_in_schema=False),
            METRICS: get(self.metrics, include_in_schema=False),
        }
        self._socket: socket.socket | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app: one route per path (the query string ignored), 404 elsewhere."""
        route = self.routes.get(scope["path"], _NOT_FOUND) if scope["type"] == "http" else _NOT_FOUND
        await route(scope, receive, send)

    @property
    def port(self) -> int:
        """The port it listens on (the configured one, or the one the OS chose for port 0)."""
        assert self._socket is not None, "the health server is not started"
        port: int = self._socket.getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen on the configured host and port (connections queue until uvicorn accepts them)."""
        # One request per connection (timeout_keep_alive=0), as the probes make them.
        listening = serving(self, self.settings.host, self.settings.port, stop_within=2, timeout_keep_alive=0)
        self._socket = await self._stack.enter_async_context(listening)
        log.info("health endpoints on http://%s:%d", self.settings.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close the open connections."""
        await self._stack.aclose()
        self._socket = None

    async def livez(self, scope: Scope) -> AsgiResponse:
        """200 while every watched loop beat recently; 503 naming the stale ones."""
        stale = self.liveness.stale()
        if not stale:
            return _text(200, "ok\n")
        lines = [f"{name}: no progress for {age:.0f}s\n" for name, age in sorted(stale.items())]
        return _text(503, "".join(lines))

    async def readyz(self, scope: Scope) -> AsgiResponse:
        """200 when every check passes; 503 with each check's result, so the body says which failed."""
        names = list(self.checks)
        results = await asyncio.gather(*(self._check(self.checks[name]) for name in names))
        lines = [f"{name}: {'ok' if ok else 'failed'}\n" for name, ok in zip(names, results, strict=True)]
        return _text(200 if all(results) else 503, "".join(lines))

    async def metrics(self, scope: Scope) -> AsgiResponse:
        """The registry's metrics in the Prometheus text format."""
        return AsgiResponse(
            generate_latest(self.registry), 200, {"Content-Type": CONTENT_TYPE_LATEST, **_NO_STORE}
        )

    async def _check(self, check: Check) -> bool:
        try:
            return bool(await asyncio.wait_for(check(), timeout=self.settings.check_timeout_seconds))
        except Exception:  # a check that raises or times out has failed; the body says so
            log.debug("readiness check failed", exc_info=True)
            return False


_NO_STORE = {"Cache-Control": "no-store"}


def _text(status: int, body: str) -> AsgiResponse:
    return AsgiResponse(body.encode(), status, {"Content-Type": "text/plain; charset=utf-8", **_NO_STORE})


_NOT_FOUND = _text(404, "not found\n")
