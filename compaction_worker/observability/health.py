"""The worker's health port: ``/livez``, ``/readyz`` and ``/metrics`` on plain asyncio streams.

Liveness asks only whether the worker's loops still turn (the consume loop and the sweeper
beat a :class:`Liveness`), never whether Redis or the broker answer: an outage of either
must not get every pod restarted at once. Readiness asks exactly that: Redis answers, the
broker is reachable, the consumer group is joined. ``/metrics`` is the Prometheus text of a
``prometheus_client`` registry, which OpenTelemetry's Prometheus reader feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from compaction_worker.settings import HealthSettings

log = logging.getLogger(__name__)

LIVEZ, READYZ, METRICS = "/livez", "/readyz", "/metrics"
"""The paths the server answers; the Kubernetes probes and the tests name these."""

WATCHED = ("consume", "sweep")
"""The loops a worker's liveness watches: the consume loop and the compaction pool's sweeper."""

Check = Callable[[], Awaitable[bool]]
"""A readiness check: true when its dependency is usable; raising counts as false."""

_REQUEST_TIMEOUT = 5.0  # a client that sends no request line and headers in this long is dropped
_MAX_REQUEST_BYTES = 8192


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


@dataclass(frozen=True, slots=True)
class Response:
    """What the server answers: a status, a content type and a body."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


class HealthServer:
    """The health port of one worker: liveness from a :class:`Liveness`, readiness from named checks."""

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
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the configured one, or the one the OS chose for port 0)."""
        assert self._server is not None, "the health server is not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen on the configured host and port."""
        self._server = await asyncio.start_server(self._serve, self.settings.host, self.settings.port)
        log.info("health endpoints on http://%s:%d", self.settings.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close the open connections."""
        if self._server is None:
            return
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), timeout=2)
        self._server = None

    async def livez(self) -> Response:
        """200 while every watched loop beat recently; 503 naming the stale ones."""
        stale = self.liveness.stale()
        if not stale:
            return Response(200, b"ok\n")
        lines = [f"{name}: no progress for {age:.0f}s" for name, age in sorted(stale.items())]
        return Response(503, ("\n".join(lines) + "\n").encode())

    async def readyz(self) -> Response:
        """200 when every check passes; 503 with each check's result, so the body says which failed."""
        names = list(self.checks)
        results = await asyncio.gather(*(self._check(self.checks[name]) for name in names))
        lines = [f"{name}: {'ok' if ok else 'failed'}" for name, ok in zip(names, results, strict=True)]
        status = 200 if all(results) else 503
        return Response(status, ("\n".join(lines) + "\n").encode())

    def metrics(self) -> Response:
        """The registry's metrics in the Prometheus text format."""
        return Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    async def _check(self, check: Check) -> bool:
        try:
            return bool(await asyncio.wait_for(check(), timeout=self.settings.check_timeout_seconds))
        except Exception:  # a check that raises or times out has failed; the body says so
            log.debug("readiness check failed", exc_info=True)
            return False

    async def respond(self, method: str, path: str) -> Response:
        """The response to one request (no I/O of its own beyond the checks)."""
        route = path.split("?", 1)[0]
        if route not in (LIVEZ, READYZ, METRICS):
            return Response(404, b"not found\n")
        if method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n")
        if route == LIVEZ:
            return await self.livez()
        if route == READYZ:
            return await self.readyz()
        return self.metrics()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=_REQUEST_TIMEOUT)
            method, path = _request_line(head)
            response = await self.respond(method, path) if method else Response(400, b"bad request\n")
            writer.write(_encode(response, include_body=method != "HEAD"))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # the client went away or sent garbage: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _request_line(head: bytes) -> tuple[str, str]:
    """The method and path of a request head, or empty strings when it is not HTTP."""
    if len(head) > _MAX_REQUEST_BYTES:
        return "", ""
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return "", ""
    return parts[0].upper(), parts[1]


def _encode(response: Response, *, include_body: bool) -> bytes:
    headers = (
        f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    return headers.encode("latin-1") + (response.body if include_body else b"")
